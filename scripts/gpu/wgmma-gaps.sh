#!/usr/bin/env bash
# Run 115: profiles of the cases run 114 left below cuDNN, on the final kernel: ncu (speed of
# light, warp states, scheduler, tensor pipe) of f16 d64 causal 1k, bf16 d128 1k and bf16 d64
# causal 2k; the timeline of f16 d64 causal 1k and of f16 d128 1k.
set -uo pipefail
. scripts/gpu/lib.sh
for c in "f16 64 on 1024" "bf16 128 off 1024" "bf16 64 on 2048"; do
  read -r dt d causal sk <<< "$c"
  el "ncu $c"
  echo "==== wgmma $c" >> "$OUT/ncu.txt"
  timeout 60 ncu --clock-control none --kernel-name attn_wgmma --launch-skip 3 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
    "$B" bench --kernels wgmma --dtype "$dt" --head-dim "$d" --seqlen "$sk" --causal "$causal" --warmup-ms 0 --warmup 1 --iters 20 --no-plot --out-dir /tmp/bn >> "$OUT/ncu.txt" 2>&1; echo "ncu exit $?" | tee -a "$L"
done
gzip -f "$OUT/ncu.txt"
timeline "$B" trace 64 1024 on "$OUT/timeline.txt"
timeline "$B" trace 128 1024 off "$OUT/timeline.txt"
el done
