#!/usr/bin/env bash
# Run 106: the row sums of P on the Tensor Cores (K: each P V also multiplies P by a block of
# ones; no FADD per score) with P packed inside the softmax (J, run 105), against HEAD (the
# kernel of runs 99-100, binary ./.gpu/flashattn-head): interleaved, f16 d64/d128 1k-16k both
# masks, two rounds, with J alone (`fsum`) and K alone (`nosplit`) from the new binary; the
# d128 1k timelines of HEAD and the new default; then the full wgmma check on the new
# default, racecheck on its d64 part of the quick sweep and synccheck on its d128 part.
set -uo pipefail
. scripts/gpu/lib.sh
tile_bin fsum fsum
tile_bin nosplit nosplit
ab_rounds 2 "head=./.gpu/flashattn-head new=$B fsum=/tmp/fsum nosplit=/tmp/nosplit" --dtype f16 --head-dim 64,128 --seqlen 1k,2k,4k,16k --causal both --warmup-ms 300 --iters 20
timeline ./.gpu/flashattn-head trace 128 1024 off $OUT/trace.txt
timeline "$B" trace 128 1024 off $OUT/trace.txt
timeline ./.gpu/flashattn-head trace 64 1024 on $OUT/trace.txt
timeline "$B" trace 64 1024 on $OUT/trace.txt
check_wgmma 290 /tmp/check-wgmma.txt "$B" ""
gzip -c /tmp/check-wgmma.txt > $OUT/check-wgmma.txt.gz
sanitize racecheck d=64 60
sanitize synccheck d=128 60
el done
