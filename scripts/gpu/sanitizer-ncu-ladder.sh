#!/usr/bin/env bash
# Final pass B: compute-sanitizer on the mma kernel, ncu of the two default tiles, the ladder.
set -uo pipefail
bash scripts/gpu/warmup-diag.sh 2>&1 | tee $OUT/diag.txt
B=${FLASHATTN:-./.gpu/flashattn}
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*"; }
for tool in memcheck racecheck initcheck synccheck; do
  el "compute-sanitizer $tool"
  timeout 150 compute-sanitizer --tool $tool $B check --quick --kernel mma > /tmp/san.txt 2>&1; echo "$tool exit $?" | tee -a $OUT/sanitizer.txt
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed,|Error|Hazard" /tmp/san.txt | tail -3 | tee -a $OUT/sanitizer.txt
done
for d in 128 64; do
  el "ncu d$d"
  timeout 120 ncu --clock-control none -k attn_mma -s 5 -c 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats $B bench --seqlen 4k --head-dim $d --causal off --dtype f16 --iters 20 --warmup 2 --warmup-ms 0 --no-plot --out-dir /tmp/ncu > $OUT/ncu-d$d.txt 2>&1; echo "ncu exit $?"
  grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Compute \(SM\) Throughput|Block Limit" $OUT/ncu-d$d.txt | head -12
done
el "ladder at 4k"
$B bench --peers --no-plot --seqlen 4k --dtype f16 --kernels naive,simt,mma --out-dir $OUT/ladder > /tmp/ladder.log 2>&1; echo "ladder exit $?"
tail -6 $OUT/ladder/bench.txt
el "done"
