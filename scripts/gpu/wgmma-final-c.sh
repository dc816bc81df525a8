#!/usr/bin/env bash
# Run 77: the final attn_wgmma of this pass (run 74's free tile starts; forward SASS identical
# to runs 74-75's default): the full wgmma check (with the backward cases), then the default
# bench sweep with the peers and the matrix product (wgmma-final-b.sh).
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check wgmma full"
timeout 240 $B check --kernel wgmma > $OUT/check-wgmma.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-wgmma.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-wgmma.txt | grep -v "^checking\|passed" | head -8 | cut -c1-300 | tee -a $L
el "bench sweep"
bash scripts/gpu/wgmma-final-b.sh 2>&1 | grep -v "^f16\|^bf16" | tee -a $L
el "done"
