#!/usr/bin/env bash
# Run 108: the row sums in P V (a ones sub-tile per V stage, N = head_dim + 8) as the default
# at d64-d192, with J's split packing ($B) or without it (./.gpu/flashattn-nosplit, the same
# code with pack_split off by default), against HEAD's binary (the kernel of runs 99-100,
# ./.gpu/flashattn-head): interleaved, f16 d64/d128 1k-16k both masks, two rounds. The faster
# of the two new binaries (geometric mean over the 16 cases) then gets the full wgmma check,
# the default bench sweep with the peers (wgmma-final-b.sh), racecheck on the d64 part of the
# quick sweep and memcheck on its d128 part.
set -uo pipefail
. scripts/gpu/lib.sh
ab_rounds 2 "head=./.gpu/flashattn-head split=$B nosplit=./.gpu/flashattn-nosplit" --dtype f16 --head-dim 64,128 --seqlen 1k,2k,4k,16k --causal both --warmup-ms 300 --iters 20
win=$(python3 - "$OUT/ab.txt" <<'PY'
import collections, math, sys
t = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 7:
        t[f[0]].append(math.log(float(f[6])))
g = {k: sum(v) / len(v) for k, v in t.items()}
print("split" if g["split"] >= g["nosplit"] else "nosplit")
PY
)
[ "$win" = split ] && W=$B || W=./.gpu/flashattn-nosplit
el "chosen: $win ($W)"
check_wgmma 220 /tmp/check-wgmma.txt "$W" ""
rc=$?
gzip -c /tmp/check-wgmma.txt > $OUT/check-wgmma.txt.gz
if [ $rc -ne 0 ]; then el "check failed: no sweep"; exit 1; fi
el "bench sweep"
FLASHATTN=$W bash scripts/gpu/wgmma-final-b.sh | tail -3 | tee -a "$L"
B=$W
sanitize racecheck d=64 60
sanitize memcheck d=128 30
el done
