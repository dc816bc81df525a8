#!/usr/bin/env bash
# Run 73: every head_dim on the GPU backward: head_dim 256 on attn_bwd in two channel passes,
# 129..255 padded to 256, head dims not a multiple of 8 padded. The whole backward check,
# memcheck on a d256 deterministic case and a d36 case, racecheck on d256, one d256 timing,
# then the quick forward check of every kernel (complete this time).
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check backward"
timeout 180 $B check --kernel mma --filter backward > $OUT/check-backward.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-backward.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-backward.txt | grep -v "^checking\|passed" | head -8 | cut -c1-300 | tee -a $L
grep -E "d=(36|160|256) " $OUT/check-backward.txt | cut -c1-200 | tee -a $L
for run in "memcheck|f16 backward b=1 sq=200 sk=300 hq=4 hkv=2 d=256 causal deterministic" "memcheck|bf16 backward b=1 sq=77 sk=130 hq=4 hkv=2 d=36 window" "racecheck|f16 backward b=1 sq=200 sk=300 hq=4 hkv=2 d=256 none"; do
  tool=${run%%|*}; f=${run#*|}
  el "$tool: $f"
  timeout 150 compute-sanitizer --tool $tool $B check --kernel mma --filter "$f" > /tmp/san.txt 2>&1; echo "exit $?" | tee -a $L
  cat /tmp/san.txt >> $OUT/sanitizers.txt
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed" /tmp/san.txt | sort | uniq -c | head -4 | cut -c1-200 | tee -a $L
done
el "bench d256 (bwd, bwd-det)"
timeout 100 $B bench --backward --kernels bwd,bwd-det --dtype f16 --head-dim 256 --seqlen 4096 --causal both --no-plot --out-dir /tmp/b256 > /tmp/b256.log 2>&1; echo "exit $?" | tee -a $L
tail -n +4 /tmp/b256/bench.txt | tee -a $L
el "check --quick --kernel all"
timeout 240 $B check --quick --kernel all > $OUT/check-quick.txt 2>&1; echo "exit $?" | tee -a $L; tail -1 $OUT/check-quick.txt | tee -a $L
grep -v "^\[PASS\]" $OUT/check-quick.txt | grep -v "^checking\|passed" | head -5 | cut -c1-200 | tee -a $L
el "done"
