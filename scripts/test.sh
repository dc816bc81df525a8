#!/usr/bin/env bash
# The whole test suite, on a fresh machine, with no GPU: installs NVRTC 13.0 (the runtime
# compiler only, from PyPI) so that every kernel is compiled to CUBIN for every supported arch,
# then runs clippy and every test. Called by .ci/run; the README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."
deps=.deps/nvrtc
if ! ls "$deps"/nvidia/cu13/lib/libnvrtc.so.13 >/dev/null 2>&1; then
    echo "installing NVRTC 13.0 into $deps (pip package nvidia-cuda-nvrtc)"
    python3 -m pip install --quiet --disable-pip-version-check --target "$deps" 'nvidia-cuda-nvrtc==13.0.*'
fi
export LD_LIBRARY_PATH="$PWD/$deps/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The NVRTC compile tests fail (not skip) when the library is missing.
export FLASHATTN_REQUIRE_NVRTC=1
cargo fmt --check
cargo clippy --all-targets --release -- -D warnings
cargo test --release --all-targets
cargo test --release --doc
