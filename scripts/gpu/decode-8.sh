#!/usr/bin/env bash
# Run 48: does the cache's row layout cost bandwidth? The same 64 (sequence, kv head) streams
# of 32k keys with the kv heads 2 KB apart (b8, 32:8), 512 B apart (b16, 16:4... 8:2 rows) and
# contiguous (b64, 4:1); then the small bench with the new split heuristic (one block per SM).
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
for cfg in "8 32:8" "32 8:2" "64 4:1"; do
  set -- $cfg
  timeout 100 $B bench --decode --dtype f16 --decode-batch $1 --decode-heads $2 --decode-seqlen 32k --decode-q 1 --decode-pages 0,16 --warmup-ms 100 --iters 20 --out-dir /tmp/bh > /tmp/bh.log 2>&1; echo "heads $2 batch $1 exit $?" | tee -a $L
  grep -E "^f16" /tmp/bh/bench-decode.txt | tee -a $L
done
timeout 200 $B bench --decode --dtype f16 --decode-batch 1,8,64 --decode-seqlen 8k,32k,128k --decode-q 1,4 --decode-pages 0,16 --warmup-ms 100 --iters 20 --out-dir /tmp/bd > /tmp/bd.log 2>&1; echo "bench exit $?" | tee -a $L
cat /tmp/bd/bench-decode.txt | tee -a $L; cp /tmp/bd/bench-decode.txt $OUT/bench-decode-small.txt
