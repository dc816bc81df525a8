#!/usr/bin/env bash
# Run 39: varlen on sm_90 as one attn_wgmma launch per sequence (batches up to 64), packed
# attn_mma otherwise; lse written with a head stride. The varlen check on both kernels (wgmma:
# the per-sequence path, mma: the packed one), memcheck on the per-sequence path, the quick
# plain sweep of wgmma and mma (the lse addressing changed), the varlen bench again.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check varlen (wgmma, mma)"
timeout 100 $B check --kernel wgmma,mma --filter varlen > $OUT/check-varlen.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-varlen.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-varlen.txt | head -12 | tee -a $L
el "memcheck wgmma varlen"
timeout 80 compute-sanitizer --tool memcheck $B check --kernel wgmma --filter "f16 varlen" > /tmp/san.txt 2>&1; echo "memcheck exit $?" | tee -a $L
grep -E "ERROR SUMMARY|passed," /tmp/san.txt | sort | uniq -c | tee -a $L
el "check --quick wgmma,mma"
timeout 150 $B check --quick --kernel wgmma,mma > /tmp/cq.txt 2>&1; echo "check exit $?" | tee -a $L; tail -1 /tmp/cq.txt | tee -a $L; grep -v "^\[PASS\]" /tmp/cq.txt | head -5 | tee -a $L
for mix in 8x2k ragged; do
  el "bench --varlen $mix"
  timeout 100 $B bench --varlen $mix --dtype f16 --head-dim 64,128 --out-dir /tmp/bv_$mix > /tmp/bv_$mix.log 2>&1; echo "bench exit $?" | tee -a $L
  cat /tmp/bv_$mix/bench-varlen.txt | tee -a $L
  cp /tmp/bv_$mix/bench-varlen.json $OUT/bench-varlen-$mix.json; cp /tmp/bv_$mix/bench-varlen.txt $OUT/bench-varlen-$mix.txt
done
el "done"
