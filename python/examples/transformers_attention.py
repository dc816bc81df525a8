"""flashattn as the attention of a Hugging Face transformers model.

Registers `flash_attn_func` under the name "rsattn" (AttentionInterface.register; transformers
reads any name with "flash" in it as a kernel to fetch from its hub), builds a
small Llama-architecture model with random weights (no download), and runs the same inputs
through the model's own SDPA attention and through ours; prints the largest difference of the
logits and exits non-zero when they differ by more than fp16 tolerance.

    python3 examples/transformers_attention.py [--device cuda] [--dtype float16]

Limits of this adapter: batches without padding (the attention mask is not read: padded
batches need the variable-length function, not wired here); no dropout.
"""

import argparse
import sys

import torch
from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM

from flashattn import flash_attn_func


NAME = "rsattn"


def flashattn_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                        sliding_window=None, softcap=None, **kwargs):
    """transformers' attention signature: query [batch, heads, seqlen, head_dim] (key, value
    with heads_kv), returns ([batch, seqlen, heads, head_dim], no weights)."""
    if dropout:
        raise NotImplementedError("flashattn has no dropout; call model.eval()")
    # bshd views of the same memory (no copy)
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))
    causal = bool(getattr(module, "is_causal", True)) and q.shape[1] > 1
    window = (sliding_window - 1, 0) if sliding_window else (-1, -1)
    out = flash_attn_func(q, k, v, softmax_scale=scaling, causal=causal, window_size=window,
                          softcap=softcap or 0.0)
    return out, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--seqlen", type=int, default=333)
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    AttentionInterface.register(NAME, flashattn_attention)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1000, hidden_size=512, intermediate_size=1024,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                         max_position_embeddings=4096)
    model = LlamaForCausalLM(config).to(args.device, dtype).eval()
    ids = torch.randint(0, config.vocab_size, (2, args.seqlen), device=args.device)
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        want = model(ids).logits.float()
        model.set_attn_implementation(NAME)
        got = model(ids).logits.float()
    diff = (got - want).abs().max().item()
    scale = want.abs().max().item()
    tol = 2e-2 * max(scale, 1.0) if dtype == torch.float16 else 5e-2 * max(scale, 1.0)
    print(f"logits {tuple(got.shape)} {args.dtype}: max |flashattn - sdpa| = {diff:.3e} "
          f"(max |logit| {scale:.2f}, tolerance {tol:.2e})")
    # Greedy decoding of a few tokens through our attention (KV cache: seqlen_q = 1 steps).
    with torch.no_grad():
        out = model.generate(ids[:1, :32], max_new_tokens=8, do_sample=False)
    print("generated", out[0, 32:].tolist())
    sys.exit(0 if diff <= tol else 1)


if __name__ == "__main__":
    main()
