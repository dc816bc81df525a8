#!/usr/bin/env python3
"""Run one SDPA backend a few times on one bench shape, for ncu to profile its kernels.

  python3 scripts/device/sdpa-once.py BACKEND HEAD_DIM SEQLEN CAUSAL(0|1) [CALLS] [f16|bf16] [fwd|bwd]

With `bwd`, each call is a forward and its backward (a random dO).

The bench's shapes: batch * seqlen = 16384 tokens, heads * head_dim = 2048, f16 (or bf16),
bshd tensors viewed as [b, h, s, d] (as the bench's peers.py does).
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

backend, d, s, causal = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
calls = int(sys.argv[5]) if len(sys.argv) > 5 else 3
dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[sys.argv[6] if len(sys.argv) > 6 else "f16"]
b, h = 16384 // s, 2048 // d
bwd = len(sys.argv) > 7 and sys.argv[7] == "bwd"
q, k, v = (torch.randn(b, s, h, d, dtype=dtype, device="cuda").transpose(1, 2).requires_grad_(bwd) for _ in range(3))
be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
torch.cuda.synchronize()
with sdpa_kernel(be):
    for _ in range(calls):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        if bwd:
            o.backward(torch.randn_like(o))
torch.cuda.synchronize()
print(f"{backend} {dtype} d{d} s{s} causal {causal}: {calls} calls done")
