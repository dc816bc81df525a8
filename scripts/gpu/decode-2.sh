#!/usr/bin/env bash
# Run 41: paged tiles with their page numbers staged in shared memory one tile ahead (the
# block-table reads no longer wait in front of each tile's copies), kernels and metadata held
# by the plan. The kvcache check again, the small decode bench, and ncu on one batch-1 32k call
# (why a block streams only ~11 GB/s there).
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check kvcache"
timeout 150 $B check --kernel mma --filter kvcache > $OUT/check-kvcache.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-kvcache.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-kvcache.txt | head -12 | cut -c1-400 | tee -a $L
el "compute-sanitizer memcheck + racecheck (paged16 / paged64 f16)"
timeout 100 compute-sanitizer --tool memcheck $B check --kernel mma --filter "f16 kvcache paged16" > /tmp/san.txt 2>&1; echo "memcheck exit $?" | tee -a $L
grep -E "ERROR SUMMARY|passed," /tmp/san.txt | sort | uniq -c | head -3 | tee -a $L
timeout 100 compute-sanitizer --tool racecheck $B check --kernel mma --filter "bf16 kvcache paged64" > /tmp/race.txt 2>&1; echo "racecheck exit $?" | tee -a $L
grep -E "RACECHECK SUMMARY|passed," /tmp/race.txt | sort | uniq -c | head -3 | tee -a $L
el "bench --decode (small)"
timeout 150 $B bench --decode --dtype f16 --decode-batch 1,8,64 --decode-seqlen 8k,32k,128k --decode-q 1 --decode-pages 0,16,256 --warmup-ms 200 --iters 20 --out-dir /tmp/bd > /tmp/bd.log 2>&1; echo "bench exit $?" | tee -a $L
cat /tmp/bd/bench-decode.txt | tee -a $L; cp /tmp/bd/bench-decode.txt $OUT/bench-decode-small.txt
el "ncu: one batch-1 32k decode launch"
timeout 120 ncu --clock-control none --kernel-name attn_decode --launch-skip 30 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
  $B bench --decode --dtype f16 --decode-batch 1 --decode-seqlen 32k --decode-q 1 --decode-pages 0 --warmup-ms 0 --warmup 1 --iters 20 --out-dir /tmp/bdn > $OUT/ncu-decode.txt 2>&1; echo "ncu exit $?" | tee -a $L
grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Warp Cycles Per Issued|Stall|Registers|Block Limit|Issued Ipc|One or More|No Eligible" $OUT/ncu-decode.txt | head -30 | tee -a $L
el "done"
