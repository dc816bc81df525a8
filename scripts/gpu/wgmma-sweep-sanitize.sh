#!/usr/bin/env bash
# Run 110: the final kernel of runs 108-109 (row sums in P V at f16 d64/d128/d192): the default
# bench sweep with the peers and d256 (wgmma-final-b.sh: README table), then racecheck on the
# d64 part of the quick wgmma sweep, synccheck and initcheck on its d128 part, memcheck on its
# d64 part.
set -uo pipefail
. scripts/gpu/lib.sh
sweep_sanitized "racecheck d=64 75" "synccheck d=128 40" "initcheck d=128 60" "memcheck d=64 40"
el done
