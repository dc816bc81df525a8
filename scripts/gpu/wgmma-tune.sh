#!/usr/bin/env bash
# attn_wgmma tuning pass: the wgmma check, one side-by-side bench (wgmma, mma, peers, matmul),
# then wgmma alone under tile variants (FLASHATTN_WGMMA_TILE = bc,stages[,nopp][,nohm][,np]).
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
if [ "${SKIP_CHECK:-0}" != 1 ]; then
  el "check wgmma full"; timeout ${CHECK_S:-200} $B check --kernel wgmma > $OUT/check.txt 2>&1; echo "check exit $?" | tee -a $L
  grep -v "^\[PASS\]" $OUT/check.txt | head -20 | tee -a $L
fi
SEQ=${SEQ:-1024,4096,16384}
el "bench side by side"; timeout 300 $B bench --peers --kernels wgmma,mma --dtype f16 --head-dim 64,128 --seqlen $SEQ --out-dir /tmp/b0 > /tmp/b0.log 2>&1; echo "bench exit $?" | tee -a $L
cp /tmp/b0/bench.txt $OUT/bench-main.txt 2>/dev/null; cat $OUT/bench-main.txt | tee -a $L
# variants: "label|head dims|tile spec"
for v in ${VARIANTS:-}; do
  IFS='|' read -r label dims spec <<< "$v"
  el "variant $label ($dims: $spec)"
  FLASHATTN_WGMMA_TILE="$spec" timeout 120 $B bench --kernels wgmma --dtype f16 --head-dim $dims --seqlen $SEQ --out-dir /tmp/v_$label > /tmp/v_$label.log 2>&1 || tail -3 /tmp/v_$label.log | tee -a $L
  grep -E "^f16" /tmp/v_$label/bench.txt | awk -v l=$label '{print l, $0}' | tee -a $OUT/variants.txt | tee -a $L
done
el "done"
