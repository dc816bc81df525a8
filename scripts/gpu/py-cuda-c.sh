#!/usr/bin/env bash
# Issue 15, third call: the Python tests again (CuPy added), which NVRTC the package loaded,
# and the host cost of one call (a tiny problem, so that the GPU waits on the host).
set -uo pipefail
. scripts/gpu/lib.sh
py_setup
timeout 200 python3 -m pytest -q -p no:cacheprovider python/tests -ra 2>&1 | tail -6 | tee -a $L
timeout 120 python3 - <<'P' 2>&1 | tee -a $L
import time, torch, flashattn
q = torch.randn(1, 128, 8, 64, device="cuda", dtype=torch.float16)
flashattn.flash_attn_func(q, q, q)
torch.cuda.synchronize()
print("libnvrtc loaded from:", sorted({l.split()[-1] for l in open("/proc/self/maps") if "nvrtc" in l}))
for label, fn in [("flashattn.flash_attn_func", lambda: flashattn.flash_attn_func(q, q, q)),
                  ("torch SDPA", lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q))]:
    for _ in range(200): fn()
    torch.cuda.synchronize()
    t = time.perf_counter(); n = 3000
    for _ in range(n): fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    print(f"{label}: {host:.1f} us of host time per call (tiny problem)")
P
