#!/usr/bin/env bash
# Final pass A of the Hopper issue: info, the layout probe (and its injected faults), the full
# wgmma check, a quick check of the other rungs and the MiniLM runs (the launch code moved),
# compute-sanitizer's four tools on the wgmma kernel, and ncu of the d128 and d64 defaults.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "info"; $B info 2>&1 | tee -a $L
el "probe"; timeout 60 $B probe > $OUT/probe.txt 2>&1; echo "probe exit $?" | tee -a $L
timeout 60 $B probe --inject-fault > $OUT/probe-fault.txt 2>&1; echo "probe --inject-fault exit $? (1 expected)" | tee -a $L
tail -1 $OUT/probe.txt | tee -a $L; tail -1 $OUT/probe-fault.txt | tee -a $L
el "check wgmma"; timeout 200 $B check --kernel wgmma > $OUT/check-wgmma.txt 2>&1; echo "check wgmma exit $?" | tee -a $L
grep -v "^\[PASS\]" $OUT/check-wgmma.txt | head -12 | tee -a $L
el "check other rungs (quick) + MiniLM"; timeout 120 $B check --kernel mma,simt,naive --quick > $OUT/check-others.txt 2>&1; echo "check others exit $?" | tee -a $L
tail -1 $OUT/check-others.txt | tee -a $L
for m in "" "--causal"; do $B run $m >> $OUT/check-others.txt 2>&1; echo "run $m exit $?" | tee -a $L; done
grep -m2 "backend:" $OUT/check-others.txt | tee -a $L
for tool in memcheck synccheck initcheck racecheck; do
  el "compute-sanitizer $tool"
  timeout ${SAN_S:-100} compute-sanitizer --tool $tool $B check --quick --kernel wgmma --filter f16 > /tmp/san.txt 2>&1; echo "$tool exit $?" | tee -a $OUT/sanitizer.txt
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed,|Error|Hazard" /tmp/san.txt | sort | uniq -c | sort -rn | head -5 | tee -a $OUT/sanitizer.txt
done
cat $OUT/sanitizer.txt >> $L
# Pipe metrics by the names this ncu knows (an unknown name would fail the whole profile).
M=$(ncu --query-metrics --chip gh100 2>/dev/null | awk '{print $1}' | grep -E "^(sm__pipe_tensor_op_gmma_cycles_active|sm__inst_executed_pipe_xu|sm__pipe_fma_cycles_active|sm__pipe_alu_cycles_active|sm__inst_executed_pipe_fma)$" | sed 's/$/.avg.pct_of_peak_sustained_active/' | paste -sd, -)
echo "ncu metrics: ${M:-none}" | tee -a $L
for d in 128 64; do
  el "ncu d$d"
  timeout 90 ncu --clock-control none -k attn_wgmma -s 3 -c 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats ${M:+--metrics $M} $B bench --kernels wgmma --seqlen 4k --head-dim $d --causal off --dtype f16 --iters 20 --warmup 2 --warmup-ms 0 --no-plot --out-dir /tmp/ncu > $OUT/ncu-d$d.txt 2>&1; echo "ncu exit $?" | tee -a $L
  grep -E "Duration|gmma|pipe_xu|pipe_fma|Issue Slots Busy|Compute \(SM\) Throughput|No Eligible|Stall" $OUT/ncu-d$d.txt | head -14 | tee -a $L
done
el "done"
