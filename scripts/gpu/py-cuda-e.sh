#!/usr/bin/env bash
# Issue 15, fifth call: after the cheaper current-stream lookup and detach only when needed,
# the CUDA tests and the host cost of a call again.
set -uo pipefail
. scripts/gpu/lib.sh
py_setup
timeout 200 python3 -m pytest -q -p no:cacheprovider python/tests -ra 2>&1 | tail -4 | tee -a $L
timeout 120 python3 - <<'P' 2>&1 | tee -a $L
import time, torch, flashattn
q = torch.randn(1, 128, 8, 64, device="cuda", dtype=torch.float16)
def per_call(fn, n=3000):
    for _ in range(200): fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n): fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return host
for label, fn in [("flashattn.flash_attn_func", lambda: flashattn.flash_attn_func(q, q, q)),
                  ("torch SDPA", lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q))]:
    print(f"{label:28}: {per_call(fn):7.1f} us of host time per call")
P
