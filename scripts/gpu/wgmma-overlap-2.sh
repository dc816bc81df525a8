#!/usr/bin/env bash
# Runs 54-55: attn_wgmma with the tile's end overlapped with the next tile (OVERLAP), after the
# fix that keeps ptxas from serialising its wgmmas (run 53 measured the serialised build):
# the full wgmma check; the d128 and d64 checks again on a grid of 2 persistent blocks, so
# that every block runs many tiles and small problems go through the carried tile ends;
# racecheck on such a grid; a side-by-side bench (wgmma, peers, matmul); wgmma alone without
# the overlap (noov) on the same cases.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check wgmma full"
timeout ${CHECK_S:-220} $B check --kernel wgmma > $OUT/check-wgmma.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-wgmma.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-wgmma.txt | head -12 | cut -c1-300 | tee -a $L
for v in "d=128|128,2,grid=2" "d=64 |128,2,nopp,wg3,grid=2" "d=64 |128,2,grid=3"; do
  IFS='|' read -r filt spec <<< "$v"
  el "check wgmma '$filt' under $spec"
  FLASHATTN_WGMMA_TILE="$spec" timeout 120 $B check --kernel wgmma --filter "$filt" > /tmp/c.txt 2>&1; echo "check exit $?" | tee -a $L
  tail -1 /tmp/c.txt | tee -a $L; grep -v "^\[PASS\]" /tmp/c.txt | head -6 | cut -c1-300 | tee -a $L
  cat /tmp/c.txt >> $OUT/check-wgmma-grid.txt
done
el "racecheck (grid=2, b=2 sq=127 d=128)"
FLASHATTN_WGMMA_TILE="128,2,grid=2" timeout 150 compute-sanitizer --tool racecheck $B check --kernel wgmma --filter "b=2 sq=127 sk=129&d=128" > /tmp/race.txt 2>&1; echo "racecheck exit $?" | tee -a $L
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
