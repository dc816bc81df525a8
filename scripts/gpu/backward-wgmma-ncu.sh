#!/usr/bin/env bash
# Run 67: ncu of the first attn_bwd_wgmma (run 66: 0.67-0.89x FlashAttention-2 at d128,
# 0.53-0.57x at d64) at d128 and d64, 4k non-causal: where its warpgroups stall.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
for d in 128 64; do
  echo "== ncu attn_bwd_wgmma d$d seqlen 4k" | tee -a $L
  timeout 200 ncu --clock-control none --kernel-name attn_bwd_wgmma --launch-skip 3 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section InstructionStats --section SourceCounters --section ComputeWorkloadAnalysis \
    $B bench --backward --dtype f16 --head-dim $d --seqlen 4096 --causal off --warmup-ms 0 --warmup 1 --iters 5 --no-plot --out-dir /tmp/bn > $OUT/ncu-d$d.txt 2>&1; echo "ncu exit $?" | tee -a $L
  grep -E "Duration|Throughput|Pipe|Warp Cycles Per Issued|Issued Ipc|No Eligible|Registers Per|Stall|Bank" $OUT/ncu-d$d.txt | head -40 | tee -a $L
done
