#!/usr/bin/env bash
# Run 32: the committed defaults (causal order grouped in 16 MiB of L2): the full wgmma check,
# the default bench sweep with peers (wgmma-final-b.sh), then ncu of the cases still below
# cuDNN (d128 causal 2k, d128 non-causal 1k, d64 causal 1k), with memory sections.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check wgmma"; timeout 200 $B check --kernel wgmma > $OUT/check-wgmma.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-wgmma.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-wgmma.txt | head -8 | tee -a $L
el "bench"; bash scripts/gpu/wgmma-final-b.sh 2>&1 | grep -v "^f16\|^bf16" | tee -a $L
M=$(ncu --query-metrics --chip gh100 2>/dev/null | awk '{print $1}' | grep -E "^(sm__pipe_tensor_op_gmma_cycles_active|sm__inst_executed_pipe_xu|sm__pipe_fma_cycles_active)$" | sed 's/$/.avg.pct_of_peak_sustained_active/' | paste -sd, -)
for c in "128 on 2k" "128 off 1k" "64 on 1k"; do
  set -- $c
  el "ncu d$1 causal $2 $3"
  echo "==== ncu d$1 causal $2 seqlen $3" >> $OUT/ncu.txt
  timeout 90 ncu --clock-control none -k attn_wgmma -s 3 -c 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats ${M:+--metrics $M} $B bench --kernels wgmma --seqlen $3 --head-dim $1 --causal $2 --dtype f16 --iters 20 --warmup 2 --warmup-ms 0 --no-plot --out-dir /tmp/ncu >> $OUT/ncu.txt 2>&1; echo "ncu exit $?" | tee -a $L
done
grep -E "====|Duration|gmma|pipe_xu|Memory Throughput|DRAM Throughput|L2 Hit Rate|Issue Slots Busy|Compute \(SM\) Throughput|No Eligible" $OUT/ncu.txt | tee -a $L
el "done"
