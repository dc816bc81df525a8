#!/usr/bin/env bash
# Run 92: attn_decode with K/V by the copy engine through tensor maps (BULK=1, `8x3b`; run 91
# was one bulk copy per row): the kvcache check
# under FLASHATTN_DECODE_BULK=1 (every case, both dtypes, every split count), memcheck,
# racecheck and synccheck on it, then the bulk tiles against the cp.async ones in the same run
# (f16, seqlen_q 1, contiguous and paged 16, batch 1/8/64, 8k-128k keys).
set -uo pipefail
. scripts/gpu/lib.sh
export FLASHATTN_DECODE_BULK=1
el "check kvcache (bulk)"
timeout 150 $B check --kernel mma --filter kvcache > $OUT/check-kvcache-bulk.txt 2>&1; echo "check exit $?" | tee -a "$L"
tail -1 $OUT/check-kvcache-bulk.txt | tee -a "$L"; grep -v "^\[PASS\]" $OUT/check-kvcache-bulk.txt | head -12 | cut -c1-400 | tee -a "$L"
timeout 150 compute-sanitizer --tool memcheck $B check --kernel mma --filter kvcache > /tmp/san.txt 2>&1; echo "memcheck exit $?" | tee -a "$L"
grep -E "ERROR SUMMARY|passed," /tmp/san.txt | sort | uniq -c | head -3 | tee -a "$L"; grep -m3 -A6 "Invalid\|Error" /tmp/san.txt | head -20 | tee -a "$L"
timeout 100 compute-sanitizer --tool racecheck $B check --kernel mma --filter "kvcache paged16" > /tmp/race.txt 2>&1; echo "racecheck exit $?" | tee -a "$L"
grep -E "RACECHECK SUMMARY|passed," /tmp/race.txt | sort | uniq -c | head -3 | tee -a "$L"
timeout 100 compute-sanitizer --tool synccheck $B check --kernel mma --filter "kvcache paged16" > /tmp/sync.txt 2>&1; echo "synccheck exit $?" | tee -a "$L"
grep -E "ERROR SUMMARY|passed," /tmp/sync.txt | sort | uniq -c | head -3 | tee -a "$L"
unset FLASHATTN_DECODE_BULK
el "bench: bulk against cp.async tiles"
timeout 240 $B bench --decode --decode-tiles 8x3,8x3b,4x3,4x3b --decode-batch 1,8,64 --decode-seqlen 8k,32k,128k --decode-q 1 --decode-pages 0,16 --dtype f16 --warmup-ms 200 --iters 20 --out-dir /tmp/bb > /tmp/bb.log 2>&1; echo "bench exit $?" | tee -a "$L"
cp /tmp/bb/bench-decode.txt $OUT/bench-decode-bulk.txt; cp /tmp/bb/bench-decode.json $OUT/bench-decode-bulk.json
tail -3 /tmp/bb.log | cut -c1-300 | tee -a "$L"
el done
