#!/usr/bin/env bash
# Run 65: the final attn_bwd defaults (d <= 64: 4 warps of 32 keys, 32 rows; d > 64: 8 warps
# of 16 keys, 32 rows): the backward check (with the deterministic cases), then the bench
# against SDPA's backends, f16 and bf16, d64 and d128, both masks, bwd and bwd-det.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check backward"
timeout 200 $B check --kernel mma --filter backward > $OUT/check-backward.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-backward.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-backward.txt | head -5 | cut -c1-300 | tee -a $L
el "bench --backward --peers (f16, bf16)"
timeout 300 $B bench --backward --peers --dtype both --head-dim 64,128 --seqlen 1024,4096,16384 --out-dir /tmp/bb > /tmp/bb.log 2>&1; echo "bench exit $?" | tee -a $L
cp /tmp/bb/bench.txt $OUT/bench-backward.txt; cp /tmp/bb/bench.json $OUT/bench-backward.json; cp /tmp/bb/*.png $OUT/ 2>/dev/null; cat $OUT/bench-backward.txt | tee -a $L; tail -2 /tmp/bb.log | tee -a $L
el "done"
