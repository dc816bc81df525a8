#!/usr/bin/env bash
# The first GPU run of the backward pass (attn_bwd): the backward cases of the check (both
# dtypes, d8-d128, none/causal/window, GQA/MQA, odd lengths, refusals), memcheck and racecheck
# on small cases, then a quick check of every forward rung (nothing else changed).
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check backward"
timeout 200 $B check --kernel mma --filter backward > $OUT/check-backward.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-backward.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-backward.txt | head -20 | cut -c1-300 | tee -a $L
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool $B check --kernel mma --filter "f16 backward b=2 sq=33" > /tmp/san.txt 2>&1; echo "$tool exit $?" | tee -a $L
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed," /tmp/san.txt | sort | uniq -c | head -3 | tee -a $L
done
el "check --quick --kernel all"
timeout 170 $B check --quick --kernel all > $OUT/check-quick-all.txt 2>&1; echo "check exit $?" | tee -a $L; tail -1 $OUT/check-quick-all.txt | tee -a $L
el "done"
