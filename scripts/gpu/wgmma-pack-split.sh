#!/usr/bin/env bash
# Run 105: P packed inside the softmax, half by half (the P V issued as two commit groups; the
# first half packed once the first group has read it), against HEAD (runs 99-100's kernel):
# interleaved, d64/d128 1k-16k both masks, two rounds; then the full wgmma check.
set -uo pipefail
. scripts/gpu/lib.sh
ab_rounds 2 "head=./.gpu/flashattn-head split=$B" --dtype f16 --head-dim 64,128 --seqlen 1k,2k,4k,16k --causal both --warmup-ms 300 --iters 20
check_wgmma 165 $OUT/check-wgmma.txt "$B" ""
el done
