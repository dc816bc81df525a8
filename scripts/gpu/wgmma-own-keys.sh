#!/usr/bin/env bash
# Run 113: each consumer runs only its own rows' key tiles (the block's others, all masked for
# its rows, are waited for and released: causal d64 on three consumers, d192/d256 where Bc < 128,
# window starts). First the quick wgmma check on grids of 2-3 blocks (many tiles per block) and
# the d64 part of the full check on three consumers at every length (wg3,nopp: two consumers
# below 2k causal today); the A/B on causal cases (HEAD's binary of run 110, run 112's binary
# with the idle skip, this one; three consumers for d64 causal 1k); the full wgmma check;
# racecheck, synccheck, initcheck and memcheck on parts of the quick sweep.
set -uo pipefail
. scripts/gpu/lib.sh
quick_checks 50 "d=64 |grid=2" "d=128|grid=3" "d=64 |wg3,nopp,grid=2"
check_wgmma 60 /tmp/c.txt "$B" "wg3,nopp" --filter "d=64 "
cat /tmp/c.txt >> "$OUT/check-wgmma-grid.txt"
gzip "$OUT/check-wgmma-grid.txt"
tile_bin wg3 wg3,nopp
ab_rounds 3 "base=./.gpu/flashattn-base idle=./.gpu/flashattn-idle new=$B" --dtype both --head-dim 64,128,256 --seqlen 1k,2k,4k --causal yes --warmup-ms 300 --iters 20
# (wg3 is refused at d256: its own rounds, d64 only; the table is over all of ab.txt.)
ab_rounds 3 "wg3=/tmp/wg3" --dtype both --head-dim 64 --seqlen 1k,2k --causal yes --warmup-ms 300 --iters 20
check_wgmma 200 /tmp/check-wgmma.txt "$B" ""
gzip -c /tmp/check-wgmma.txt > "$OUT/check-wgmma.txt.gz"
sanitize racecheck d=64 75
sanitize synccheck d=128 40
sanitize memcheck d=64 30
el done
