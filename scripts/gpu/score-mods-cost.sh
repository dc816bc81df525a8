#!/usr/bin/env bash
# Run 35: what softcap and ALiBi cost (wgmma and mma, against the plain kernels in the same
# run), the mma ALiBi cases again (Bc 32 above d64 now), and the d64 window case on two
# consumer warpgroups (FLASHATTN_WGMMA_TILE=128,2) against the default three.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check mma alibi"
timeout 90 $B check --kernel mma --filter alibi > $OUT/check-mma-alibi.txt 2>&1; echo "check exit $?" | tee -a $L; tail -1 $OUT/check-mma-alibi.txt | tee -a $L
grep -v "^\[PASS\]" $OUT/check-mma-alibi.txt | head -5 | tee -a $L
A="--kernels wgmma,mma --dtype f16 --head-dim 64,128 --seqlen 1k,4k,16k --no-plot"
for v in "plain|" "softcap|--softcap 50" "alibi|--alibi" "all|--softcap 50 --alibi --window 1024,0"; do
  IFS='|' read -r label flags <<< "$v"
  el "bench $label"
  timeout 100 $B bench $A $flags --out-dir /tmp/b_$label > /tmp/b_$label.log 2>&1; echo "bench exit $?" | tee -a $L
  cp /tmp/b_$label/bench.txt $OUT/bench-$label.txt; cat /tmp/b_$label/bench.txt | tee -a $L
done
el "window d64 on two consumers"
FLASHATTN_WGMMA_TILE=128,2 timeout 80 $B bench --kernels wgmma --dtype f16 --head-dim 64 --seqlen 16k,32k,64k --causal on --window 4096,0 --no-plot --out-dir /tmp/bw2 > /tmp/bw2.log 2>&1; echo "bench exit $?" | tee -a $L
cat /tmp/bw2/bench.txt | tee -a $L
el "done"
