"""The FP8 tests' reference and tolerance (PyTorch, float64), shared by test_fp8_cpu.py and
test_fp8_cuda.py.

The reference is exact attention of the dequantised inputs (``x * descale``, exact in
float64). The tolerance is the library's FP8 tolerance (src/fp8/reference.rs derives it):
the GPU kernel rounds P to e4m3 for P V (at most half an e4m3 ulp per weight, ``b_j``), its
S = Q K^T sums keep about 2^-12 of each logit's size (``c_j``), and o is rounded to bf16.
With those:

- o: ``||o~ - o||_2 <= 2 ||n||_2``, n being each element's rms rounding noise
  ``sqrt((sum_j b_j^2 (v_jc - o_c)^2 / P^2 + (2^-8 o_c)^2) / 3)`` (P = sum_j p_j, p_j =
  exp(s_j - max)): a correct kernel measures 0.7-0.85, a wrong descale or a permuted P far
  more;
- o, each element (worst case): ``|o~_c - o_c| <= sum_j (b_j + c_j)(|v_jc| + |o_c|) / (P - B)
  + 2^-8 |o_c|`` with ``B = sum_j (b_j + c_j)`` (the library's bound with |v_jc - o_c|
  bounded by |v_jc| + |o_c|);
- lse: ``|lse~ - lse| <= -ln(1 - B / P) + 2e-3``; -inf for rows that see no key.

The CPU backend does not quantise P (it dequantises the inputs and runs in f32), so its o
is also held to bf16's rounding, ``|o~ - o| <= 2^-8 |o| + 1e-5`` element by element.
"""

import math

import torch

E4M3_MIN_NORMAL = 2.0**-6
NOISE_RATIO_MAX = 2.0
S_ERROR = 2.0**-12
LSE_F32 = 2e-3


def quantise(x, descale, heads):
    """float ``x`` ``[b, s, h, d]`` as float8_e4m3fn with the given descale (None, a float,
    or a tensor of one element or ``(batch, heads_kv)``), so that ``fp8 * descale`` is
    about x; codes that round to 0 are made the smallest normal of x's sign (inputs are
    never zero)."""
    d = expand(descale, heads, x.shape[0], x.device, torch.float32)
    y = (x.float() / d).to(torch.float8_e4m3fn)
    tiny = torch.full_like(x, E4M3_MIN_NORMAL).copysign(x).to(torch.float8_e4m3fn)
    return torch.where(y.float() == 0, tiny, y)


def expand(descale, heads, batch, device, dtype=torch.float64):
    """A descale as a factor that broadcasts against ``[b, s, heads, d]``: query heads take
    their kv head's factor (``h // (heads / heads_kv)``)."""
    if descale is None:
        return torch.ones((), dtype=dtype, device=device)
    d = torch.as_tensor(descale, dtype=dtype).to(device)
    if d.dim() == 2:
        d = d.repeat_interleave(heads // d.shape[1], dim=1)
        return d.reshape(batch, 1, heads, 1)
    return d.reshape(())


def dequantise(x, descale, heads):
    return x.to(torch.float64) * expand(descale, heads, x.shape[0], x.device)


def reference(q, k, v, q_descale=None, k_descale=None, v_descale=None, scale=None,
              causal=False, window=(-1, -1), softcap=0.0, slopes=None):
    """Exact attention (float64, on the inputs' device) of the dequantised FP8 inputs, with
    FlashAttention-2's semantics. Returns a dict: o ``[b, sq, hq, d]``, lse ``[b, hq, sq]``,
    and what the tolerance needs: p (``exp(s - max)``, ``[b, hq, sq, sk]``), big_p (its row
    sums), logits (each score's size ``scale * sum_c |q_c k_c|``), v (per query head,
    ``[b, hq, sk, d]``)."""
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    qf = dequantise(q, q_descale, hq).transpose(1, 2)
    kf = dequantise(k, k_descale, hkv).repeat_interleave(g, dim=2).transpose(1, 2)
    vf = dequantise(v, v_descale, hkv).repeat_interleave(g, dim=2).transpose(1, 2)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    s = qf @ kf.transpose(-1, -2) * scale
    logits = qf.abs() @ kf.abs().transpose(-1, -2) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    center = i + sk - sq
    if slopes is not None:
        sl = torch.as_tensor(slopes, dtype=torch.float64).to(q.device)
        sl = sl.reshape(-1 if sl.dim() == 2 else 1, hq, 1, 1)
        s = s - sl * (center - j).abs()
    visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        visible &= j <= center
    if window[0] >= 0:
        visible &= j >= center - window[0]
    if window[1] >= 0:
        visible &= j <= center + window[1]
    s = s.masked_fill(~visible, -math.inf)
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    big_p = p.sum(-1, keepdim=True)
    o = torch.where(big_p > 0, (p @ vf) / big_p.clamp_min(1e-300), torch.zeros_like(qf))
    lse = torch.where(big_p[..., 0] > 0, m[..., 0] + torch.log(big_p[..., 0]), -math.inf)
    return dict(o=o.transpose(1, 2), lse=lse, p=p, big_p=big_p, logits=logits, v=vf,
                o_bhsd=o)


def judge(r, out, lse):
    """The FP8 tolerance (the module's docstring) of `out` (bf16 ``[b, sq, hq, d]``) and
    `lse` against reference `r`. Returns (problems, numbers): an empty list passes."""
    p, big_p, vf, o = r["p"], r["big_p"], r["v"], r["o_bhsd"]
    half_ulp = torch.exp2(torch.floor(torch.log2(p.clamp_min(1e-300))) - 4)
    bj = torch.where(p >= E4M3_MIN_NORMAL, half_ulp, p.clamp(max=2.0**-10))
    b2 = bj * bj
    var = b2 @ (vf * vf) - 2 * o * (b2 @ vf) + o * o * b2.sum(-1, keepdim=True)
    bf16 = o.abs() / 256
    safe_p = torch.where(big_p > 0, big_p, torch.ones_like(big_p))  # rows with no key: p = 0
    noise = torch.sqrt((var.clamp_min(0) / safe_p**2 + bf16 * bf16) / 3)
    got = out.to(torch.float64).transpose(1, 2).to(o.device)
    problems = []
    if not torch.isfinite(got).all():
        problems.append("o has non-finite values")
    err = (got - o).norm().item()
    ratio = err / max(noise.norm().item(), 1e-300)
    rel = err / max(o.norm().item(), 1e-300)
    if not ratio <= NOISE_RATIO_MAX:  # NaN fails too
        problems.append(f"o: error {ratio:.2f} x its rounding noise (at most {NOISE_RATIO_MAX})")
    w = bj + p * S_ERROR * r["logits"]
    big_b = w.sum(-1)
    # The worst case of each element, with |v_jc - o_c| <= |v_jc| + |o_c| (a little looser
    # than the library's, so never tighter): sum_j w_j |v_jc - o_c| / (P - B) + 2^-8 |o_c|.
    spare = big_p - big_b[..., None]
    worst = (w @ vf.abs() + o.abs() * big_b[..., None]) / torch.where(spare > 0, spare, 1.0)
    allow_o = torch.where(spare > 0, worst, torch.inf) + bf16
    used_o = ((got - o).abs() / allow_o.clamp_min(1e-300)).max().item()
    if not used_o <= 1:
        problems.append(f"o: an element {used_o:.2f} x its worst-case FP8 bound")
    room = (1 - big_b / safe_p[..., 0]).clamp_min(1e-300)
    allow = -torch.log(room) + LSE_F32
    seen = big_p[..., 0] > 0
    lse = lse.to(torch.float64).to(o.device)
    lse_err = (lse - r["lse"]).abs()
    lse_used = (lse_err / allow)[seen].max().item() if seen.any() else 0.0
    if not torch.all(lse[~seen] == -torch.inf):
        problems.append("lse of rows that see no key is not -inf")
    if not lse_used <= 1:
        problems.append(f"lse: {lse_used:.2f} x its allowance")
    return problems, dict(noise_ratio=ratio, rel_l2=rel, o_allow_used=used_o,
                          lse_allow_used=lse_used)


def close_to_bf16_rounding(out, r):
    """The CPU backend's bound: o within bf16's rounding (2^-8 relative) plus 1e-5."""
    got = out.to(torch.float64).to(r["o"].device)
    bound = r["o"].abs() / 256 + 1e-5
    excess = ((got - r["o"]).abs() / bound).max().item()
    assert excess <= 1, f"o beyond bf16 rounding: {excess:.2f} x the bound"
