#!/usr/bin/env bash
# Run 31: the causal block order grouped by L2 (CAUSAL_L2_MB): the wgmma check of every
# causal case, a side-by-side causal bench (wgmma, cuDNN, FA2), then wgmma alone under
# other L2 budgets (l2=0 is the previous order).
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check wgmma causal"; timeout 200 $B check --kernel wgmma --filter causal > $OUT/check.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check.txt | head -8 | tee -a $L
SEQ=${SEQ:-1024,2048,4096,16384}
el "bench causal side by side"; timeout 300 $B bench --peers --kernels wgmma,mma --dtype f16 --causal on --head-dim 64,128 --seqlen $SEQ --out-dir /tmp/b0 > /tmp/b0.log 2>&1; echo "bench exit $?" | tee -a $L
cp /tmp/b0/bench.txt $OUT/bench-main.txt 2>/dev/null; cat $OUT/bench-main.txt | tee -a $L
for v in ${VARIANTS:-}; do
  IFS='|' read -r label dims spec <<< "$v"
  el "variant $label ($dims: $spec)"
  FLASHATTN_WGMMA_TILE="$spec" timeout 120 $B bench --kernels wgmma --dtype f16 --causal on --head-dim $dims --seqlen $SEQ --out-dir /tmp/v_$label > /tmp/v_$label.log 2>&1 || tail -3 /tmp/v_$label.log | tee -a $L
  grep -E "^f16" /tmp/v_$label/bench.txt | awk -v l=$label '{print l, $0}' | tee -a $OUT/variants.txt | tee -a $L
done
el "done"
