#!/usr/bin/env bash
# The final H200 pass of the Hopper issue, on the committed kernel: the layout probe (and its
# faults), the full wgmma check, compute-sanitizer's four tools on the wgmma kernel, then (only
# if all passed) pass B: the bench sweep with peers (wgmma-final-b.sh).
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
ok=1
el "probe"; timeout 60 $B probe > $OUT/probe.txt 2>&1 || ok=0
tail -1 $OUT/probe.txt | tee -a $L
echo "==== probe --inject-fault" >> $OUT/probe.txt
timeout 60 $B probe --inject-fault >> $OUT/probe.txt 2>&1; echo "probe --inject-fault exit $? (1 expected)" | tee -a $L
tail -1 $OUT/probe.txt | tee -a $L
el "check wgmma"; timeout 200 $B check --kernel wgmma > $OUT/check-wgmma.txt 2>&1 || ok=0
tail -1 $OUT/check-wgmma.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-wgmma.txt | head -8 | tee -a $L
for tool in memcheck synccheck initcheck racecheck; do
  el "compute-sanitizer $tool"
  timeout ${SAN_S:-100} compute-sanitizer --tool $tool $B check --quick --kernel wgmma --filter f16 > /tmp/san.txt 2>&1; echo "$tool exit $?" | tee -a /tmp/sanitizer.txt
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed,|Error|Hazard" /tmp/san.txt | sort | uniq -c | sort -rn | head -5 | tee -a /tmp/sanitizer.txt
done
cat /tmp/sanitizer.txt >> $L
if [ $ok = 1 ]; then el "bench"; bash scripts/gpu/wgmma-final-b.sh 2>&1 | grep -v "^f16\|^bf16" | tee -a $L; else el "probe or check failed: no bench"; fi
el "done"
