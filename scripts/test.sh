#!/usr/bin/env bash
# The whole test suite, on a fresh machine, with no GPU: installs NVRTC 13.0 (the runtime
# compiler only, from PyPI) so that every kernel is compiled to CUBIN for every supported arch,
# then runs fmt, clippy and every test of the workspace. Called by .ci/run; the README's test
# command.
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
# The whole workspace: the library (root), flashattn-tools (tools/: the binary, check, bench,
# probes, the import-circle check) and the binding's Rust side (python/).
cargo fmt --all --check
cargo clippy --workspace --all-targets --release -- -D warnings
cargo test --release --workspace --all-targets
cargo test --release --workspace --doc
# The Python package (python/; its Rust side was linted and tested with the workspace above):
# build the wheel, install it in a fresh virtual environment and run its tests on the CPU with
# NumPy inputs (from outside the source tree, so that the installed wheel is what is imported).
venv=.deps/pyvenv
rm -rf "$venv" .deps/wheels
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check 'maturin>=1.5,<2' pytest 'numpy>=1.23'
"$venv/bin/maturin" build --release --quiet -m python/Cargo.toml -o .deps/wheels --interpreter "$venv/bin/python"
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps .deps/wheels/flashattn-*.whl
(cd .deps && FLASHATTN_TEST_NVRTC_SITE="$PWD/nvrtc" "$PWD/pyvenv/bin/python" -m pytest -q -p no:cacheprovider ../python/tests)
