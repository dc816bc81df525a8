#!/usr/bin/env bash
# Run 53: (1) the decode fixes not yet run on a GPU (NaN rows, the decoding loop on one plan):
# the kvcache check and memcheck on the NaN and loop cases; (2) attn_wgmma with the tile's end
# overlapped with the next tile's first S = Q K^T (OVERLAP, two Q buffers): the full wgmma
# check, racecheck on the quick d128 cases, a side-by-side bench (wgmma, peers, matmul), then
# wgmma alone without the overlap (noov) on the same cases.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check kvcache"
timeout 150 $B check --kernel mma --filter kvcache > $OUT/check-kvcache.txt 2>&1; echo "check exit $?" | tee -a $L; tail -1 $OUT/check-kvcache.txt | tee -a $L
grep -v "^\[PASS\]" $OUT/check-kvcache.txt | head -8 | cut -c1-300 | tee -a $L
for f in "NaN in q" "decoding loop"; do
  timeout 100 compute-sanitizer --tool memcheck $B check --kernel mma --filter "$f" > /tmp/san.txt 2>&1; echo "memcheck '$f' exit $?" | tee -a $L
  grep -E "ERROR SUMMARY|passed," /tmp/san.txt | sort | uniq -c | head -3 | tee -a $L
done
el "check wgmma full"
timeout ${CHECK_S:-220} $B check --kernel wgmma > $OUT/check-wgmma.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-wgmma.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-wgmma.txt | head -12 | cut -c1-300 | tee -a $L
el "racecheck quick wgmma d=128"
timeout 90 compute-sanitizer --tool racecheck $B check --quick --kernel wgmma --filter "d=128" > /tmp/race.txt 2>&1; echo "racecheck exit $?" | tee -a $L
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed," /tmp/race.txt | sort | uniq -c | head -4 | tee -a $L
SEQ=${SEQ:-1024,2048,4096,16384}
el "bench side by side"
timeout 220 $B bench --peers --kernels wgmma --dtype f16 --head-dim 64,128 --seqlen $SEQ --out-dir /tmp/b0 > /tmp/b0.log 2>&1; echo "bench exit $?" | tee -a $L
cp /tmp/b0/bench.txt $OUT/bench-main.txt 2>/dev/null; cp /tmp/b0/bench.json $OUT/bench-main.json 2>/dev/null; cat $OUT/bench-main.txt | tee -a $L
el "variant noov (the default tile of each case without the overlap)"
for dims in 64 128; do
  for c in off on; do
    for sq in ${SEQ//,/ }; do
      spec="128,2,noov"
      [ $dims = 64 ] && { [ $c = off ] || [ $sq -ge 2048 ]; } && spec="128,2,nopp,wg3,noov"
      FLASHATTN_WGMMA_TILE="$spec" timeout 40 $B bench --kernels wgmma --dtype f16 --causal $c --head-dim $dims --seqlen $sq --out-dir /tmp/v > /tmp/v.log 2>&1 || tail -3 /tmp/v.log | tee -a $L
      grep -E "^f16" /tmp/v/bench.txt | awk -v l="noov:$spec" '{print l, $0}' | tee -a $OUT/variants.txt | tee -a $L
    done
  done
done
el "done"
