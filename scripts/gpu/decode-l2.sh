#!/usr/bin/env bash
# Run 51: cp.async with the .L2::256B prefetch-size hint in attn_decode (whole 256-byte rows
# fetched into L2), against run 50's numbers on a subset of its shapes; the kvcache check.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
timeout 150 $B check --kernel mma --filter kvcache > /tmp/ck.txt 2>&1; echo "check exit $?" | tee -a $L; tail -1 /tmp/ck.txt | tee -a $L
timeout 200 $B bench --decode --dtype f16 --decode-batch 1,8,64 --decode-seqlen 8k,32k,128k --decode-q 1 --decode-pages 0,16 --warmup-ms 200 --iters 20 --out-dir /tmp/bd > /tmp/bd.log 2>&1; echo "bench exit $?" | tee -a $L
cat /tmp/bd/bench-decode.txt | tee -a $L; cp /tmp/bd/bench-decode.txt $OUT/bench-decode-l2.txt
