#!/usr/bin/env bash
# Runs 70+: attn_bwd_wgmma A/B: the backward check at its head dims (both kernels), then the
# bwd line alone, f16, with each value of $AB_VAR in $AB_VALUES (default: the step rotation).
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
VAR=${AB_VAR:-FLASHATTN_BWD_ROTATE}
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check backward (wgmma head dims)"
for d in 64 96 128; do
  timeout 100 $B check --kernel mma --filter "backward& d=$d " > $OUT/check-d$d.txt 2>&1; echo "d$d exit $?" | tee -a $L
  tail -1 $OUT/check-d$d.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-d$d.txt | grep -v "^checking\|passed" | head -6 | cut -c1-300 | tee -a $L
done
for v in ${AB_VALUES:-1 0}; do
  el "bench bwd $VAR=$v"
  env $VAR=$v timeout 150 $B bench --backward --kernels bwd --dtype f16 --head-dim 64,128 --seqlen 1024,4096,16384 --no-plot --out-dir /tmp/bb$v > /tmp/bb$v.log 2>&1; echo "bench exit $?" | tee -a $L
  cp /tmp/bb$v/bench.txt $OUT/bench-$v.txt; tail -n +4 $OUT/bench-$v.txt | tee -a $L
done
el "done"
