#!/usr/bin/env bash
# Run 40: the KV-cache decode kernels (attn_decode, attn_combine, kv_append) brought up. The
# check of the kvcache cases, compute-sanitizer memcheck and racecheck on them, a quick check
# of every rung (naive and simt were last checked before the parameter block grew), then a
# small decode bench (batch 1 and 64, 8k and 32k keys, contiguous and paged 16) for a first
# bandwidth reading.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check kvcache"
timeout 150 $B check --kernel mma --filter kvcache > $OUT/check-kvcache.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-kvcache.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-kvcache.txt | head -12 | cut -c1-400 | tee -a $L
el "compute-sanitizer memcheck (paged16 cases)"
timeout 120 compute-sanitizer --tool memcheck $B check --kernel mma --filter "kvcache paged16" > /tmp/san.txt 2>&1; echo "memcheck exit $?" | tee -a $L
grep -E "ERROR SUMMARY|passed,|Invalid" /tmp/san.txt | sort | uniq -c | sort -rn | head -4 | tee -a $L
el "compute-sanitizer racecheck (d40/d256 contiguous)"
timeout 120 compute-sanitizer --tool racecheck $B check --kernel mma --filter "f16 kvcache contiguous lens[1000, 37]" > /tmp/race.txt 2>&1; echo "racecheck exit $?" | tee -a $L
grep -E "RACECHECK SUMMARY|ERROR SUMMARY|passed,|Hazard" /tmp/race.txt | sort | uniq -c | sort -rn | head -4 | tee -a $L
el "check --quick --kernel all"
timeout 150 $B check --quick --kernel all > $OUT/check-quick-all.txt 2>&1; echo "check exit $?" | tee -a $L; tail -1 $OUT/check-quick-all.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-quick-all.txt | head -5 | cut -c1-300 | tee -a $L
el "bench --decode (small)"
timeout 150 $B bench --decode --decode-batch 1,64 --decode-seqlen 8k,32k --decode-q 1 --decode-pages 0,16 --warmup-ms 200 --iters 20 --out-dir /tmp/bd > /tmp/bd.log 2>&1; echo "bench exit $?" | tee -a $L
tail -4 /tmp/bd.log | tee -a $L; cp /tmp/bd/bench-decode.txt $OUT/bench-decode-small.txt
el "done"
