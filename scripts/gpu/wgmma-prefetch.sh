#!/usr/bin/env bash
# Run 98: the next tile's Q and first two K/V tiles prefetched into L2 by the producer after it
# has issued this tile's loads, the tile counter drawn at the round's start (`flashattn-e`, on
# top of run 97's D), against HEAD (`flashattn`) and D: the quick wgmma check on E (cut at
# 60 s), A/D/E interleaved (d64/d128 1k/2k/4k/16k, causal and not, two rounds), E's timeline.
set -uo pipefail
. scripts/gpu/lib.sh
check_wgmma 60 $OUT/check-quick-e.txt ./.gpu/flashattn-e "" --quick
ab_rounds 2 "a=./.gpu/flashattn d=./.gpu/flashattn-d e=./.gpu/flashattn-e" --dtype f16 --head-dim 64,128 --seqlen 1k,2k,4k,16k --causal both --warmup-ms 300 --iters 20
timeline ./.gpu/flashattn-e trace 128 1024 off $OUT/trace-e.txt
el done
