#!/usr/bin/env bash
# attn_wgmma with three consumer warpgroups (Br 192) at d64: the d64 check under each variant,
# then wgmma-tune.sh's side-by-side bench and the variants (f16, d64).
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
for spec in ${CHECK_SPECS:-128,2,wg3}; do
  echo "== check d=64 under $spec" | tee -a $L
  FLASHATTN_WGMMA_TILE="$spec" timeout 200 $B check --kernel wgmma --filter "d=64" > /tmp/c.txt 2>&1; echo "check exit $?" | tee -a $L
  grep -v "^\[PASS\]" /tmp/c.txt | tail -8 | tee -a $L
done
SKIP_CHECK=1 bash scripts/gpu/wgmma-tune.sh
