#!/usr/bin/env bash
# Run 59: ncu of the first attn_bwd (run 58: 0.42-0.48x FlashAttention-2's backward) at d128
# 16k non-causal and d64 1k causal: where its warps stall.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
for cfg in "128 16k off" "64 1k on"; do
  set -- $cfg
  echo "== ncu attn_bwd d$1 seqlen $2 causal $3" | tee -a $L
  timeout 240 ncu --clock-control none --kernel-name attn_bwd --launch-skip 3 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section InstructionStats --section SourceCounters --section ComputeWorkloadAnalysis \
    $B bench --backward --dtype f16 --head-dim $1 --seqlen $2 --causal $3 --warmup-ms 0 --warmup 1 --iters 20 --no-plot --out-dir /tmp/bn > $OUT/ncu-d$1-$2-$3.txt 2>&1; echo "ncu exit $?" | tee -a $L
  grep -E "Duration|Throughput|Achieved Occupancy|Warp Cycles Per Issued|Issued Ipc|No Eligible|Registers Per|Block Limit|Stall" $OUT/ncu-d$1-$2-$3.txt | head -30 | tee -a $L
done
