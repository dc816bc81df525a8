#!/usr/bin/env python3
"""Host time per call of the Python package against PyTorch SDPA, and where it goes, on a
shape whose kernel is shorter than the host work (1 x 128 x 8 x 64, f16), so that the loop
time per call is the host time. Prints microseconds per call.

    python3 scripts/device/py-host.py
"""
import time

import torch

import flashattn

q = torch.randn(1, 128, 8, 64, device="cuda", dtype=torch.float16)
out = torch.empty_like(q)
lse = torch.empty(1, 8, 128, device="cuda", dtype=torch.float32)
native = flashattn._native
stream, current = flashattn._stream(q)


def per_call(fn, n=3000):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return host


def native_forward(torch_attributes):
    native.forward(
        q, q, q, out, lse, None, False, -1, -1, 0.0, None, stream, current, torch=torch_attributes
    )


steps = [
    ("flashattn.flash_attn_func", lambda: flashattn.flash_attn_func(q, q, q)),
    ("_native.forward (torch attributes)", lambda: native_forward(True)),
    ("_native.forward (DLPack)", lambda: native_forward(False)),
    ("5 x __dlpack__(stream=-1)", lambda: [x.__dlpack__(stream=-1) for x in (q, q, q, out, lse)]),
    ("2 x torch.empty", lambda: (torch.empty_like(q), torch.empty(1, 8, 128, device="cuda"))),
    ("_stream(q)", lambda: flashattn._stream(q)),
    ("torch SDPA", lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q)),
]
for label, fn in steps:
    print(f"{label:34}: {per_call(fn):7.1f} us of host time per call")
