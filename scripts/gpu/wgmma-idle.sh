#!/usr/bin/env bash
# Run 112: consumers without a row (all 64 past seqlen_q, in the last query block) skip their
# GEMMs and softmax, and the speculative maxima are on by default (not for bf16 d64). First the
# quick wgmma check of d64 (three consumers) and d128 (two, pingpong) on a grid of 2 blocks,
# where every block runs many tiles and an idle consumer's protocol crosses tile hand-offs;
# then the A/B at d64 (HEAD's binary, the idle skip alone, the new default, two consumers);
# then the full wgmma check of the new default.
set -uo pipefail
. scripts/gpu/lib.sh
quick_checks 60 "d=64 |grid=2" "d=128|grid=2" "d=64 |128,2,grid=3"
tile_bin idle nospec
tile_bin twocons 128,2
ab_rounds 3 "base=./.gpu/flashattn-base idle=/tmp/idle new=$B twocons=/tmp/twocons" --dtype both --head-dim 64 --seqlen 1k,2k,4k --causal both --warmup-ms 300 --iters 20
check_wgmma 280 /tmp/check-wgmma.txt "$B" ""
gzip -c /tmp/check-wgmma.txt > "$OUT/check-wgmma.txt.gz"
el done
