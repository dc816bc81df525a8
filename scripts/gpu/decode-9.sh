#!/usr/bin/env bash
# Run 49: attn_decode with 8 warps (128-key tiles) against 4, and the paged group offsets read
# two tiles ahead; the kvcache check and sanitizers on the new default (8 warps, 3 stages),
# then tiles 4x3, 8x2, 8x3 side by side on the small decode bench.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check kvcache"
timeout 150 $B check --kernel mma --filter kvcache > $OUT/check-kvcache.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-kvcache.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-kvcache.txt | head -12 | cut -c1-400 | tee -a $L
timeout 100 compute-sanitizer --tool memcheck $B check --kernel mma --filter "kvcache paged16" > /tmp/san.txt 2>&1; echo "memcheck exit $?" | tee -a $L
grep -E "ERROR SUMMARY|passed," /tmp/san.txt | sort | uniq -c | head -3 | tee -a $L
timeout 100 compute-sanitizer --tool racecheck $B check --kernel mma --filter "f16 kvcache paged64" > /tmp/race.txt 2>&1; echo "racecheck exit $?" | tee -a $L
grep -E "RACECHECK SUMMARY|passed," /tmp/race.txt | sort | uniq -c | head -3 | tee -a $L
el "bench tiles"
timeout 250 $B bench --decode --dtype f16 --decode-batch 1,8,64 --decode-seqlen 8k,32k,128k --decode-q 1 --decode-pages 0,16 --decode-tiles 4x3,8x2,8x3 --warmup-ms 100 --iters 20 --out-dir /tmp/bd > /tmp/bd.log 2>&1; echo "bench exit $?" | tee -a $L
cat /tmp/bd/bench-decode.txt | tee -a $L; cp /tmp/bd/bench-decode.txt $OUT/bench-decode-tiles.txt; cp /tmp/bd/bench-decode.json $OUT/bench-decode-tiles.json
el "done"
