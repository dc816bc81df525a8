#!/usr/bin/env bash
# Run 45: the split heuristic counts the blocks an SM really holds (shared memory and
# registers of the compiled kernel) instead of two; attn_decode's pipeline depth 2, 3 and 4
# side by side on the small decode bench, with the SDPA peers for a first comparison.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check kvcache"
timeout 150 $B check --kernel mma --filter kvcache > $OUT/check-kvcache.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-kvcache.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-kvcache.txt | head -12 | cut -c1-400 | tee -a $L
el "bench --decode stages 2,3,4 with peers"
timeout 300 $B bench --decode --dtype f16 --decode-batch 1,8,64 --decode-seqlen 8k,32k,128k --decode-q 1 --decode-pages 0,16 --decode-stages 2,3,4 --peers --warmup-ms 200 --iters 20 --out-dir /tmp/bd > /tmp/bd.log 2>&1; echo "bench exit $?" | tee -a $L
cat /tmp/bd/bench-decode.txt | tee -a $L; cp /tmp/bd/bench-decode.txt $OUT/bench-decode-stages.txt; cp /tmp/bd/bench-decode.json $OUT/bench-decode-stages.json
grep -i "skipped\|error" /tmp/bd.log | head -5 | cut -c1-300 | tee -a $L
el "done"
