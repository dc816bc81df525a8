"""flashattn inside a plain PyTorch module: a causal self-attention block with grouped-query
attention, one training step (gradients through flashattn's backward) and a check of the
output and the gradients against the same block on PyTorch's SDPA.

    python3 examples/torch_module.py [--device cuda]
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

from flashattn import flash_attn_func


class SelfAttention(nn.Module):
    def __init__(self, dim, heads, heads_kv, use_flashattn=True):
        super().__init__()
        self.heads, self.heads_kv, self.head_dim = heads, heads_kv, dim // heads
        self.qkv = nn.Linear(dim, (heads + 2 * heads_kv) * self.head_dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.use_flashattn = use_flashattn

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split(
            [self.heads * self.head_dim, self.heads_kv * self.head_dim, self.heads_kv * self.head_dim], dim=-1)
        q = q.view(b, s, self.heads, self.head_dim)
        k = k.view(b, s, self.heads_kv, self.head_dim)
        v = v.view(b, s, self.heads_kv, self.head_dim)
        if self.use_flashattn:
            o = flash_attn_func(q, k, v, causal=True)  # bshd in, bshd out
        else:
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True, enable_gqa=True).transpose(1, 2)
        return self.proj(o.reshape(b, s, -1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    ours = SelfAttention(1024, 16, 4).to(args.device, dtype)
    ref = SelfAttention(1024, 16, 4, use_flashattn=False).to(args.device, dtype)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(4, 777, 1024, device=args.device, dtype=dtype)
    for m in (ours, ref):
        m(x).float().square().mean().backward()
    out, want = ours(x).float(), ref(x).float()
    rel = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
    print(f"output rel-L2 {rel(out, want):.2e}")
    for (name, p), (_, pr) in zip(ours.named_parameters(), ref.named_parameters()):
        print(f"grad {name} rel-L2 {rel(p.grad.float(), pr.grad.float()):.2e}")
        assert rel(p.grad.float(), pr.grad.float()) < 2e-2
    assert rel(out, want) < 2e-2
    opt = torch.optim.AdamW(ours.parameters(), lr=1e-3)
    opt.step()
    print("one optimiser step done")


if __name__ == "__main__":
    main()
