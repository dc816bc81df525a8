#!/usr/bin/env bash
# Issue 15 on the H200: the Python package's CUDA path. The wheel (built here, carried in
# .gpu/) unpacked onto PYTHONPATH; its CUDA tests (pytest, torch tensors, graph capture,
# streams), the two examples (a transformers model against its own SDPA; a module trained one
# step), and the same-process timing cross-check against the Rust bench.
set -uo pipefail
. scripts/gpu/lib.sh
py_setup
python3 -c "import flashattn, torch, transformers; print('flashattn', flashattn.__file__, 'torch', torch.__version__, 'transformers', transformers.__version__)" 2>&1 | tee -a $L
el "pytest python/tests (CUDA and CPU)"
timeout 300 python3 -m pytest -q -p no:cacheprovider python/tests -x -ra 2>&1 | tail -25 | tee -a $L
el "examples/torch_module.py"
timeout 120 python3 python/examples/torch_module.py 2>&1 | tail -8 | tee -a $L
el "examples/transformers_attention.py"
timeout 120 python3 python/examples/transformers_attention.py 2>&1 | grep -v Warning | tail -6 | tee -a $L
timeout 120 python3 python/examples/transformers_attention.py --dtype bfloat16 2>&1 | grep -v Warning | tail -3 | tee -a $L
el "Rust bench (wgmma) for the cross-check"
timeout 150 $B bench --kernels wgmma --dtype both --head-dim 64,128 --seqlen 1024,4096,16384 --no-plot --out-dir /tmp/xb > /tmp/xb.log 2>&1 || tail -3 /tmp/xb.log | tee -a $L
el "peers.py: flashattn (Python) and cuDNN on the same cases"
timeout 200 python3 scripts/gpu/py-crosscheck.py /tmp/xb/bench.json $OUT/crosscheck.json 2>/dev/null | tee -a $L
el done
