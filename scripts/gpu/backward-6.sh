#!/usr/bin/env bash
# Run 64: attn_bwd generalised to MT m-tiles of 16 keys per warp. The default tiles (MT = 1)
# through the full backward check; the 4-warp, 32-row, 32-keys-per-warp tile (two m-tiles:
# every Q/dO fragment from shared memory serves both; two blocks per SM) at d <= 64 through
# the check and racecheck, then timed against the default in the same process order.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check backward (default tiles)"
timeout 200 $B check --kernel mma --filter backward > $OUT/check-backward.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-backward.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-backward.txt | head -5 | cut -c1-300 | tee -a $L
el "check backward, tile 4,32,32, d 8/40/64"
for d in "d=8 " "d=40 " "d=64 "; do
  FLASHATTN_BWD_TILE=4,32,32 timeout 100 $B check --kernel mma --filter "backward&$d" > /tmp/c.txt 2>&1; echo "check $d exit $?" | tee -a $L
  cat /tmp/c.txt >> $OUT/check-kpw32.txt; tail -1 /tmp/c.txt | tee -a $L; grep -v "^\[PASS\]" /tmp/c.txt | head -4 | cut -c1-300 | tee -a $L
done
FLASHATTN_BWD_TILE=4,32,32 timeout 100 compute-sanitizer --tool racecheck $B check --kernel mma --filter "f16 backward b=1 sq=513&causal" > /tmp/san.txt 2>&1; echo "racecheck exit $?" | tee -a $L
grep -E "RACECHECK SUMMARY|passed,|Hazard" /tmp/san.txt | sort | uniq -c | head -4 | tee -a $L
for t in default 4,32,32; do
  el "bench d64 tile $t"
  if [ $t = default ]; then unset FLASHATTN_BWD_TILE; else export FLASHATTN_BWD_TILE=$t; fi
  timeout 80 $B bench --backward --dtype f16 --head-dim 64 --seqlen 1024,4096,16384 --no-plot --out-dir /tmp/bt > /tmp/bt.log 2>&1; echo "exit $?" | tee -a $L
  cp /tmp/bt/bench.txt $OUT/bench-d64-$t.txt; grep -E "^f16" /tmp/bt/bench.txt | tee -a $L
done
el "done"
