#!/usr/bin/env bash
# Runs 69+: one attn_bwd_wgmma change: the backward check at the head dims it serves (both
# kernels), then the bench without peers (the peers' numbers of run 66 stand), f16 and bf16.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check backward (wgmma head dims)"
for d in 64 96 128; do
  timeout 100 $B check --kernel mma --filter "backward& d=$d " > $OUT/check-d$d.txt 2>&1; echo "d$d exit $?" | tee -a $L
  tail -1 $OUT/check-d$d.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-d$d.txt | grep -v "^checking\|passed" | head -6 | cut -c1-300 | tee -a $L
done
el "bench --backward (no peers)"
timeout 200 $B bench --backward --dtype ${DTYPES:-both} --head-dim 64,128 --seqlen 1024,4096,16384 --no-plot --out-dir /tmp/bb > /tmp/bb.log 2>&1; echo "bench exit $?" | tee -a $L
cp /tmp/bb/bench.txt $OUT/bench-backward.txt; cp /tmp/bb/bench.json $OUT/bench-backward.json; cat $OUT/bench-backward.txt | tee -a $L; tail -3 /tmp/bb.log | tee -a $L
el "done"
