#!/usr/bin/env bash
# Run 33: two Q buffers (the next tile's Q loads during this tile): the full wgmma check,
# compute-sanitizer on the changed hand-off, wgmma alone with one Q buffer (q1) against the
# default, then (only if all passed) the default bench sweep with peers (wgmma-final-b.sh).
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
ok=1
el "check wgmma"; timeout 200 $B check --kernel wgmma > $OUT/check-wgmma.txt 2>&1 || ok=0
tail -1 $OUT/check-wgmma.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-wgmma.txt | head -8 | tee -a $L
for tool in racecheck synccheck memcheck; do
  el "compute-sanitizer $tool"
  timeout 100 compute-sanitizer --tool $tool $B check --quick --kernel wgmma --filter "f16" > /tmp/san.txt 2>&1 || ok=0
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed," /tmp/san.txt | sort | uniq -c | tee -a $L
done
for v in "default|128,2" "q1|128,2,q1"; do
  IFS='|' read -r label spec <<< "$v"
  FLASHATTN_WGMMA_TILE="$spec" timeout 60 $B bench --kernels wgmma --dtype f16 --head-dim 128 --seqlen 1024,2048,4096 --out-dir /tmp/v_$label > /dev/null 2>&1
  grep -E "^f16" /tmp/v_$label/bench.txt | awk -v l=$label '{print l, $0}' | tee -a $L
done
if [ $ok = 1 ]; then el "bench"; bash scripts/gpu/wgmma-final-b.sh 2>&1 | grep -v "^f16\|^bf16" | tee -a $L; else el "check or sanitizer failed: no bench"; fi
el "done"
