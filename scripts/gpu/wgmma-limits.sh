#!/usr/bin/env bash
# Run 121: what limits each case run 119 left below cuDNN, on the final kernel (c3310d4): ncu
# (speed of light, warp states with every stall reason, scheduler; tensor pipe, MUFU (XU) pipe,
# issue slots) of attn_wgmma and of cuDNN's SDPA kernel on the same shapes and dtypes, then
# the timelines of f16 d64 causal 1k and d128 causal 1k (the causal shift changed them since
# run 115; d128 non-causal is run 115's kernel).
set -uo pipefail
. scripts/gpu/lib.sh
M=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__cycles_active.avg,gpu__time_duration.sum
for c in "f16 64 on 1024" "bf16 64 on 1024" "bf16 64 off 1024" "f16 128 off 1024" "bf16 128 off 1024" \
         "f16 128 off 2048" "bf16 128 off 2048" "f16 128 on 1024" "bf16 128 on 1024" "bf16 128 on 2048"; do
  read -r dt d causal sk <<< "$c"
  el "ncu wgmma $c"
  echo "==== wgmma $c" >> "$OUT/ncu.txt"
  args=(bench --kernels wgmma --dtype "$dt" --head-dim "$d" --seqlen "$sk" --causal "$causal" --warmup-ms 0 --warmup 1 --iters 20 --no-plot --out-dir /tmp/bn)
  timeout 60 ncu --clock-control none --kernel-name attn_wgmma --launch-skip 3 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --metrics "$M" --page raw "$B" "${args[@]}" > /tmp/ncu.txt 2>&1
  rc=$?
  echo "ncu exit $rc" | tee -a "$L"
  if [ $rc -ne 0 ]; then
    tail -3 /tmp/ncu.txt | tee -a "$L"
    timeout 60 ncu --clock-control none --kernel-name attn_wgmma --launch-skip 3 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
      --metrics "$M" "$B" "${args[@]}" > /tmp/ncu.txt 2>&1; echo "ncu (details page) exit $?" | tee -a "$L"
  fi
  cat /tmp/ncu.txt >> "$OUT/ncu.txt"
  grep -E "^(f16|bf16) " /tmp/bn/bench.txt | tee -a "$L"
  el "ncu cudnn $c"
  echo "==== cudnn $c" >> "$OUT/ncu-cudnn.txt"
  cz=0; [ "$causal" = on ] && cz=1
  timeout 90 ncu --clock-control none --kernel-name regex:sdpa --launch-skip 1 --launch-count 1 --section LaunchStats --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --metrics "$M" --page raw python3 scripts/gpu/sdpa-once.py cudnn "$d" "$sk" "$cz" 3 "$dt" > /tmp/ncu.txt 2>&1; echo "ncu exit $?" | tee -a "$L"
  cat /tmp/ncu.txt >> "$OUT/ncu-cudnn.txt"
done
grep -E "hmma_cycles_active|issue_active.avg.pct|pipe_xu|gpu__time_duration.sum|^==== " "$OUT/ncu.txt" "$OUT/ncu-cudnn.txt" | tee -a "$L"
timeline "$B" trace 64 1024 on "$OUT/timeline.txt"
timeline "$B" trace 128 1024 on "$OUT/timeline.txt"
gzip -f "$OUT/ncu.txt" "$OUT/ncu-cudnn.txt"
el done
