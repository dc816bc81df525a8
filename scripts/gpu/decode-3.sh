#!/usr/bin/env bash
# Run 43: K/V rows located per 16-key group (one offset per group, staged in shared memory one
# tile ahead when paged) instead of per row with a division by the page size; lazy rescale of
# O (slack 2^8, as attn_mma). The kvcache check, memcheck on paged, the small decode bench,
# and ncu on batch 64 x 8k paged16.
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
el "bench --decode (small)"
timeout 150 $B bench --decode --dtype f16 --decode-batch 1,8,64 --decode-seqlen 8k,32k,128k --decode-q 1 --decode-pages 0,16,256 --warmup-ms 200 --iters 20 --out-dir /tmp/bd > /tmp/bd.log 2>&1; echo "bench exit $?" | tee -a $L
cat /tmp/bd/bench-decode.txt | tee -a $L; cp /tmp/bd/bench-decode.txt $OUT/bench-decode-small.txt
timeout 200 ncu --clock-control none --kernel-name attn_decode --launch-skip 5 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats \
    $B bench --decode --dtype f16 --decode-batch 64 --decode-seqlen 8k --decode-q 1 --decode-pages 16 --warmup-ms 0 --warmup 1 --iters 20 --out-dir /tmp/bdn > $OUT/ncu-b64-p16.txt 2>&1; echo "ncu exit $?" | tee -a $L
grep -E "Duration|DRAM Throughput|Warp Cycles Per Issued|Issued Warp|Executed Instructions  " $OUT/ncu-b64-p16.txt | head -8 | tee -a $L
el "done"
