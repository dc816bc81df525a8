"""FlashAttention-2's ``flash_attn_with_kvcache`` written out in PyTorch, as its own test
(tests/test_flash_attn.py, test_flash_attn_kvcache) states the semantics: the reference the
CPU and CUDA tests compare flashattn with. Plain float32 math on any device; slow and simple.

- ``cache_batch_idx``: batch entry b uses cache sequence ``cache_batch_idx[b]``;
- ``block_table``: a sequence's keys are its pages in order;
- new rows ``k``, ``v`` go to rows ``cache_seqlens[b]..`` of the sequence, k rotated first at
  positions ``cache_seqlens[b] + t``;
- q is rotated at ``cache_seqlens[b] + i`` (causal or a local window) or ``cache_seqlens[b]``;
- sequence b attends to rows ``cache_leftpad[b] .. cache_seqlens[b] + seqlen_new``, causal and
  windows aligned to the end of that range (bottom right); rows that see no key give 0.
"""

import math

import torch


def apply_rotary(x, cos, sin, pos, interleaved):
    """x ``[..., rows, heads, d]`` with row r at table row ``pos[..., r]``: its first
    ``rotary_dim = 2 * cos.shape[1]`` channels rotated in float32, pairs ``(2k, 2k + 1)``
    (interleaved) or ``(k, k + rotary_dim / 2)``; the rest as they are."""
    rd = 2 * cos.shape[1]
    c = cos[pos].float().unsqueeze(-2)  # [..., rows, 1, rd / 2]
    s = sin[pos].float().unsqueeze(-2)
    xr = x[..., :rd].float()
    if interleaved:
        x0, x1 = xr[..., 0::2], xr[..., 1::2]
        y = torch.stack([x0 * c - x1 * s, x1 * c + x0 * s], dim=-1).flatten(-2)
    else:
        x0, x1 = xr[..., : rd // 2], xr[..., rd // 2 :]
        y = torch.cat([x0 * c - x1 * s, x1 * c + x0 * s], dim=-1)
    return torch.cat([y.to(x.dtype), x[..., rd:]], dim=-1)


def kvcache_reference(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                      cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None,
                      block_table=None, softmax_scale=None, causal=False, window_size=(-1, -1),
                      rotary_interleaved=True):
    """(out float32 like q, k_cache, v_cache after the call): the inputs are not modified."""
    b, sq, hq, d = q.shape
    dev = q.device
    if block_table is not None:
        table = block_table.long()
        kc = k_cache[table].flatten(1, 2).clone()  # [batch, max_blocks * page, heads_kv, d]
        vc = v_cache[table].flatten(1, 2).clone()
    else:
        idx = torch.arange(b, device=dev) if cache_batch_idx is None else cache_batch_idx.long()
        kc, vc = k_cache[idx].clone(), v_cache[idx].clone()
    cap, hkv = kc.shape[1], kc.shape[2]
    sn = 0 if k is None else k.shape[1]
    if torch.is_tensor(cache_seqlens):
        lens = cache_seqlens.long()
    else:
        every = cap - sn if cache_seqlens is None else cache_seqlens
        lens = torch.full((b,), every, device=dev, dtype=torch.long)
    rows = torch.arange(max(sn, sq), device=dev)
    if k is not None:
        if rotary_cos is not None:
            pos = lens[:, None] + rows[None, :sn]
            k = apply_rotary(k, rotary_cos, rotary_sin, pos, rotary_interleaved)
        for bb in range(b):
            n = int(lens[bb])
            kc[bb, n : n + sn], vc[bb, n : n + sn] = k[bb], v[bb]
    left, right = window_size
    if rotary_cos is not None:
        per_row = causal or 0 <= left < cap or 0 <= right < cap
        pos = lens[:, None] + (rows[None, :sq] if per_row else 0 * rows[None, :sq])
        q = apply_rotary(q, rotary_cos, rotary_sin, pos, rotary_interleaved)
    scale = softmax_scale if softmax_scale is not None else 1 / math.sqrt(d)
    out = torch.zeros(b, sq, hq, d, device=dev, dtype=torch.float32)
    for bb in range(b):
        start = 0 if cache_leftpad is None else int(cache_leftpad[bb])
        end = int(lens[bb]) + sn
        keys = kc[bb, start:end].float().repeat_interleave(hq // hkv, dim=1)  # [sk, hq, d]
        vals = vc[bb, start:end].float().repeat_interleave(hq // hkv, dim=1)
        sk = end - start
        s = torch.einsum("ihd,jhd->hij", q[bb].float(), keys) * scale
        i = torch.arange(sq, device=dev)[:, None]
        j = torch.arange(sk, device=dev)[None, :]
        center = i + sk - sq
        visible = torch.ones(sq, sk, dtype=torch.bool, device=dev)
        if causal:
            visible &= j <= center
        if left >= 0:
            visible &= j >= center - left
        if right >= 0:
            visible &= j <= center + right
        s = s.masked_fill(~visible, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows that see no key: 0
        out[bb] = torch.einsum("hij,jhd->ihd", p, vals)
    k_after, v_after = k_cache.clone(), v_cache.clone()
    if block_table is not None:
        page = k_cache.shape[1]
        for bb in range(b):
            for c, blk in enumerate(block_table[bb].long().tolist()):
                k_after[blk] = kc[bb, c * page : (c + 1) * page]
                v_after[blk] = vc[bb, c * page : (c + 1) * page]
    else:
        idx = range(b) if cache_batch_idx is None else cache_batch_idx.long().tolist()
        for bb, c in enumerate(idx):
            k_after[c], v_after[c] = kc[bb], vc[bb]
    return out, k_after, v_after
