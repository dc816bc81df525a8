#!/usr/bin/env bash
# Run 96: the softmax of both accumulator rows at once (row maxima as trees, one branch for
# huge logits around both rows' exponentials: `flashattn-b`), and with it lse written after
# the O store is issued (`flashattn-c`), against the kernel of HEAD (`flashattn`). The wgmma
# check on C, then A/B/C interleaved (wgmma alone, f16, d64/d128, 1k/4k/16k, causal and not,
# two rounds), then C's timeline at d128 1k and 16k (run 95 had HEAD's).
set -uo pipefail
. scripts/gpu/lib.sh
el "check --kernel wgmma (C)"
timeout 200 ./.gpu/flashattn-c check --kernel wgmma > $OUT/check-wgmma-c.txt 2>&1; echo "check exit $?" | tee -a "$L"
tail -1 $OUT/check-wgmma-c.txt | tee -a "$L"; grep -v "^\[PASS\]" $OUT/check-wgmma-c.txt | head -8 | cut -c1-300 | tee -a "$L"
for round in 1 2; do
  for v in a b c; do
    bin=./.gpu/flashattn; [ $v != a ] && bin=./.gpu/flashattn-$v
    el "bench $v round $round"
    timeout 120 $bin bench --kernels wgmma --dtype f16 --head-dim 64,128 --seqlen 1k,4k,16k --causal both --warmup-ms 300 --iters 20 --no-plot --out-dir /tmp/b-$v-$round > /tmp/b.log 2>&1; echo "bench exit $?" | tee -a "$L"
    grep -E "^f16" /tmp/b-$v-$round/bench.txt | awk -v v=$v -v r=$round '{print v, r, $0}' >> $OUT/ab.txt
  done
done
python3 - <<'PY' | tee -a "$L"
import collections, os
rows = collections.defaultdict(list)
for line in open(os.environ["OUT"] + "/ab.txt"):
    f = line.split()
    v, key, tf = f[0], " ".join(f[2:6]), float(f[6])
    rows[(key, v)].append(tf)
keys = sorted({k for k, _ in rows}, key=lambda k: (int(k.split()[1]), k.split()[2], int(k.split()[3])))
print("case (f16, d, causal, seqlen)      A (HEAD)   B (softmax)   C (+lse late)   B/A   C/A")
for k in keys:
    m = {v: sum(rows[(k, v)]) / len(rows[(k, v)]) for v in "abc" if rows.get((k, v))}
    print(f"{k:32s} {m.get('a',0):8.1f} {m.get('b',0):10.1f} {m.get('c',0):12.1f}   {m.get('b',0)/m['a']:.3f} {m.get('c',0)/m['a']:.3f}")
PY
for spec in "128 1024 off" "128 16384 off" "64 1024 off"; do
  set -- $spec
  el "trace C d$1 $2 causal $3"
  FLASHATTN_WGMMA_TILE=trace FLASHATTN_WGMMA_TRACE=/tmp/tr.json timeout 90 ./.gpu/flashattn-c bench --kernels wgmma --dtype f16 --head-dim $1 --seqlen $2 --causal $3 --warmup 2 --warmup-ms 300 --iters 20 --no-plot --out-dir /tmp/bt > /tmp/bt.log 2>&1; echo "bench exit $?" | tee -a "$L"
  echo "== C d$1 $2 causal $3" >> $OUT/trace.txt
  python3 scripts/gpu/wgmma-trace.py /tmp/tr.json >> $OUT/trace.txt 2>&1
done
el done
