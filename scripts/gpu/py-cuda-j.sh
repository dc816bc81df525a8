#!/usr/bin/env bash
# Run 89: the short path for plain PyTorch CUDA tensors in flash_attn_func (no grad, no
# ALiBi): the CUDA tests, both examples, the host time per call (py-host.py), and one
# cross-check round of the package alone against the Rust bench on the 12 f16 cases.
set -uo pipefail
. scripts/gpu/lib.sh
py_setup
py_tests
py_examples
py_host
el "cross-check"
timeout 80 $B bench --kernels wgmma --dtype f16 --head-dim 64,128 --seqlen 1024,4096,16384 --no-plot --out-dir /tmp/xr > /dev/null 2>&1
XC_PEERS=flashattn timeout 120 python3 scripts/gpu/py-crosscheck.py /tmp/xr/bench.json /tmp/xc.json 2>&1 | tee -a "$L"
el done
