#!/usr/bin/env bash
# Run 93: the decode path with K/V by the copy engine as the default on sm_90 (run 92). As run
# 90 (decode-final-b.sh):
# the kvcache check (both dtypes, every
# split count), memcheck on every kvcache case (decode, combine and kv_append kernels),
# racecheck on the paged ones, then the decode bench with the SDPA peers.
set -uo pipefail
. scripts/gpu/lib.sh
el "check kvcache"
timeout 150 $B check --kernel mma --filter kvcache > $OUT/h200-check-kvcache.txt 2>&1; echo "check exit $?" | tee -a "$L"
tail -1 $OUT/h200-check-kvcache.txt | tee -a "$L"; grep -v "^\[PASS\]" $OUT/h200-check-kvcache.txt | head -12 | cut -c1-400 | tee -a "$L"
timeout 150 compute-sanitizer --tool memcheck $B check --kernel mma --filter kvcache > /tmp/san.txt 2>&1; echo "memcheck exit $?" | tee -a "$L"
grep -E "ERROR SUMMARY|passed," /tmp/san.txt | sort | uniq -c | head -3 | tee -a "$L"
timeout 100 compute-sanitizer --tool racecheck $B check --kernel mma --filter "kvcache paged16" > /tmp/race.txt 2>&1; echo "racecheck exit $?" | tee -a "$L"
grep -E "RACECHECK SUMMARY|passed," /tmp/race.txt | sort | uniq -c | head -3 | tee -a "$L"
el "bench --decode --peers (the issue's shapes)"
timeout 420 $B bench --decode --peers --warmup-ms 200 --iters 20 --out-dir /tmp/bd > /tmp/bd.log 2>&1; echo "bench exit $?" | tee -a "$L"
cp /tmp/bd/bench-decode.txt $OUT/bench-decode-h200.txt; cp /tmp/bd/bench-decode.json $OUT/bench-decode-h200.json
tail -5 /tmp/bd.log | cut -c1-300 | tee -a "$L"
el done
