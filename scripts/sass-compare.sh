#!/usr/bin/env bash
# Proves that a change left the kernels' machine code alone, with no GPU: compiles every
# specialisation of tests/kernels_compile.rs at two commits (NVRTC to CUBIN), disassembles each
# with nvdisasm and diffs the SASS. Usage: scripts/sass-compare.sh BASE [HEAD]
# (HEAD defaults to the working tree). The base's SASS is cached in .deps/sass/. Needs NVRTC (scripts/test.sh installs it) and nvdisasm
# (installed here from the pip package nvidia-cuda-nvdisasm into .deps/nvdisasm).
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: scripts/sass-compare.sh BASE [HEAD]}
head=${2:-}
top=$PWD
nvd=$top/.deps/nvdisasm
if ! ls "$nvd"/nvidia/cu13/bin/nvdisasm >/dev/null 2>&1; then
    python3 -m pip install --quiet --disable-pip-version-check --target "$nvd" 'nvidia-cuda-nvdisasm==13.2.*'
fi
export LD_LIBRARY_PATH="$top/.deps/nvrtc/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
work=$(mktemp -d)
trap 'git worktree remove --force "$work/base" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

dump() { # dump <checkout> <out>
    (cd "$1" && CARGO_TARGET_DIR="$top/target/sass-compare" FLASHATTN_REQUIRE_NVRTC=1 \
        FLASHATTN_CUBIN_DIR="$2" cargo test --release --quiet --test kernels_compile \
        every_kernel_compiles >/dev/null)
}
disasm() { "$nvd"/nvidia/cu13/bin/nvdisasm -c "$1" >"${1%.cubin}.sass"; }
# A commit's SASS does not change: the base's dump is kept in .deps/sass/<commit>.
base_id=$(git rev-parse "$base^{commit}")
cache=$top/.deps/sass/$base_id
if ! ls "$cache"/*.sass >/dev/null 2>&1; then
    git worktree add --detach "$work/base" "$base" >/dev/null
    rm -rf "$cache.tmp"; mkdir -p "$cache.tmp"
    dump "$work/base" "$cache.tmp"
    for f in "$cache.tmp"/*.cubin; do disasm "$f"; done
    rm -rf "$cache"; mv "$cache.tmp" "$cache"
fi
if [ -n "$head" ]; then
    git worktree add --detach "$work/head" "$head" >/dev/null
    dump "$work/head" "$work/b"
    git worktree remove --force "$work/head"
else
    dump "$top" "$work/b"
fi
# Equal CUBINs have equal SASS; only the others are disassembled and diffed.
same=0; differ=0; missing=0
for f in "$cache"/*.cubin; do
    n=$(basename "$f" .cubin)
    g=$work/b/$n.cubin
    if [ ! -f "$g" ]; then missing=$((missing + 1)); echo "only in $base: $n"; continue; fi
    if cmp -s "$f" "$g"; then same=$((same + 1)); continue; fi
    disasm "$g"
    if cmp -s "$cache/$n.sass" "$work/b/$n.sass"; then same=$((same + 1)); else
        differ=$((differ + 1)); echo "SASS differs: $n"
    fi
done
echo "$same identical, $differ different, $missing missing of $(ls "$cache"/*.cubin | wc -l) specialisations"
[ "$differ" -eq 0 ]
