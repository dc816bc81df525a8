#!/usr/bin/env bash
# Prepared in session of runs 74-77, not yet run: part of attn_wgmma's exponentials on the FMA
# pipe (FLASHATTN_WGMMA_TILE=poly=K: K of every 8 score column groups by ex2_poly). The checks
# under poly=2 and poly=8 (every exponential by the polynomial: the accuracy bound's worst
# case), then default against poly=1,2,3,4 interleaved, wgmma alone, f16, d64 and d128.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
for v in "d=64 |poly=2" "d=128 |poly=8" "d=64 |poly=8"; do
  f=${v%%|*}; spec=${v#*|}
  el "check wgmma '$f' under $spec"
  FLASHATTN_WGMMA_TILE="$spec" timeout 120 $B check --kernel wgmma --filter "$f" > /tmp/cg.txt 2>&1; echo "check exit $?" | tee -a $L
  tail -1 /tmp/cg.txt | tee -a $L; grep -v "^\[PASS\]" /tmp/cg.txt | grep -v "^checking\|passed" | head -5 | cut -c1-300 | tee -a $L
  cat /tmp/cg.txt >> $OUT/check-poly.txt
done
SEQ=${SEQ:-1024,2048,4096,16384}
for i in 1 2; do
  for spec in "" poly=1 poly=2 poly=3 poly=4; do
    label=${spec:-default}
    el "bench $label ($i)"
    FLASHATTN_WGMMA_TILE="$spec" timeout 150 $B bench --kernels wgmma --dtype f16 --head-dim 64,128 --seqlen $SEQ --no-plot --out-dir /tmp/v_${label}_$i > /tmp/v.log 2>&1 || tail -3 /tmp/v.log | tee -a $L
    grep -E "^f16" /tmp/v_${label}_$i/bench.txt | awk -v l=$label -v i=$i '{print l, i, $0}' >> $OUT/ab.txt
  done
done
el "done"
