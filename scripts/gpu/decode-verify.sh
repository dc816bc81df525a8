#!/usr/bin/env bash
# Run 52: the committed binary after the clean-up (one 1-D launch helper for kv_append and
# attn_combine, shared buffer checks): the kvcache check, memcheck on the cases with appended
# rows and splits, a quick check of every rung, and the small decode bench as a sanity line.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check kvcache"
timeout 150 $B check --kernel mma --filter kvcache > $OUT/check-kvcache.txt 2>&1; echo "check exit $?" | tee -a $L; tail -1 $OUT/check-kvcache.txt | tee -a $L
grep -v "^\[PASS\]" $OUT/check-kvcache.txt | head -8 | cut -c1-300 | tee -a $L
timeout 100 compute-sanitizer --tool memcheck $B check --kernel mma --filter "f16 kvcache contiguous lens[300" > /tmp/san.txt 2>&1; echo "memcheck exit $?" | tee -a $L
grep -E "ERROR SUMMARY|passed," /tmp/san.txt | sort | uniq -c | head -3 | tee -a $L
el "check --quick --kernel all"
timeout 150 $B check --quick --kernel all > $OUT/check-quick-all.txt 2>&1; echo "check exit $?" | tee -a $L; tail -1 $OUT/check-quick-all.txt | tee -a $L
el "small bench"
timeout 100 $B bench --decode --dtype bf16 --decode-batch 1,64 --decode-seqlen 32k --decode-q 1 --decode-pages 0,256 --warmup-ms 100 --iters 20 --out-dir /tmp/bd > /tmp/bd.log 2>&1; echo "bench exit $?" | tee -a $L
cat /tmp/bd/bench-decode.txt | tee -a $L
el "done"
