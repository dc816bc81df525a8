#!/usr/bin/env bash
# Run 76: each attn_wgmma consumer computes only the key tiles its own rows see (a consumer
# past seqlen_q none, past a causal diagonal fewer), passing over the others; the free tile
# starts of run 74 kept, lockstep and two Q buffers dropped. The full wgmma check (with the
# backward cases it now holds), the hand-off checks on small grids, sanitizers, then an
# interleaved A/B against the previous commit's binary ($BASE).
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
BASE=${BASE:-./.gpu/flashattn-base}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check wgmma full"
timeout 320 $B check --kernel wgmma > $OUT/check-wgmma.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-wgmma.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-wgmma.txt | grep -v "^checking\|passed" | head -8 | cut -c1-300 | tee -a $L
for v in "d=128 |grid=2" "d=64 |grid=3" "d=64 |128,2,grid=2"; do
  f=${v%%|*}; spec=${v#*|}
  el "check wgmma '$f' under $spec"
  FLASHATTN_WGMMA_TILE="$spec" timeout 90 $B check --kernel wgmma --filter "$f" > /tmp/cg.txt 2>&1; echo "check exit $?" | tee -a $L
  tail -1 /tmp/cg.txt | tee -a $L; grep -v "^\[PASS\]" /tmp/cg.txt | grep -v "^checking\|passed" | head -5 | cut -c1-300 | tee -a $L
  cat /tmp/cg.txt >> $OUT/check-grids.txt
done
for run in "racecheck|grid=3|f16 b=1 sq=1000 sk=1000 hq=2 hkv=2 d=64&none" "synccheck|grid=3|f16 b=1 sq=1000 sk=1000 hq=2 hkv=2 d=64&none" "memcheck||f16 b=1 sq=1000 sk=1000 hq=2 hkv=2 d=64&causal"; do
  IFS='|' read -r tool spec f <<< "$run"
  el "$tool ($spec): $f"
  FLASHATTN_WGMMA_TILE="$spec" timeout 100 compute-sanitizer --tool $tool $B check --kernel wgmma --filter "$f" > /tmp/san.txt 2>&1; echo "exit $?" | tee -a $L
  cat /tmp/san.txt >> $OUT/sanitizers.txt
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed" /tmp/san.txt | sort | uniq -c | head -4 | cut -c1-200 | tee -a $L
done
SEQ=${SEQ:-1024,2048,4096,16384}
for i in 1 2; do
  for bin in base new; do
    b=$B; [ $bin = base ] && b=$BASE
    el "bench $bin ($i)"
    timeout 150 $b bench --kernels wgmma --dtype f16 --head-dim 64,128 --seqlen $SEQ --no-plot --out-dir /tmp/v_${bin}_$i > /tmp/v.log 2>&1 || tail -3 /tmp/v.log | tee -a $L
    grep -E "^f16" /tmp/v_${bin}_$i/bench.txt | awk -v l=$bin -v i=$i '{print l, i, $0}' >> $OUT/ab.txt
  done
done
el "done"
