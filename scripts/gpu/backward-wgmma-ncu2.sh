#!/usr/bin/env bash
# Run 68: attn_bwd_wgmma d128 4k: stall reasons per kernel and per SASS instruction (warp
# state sampling), to see where the 9000 cycles per step go (tensor pipe 28 % busy, run 67).
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
if [ ! -f /tmp/rep.ncu-rep ]; then timeout 150 ncu --clock-control none --kernel-name attn_bwd_wgmma --launch-skip 3 --launch-count 1 --section WarpStateStats --section SourceCounters --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio -o /tmp/rep \
  $B bench --backward --dtype f16 --head-dim 128 --seqlen 4096 --causal off --warmup-ms 0 --warmup 1 --iters 20 --no-plot --out-dir /tmp/bn > $OUT/ncu-run.txt 2>&1; echo "ncu exit $?" | tee -a $L; fi
ncu -i /tmp/rep.ncu-rep --page raw --csv > /tmp/raw.csv 2>&1
python3 - <<'PY' | tee -a $L
import csv
rows = list(csv.reader(open('/tmp/raw.csv')))
h, v = rows[0], rows[-1]
st = [(h[i], v[i]) for i in range(len(h)) if 'issue_stalled' in h[i] and 'per_issue_active' in h[i]]
st = sorted(st, key=lambda x: -float(x[1].replace(',', '') or 0))
for k, x in st[:14]: print(f"{x:>10} {k}")
PY
ncu -i /tmp/rep.ncu-rep --page source --print-source sass --csv > /tmp/src.csv 2> $OUT/src-err.txt; echo "source page exit $?" | tee -a $L
head -c 300 /tmp/src.csv > $OUT/src-head.txt
python3 - <<'PY' | tee $OUT/top-stalls.txt | head -60 | tee -a $L
import csv
r = list(csv.reader(open('/tmp/src.csv')))
hi = next(i for i, x in enumerate(r) if x and x[0] == 'Address')
h = r[hi]
r = r[hi:]
ci = [i for i, x in enumerate(h) if x == 'Warp Stall Sampling (All Samples)']
si = [i for i, x in enumerate(h) if x in ('Source', 'Address')]
if not ci: raise SystemExit('no sampling column')
c = ci[0]
body = [x for x in r[1:] if len(x) > c]
def val(x):
    try: return float(x[c].replace(',', ''))
    except: return 0.0
tot = sum(val(x) for x in body)
for x in sorted(body, key=lambda x: -val(x))[:45]:
    print(f"{val(x)/tot*100:5.1f}% " + " | ".join(x[i] for i in si))
print('total samples', tot)
# the whole listing, address order, for reading the neighbourhood of a hot spot
with open('/tmp/listing.txt', 'w') as f:
    for x in body: f.write(f"{val(x)/tot*100:5.1f}% {x[si[0]]} {x[si[1]]}\n")
PY
cp /tmp/listing.txt $OUT/listing.txt
