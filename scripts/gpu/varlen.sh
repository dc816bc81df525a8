#!/usr/bin/env bash
# Run 38: packed variable-length batches in one attn_mma launch. The check of the varlen cases
# (mma; wgmma hands them to mma), compute-sanitizer on them, a quick check of the plain mma
# sweep (the kernel's prologue changed), then the varlen bench: 8 x 2k and the ragged mix.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check varlen (wgmma, mma)"
timeout 120 $B check --kernel wgmma,mma --filter varlen > $OUT/check-varlen.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-varlen.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-varlen.txt | head -12 | tee -a $L
for tool in memcheck racecheck; do
  el "compute-sanitizer $tool on the varlen cases (mma)"
  timeout 90 compute-sanitizer --tool $tool $B check --kernel mma --filter "f16 varlen" > /tmp/san.txt 2>&1; echo "$tool exit $?" | tee -a $L
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed,|Hazard" /tmp/san.txt | sort | uniq -c | sort -rn | head -4 | tee -a $L
done
el "check --quick mma (plain sweep)"
timeout 120 $B check --quick --kernel mma > /tmp/cq.txt 2>&1; echo "check exit $?" | tee -a $L; tail -1 /tmp/cq.txt | tee -a $L; grep -v "^\[PASS\]" /tmp/cq.txt | head -5 | tee -a $L
for mix in 8x2k ragged; do
  el "bench --varlen $mix"
  timeout 150 $B bench --varlen $mix --dtype f16 --head-dim 64,128 --out-dir /tmp/bv_$mix > /tmp/bv_$mix.log 2>&1; echo "bench exit $?" | tee -a $L
  tail -3 /tmp/bv_$mix.log | tee -a $L
  cp /tmp/bv_$mix/bench-varlen.json $OUT/bench-varlen-$mix.json; cp /tmp/bv_$mix/bench-varlen.txt $OUT/bench-varlen-$mix.txt
done
el "done"
