"""The calls of ``flash_attn_with_kvcache`` with rotary embeddings, ``cache_batch_idx`` and
``cache_leftpad`` that the CPU and CUDA tests run against :mod:`kvcache_reference`, and the
comparison: one place for both devices."""

import torch

from kvcache_reference import kvcache_reference

# name: (layout, rotary (dim, interleaved) or None, causal, window, cache_batch_idx, leftpad, new)
CASES = {
    "rotary-causal": ("contiguous", (16, False), True, (-1, -1), False, False, 2),
    "rotary-interleaved-uniform": ("contiguous", (32, True), False, (-1, -1), False, False, 2),
    "rotary-local-window": ("contiguous", (16, True), False, (8, 2), False, False, 1),
    "rotary-paged": ("paged", (32, False), True, (-1, -1), False, False, 3),
    "rotary-paged-interleaved-uniform": ("paged", (16, True), False, (-1, -1), False, False, 1),
    "batch-idx-permutation": ("contiguous", None, True, (-1, -1), True, False, 2),
    "batch-idx-repeat": ("contiguous", None, False, (-1, -1), "repeat", False, 0),
    "leftpad": ("contiguous", None, True, (-1, -1), False, True, 2),
    "everything": ("contiguous", (32, False), True, (-1, -1), True, True, 2),
}


def make_call(name, device, dtype, seed=0, b=3, sq=2, hq=8, hkv=2, d=32, cap=64):
    """The arguments of case `name` as keyword arguments of flash_attn_with_kvcache (caches
    fresh random tensors), on `device`."""
    layout, rotary, causal, window, batch_idx, leftpad, new = CASES[name]
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    def ints(x):
        return torch.tensor(x, dtype=torch.int32, device=device)

    lens = torch.randint(0, cap - new + 1, (b,), generator=g).tolist()
    lens[0] = cap - new  # one sequence full after the call
    kw = dict(q=rand(b, sq, hq, d), causal=causal, window_size=window)
    cache_batch = b
    if batch_idx == "repeat":
        kw["cache_batch_idx"] = ints([1, 1] + [0] * (b - 2))
        lens[1] = lens[0]  # two entries of one cache sequence, one length apart below
        lens[0] = max(lens[0] - 5, 0)
        cache_batch = 2
    elif batch_idx:
        cache_batch = b + 2
        kw["cache_batch_idx"] = ints(torch.randperm(cache_batch, generator=g)[:b].tolist())
    if leftpad:
        pads = [int(torch.randint(0, n + 1, (1,), generator=g)) for n in lens]
        pads[-1] = lens[-1]  # a sequence of only its new rows
        kw["cache_leftpad"] = ints(pads)
    if layout == "paged":
        page = 16
        per_seq = -(-cap // page)  # pages per sequence: capacity cap rounded up
        nblocks = b * per_seq + 2
        kw["k_cache"], kw["v_cache"] = rand(nblocks, page, hkv, d), rand(nblocks, page, hkv, d)
        perm = torch.randperm(nblocks, generator=g)[: b * per_seq]
        kw["block_table"] = perm.view(b, per_seq).to(device=device, dtype=torch.int32)
    else:
        kw["k_cache"], kw["v_cache"] = rand(cache_batch, cap, hkv, d), rand(cache_batch, cap, hkv, d)
    if new:
        kw["k"], kw["v"] = rand(b, new, hkv, d), rand(b, new, hkv, d)
    if rotary is not None:
        dim, interleaved = rotary
        angle = torch.rand(cap + 5, dim // 2, generator=g) * 2 * torch.pi
        kw["rotary_cos"] = angle.cos().to(device=device, dtype=dtype)
        kw["rotary_sin"] = angle.sin().to(device=device, dtype=dtype)
        kw["rotary_interleaved"] = interleaved
    kw["cache_seqlens"] = ints(lens)
    return kw


def rel_l2(got, want):
    got, want = got.float(), want.float()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def check_call(flash_attn_with_kvcache, kw, tol, label):
    """Runs the call on copies of the caches, compares out with the reference (relative L2
    below `tol`) and the caches after the call (the appended rows within rounding of the
    element type: rotated keys round apart by an ulp at most). Returns (out, k_cache,
    v_cache)."""
    want, want_k, want_v = kvcache_reference(**{n: x for n, x in kw.items() if n != "num_splits"})
    call = dict(kw, k_cache=kw["k_cache"].clone(), v_cache=kw["v_cache"].clone())
    out = flash_attn_with_kvcache(**call)
    assert out.shape == kw["q"].shape and torch.isfinite(out).all(), label
    err = rel_l2(out, want)
    assert err < tol, f"{label}: rel-L2 {err:.3e}"
    step = 2 ** -7 if kw["q"].dtype == torch.bfloat16 else 2 ** -10
    for got, ref, what in ((call["k_cache"], want_k, "k_cache"), (call["v_cache"], want_v, "v_cache")):
        diff = (got.float() - ref.float()).abs()
        bound = step * torch.maximum(got.float().abs(), ref.float().abs()) + 1e-6
        assert (diff <= bound).all(), f"{label}: {what} after the call, max diff {float(diff.max()):.3e}"
    return out, call["k_cache"], call["v_cache"]
