#!/usr/bin/env bash
# Run 121 (second call): the sanitizer runs that run 119 cut or left to the other head_dim, on
# the final kernel (c3310d4): initcheck on the whole d128 part of the quick sweep, racecheck on
# its d128 part (the pingpong turns), synccheck on its d64 part, memcheck on its d128 part.
set -uo pipefail
. scripts/gpu/lib.sh
sanitize initcheck d=128 150
sanitize racecheck d=128 200
sanitize synccheck d=64 80
sanitize memcheck d=128 80
el done
