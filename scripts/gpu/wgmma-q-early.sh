#!/usr/bin/env bash
# Run 99: the Q tile released after the tile's last S = Q K^T completes (in the last key tile's
# iteration) instead of after its softmax and P V (`flashattn-f`, on top of run 97's D): the
# full wgmma check on F, then D/F interleaved (d64/d128 1k/2k/4k/16k, causal and not, two
# rounds), and F's timeline at d128 1k.
set -uo pipefail
. scripts/gpu/lib.sh
el "check --kernel wgmma (F)"
timeout 230 ./.gpu/flashattn-f check --kernel wgmma > $OUT/check-wgmma-f.txt 2>&1; echo "check exit $?" | tee -a "$L"
tail -1 $OUT/check-wgmma-f.txt | tee -a "$L"; grep -v "^\[PASS\]" $OUT/check-wgmma-f.txt | head -8 | cut -c1-300 | tee -a "$L"
for round in 1 2; do
  for v in d f; do
    el "bench $v round $round"
    timeout 150 ./.gpu/flashattn-$v bench --kernels wgmma --dtype f16 --head-dim 64,128 --seqlen 1k,2k,4k,16k --causal both --warmup-ms 300 --iters 20 --no-plot --out-dir /tmp/b-$v-$round > /tmp/b.log 2>&1; echo "bench exit $?" | tee -a "$L"
    grep -E "^f16" /tmp/b-$v-$round/bench.txt | awk -v v=$v -v r=$round '{print v, r, $0}' >> $OUT/ab.txt
  done
done
python3 - <<'PY' | tee -a "$L"
import collections, os
rows = collections.defaultdict(list)
for line in open(os.environ["OUT"] + "/ab.txt"):
    f = line.split()
    rows[(" ".join(f[2:6]), f[0])].append(float(f[6]))
keys = sorted({k for k, _ in rows}, key=lambda k: (int(k.split()[1]), k.split()[2], int(k.split()[3])))
m = lambda k, v: sum(rows[(k, v)]) / len(rows[(k, v)])
print("case (f16, d, causal, seqlen)         D        F    F/D   (rounds D | F)")
for k in keys:
    print(f"{k:32s} {m(k,'d'):8.1f} {m(k,'f'):8.1f}  {m(k,'f')/m(k,'d'):.3f}   {' '.join(f'{x:.0f}' for x in rows[(k,'d')])} | {' '.join(f'{x:.0f}' for x in rows[(k,'f')])}")
PY
el "trace F d128 1k"
FLASHATTN_WGMMA_TILE=trace FLASHATTN_WGMMA_TRACE=/tmp/tr.json timeout 90 ./.gpu/flashattn-f bench --kernels wgmma --dtype f16 --head-dim 128 --seqlen 1024 --causal off --warmup 2 --warmup-ms 300 --iters 20 --no-plot --out-dir /tmp/bt > /tmp/bt.log 2>&1; echo "bench exit $?" | tee -a "$L"
python3 scripts/gpu/wgmma-trace.py /tmp/tr.json > $OUT/trace-f.txt 2>&1
el done
