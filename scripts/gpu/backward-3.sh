#!/usr/bin/env bash
# Run 61: run 60's attn_bwd with the lse fix (cp.async copies lse in natural log; the kernel
# now scales it by log2(e) where it subtracts it): the backward check, sanitizers on a
# multi-step GQA case, the bench against SDPA, ncu with the stall reasons at d128 16k and d64 4k.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check backward"
timeout 300 $B check --kernel mma --filter backward > $OUT/check-backward.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-backward.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-backward.txt | head -8 | cut -c1-300 | tee -a $L
for tool in memcheck racecheck synccheck; do
  timeout 90 compute-sanitizer --tool $tool $B check --kernel mma --filter "backward b=1 sq=300" > /tmp/san.txt 2>&1; echo "$tool exit $?" | tee -a $L
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed,|Error|Hazard" /tmp/san.txt | sort | uniq -c | head -5 | tee -a $L
done
el "bench --backward --peers"
timeout 150 $B bench --backward --peers --dtype f16 --head-dim 64,128 --seqlen 1024,4096,16384 --out-dir /tmp/bb > /tmp/bb.log 2>&1; echo "bench exit $?" | tee -a $L
cp /tmp/bb/bench.txt $OUT/bench-backward.txt; cp /tmp/bb/bench.json $OUT/bench-backward.json; grep -E "^f16" $OUT/bench-backward.txt | tee -a $L; tail -2 /tmp/bb.log | tee -a $L
R=barrier,long_scoreboard,short_scoreboard,math_pipe_throttle,mio_throttle,lg_throttle,wait,not_selected,selected,dispatch_stall,membar,branch_resolving,no_instruction,tex_throttle,drain,misc
M=$(echo $R | tr ',' '\n' | sed 's/.*/smsp__average_warps_issue_stalled_&_per_issue_active.ratio/' | paste -sd,)
for cfg in "128 16k off" "64 4k off"; do
  set -- $cfg
  el "ncu d$1 $2 causal $3"
  timeout 120 ncu --clock-control none --kernel-name attn_bwd --launch-skip 3 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section InstructionStats --section MemoryWorkloadAnalysis --metrics $M,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active \
    $B bench --backward --dtype f16 --head-dim $1 --seqlen $2 --causal $3 --warmup-ms 0 --warmup 1 --iters 20 --no-plot --out-dir /tmp/bn > $OUT/ncu-d$1-$2.txt 2>&1; echo "ncu exit $?" | tee -a $L
  grep -E "Duration|L2 Cache Throughput|Compute \(SM\) Throughput|Warp Cycles Per Issued|Registers Per|stalled|hmma|pipe_lsu" $OUT/ncu-d$1-$2.txt | awk '$NF+0 > 0.05 || /Duration|Throughput|Registers|Cycles/' | head -30 | tee -a $L
done
el "done"
