#!/usr/bin/env bash
# Run 96: the softmax of both accumulator rows at once (row maxima as trees, one branch for
# huge logits around both rows' exponentials: `flashattn-b`), and with it lse written after
# the O store is issued (`flashattn-c`), against the kernel of HEAD (`flashattn`). The wgmma
# check on C, then A/B/C interleaved (wgmma alone, f16, d64/d128, 1k/4k/16k, causal and not,
# two rounds), then C's timeline at d128 1k and 16k (run 95 had HEAD's).
set -uo pipefail
. scripts/gpu/lib.sh
check_wgmma 200 $OUT/check-wgmma-c.txt ./.gpu/flashattn-c ""
ab_rounds 2 "a=./.gpu/flashattn b=./.gpu/flashattn-b c=./.gpu/flashattn-c" --dtype f16 --head-dim 64,128 --seqlen 1k,4k,16k --causal both --warmup-ms 300 --iters 20
for spec in "128 1024 off" "128 16384 off" "64 1024 off"; do
  timeline ./.gpu/flashattn-c trace $spec $OUT/trace.txt
done
el done
