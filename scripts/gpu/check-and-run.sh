#!/usr/bin/env bash
# Final pass A: info, probe, check (all kernels), MiniLM runs, the default bench sweep with
# peers and plots (steady-clock warm-up). Eight files back: log, check, bench/{json,txt,4 plots}.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "info"; $B info 2>&1 | tee -a $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader | tee -a $L
el "probe"; $B probe >> $L 2>&1; echo "probe exit $?" | tee -a $L
$B probe --inject-fault > /tmp/fault.txt 2>&1; echo "probe --inject-fault exit $? (1 expected)" | tee -a $L
el "check all kernels"; $B check > $OUT/check.txt 2>&1; echo "check exit $?" | tee -a $L
grep -v "^\[PASS\]" $OUT/check.txt | head -20 | tee -a $L
el "MiniLM runs"
for f in "" "--input data/minilm-L6-s200.safetensors"; do for m in "" "--causal"; do
  $B run $f $m >> $L 2>&1; echo "run $f $m exit $?" | tee -a $L; done; done
el "bench default sweep + peers + plots"
$B bench --peers --out-dir $OUT/bench > /tmp/bench.log 2>&1; echo "bench exit $?" | tee -a $L
tail -3 /tmp/bench.log | tee -a $L
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader | tee -a $L
el "done"
