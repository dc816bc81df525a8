#!/usr/bin/env bash
# Run 75: two Q buffers again (run 33 tried them with every tile started in lockstep), now that
# a consumer starts its next tile as soon as it has stored this one: the checks under q2 (also
# on small grids, so that blocks run many tiles), an interleaved A/B (default against q2), the
# d64 consumer variants once, then ncu's per-instruction stall sampling of d128 non-causal 1k.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
for v in "d=128 |q2" "d=128 |q2,grid=2" "d=64 |q2,grid=3"; do
  f=${v%%|*}; spec=${v#*|}
  el "check wgmma '$f' under $spec"
  FLASHATTN_WGMMA_TILE="$spec" timeout 90 $B check --kernel wgmma --filter "$f" > /tmp/cg.txt 2>&1; echo "check exit $?" | tee -a $L
  tail -1 /tmp/cg.txt | tee -a $L; grep -v "^\[PASS\]" /tmp/cg.txt | grep -v "^checking\|passed" | head -5 | cut -c1-300 | tee -a $L
  cat /tmp/cg.txt >> $OUT/check-q2.txt
done
el "racecheck (q2,grid=2)"
FLASHATTN_WGMMA_TILE="q2,grid=2" timeout 60 compute-sanitizer --tool racecheck $B check --kernel wgmma --filter "f16 b=1 sq=1000 sk=1000 hq=2 hkv=2 d=128&causal" > /tmp/san.txt 2>&1; echo "exit $?" | tee -a $L
grep -E "RACECHECK SUMMARY|passed" /tmp/san.txt | sort | uniq -c | head -3 | tee -a $L; cat /tmp/san.txt > $OUT/sanitizers.txt
SEQ=${SEQ:-1024,2048,4096,16384}
ab() { # label dims spec
  el "bench $1"
  FLASHATTN_WGMMA_TILE="$3" timeout 150 $B bench --kernels wgmma --dtype f16 --head-dim $2 --seqlen $SEQ --no-plot --out-dir /tmp/v_$1 > /tmp/v.log 2>&1 || tail -3 /tmp/v.log | tee -a $L
  grep -E "^f16" /tmp/v_$1/bench.txt | awk -v l=$1 '{print l, $0}' >> $OUT/ab.txt
}
ab default1 64,128 ""; ab q2-1 64,128 q2; ab default2 64,128 ""; ab q2-2 64,128 q2
ab wg3-nopp 64 "128,2,nopp,wg3"; ab wg3-pp 64 "128,2,wg3"; ab d128-nopp 128 "nopp"
el "ncu stall sampling d128 non-causal 1k"
timeout 150 ncu --clock-control none --kernel-name attn_wgmma --launch-skip 3 --launch-count 1 --section WarpStateStats --section SourceCounters -o /tmp/rep \
  $B bench --kernels wgmma --dtype f16 --head-dim 128 --seqlen 1024 --causal off --warmup-ms 0 --warmup 1 --iters 20 --no-plot --out-dir /tmp/bn > $OUT/ncu-run.txt 2>&1; echo "ncu exit $?" | tee -a $L
ncu -i /tmp/rep.ncu-rep --page source --print-source sass --csv > /tmp/src.csv 2> /dev/null; echo "source page exit $?" | tee -a $L
python3 - <<'PY' | tee $OUT/top-stalls.txt | head -40 | tee -a $L
import csv
r = list(csv.reader(open('/tmp/src.csv')))
hi = next(i for i, x in enumerate(r) if x and x[0] == 'Address')
h = r[hi]; r = r[hi:]
c = [i for i, x in enumerate(h) if x == 'Warp Stall Sampling (All Samples)'][0]
si = [i for i, x in enumerate(h) if x in ('Source', 'Address')]
body = [x for x in r[1:] if len(x) > c]
def val(x):
    try: return float(x[c].replace(',', ''))
    except: return 0.0
tot = sum(val(x) for x in body)
for x in sorted(body, key=lambda x: -val(x))[:40]:
    print(f"{val(x)/tot*100:5.1f}% " + " | ".join(x[i] for i in si))
print('total samples', tot)
with open('/tmp/listing.txt', 'w') as f:
    for x in body: f.write(f"{val(x)/tot*100:5.1f}% {x[si[0]]} {x[si[1]]}\n")
PY
cp /tmp/listing.txt $OUT/listing.txt
el "done"
