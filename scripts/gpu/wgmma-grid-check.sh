#!/usr/bin/env bash
# Run 56: the kernel as committed before the overlap attempt, with the new host knobs: a quick
# check of every rung; the wgmma d128 and d64 checks on a grid of 2 persistent blocks
# (FLASHATTN_WGMMA_TILE grid=2: every block runs many tiles, so small problems go through the
# tile hand-offs); racecheck on one small case on that grid, to time the tool.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
for v in "d=128|128,2,grid=2" "d=64 |128,2,nopp,wg3,grid=2" "d=64 |128,2,grid=3"; do
  IFS='|' read -r filt spec <<< "$v"
  el "check wgmma '$filt' under $spec"
  FLASHATTN_WGMMA_TILE="$spec" timeout 100 $B check --kernel wgmma --filter "$filt" > /tmp/c.txt 2>&1; echo "check exit $?" | tee -a $L
  tail -1 /tmp/c.txt | tee -a $L; grep -v "^\[PASS\]" /tmp/c.txt | head -6 | cut -c1-300 | tee -a $L
  cat /tmp/c.txt >> $OUT/check-wgmma-grid.txt
done
el "racecheck, one case on grid=2"
FLASHATTN_WGMMA_TILE="128,2,grid=2" timeout 60 compute-sanitizer --tool racecheck $B check --kernel wgmma --filter "f16 b=2 sq=127 sk=129 hq=3 hkv=1 d=128 none" > /tmp/race.txt 2>&1; echo "racecheck exit $?" | tee -a $L
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed," /tmp/race.txt | sort | uniq -c | head -4 | tee -a $L
el "check --quick --kernel all"
timeout 170 $B check --quick --kernel all > $OUT/check-quick-all.txt 2>&1; echo "check exit $?" | tee -a $L; tail -1 $OUT/check-quick-all.txt | tee -a $L
grep -v "^\[PASS\]" $OUT/check-quick-all.txt | head -6 | cut -c1-300 | tee -a $L
el "done"
