#!/usr/bin/env bash
# Run 50: the final decode kernels (8 warps x 3 stages, 4 x 3 for one-split calls with two
# blocks per SM; one block per SM in the split heuristic). The kvcache check (both dtypes),
# memcheck and racecheck, then the decode bench with the SDPA peers: seqlen_q 1 and 4,
# batch 1/8/64/256, seqlen_k 1k/8k/32k/128k, 32 q / 8 kv heads, d128, f16 and bf16,
# contiguous and paged 16 / 256 (caches above 64 GB skipped: batch 256 x 128k).
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check kvcache"
timeout 150 $B check --kernel mma --filter kvcache > $OUT/h200-check-kvcache.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/h200-check-kvcache.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/h200-check-kvcache.txt | head -12 | cut -c1-400 | tee -a $L
timeout 120 compute-sanitizer --tool memcheck $B check --kernel mma --filter "kvcache paged" > /tmp/san.txt 2>&1; echo "memcheck exit $?" | tee -a $L
grep -E "ERROR SUMMARY|passed," /tmp/san.txt | sort | uniq -c | head -3 | tee -a $L
timeout 100 compute-sanitizer --tool racecheck $B check --kernel mma --filter "kvcache paged16" > /tmp/race.txt 2>&1; echo "racecheck exit $?" | tee -a $L
grep -E "RACECHECK SUMMARY|passed," /tmp/race.txt | sort | uniq -c | head -3 | tee -a $L
el "bench --decode --peers (the issue's shapes)"
timeout 420 $B bench --decode --peers --warmup-ms 200 --iters 20 --out-dir /tmp/bd > /tmp/bd.log 2>&1; echo "bench exit $?" | tee -a $L
cp /tmp/bd/bench-decode.txt $OUT/bench-decode-h200.txt; cp /tmp/bd/bench-decode.json $OUT/bench-decode-h200.json
tail -5 /tmp/bd.log | cut -c1-300 | tee -a $L
el "done"
