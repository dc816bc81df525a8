#!/usr/bin/env bash
# Run 36: softcap's tanh with its reciprocal on the FMA pipe (Newton) instead of rcp.approx,
# and ALiBi's distance converted once per row: the modifier cases of the check on wgmma and
# mma, compute-sanitizer on them, and the cost bench again (plain, softcap, alibi, all).
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
for f in softcap alibi "window("; do
  el "check wgmma,mma --filter $f"
  timeout 120 $B check --kernel wgmma,mma --filter "$f" > /tmp/c.txt 2>&1; echo "check exit $?" | tee -a $L
  cat /tmp/c.txt >> $OUT/check-mods.txt; tail -1 /tmp/c.txt | tee -a $L; grep -v "^\[PASS\]" /tmp/c.txt | head -5 | tee -a $L
done
el "memcheck wgmma softcap"; timeout 60 compute-sanitizer --tool memcheck $B check --quick --kernel wgmma,mma --filter softcap > /tmp/san.txt 2>&1; echo "exit $?" | tee -a $L
grep -E "ERROR SUMMARY|passed," /tmp/san.txt | sort | uniq -c | tee -a $L
A="--kernels wgmma,mma --dtype f16 --head-dim 64,128 --seqlen 1k,4k,16k --no-plot"
for v in "plain|" "softcap|--softcap 50" "alibi|--alibi" "all|--softcap 50 --alibi --window 1024,0"; do
  IFS='|' read -r label flags <<< "$v"
  el "bench $label"
  timeout 100 $B bench $A $flags --out-dir /tmp/b_$label > /tmp/b_$label.log 2>&1; echo "bench exit $?" | tee -a $L
  cp /tmp/b_$label/bench.txt $OUT/bench-$label.txt; cat /tmp/b_$label/bench.txt | tee -a $L
done
el "done"
