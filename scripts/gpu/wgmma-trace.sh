#!/usr/bin/env bash
# Run 95: where a 1k tile's time goes. attn_wgmma's timeline build (`trace`: the SM clock at
# the phases of each block's first 8 tiles, summarised by wgmma-trace.py) at d128/d64 1k and
# d128 16k; ncu's launch statistics of cuDNN's kernels on the same shapes (grid, block,
# registers, shared memory, tensor pipe); then the decode cases and review fixes of the last
# stop that never ran on a GPU: the kvcache check, its memcheck, the Python CUDA tests.
set -uo pipefail
. scripts/gpu/lib.sh
for spec in "128 1024 off" "128 16384 off" "64 1024 off" "64 1024 on" "128 1024 on"; do
  set -- $spec
  el "trace d$1 $2 causal $3"
  FLASHATTN_WGMMA_TILE=trace FLASHATTN_WGMMA_TRACE=/tmp/tr-d$1-$2-$3.json timeout 90 $B bench --kernels wgmma --dtype f16 --head-dim $1 --seqlen $2 --causal $3 --warmup 2 --warmup-ms 300 --iters 20 --no-plot --out-dir /tmp/bt > /tmp/bt.log 2>&1; echo "bench exit $?" | tee -a "$L"
  grep -E "^f16" /tmp/bt/bench.txt | tee -a "$L"
  echo "== d$1 $2 causal $3" >> $OUT/trace.txt
  python3 scripts/gpu/wgmma-trace.py /tmp/tr-d$1-$2-$3.json >> $OUT/trace.txt 2>&1
done
gzip -c /tmp/tr-d128-1024-off.json > $OUT/trace-d128-1k.json.gz
el "the same shapes untraced"
timeout 120 $B bench --kernels wgmma --dtype f16 --head-dim 64,128 --seqlen 1k,16k --causal both --warmup-ms 300 --iters 20 --no-plot --out-dir /tmp/bu > /tmp/bu.log 2>&1; echo "bench exit $?" | tee -a "$L"
grep -E "^f16" /tmp/bu/bench.txt | tee -a "$L"
for spec in "128 1024 0" "64 1024 0" "64 1024 1" "128 1024 1" "128 16384 0"; do
  set -- $spec
  el "ncu cudnn d$1 $2 causal $3"
  echo "==== cudnn d$1 $2 causal $3" >> $OUT/ncu-cudnn.txt
  timeout 100 ncu --clock-control none --section LaunchStats --section Occupancy --section SpeedOfLight --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__cycles_active.avg,smsp__cycles_active.avg \
    python3 scripts/gpu/sdpa-once.py cudnn $1 $2 $3 2 > /tmp/ncu.txt 2>&1; echo "ncu exit $?" | tee -a "$L"
  grep -E "^  [a-zA-Z_].*\(|Grid Size|Block Size|Registers Per|Shared Memory Config|Dynamic Shared|Static Shared|Duration|hmma|issue_active|Waves Per SM|Cluster|Threads  |Achieved Occupancy|cycles_active" /tmp/ncu.txt >> $OUT/ncu-cudnn.txt
done
grep -E "^  [a-zA-Z_].*\(" $OUT/ncu-cudnn.txt | cut -c1-200 | sort | uniq -c | tee -a "$L"
el "check kvcache"
timeout 150 $B check --kernel mma --filter kvcache > $OUT/check-kvcache.txt 2>&1; echo "check exit $?" | tee -a "$L"
tail -1 $OUT/check-kvcache.txt | tee -a "$L"; grep -v "^\[PASS\]" $OUT/check-kvcache.txt | head -8 | cut -c1-300 | tee -a "$L"
timeout 120 compute-sanitizer --tool memcheck $B check --kernel mma --filter kvcache > /tmp/san.txt 2>&1; echo "memcheck exit $?" | tee -a "$L"
grep -E "ERROR SUMMARY|passed," /tmp/san.txt | sort | uniq -c | head -3 | tee -a "$L"
py_setup
py_tests
el done
