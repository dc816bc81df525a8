#!/usr/bin/env bash
# Run 72: attn_bwd_wgmma's final defaults (d64: 128 rows per step, d72..128: 64): the whole
# backward check (both kernels, the deterministic cases), memcheck and racecheck on a d64 and
# a d128 case, then the bench against SDPA's backends (f16, bf16; lines bwd, bwd-mma,
# bwd-det), then the quick forward check of every kernel.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee -a $L
el "check backward"
timeout 150 $B check --kernel mma --filter backward > $OUT/check-backward.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-backward.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-backward.txt | grep -v "^checking\|passed" | head -8 | cut -c1-300 | tee -a $L
for tool in memcheck racecheck; do
  for f in "f16 backward b=1 sq=128 sk=128 hq=2 hkv=2 d=64 causal" "bf16 backward b=2 sq=100 sk=100 hq=4 hkv=2 d=128 window"; do
    el "$tool: $f"
    timeout 120 compute-sanitizer --tool $tool $B check --kernel mma --filter "$f" > /tmp/san.txt 2>&1; echo "exit $?" | tee -a $L
    cat /tmp/san.txt >> $OUT/sanitizers.txt
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|Race|hazard" /tmp/san.txt | sort | uniq -c | head -6 | cut -c1-200 | tee -a $L
  done
done
el "bench --backward --peers"
timeout 300 $B bench --backward --peers --dtype both --head-dim 64,128 --seqlen 1024,4096,16384 --out-dir /tmp/bb > /tmp/bb.log 2>&1; echo "bench exit $?" | tee -a $L
cp /tmp/bb/bench.txt $OUT/bench-backward.txt; cp /tmp/bb/bench.json $OUT/bench-backward.json; cp /tmp/bb/*.png $OUT/ 2>/dev/null; cat $OUT/bench-backward.txt | tee -a $L; tail -2 /tmp/bb.log | tee -a $L
el "check --quick --kernel all"
timeout 100 $B check --quick --kernel all > $OUT/check-quick.txt 2>&1; echo "exit $?" | tee -a $L; tail -1 $OUT/check-quick.txt | tee -a $L
grep -v "^\[PASS\]" $OUT/check-quick.txt | grep -v "^checking\|passed" | head -5 | cut -c1-200 | tee -a $L
el "done"
