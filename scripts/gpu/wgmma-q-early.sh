#!/usr/bin/env bash
# Run 99: the Q tile released after the tile's last S = Q K^T completes (in the last key tile's
# iteration) instead of after its softmax and P V (`flashattn-f`, on top of run 97's D): the
# full wgmma check on F, then D/F interleaved (d64/d128 1k/2k/4k/16k, causal and not, two
# rounds), and F's timeline at d128 1k.
set -uo pipefail
. scripts/gpu/lib.sh
check_wgmma 230 $OUT/check-wgmma-f.txt ./.gpu/flashattn-f ""
ab_rounds 2 "d=./.gpu/flashattn-d f=./.gpu/flashattn-f" --dtype f16 --head-dim 64,128 --seqlen 1k,2k,4k,16k --causal both --warmup-ms 300 --iters 20
timeline ./.gpu/flashattn-f trace 128 1024 off $OUT/trace-f.txt
el done
