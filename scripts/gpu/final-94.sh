#!/usr/bin/env bash
# Run 94: the final commit of this stop: the Python CUDA tests (the kvcache ones now on the
# copy-engine decode path) and `check --quick --kernel all` (cut at 90 s).
set -uo pipefail
. scripts/gpu/lib.sh
py_setup
py_tests
el "check --quick --kernel all"
timeout 90 $B check --quick --kernel all > $OUT/check-quick-all.txt 2>&1; echo "check exit $?" | tee -a "$L"
tail -1 $OUT/check-quick-all.txt | tee -a "$L"; grep -v "^\[PASS\]" $OUT/check-quick-all.txt | head -8 | cut -c1-300 | tee -a "$L"
el done
