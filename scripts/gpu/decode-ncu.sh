#!/usr/bin/env bash
# Run 42: ncu on attn_decode: batch 1 x 32k contiguous (latency-bound: ~2.4 us per 64-key tile
# per block) and batch 64 x 8k paged16 (bandwidth-bound, 71% of the read pass).
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
for cfg in "1 32k 0" "64 8k 16"; do
  set -- $cfg
  echo "== ncu batch $1 seqlen $2 pages $3" | tee -a $L
  timeout 200 ncu --clock-control none --kernel-name attn_decode --launch-skip 5 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section InstructionStats --section SourceCounters \
    $B bench --decode --dtype f16 --decode-batch $1 --decode-seqlen $2 --decode-q 1 --decode-pages $3 --warmup-ms 0 --warmup 1 --iters 20 --out-dir /tmp/bdn > $OUT/ncu-b$1-p$3.txt 2>&1; echo "ncu exit $?" | tee -a $L
  grep -E "Duration|DRAM Throughput|Achieved Occupancy|Warp Cycles Per Issued|Issued Ipc|No Eligible|Executed Instructions  |Registers Per" $OUT/ncu-b$1-p$3.txt | head -12 | tee -a $L
done
