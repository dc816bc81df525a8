#!/usr/bin/env bash
# The repeat pass: the full check of every rung (the launch code of all four moved), then a
# second run of the default bench sweep (d64/d128, f16/bf16) to show run-to-run spread.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check all rungs"; timeout 200 $B check > $OUT/check-all.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-all.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-all.txt | head -8 | tee -a $L
el "bench repeat"; timeout 300 $B bench --peers --no-plot --out-dir $OUT/bench > $OUT/bench-log.txt 2>&1; echo "bench exit $?" | tee -a $L
el "done"
