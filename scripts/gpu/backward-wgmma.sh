#!/usr/bin/env bash
# Run 66: first run of attn_bwd_wgmma (the Hopper backward). One small case first (a hang
# or a wrong layout shows in seconds), memcheck on it, then the whole backward check (both
# kernels), then the bench against SDPA's backends: bwd (wgmma), bwd-mma, bwd-det.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee -a $L
el "one case"
timeout 60 $B check --kernel mma --filter "f16 backward b=2 sq=100 sk=100 hq=4 hkv=2 d=128" > $OUT/one.txt 2>&1; echo "exit $?" | tee -a $L
cut -c1-400 $OUT/one.txt | tail -8 | tee -a $L
el "memcheck one case"
timeout 120 compute-sanitizer --tool memcheck $B check --kernel mma --filter "f16 backward b=2 sq=100 sk=100 hq=4 hkv=2 d=128 causal" > $OUT/memcheck.txt 2>&1; echo "exit $?" | tee -a $L
grep -E "ERROR SUMMARY|PASS|FAIL" $OUT/memcheck.txt | cut -c1-200 | head -6 | tee -a $L
el "check backward"
timeout 240 $B check --kernel mma --filter backward > $OUT/check-backward.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-backward.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-backward.txt | head -12 | cut -c1-300 | tee -a $L
el "bench --backward --peers"
timeout 280 $B bench --backward --peers --dtype both --head-dim 64,128 --seqlen 1024,4096,16384 --out-dir /tmp/bb > /tmp/bb.log 2>&1; echo "bench exit $?" | tee -a $L
cp /tmp/bb/bench.txt $OUT/bench-backward.txt; cp /tmp/bb/bench.json $OUT/bench-backward.json; cat $OUT/bench-backward.txt | tee -a $L; tail -3 /tmp/bb.log | tee -a $L
el "done"
