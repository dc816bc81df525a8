"""The Python package on the CPU with NumPy inputs, against an independent float64 reference
written here with FlashAttention-2's semantics, and against the library's own f64 oracle."""

import math

import numpy as np
import pytest

import flashattn
from flashattn import _native


def reference(q, k, v, scale=None, causal=False, window=(-1, -1), softcap=0.0, slopes=None,
              with_lse=False):
    """Attention in float64, FA2 semantics (bottom-right causal and window, softcap, ALiBi);
    with `with_lse` also the log-sum-exp of each row's scaled scores [batch, heads, seqlen_q]
    (-inf where a row sees no key)."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    g = hq // hkv
    out = np.zeros_like(q)
    lse = np.full((b, hq, sq), -np.inf)
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    center = i + sk - sq
    visible = np.ones((sq, sk), dtype=bool)
    if causal:
        visible &= j <= center
    left, right = window
    if left >= 0:
        visible &= j >= center - left
    if right >= 0:
        visible &= j <= center + right
    for bb in range(b):
        for h in range(hq):
            s = q[bb, :, h] @ k[bb, :, h // g].T * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            if slopes is not None:
                sl = slopes[bb, h] if slopes.ndim == 2 else slopes[h]
                s = s - sl * np.abs(center - j)
            s = np.where(visible, s, -np.inf)
            m = s.max(axis=1, keepdims=True)
            m = np.where(np.isfinite(m), m, 0.0)
            p = np.exp(s - m)
            l = p.sum(axis=1, keepdims=True)
            out[bb, :, h] = np.where(l > 0, (p @ v[bb, :, h // g]) / np.where(l > 0, l, 1), 0)
            with np.errstate(divide="ignore"):
                lse[bb, h] = np.where(l[:, 0] > 0, m[:, 0] + np.log(l[:, 0]), -np.inf)
    return (out, lse) if with_lse else out


def inputs(b, sq, sk, hq, hkv, d, dtype=np.float16, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, sq, hq, d)).astype(dtype)
    k = rng.standard_normal((b, sk, hkv, d)).astype(dtype)
    v = rng.standard_normal((b, sk, hkv, d)).astype(dtype)
    return q, k, v


def close(out, want, dtype):
    tol = 2e-3 if dtype == np.float16 else 1e-5
    err = np.linalg.norm(out.astype(np.float64) - want) / max(np.linalg.norm(want), 1e-30)
    assert err <= tol, f"rel-L2 {err:.3e} > {tol:.0e}"


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 65, 65, 4, 4, 32), (1, 17, 100, 8, 2, 64), (1, 100, 17, 4, 1, 16)])
def test_flash_attn_func(dtype, causal, shape):
    q, k, v = inputs(*shape, dtype=dtype)
    out = flashattn.flash_attn_func(q, k, v, causal=causal)
    assert out.shape == q.shape and out.dtype == q.dtype
    close(out, reference(q, k, v, causal=causal), dtype)


def test_modifiers_scale_window_softcap_alibi():
    q, k, v = inputs(2, 77, 90, 4, 2, 32, seed=3)
    slopes = (2.0 ** -np.arange(1, 9)).reshape(2, 4).astype(np.float32)
    for kw in [
        dict(window_size=(16, 0), causal=True),
        dict(window_size=(-1, 5)),
        dict(softcap=30.0, softmax_scale=0.3),
        dict(alibi_slopes=slopes[0], causal=True),
        dict(alibi_slopes=slopes, window_size=(20, 20), softcap=50.0),
    ]:
        out = flashattn.flash_attn_func(q, k, v, **kw)
        want = reference(
            q,
            k,
            v,
            scale=kw.get("softmax_scale"),
            causal=kw.get("causal", False),
            window=kw.get("window_size", (-1, -1)),
            softcap=kw.get("softcap", 0.0),
            slopes=kw.get("alibi_slopes"),
        )
        close(out, want, np.float16)


def test_packed_forms_read_strided_views():
    q, k, v = inputs(2, 33, 33, 4, 4, 32, seed=5)
    qkv = np.stack([q, k, v], axis=2)
    want = reference(q, k, v, causal=True)
    close(flashattn.flash_attn_qkvpacked_func(qkv, causal=True), want, np.float16)
    kv = np.stack([k, v], axis=2)
    close(flashattn.flash_attn_kvpacked_func(q, kv, causal=True), want, np.float16)


def test_matches_the_library_oracle():
    q, k, v = inputs(1, 40, 50, 2, 1, 16, seed=7)
    o, _ = _native.reference(q, k, v, None, True)
    np.testing.assert_allclose(np.array(o).reshape(q.shape), reference(q, k, v, causal=True), atol=1e-12)


def test_unsupported_and_invalid_calls_raise():
    q, k, v = inputs(1, 8, 8, 2, 2, 16)
    with pytest.raises(flashattn.FlashAttnUnsupportedError, match="dropout"):
        flashattn.flash_attn_func(q, k, v, dropout_p=0.1)
    with pytest.raises(flashattn.FlashAttnError, match="4 dimensions|expected 4"):
        flashattn.flash_attn_func(q[0], k, v)
    with pytest.raises(flashattn.FlashAttnError, match="element type"):
        flashattn.flash_attn_func(q, k.astype(np.float32), v)
    with pytest.raises(flashattn.FlashAttnError, match="shapes disagree"):
        flashattn.flash_attn_func(q, k[..., :8], v)
    with pytest.raises(flashattn.FlashAttnError, match="window.*unbounded"):
        flashattn.flash_attn_func(q, k, v, window_size=(-2, 0))
    with pytest.raises(flashattn.FlashAttnError, match="window_size = None: expected a pair"):
        flashattn.flash_attn_func(q, k, v, window_size=None)
    with pytest.raises(flashattn.FlashAttnError, match=r"probability in \[0, 1\]"):
        flashattn.flash_attn_func(q, k, v, dropout_p=-0.1)
    with pytest.raises(flashattn.FlashAttnError, match="q is None"):
        flashattn.flash_attn_func(None, k, v)
    with pytest.raises(flashattn.FlashAttnError, match="softcap"):
        flashattn.flash_attn_func(q, k, v, softcap=-1.0)
    with pytest.raises(flashattn.FlashAttnError, match="alibi_slopes"):
        flashattn.flash_attn_func(q, k, v, alibi_slopes=np.ones(3, np.float32))
    with pytest.raises(flashattn.FlashAttnError, match="contiguous"):
        flashattn.flash_attn_func(np.asfortranarray(q), k, v)
    with pytest.raises(flashattn.FlashAttnError, match="DLPack"):
        flashattn.flash_attn_func([1, 2], k, v)


def test_varlen_against_each_sequence():
    lens_q, lens_k = [5, 0, 17, 1], [7, 3, 0, 40]
    cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    rng = np.random.default_rng(11)
    q = rng.standard_normal((cq[-1], 4, 16)).astype(np.float16)
    k = rng.standard_normal((ck[-1], 2, 16)).astype(np.float16)
    v = rng.standard_normal((ck[-1], 2, 16)).astype(np.float16)
    for kw in [dict(), dict(causal=True, window_size=(8, 0), softcap=30.0)]:
        out = flashattn.flash_attn_varlen_func(q, k, v, cq, ck, 17, 40, **kw)
        assert out.shape == q.shape
        for b in range(4):
            qb = q[cq[b] : cq[b + 1]][None]
            kb, vb = k[ck[b] : ck[b + 1]][None], v[ck[b] : ck[b + 1]][None]
            got = out[cq[b] : cq[b + 1]].astype(np.float64)
            if qb.shape[1] == 0:
                continue
            if kb.shape[1] == 0:
                assert np.all(got == 0)  # no keys: o = 0
                continue
            want = reference(
                qb,
                kb,
                vb,
                causal=kw.get("causal", False),
                window=kw.get("window_size", (-1, -1)),
                softcap=kw.get("softcap", 0.0),
            )[0]
            close(got, want, np.float16)
    with pytest.raises(flashattn.FlashAttnError, match="max_seqlen_q"):
        flashattn.flash_attn_varlen_func(q, k, v, cq, ck, 16, 40)
    with pytest.raises(flashattn.FlashAttnError, match="decreases"):
        bad = np.array([0, 5, 3, 22, 23], np.int32)
        flashattn.flash_attn_varlen_func(q, k, v, bad, ck, 17, 40)


def test_kvcache_contiguous_and_paged_with_appends():
    rng = np.random.default_rng(13)
    b, sq, hq, hkv, d, cap = 2, 2, 4, 2, 16, 64
    q = rng.standard_normal((b, sq, hq, d)).astype(np.float16)
    kc = rng.standard_normal((b, cap, hkv, d)).astype(np.float16)
    vc = rng.standard_normal((b, cap, hkv, d)).astype(np.float16)
    kn = rng.standard_normal((b, 3, hkv, d)).astype(np.float16)
    vn = rng.standard_normal((b, 3, hkv, d)).astype(np.float16)
    lens = np.array([30, 7], np.int32)
    # The same logical cache as 16-key pages in a shuffled pool.
    table = np.array([[5, 2, 7, 0], [1, 6, 3, 4]], np.int32)
    kp = np.zeros((8, 16, hkv, d), np.float16)
    vp = np.zeros((8, 16, hkv, d), np.float16)
    for bb in range(b):
        for c in range(4):
            kp[table[bb, c]] = kc[bb, c * 16 : (c + 1) * 16]
            vp[table[bb, c]] = vc[bb, c * 16 : (c + 1) * 16]
    for splits in (0, 3):
        kc2, vc2, kp2, vp2 = kc.copy(), vc.copy(), kp.copy(), vp.copy()
        a, la = flashattn.flash_attn_with_kvcache(
            q, kc2, vc2, kn, vn, cache_seqlens=lens, causal=True, num_splits=splits, return_softmax_lse=True
        )
        p = flashattn.flash_attn_with_kvcache(
            q, kp2, vp2, kn, vn, cache_seqlens=lens, block_table=table, causal=True, num_splits=splits
        )
        np.testing.assert_array_equal(a, p)
        assert la.shape == (b, hq, sq)
        for bb in range(b):
            n = lens[bb] + 3
            # The new rows were written in place.
            np.testing.assert_array_equal(kc2[bb, lens[bb] : n], kn[bb])
            want = reference(q[bb : bb + 1], kc2[bb : bb + 1, :n], vc2[bb : bb + 1, :n], causal=True)
            close(a[bb : bb + 1], want, np.float16)
    with pytest.raises(flashattn.FlashAttnError, match="rotary_sin"):
        flashattn.flash_attn_with_kvcache(q, kc, vc, rotary_cos=np.ones(1))
    with pytest.raises(flashattn.FlashAttnUnsupportedError, match="cache_batch_idx with a paged cache"):
        flashattn.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=lens, block_table=table,
                                          cache_batch_idx=np.array([1, 0], np.int32))
    with pytest.raises(flashattn.FlashAttnUnsupportedError, match="cache_leftpad with a paged cache"):
        flashattn.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=lens, block_table=table,
                                          cache_leftpad=np.array([1, 0], np.int32))
    with pytest.raises(flashattn.FlashAttnError, match="capacity"):
        flashattn.flash_attn_with_kvcache(q, kc.copy(), vc.copy(), kn, vn, cache_seqlens=62)
    with pytest.raises(flashattn.FlashAttnError, match="outside the pool"):
        flashattn.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=lens, block_table=table + 8)
    with pytest.raises(flashattn.FlashAttnError, match="share memory"):
        flashattn.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=lens)


def test_memory_rules():
    """What the call writes must be writable and share memory with nothing else; read-only
    inputs are fine; misaligned data and transposed slopes are refused (new-user trial)."""
    rng = np.random.default_rng(17)
    b, hq, hkv, d = 2, 2, 2, 16
    q = rng.standard_normal((b, 2, hq, d)).astype(np.float16)
    kc = rng.standard_normal((b, 32, hkv, d)).astype(np.float16)
    vc = rng.standard_normal((b, 32, hkv, d)).astype(np.float16)
    kn = rng.standard_normal((b, 1, hkv, d)).astype(np.float16)
    with pytest.raises(flashattn.FlashAttnError, match="share memory"):
        flashattn.flash_attn_with_kvcache(kc[:, :2, :, :].copy(), kc, kc, cache_seqlens=3)
    with pytest.raises(flashattn.FlashAttnError, match="share memory"):
        alias = vc.reshape(-1)[: b * hkv * d].reshape(b, 1, hkv, d)  # compact, inside v_cache
        flashattn.flash_attn_with_kvcache(q, kc, vc, kn, alias, cache_seqlens=3)
    with pytest.raises(flashattn.FlashAttnError, match="share memory"):
        flashattn.flash_attn_with_kvcache(kc.reshape(-1)[: q.size].reshape(q.shape), kc, vc, cache_seqlens=3)
    version = tuple(int(x) for x in np.__version__.split(".")[:2])
    if version >= (2, 1):  # read-only arrays export through DLPack 1.0 only
        ro = q.copy()
        ro.flags.writeable = False
        out = flashattn.flash_attn_func(ro, ro, ro)
        close(out, reference(q, q, q), np.float16)
        kro = kc.copy()
        kro.flags.writeable = False
        with pytest.raises(flashattn.FlashAttnError, match="read-only"):
            flashattn.flash_attn_with_kvcache(q, kro, vc.copy(), kn, kn.copy(), cache_seqlens=3)
        assert np.array_equal(kro, kc)
    buf = np.zeros(2 * 4 * 2 * 8 * 4 + 1, np.uint8)
    mis = np.frombuffer(buf.data, np.float32, count=2 * 4 * 2 * 8, offset=1).reshape(2, 4, 2, 8)
    with pytest.raises(flashattn.FlashAttnError, match="aligned"):
        flashattn.flash_attn_func(mis, mis, mis)
    slopes = np.ones((hq, b), np.float32)
    with pytest.raises(flashattn.FlashAttnError, match="alibi_slopes has shape"):
        flashattn.flash_attn_func(q, q, q, alibi_slopes=slopes[:, :1].T.copy().T)
    with pytest.raises(flashattn.FlashAttnError, match="num_splits"):
        flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=3, num_splits=-1)
    with pytest.raises(flashattn.FlashAttnError, match="is 0|ZeroDim|zero|0"):
        flashattn.flash_attn_func(q[:0], q[:0], q[:0])
    with pytest.raises(flashattn.FlashAttnError, match="DLPack"):
        flashattn.flash_attn_with_kvcache([1], kc, vc)


def reference_grad(q, k, v, do, scale=None, causal=False):
    """dq, dk, dv of attention in float64 (FA2 semantics; dk, dv summed over each kv head's
    query heads), written out from the softmax's derivative."""
    q, k, v, do = (x.astype(np.float64) for x in (q, k, v, do))
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    g = hq // hkv
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    visible = np.ones((sq, sk), dtype=bool)
    if causal:
        visible &= np.arange(sk)[None, :] <= np.arange(sq)[:, None] + sk - sq
    for bb in range(b):
        for h in range(hq):
            kh, vh = k[bb, :, h // g], v[bb, :, h // g]
            s = np.where(visible, q[bb, :, h] @ kh.T * scale, -np.inf)
            m = s.max(axis=1, keepdims=True)
            p = np.exp(s - np.where(np.isfinite(m), m, 0.0))
            l = p.sum(axis=1, keepdims=True)
            p = np.where(l > 0, p / np.where(l > 0, l, 1), 0)
            o, g_o = p @ vh, do[bb, :, h]
            dv[bb, :, h // g] += p.T @ g_o
            ds = p * (g_o @ vh.T - (g_o * o).sum(axis=1, keepdims=True))
            dq[bb, :, h] = ds @ kh * scale
            dk[bb, :, h // g] += ds.T @ q[bb, :, h] * scale
    return dq, dk, dv


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 37, 53, 4, 2, 64), (1, 64, 29, 2, 1, 40)])
def test_backward_against_reference(causal, shape):
    b, sq, sk, hq, hkv, d = shape
    q, k, v = inputs(*shape, dtype=np.float32, seed=7)
    do = np.random.default_rng(8).standard_normal((b, sq, hq, d)).astype(np.float32)
    out = np.empty_like(q)
    lse = np.empty((b, hq, sq), np.float32)
    _native.forward(q, k, v, out, lse, None, causal, -1, -1, 0.0, None)
    grads = [np.full_like(x, np.nan) for x in (q, k, v)]
    ran = _native.backward(q, k, v, out, lse, do, *grads, None, causal, -1, -1, 0.0, None, False)
    assert ran.startswith("cpu")
    for got, want in zip(grads, reference_grad(q, k, v, do, causal=causal)):
        close(got, want, np.float32)


def test_backward_rejects_bad_gradients():
    q, k, v = inputs(1, 8, 8, 2, 2, 64, dtype=np.float32)
    out = np.empty_like(q)
    lse = np.empty((1, 2, 8), np.float32)
    _native.forward(q, k, v, out, lse, None, False, -1, -1, 0.0, None)
    do = np.ones_like(out)
    dq, dk, dv = (np.empty_like(x) for x in (q, k, v))
    with pytest.raises(flashattn.FlashAttnError, match="dk has shape"):
        _native.backward(q, k, v, out, lse, do, dq, np.empty((1, 8, 1, 64), np.float32), dv,
                         None, False, -1, -1, 0.0, None, False)
    with pytest.raises(flashattn.FlashAttnError, match="dout has shape"):
        _native.backward(q, k, v, out, lse, do[:, :4], dq, dk, dv,
                         None, False, -1, -1, 0.0, None, False)
    with pytest.raises(flashattn.FlashAttnError, match="share memory"):
        _native.backward(q, k, v, out, lse, do, dq, dk, dk,
                         None, False, -1, -1, 0.0, None, False)


def test_nvrtc_from_the_wheel_without_ld_library_path():
    # scripts/test.sh names the folder where pip put the nvidia-cuda-nvrtc wheel; the package
    # must find NVRTC there through Python's path alone, as after `pip install`.
    site = __import__("os").environ.get("FLASHATTN_TEST_NVRTC_SITE")
    if not site:
        pytest.skip("FLASHATTN_TEST_NVRTC_SITE not set (scripts/test.sh sets it)")
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env["PYTHONPATH"] = site
    code = "import flashattn; print(flashattn._native.nvrtc_version())"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "(13, 0)", r.stdout


# ---- FlashAttention-2 compatibility (issue 42): code written for flash_attn runs unchanged ----

# FlashAttention-2's public functions (flash_attn/flash_attn_interface.py, v2.6-2.8): every
# parameter in order, with its default (None where there is none).
_TAIL = [
    ("dropout_p", 0.0), ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
    ("softcap", 0.0), ("alibi_slopes", None), ("deterministic", False),
    ("return_attn_probs", False),
]
_VARLEN = [("cu_seqlens_q", None), ("cu_seqlens_k", None), ("max_seqlen_q", None), ("max_seqlen_k", None)]
# FlashAttention-3's FP8 descales, after FA2's arguments (test_fp8_cpu.py tests them).
_FP8 = [("q_descale", None), ("k_descale", None), ("v_descale", None)]
FA2_SIGNATURES = {
    "flash_attn_func": [("q", None), ("k", None), ("v", None), *_TAIL, *_FP8],
    "flash_attn_qkvpacked_func": [("qkv", None), *_TAIL, *_FP8],
    "flash_attn_kvpacked_func": [("q", None), ("kv", None), *_TAIL, *_FP8],
    "flash_attn_varlen_func": [("q", None), ("k", None), ("v", None), *_VARLEN, *_TAIL, ("block_table", None)],
    "flash_attn_varlen_qkvpacked_func": [("qkv", None), ("cu_seqlens", None), ("max_seqlen", None), *_TAIL],
    "flash_attn_varlen_kvpacked_func": [("q", None), ("kv", None), *_VARLEN, *_TAIL],
    "flash_attn_with_kvcache": [
        ("q", None), ("k_cache", None), ("v_cache", None), ("k", None), ("v", None),
        ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None),
        ("cache_batch_idx", None), ("cache_leftpad", None), ("block_table", None),
        ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)), ("softcap", 0.0),
        ("rotary_interleaved", True), ("alibi_slopes", None), ("num_splits", 0),
        ("return_softmax_lse", False),
    ],
}


# flashattn's own arguments after FA2's: keyword only, so that no FA2 call changes meaning.
EXTENSIONS = {name: [("learnable_sink", None), ("s_aux", None)] for name in FA2_SIGNATURES}


def test_signatures_are_flash_attn_2s():
    import inspect

    for name, want in FA2_SIGNATURES.items():
        assert name in flashattn.__all__, name
        params = list(inspect.signature(getattr(flashattn, name)).parameters.values())
        got = [(p.name, None if p.default is inspect.Parameter.empty else p.default) for p in params]
        extra = EXTENSIONS.get(name, [])
        assert got == want + extra, name
        fa2, ours = params[: len(want)], params[len(want):]
        assert all(p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD for p in fa2), name
        assert all(p.kind == inspect.Parameter.KEYWORD_ONLY for p in ours), name


def varlen_inputs(lens_q, lens_k, hq=4, hkv=2, d=16, seed=11, dtype=np.float16):
    cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((cq[-1], hq, d)).astype(dtype)
    k = rng.standard_normal((ck[-1], hkv, d)).astype(dtype)
    v = rng.standard_normal((ck[-1], hkv, d)).astype(dtype)
    return q, k, v, cq, ck


def test_native_varlen_offsets_are_lists_or_device_tensors():
    """The native varlen calls take the offsets as host lists (validated), or both as tensors
    with max_seqlen_q/k (read on the device: a CPU call refuses them by name); mixing the two,
    or tensors without max_seqlen, is refused with the package's error."""
    q, k, v, cq, ck = varlen_inputs([5, 30], [7, 40])
    out = np.empty_like(q)
    lse = np.empty((q.shape[1], q.shape[0]), np.float32)
    args = (None, False, -1, -1, 0.0, None)
    _native.varlen_forward(q, k, v, out, lse, cq.tolist(), ck.tolist(), *args)
    want = flashattn.flash_attn_varlen_func(q, k, v, cq, ck, 30, 40)
    np.testing.assert_array_equal(out, want)
    for bad, match in (
        ((cq.tolist(), ck), "pass both as lists"),
        ((cq, ck), "need max_seqlen_q and max_seqlen_k"),
    ):
        with pytest.raises(flashattn.FlashAttnError, match=match):
            _native.varlen_forward(q, k, v, out, lse, *bad, *args)
    with pytest.raises(flashattn.FlashAttnError, match="read on the device, but q is on the CPU"):
        _native.varlen_forward(q, k, v, out, lse, cq, ck, *args, max_seqlen_q=30, max_seqlen_k=40)
    with pytest.raises(flashattn.FlashAttnError, match="int32"):
        _native.varlen_forward(q, k, v, out, lse, cq.astype(np.int64), ck, *args,
                               max_seqlen_q=30, max_seqlen_k=40)
    with pytest.raises(flashattn.FlashAttnError, match="batch \\+ 1"):
        _native.varlen_forward(q, k, v, out, lse, cq, ck[:2], *args,
                               max_seqlen_q=30, max_seqlen_k=40)


def test_every_argument_positionally_in_fa2s_order():
    """FA2 code that passes every argument positionally (softcap 5, ALiBi, a window,
    deterministic, return_attn_probs) gets FA2's three values."""
    q, k, v = inputs(2, 40, 50, 4, 2, 16, seed=21)
    slopes = (2.0 ** -np.arange(1, 5)).astype(np.float32)
    args = (0.0, 0.2, True, (30, 0), 5.0, slopes, True, True)
    out, lse, s_dmask = flashattn.flash_attn_func(q, k, v, *args)
    want, want_lse = reference(q, k, v, 0.2, True, (30, 0), 5.0, slopes, with_lse=True)
    close(out, want, np.float16)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-3, atol=1e-3)
    kv = np.stack([k, v], axis=2)
    np.testing.assert_array_equal(flashattn.flash_attn_kvpacked_func(q, kv, *args)[0], out)
    qs, ks, vs, cq, ck = varlen_inputs([5, 30], [7, 40])
    out_v, lse_v, _ = flashattn.flash_attn_varlen_func(qs, ks, vs, cq, ck, 30, 40, *args, None)
    assert out_v.shape == qs.shape and lse_v.shape == (4, qs.shape[0])
    kvs = np.stack([ks, vs], axis=1)
    out_kv = flashattn.flash_attn_varlen_kvpacked_func(qs, kvs, cq, ck, 30, 40, *args)[0]
    np.testing.assert_array_equal(out_kv, out_v)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_return_attn_probs_gives_out_lse_and_fa2s_placeholder(dtype):
    q, k, v = inputs(2, 33, 47, 4, 2, 32, dtype=dtype, seed=23)
    want, want_lse = reference(q, k, v, causal=True, with_lse=True)
    results = {
        "func": flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True),
        "kvpacked": flashattn.flash_attn_kvpacked_func(
            q, np.stack([k, v], axis=2), causal=True, return_attn_probs=True
        ),
    }
    for name, r in results.items():
        assert isinstance(r, tuple) and len(r) == 3, name
        out, lse, s_dmask = r
        close(out, want, dtype)
        assert lse.shape == (2, 4, 33) and lse.dtype == np.float32, name
        finite = np.isfinite(want_lse)
        assert np.array_equal(np.isfinite(lse), finite), name
        np.testing.assert_allclose(lse[finite], want_lse[finite], rtol=1e-4, atol=1e-4)
        # FA2's S_dmask at dropout_p = 0: an empty tensor of q's dtype.
        assert s_dmask.shape == (0,) and s_dmask.dtype == q.dtype, name
    qkv = np.stack([q, q, q], axis=2)
    out, lse, s_dmask = flashattn.flash_attn_qkvpacked_func(qkv, return_attn_probs=True)
    want, want_lse = reference(q, q, q, with_lse=True)
    close(out, want, dtype)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-4, atol=1e-4)
    assert s_dmask.shape == (0,)
    # Unpacking three values at dropout_p = 0 is what FA2 code does: the plain return stays out.
    assert isinstance(flashattn.flash_attn_func(q, k, v), np.ndarray)


def test_varlen_return_attn_probs_and_packed_forms():
    lens = [5, 0, 17, 1]
    q, k, v, cu, _ = varlen_inputs(lens, lens, hq=4, hkv=4)
    out, lse, s_dmask = flashattn.flash_attn_varlen_func(
        q, k, v, cu, cu, 17, 17, causal=True, return_attn_probs=True, block_table=None
    )
    assert lse.shape == (4, q.shape[0]) and lse.dtype == np.float32 and s_dmask.shape == (0,)
    for b in range(len(lens)):
        rows = slice(cu[b], cu[b + 1])
        if lens[b] == 0:
            continue
        want, want_lse = reference(q[rows][None], k[rows][None], v[rows][None], causal=True, with_lse=True)
        close(out[rows], want[0], np.float16)
        np.testing.assert_allclose(lse[:, rows], want_lse[0], rtol=1e-3, atol=1e-3)
    # The packed forms: the same bytes as the unpacked call.
    qkv = np.stack([q, k, v], axis=1)
    got = flashattn.flash_attn_varlen_qkvpacked_func(qkv, cu, 17, causal=True)
    np.testing.assert_array_equal(got, out)
    got3 = flashattn.flash_attn_varlen_qkvpacked_func(qkv, cu, 17, 0.0, None, True, return_attn_probs=True)
    np.testing.assert_array_equal(got3[0], out)
    np.testing.assert_array_equal(got3[1], lse)
    kv = np.stack([k, v], axis=1)
    np.testing.assert_array_equal(
        flashattn.flash_attn_varlen_kvpacked_func(q, kv, cu, cu, 17, 17, causal=True), out
    )
    # Strided views (FA2 takes row strides): copied compact, the same bytes.
    views = flashattn.flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu, cu, 17, 17, causal=True)
    np.testing.assert_array_equal(views, out)
    with pytest.raises(flashattn.FlashAttnError, match=r"qkv has shape .*\[total, 3, heads, head_dim\]"):
        flashattn.flash_attn_varlen_qkvpacked_func(qkv[:, :2], cu, 17)
    with pytest.raises(flashattn.FlashAttnUnsupportedError, match="block_table"):
        flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 17, 17, block_table=np.zeros((4, 1), np.int32))
    with pytest.raises(flashattn.FlashAttnUnsupportedError, match="dropout"):
        flashattn.flash_attn_varlen_kvpacked_func(q, kv, cu, cu, 17, 17, dropout_p=0.5)


def test_window_size_as_a_pair_of_any_kind():
    q, k, v = inputs(1, 40, 60, 2, 2, 16, seed=25)
    want = flashattn.flash_attn_func(q, k, v, window_size=(8, 3))
    close(want, reference(q, k, v, window=(8, 3)), np.float16)
    for pair in ([8, 3], np.array([8, 3]), np.array([8, 3], np.int32), (np.int64(8), np.int32(3))):
        np.testing.assert_array_equal(flashattn.flash_attn_func(q, k, v, window_size=pair), want)
    torch = pytest.importorskip("torch")
    for pair in (torch.tensor([8, 3]), torch.tensor([8, 3], dtype=torch.int32), (torch.tensor(8), 3)):
        np.testing.assert_array_equal(flashattn.flash_attn_func(q, k, v, window_size=pair), want)
    with pytest.raises(flashattn.FlashAttnError, match="window_size"):
        flashattn.flash_attn_func(q, k, v, window_size=torch.tensor([8, 3, 1]))
    with pytest.raises(flashattn.FlashAttnError, match="expected an integer"):
        flashattn.flash_attn_func(q, k, v, window_size=torch.tensor([8.0, 3.0]))


def test_one_documented_exception_type():
    """Every refusal is a FlashAttnError (a ValueError); what is not implemented is its
    subclass FlashAttnUnsupportedError (also a NotImplementedError), raised at the call."""
    assert issubclass(flashattn.FlashAttnError, ValueError)
    assert issubclass(flashattn.FlashAttnUnsupportedError, flashattn.FlashAttnError)
    assert issubclass(flashattn.FlashAttnUnsupportedError, NotImplementedError)
    q, k, v = inputs(1, 8, 8, 2, 2, 16)
    kc = np.zeros((1, 16, 2, 16), np.float16)
    kp, table, idx = np.zeros((2, 16, 2, 16), np.float16), np.array([[1]], np.int32), np.zeros(1, np.int32)
    qs, ks, vs, cu, _ = varlen_inputs([8], [8])

    class FakeCudaArray:  # a CUDA array of a framework flashattn cannot allocate in
        shape = (1, 8, 2, 16)

        def __dlpack__(self, **kwargs):
            raise AssertionError("not read")

        def __dlpack_device__(self):
            return (2, 0)

    unsupported = [
        lambda: flashattn.flash_attn_func(q, k, v, dropout_p=0.1),
        lambda: flashattn.flash_attn_qkvpacked_func(np.stack([q, k, v], 2), 0.5),
        lambda: flashattn.flash_attn_varlen_func(qs, ks, vs, cu, cu, 8, 8, dropout_p=0.1),
        lambda: flashattn.flash_attn_varlen_func(qs, ks, vs, cu, cu, 8, 8, block_table=cu),
        lambda: flashattn.flash_attn_with_kvcache(
            q, kp, kp.copy(), cache_seqlens=3, block_table=table, cache_batch_idx=idx),
        lambda: flashattn.flash_attn_with_kvcache(
            q, kp, kp.copy(), cache_seqlens=3, block_table=table, cache_leftpad=idx),
        lambda: flashattn.flash_attn_func(*(FakeCudaArray(),) * 3),
        lambda: flashattn.flash_attn_func(*(np.zeros((1, 4, 1, 264), np.float16),) * 3),  # head_dim > 256
    ]
    for call in unsupported:
        with pytest.raises(flashattn.FlashAttnUnsupportedError):
            call()
    invalid = [
        lambda: flashattn.flash_attn_func(q, k, v, dropout_p=2.0),
        lambda: flashattn.flash_attn_func(q, k, v, window_size="left"),
        lambda: flashattn.flash_attn_func(object(), k, v),
        lambda: flashattn.flash_attn_varlen_func(qs, ks, vs, cu, cu, 7, 8),
        lambda: _native.reference(object(), k, v, None, False),
        lambda: flashattn.flash_attn_with_kvcache(q, kc, kc.copy(), rotary_sin=np.ones(1)),
        lambda: flashattn.flash_attn_with_kvcache(q, kc, kc.copy(), cache_batch_idx=cu),
        lambda: flashattn.flash_attn_with_kvcache(q, kc, kc.copy(), cache_leftpad=cu),
    ]
    for call in invalid:
        with pytest.raises(flashattn.FlashAttnError) as e:
            call()
        assert not isinstance(e.value, flashattn.FlashAttnUnsupportedError)


def _rotate(x, cos, sin, pos, interleaved):
    """x [b, s, h, d] with row (b, s) rotated at table row pos[b, s] (float64)."""
    rd = 2 * cos.shape[1]
    c, s = cos[pos][:, :, None].astype(np.float64), sin[pos][:, :, None].astype(np.float64)
    y = x.astype(np.float64).copy()
    i0, i1 = (np.arange(0, rd, 2), np.arange(1, rd, 2)) if interleaved else (np.arange(rd // 2), np.arange(rd // 2, rd))
    x0, x1 = y[..., i0].copy(), y[..., i1].copy()
    y[..., i0], y[..., i1] = x0 * c - x1 * s, x1 * c + x0 * s
    return y.astype(x.dtype)


def test_kvcache_rotary_batch_idx_and_leftpad_with_numpy():
    """The CPU path of the new arguments with NumPy inputs (the PyTorch reference is
    test_kvcache_args.py's): rotary against inputs rotated here, cache_batch_idx against the
    gathered cache, cache_leftpad against caches shifted to row 0."""
    rng = np.random.default_rng(31)
    b, sq, hq, hkv, d, cap, new = 3, 2, 4, 2, 16, 40, 2
    q = rng.standard_normal((b, sq, hq, d)).astype(np.float32)
    kc = rng.standard_normal((b + 2, cap, hkv, d)).astype(np.float32)
    vc = rng.standard_normal((b + 2, cap, hkv, d)).astype(np.float32)
    kn = rng.standard_normal((b, new, hkv, d)).astype(np.float32)
    vn = rng.standard_normal((b, new, hkv, d)).astype(np.float32)
    lens = np.array([30, 0, 38], np.int32)
    idx = np.array([4, 0, 2], np.int32)
    angle = rng.uniform(0, 2 * np.pi, (cap, 4))
    cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
    for interleaved in (True, False):
        k1, v1 = kc.copy(), vc.copy()
        got = flashattn.flash_attn_with_kvcache(
            q, k1, v1, kn, vn, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens, cache_batch_idx=idx,
            causal=True, rotary_interleaved=interleaved,
        )
        pos_k = lens[:, None] + np.arange(new)[None]
        pos_q = lens[:, None] + np.arange(sq)[None]  # causal: per row
        k2, v2 = kc[idx].copy(), vc[idx].copy()
        want = flashattn.flash_attn_with_kvcache(
            _rotate(q, cos, sin, pos_q, interleaved), k2, v2, _rotate(kn, cos, sin, pos_k, interleaved), vn,
            cache_seqlens=lens, causal=True,
        )
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(k1[idx], k2, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(k1[[1, 3]], kc[[1, 3]])  # not picked: untouched
    # cache_leftpad: rows before it are never read (NaN there).
    pad = np.array([7, 0, 38], np.int32)
    kp = kc[:b].copy()
    for bb in range(b):
        kp[bb, : pad[bb]] = np.nan
    got = flashattn.flash_attn_with_kvcache(q, kp.copy(), vc[:b].copy(), kn, vn, cache_seqlens=lens,
                                           cache_leftpad=pad, causal=True)
    shifted_k, shifted_v = np.zeros_like(kp), np.zeros_like(kp)
    for bb in range(b):
        shifted_k[bb, : cap - pad[bb]] = kp[bb, pad[bb]:]
        shifted_v[bb, : cap - pad[bb]] = vc[bb, pad[bb]:]
    want = flashattn.flash_attn_with_kvcache(q, shifted_k, shifted_v, kn, vn, cache_seqlens=lens - pad, causal=True)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, want)
    with pytest.raises(flashattn.FlashAttnError, match="cache_leftpad\\[1\\] = 1 is outside"):
        flashattn.flash_attn_with_kvcache(q, kp.copy(), vc[:b].copy(), cache_seqlens=lens, cache_leftpad=pad + 1)


def test_kvcache_head_dims_not_a_multiple_of_8():
    """The CPU takes every head_dim; the padded route that CUDA takes (q, the caches and the
    new rows copied with zero channels to the next multiple of 8, the new rows copied back)
    is forced here on the CPU and must give what the unpadded call gives."""
    rng = np.random.default_rng(27)
    b, sq, hq, hkv, d, cap = 2, 3, 4, 2, 12, 48
    q = rng.standard_normal((b, sq, hq, d)).astype(np.float32)
    kc = rng.standard_normal((b, cap, hkv, d)).astype(np.float32)
    vc = rng.standard_normal((b, cap, hkv, d)).astype(np.float32)
    kn = rng.standard_normal((b, 2, hkv, d)).astype(np.float32)
    vn = rng.standard_normal((b, 2, hkv, d)).astype(np.float32)
    lens = np.array([20, 5], np.int32)
    kc1, vc1 = kc.copy(), vc.copy()
    out, lse = flashattn.flash_attn_with_kvcache(
        q, kc1, vc1, kn, vn, cache_seqlens=lens, causal=True, return_softmax_lse=True
    )
    for bb in range(b):
        n = lens[bb] + 2
        want = reference(q[bb : bb + 1], kc1[bb : bb + 1, :n], vc1[bb : bb + 1, :n], causal=True)
        close(out[bb : bb + 1], want, np.float32)
    import unittest.mock

    with unittest.mock.patch.object(flashattn, "_decode_pads", lambda q: True):
        for make in (lambda x: x,) + ((lambda x: __import__("torch").from_numpy(x)),) * _has_torch():
            kc2, vc2 = make(kc.copy()), make(vc.copy())
            out2, lse2 = flashattn.flash_attn_with_kvcache(
                make(q), kc2, vc2, make(kn), make(vn), cache_seqlens=make(lens), causal=True,
                return_softmax_lse=True,
            )
            out2, lse2, kc2, vc2 = (np.asarray(x) for x in (out2, lse2, kc2, vc2))
            assert out2.shape == q.shape and out2.flags.c_contiguous
            np.testing.assert_allclose(out2, out, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(lse2, lse, rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(kc2, kc1)  # the new rows, copied back
            np.testing.assert_array_equal(vc2, vc1)
            # Without new rows the caches are left alone; an explicit scale is kept.
            kc3 = make(kc1.copy())
            o3 = flashattn.flash_attn_with_kvcache(make(q), kc3, make(vc1.copy()), cache_seqlens=make(lens + 2),
                                                  softmax_scale=0.5)
            o1 = flashattn.flash_attn_with_kvcache(q, kc1.copy(), vc1.copy(), cache_seqlens=lens + 2, softmax_scale=0.5)
            np.testing.assert_allclose(np.asarray(o3), o1, rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(np.asarray(kc3), kc1)


def _has_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def test_torch_cpu_tensors_that_require_grad():
    """FA2 code calls every function on tensors that require grad: flash_attn_func gets
    gradients, as do the varlen functions (each sequence's gradients those of
    flash_attn_func on it alone); the KV-cache function (no backward, as FA2) runs, and only a
    backward through it raises the documented type."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 20, 2, 16, generator=g, requires_grad=True) for _ in range(3))
    out, lse, s_dmask = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.requires_grad and not lse.requires_grad and s_dmask.shape == (0,)
    out.sum().backward()
    assert all(x.grad is not None and torch.isfinite(x.grad).all() for x in (q, k, v))
    with pytest.raises(flashattn.FlashAttnUnsupportedError, match="dropout"):
        flashattn.flash_attn_func(q, k, v, dropout_p=0.1)  # at the call, not in backward

    cu = torch.tensor([0, 7, 20], dtype=torch.int32)
    qv, kv_, vv = (x[0].detach().requires_grad_(True) for x in (q, k, v))
    with torch.no_grad():
        want = flashattn.flash_attn_varlen_func(qv, kv_, vv, cu, cu, 13, 13, causal=True)
    got = flashattn.flash_attn_varlen_func(qv, kv_, vv, cu, cu, 13, 13, causal=True)
    assert got.requires_grad and torch.equal(got.detach(), want)
    dout = torch.randn(got.shape, generator=g)
    got.backward(dout)
    for s0, s1 in ((0, 7), (7, 20)):
        parts = [x[s0:s1].detach().unsqueeze(0).requires_grad_(True) for x in (qv, kv_, vv)]
        flashattn.flash_attn_func(*parts, causal=True).backward(dout[s0:s1].unsqueeze(0))
        for name, x, xs in zip(("dq", "dk", "dv"), (qv, kv_, vv), parts):
            torch.testing.assert_close(x.grad[s0:s1], xs.grad[0], rtol=1e-5, atol=1e-5, msg=name)
    qkv = torch.stack([qv, kv_, vv], dim=1).detach().requires_grad_(True)
    got, lse, _ = flashattn.flash_attn_varlen_qkvpacked_func(qkv, cu, 13, causal=True, return_attn_probs=True)
    assert torch.equal(got.detach(), want) and lse.shape == (2, 20)
    got.backward(dout)
    for i, x in enumerate((qv, kv_, vv)):  # the packed form's gradient, through the stack
        torch.testing.assert_close(qkv.grad[:, i], x.grad, rtol=1e-6, atol=1e-6)

    kc, vc = torch.zeros(1, 32, 2, 16), torch.zeros(1, 32, 2, 16)
    kn, vn = (x[:, :4].detach().requires_grad_(True) for x in (k, v))
    out = flashattn.flash_attn_with_kvcache(q[:, :2], kc, vc, kn, vn, cache_seqlens=3, causal=True)
    assert torch.equal(kc[:, 3:7], kn.detach())
    with pytest.raises(flashattn.FlashAttnUnsupportedError, match="no backward"):
        out.sum().backward()


def _torch_sequence_attention(q, k, v, causal, window, softcap, slopes):
    """One sequence's attention in the inputs' dtype (float64 here), q [sq, hq, d], k, v [sk,
    hkv, d], FA2 semantics: softcap, ALiBi -slope |i + sk - sq - j|, bottom-right causal and
    window; rows that see no key give 0 with zero gradients."""
    import torch

    sq, hq, d = q.shape
    sk, hkv = k.shape[0], k.shape[1]
    k, v = (x.repeat_interleave(hq // hkv, dim=1).transpose(0, 1) for x in (k, v))
    s = q.transpose(0, 1) @ k.transpose(-1, -2) / math.sqrt(d)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq)[:, None] + sk - sq
    j = torch.arange(sk)[None, :]
    if slopes is not None:
        s = s - slopes.to(s.dtype)[:, None, None] * (i - j).abs()
    left, right = window
    mask = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        mask &= j <= i
    if left >= 0:
        mask &= j >= i - left
    if right >= 0:
        mask &= j <= i + right
    p = torch.softmax(s.masked_fill(~mask, -1e30), dim=-1) * mask.any(dim=1, keepdim=True)
    return (p @ v).transpose(0, 1)


@pytest.mark.parametrize(
    "causal, window, softcap, alibi",
    [(False, (-1, -1), 0.0, False), (True, (-1, -1), 0.0, False), (False, (5, 3), 0.0, False),
     (True, (-1, -1), 3.0, True)],
)
def test_varlen_gradients_against_torch_float64(causal, window, softcap, alibi):
    """flash_attn_varlen_func's gradients (float32 on the CPU backend) against PyTorch's
    autograd through a float64 reference, sequence by sequence: sequences without queries,
    without keys, shorter and longer key sides, GQA, every score argument."""
    torch = pytest.importorskip("torch")
    lens_q, lens_k = [5, 0, 9, 1, 4], [7, 3, 9, 0, 12]
    hq, hkv, d = 4, 2, 16
    g = torch.Generator().manual_seed(5)
    cq = torch.tensor([0] + list(np.cumsum(lens_q)), dtype=torch.int32)
    ck = torch.tensor([0] + list(np.cumsum(lens_k)), dtype=torch.int32)
    q = torch.randn(sum(lens_q), hq, d, generator=g, requires_grad=True)
    k = torch.randn(sum(lens_k), hkv, d, generator=g, requires_grad=True)
    v = torch.randn(sum(lens_k), hkv, d, generator=g, requires_grad=True)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625]) if alibi else None
    out = flashattn.flash_attn_varlen_func(
        q, k, v, cq, ck, max(lens_q), max(lens_k), causal=causal, window_size=window,
        softcap=softcap, alibi_slopes=slopes,
    )
    dout = torch.randn(out.shape, generator=g)
    out.backward(dout)
    q64, k64, v64 = (x.detach().double().requires_grad_(True) for x in (q, k, v))
    want = torch.cat([
        _torch_sequence_attention(q64[cq[b]:cq[b + 1]], k64[ck[b]:ck[b + 1]], v64[ck[b]:ck[b + 1]],
                                  causal, window, softcap, slopes)
        for b in range(len(lens_q))
    ])
    want.backward(dout.double())
    for name, got, ref in (("out", out.detach(), want.detach()), ("dq", q.grad, q64.grad),
                           ("dk", k.grad, k64.grad), ("dv", v.grad, v64.grad)):
        err = (got.double() - ref).norm() / ref.norm().clamp_min(1e-30)
        assert err < 1e-5, f"{name}: rel-L2 {err:.3e}"
    # Keys no query sees (sequence 1 has no queries): dk = dv = 0 exactly.
    assert torch.equal(k.grad[7:10], torch.zeros_like(k.grad[7:10]))
    assert torch.equal(v.grad[7:10], torch.zeros_like(v.grad[7:10]))


# ---- torch.compile (issue 40 item 3): the calls as torch.library custom ops ----


def _torch_compile():
    torch = pytest.importorskip("torch")
    if not hasattr(torch.library, "custom_op"):
        pytest.skip("flashattn's custom ops need torch 2.4 or later")
    return torch


def test_custom_ops_pass_opcheck():
    """Schema, fake (meta) implementations against the real ones, autograd registration and
    AOT dispatch of every op, on the CPU."""
    torch = _torch_compile()
    from flashattn import _torch_ops as ops

    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 9, 4, 16, generator=g, requires_grad=True)
    k = torch.randn(2, 11, 2, 16, generator=g, requires_grad=True)
    v = torch.randn(2, 11, 2, 16, generator=g, requires_grad=True)
    slopes = torch.tensor([0.5, 0.25, 0.1, 0.05])
    for args in [
        (q, k, v, None, True, -1, -1, 0.0, None, False, True),
        (q, k, v, 0.3, False, 3, 2, 5.0, slopes, True, True),
    ]:
        torch.library.opcheck(ops.fwd, args)
    out, lse = ops.fwd(*args)
    do = torch.randn(out.shape, generator=g)
    plain = [x.detach() for x in (q, k, v, out)]
    torch.library.opcheck(ops.bwd, (do, *plain, lse, 0.3, False, 3, 2, 5.0, slopes, True))
    # The strided inputs a model hands the ops (the CUDA compile test's module): q, k, v as
    # views of one projection's columns, k, v as views into a stacked kv, and a dout that is
    # not compact; out, lse, dq, dk, dv compact as the fakes say (opcheck compares strides).
    qkv = torch.randn(2, 9, 6 * 16, generator=g)
    q, k, v = qkv.split([4 * 16, 16, 16], dim=-1)
    q, k, v = q.view(2, 9, 4, 16), k.view(2, 9, 1, 16), v.view(2, 9, 1, 16)
    kv = torch.stack([k, v], dim=2)
    dot = torch.randn(2, 4, 9, 16, generator=g).transpose(1, 2)
    for kk, vv in ((k, v), (kv[:, :, 0], kv[:, :, 1])):
        args = (q, kk, vv, None, False, 4, 0, 30.0, None, True, True)
        grads = [x.detach().requires_grad_(True) for x in (q, kk, vv)]
        torch.library.opcheck(ops.fwd, (*grads, *args[3:]))
        out, lse = ops.fwd(*args)
        assert out.is_contiguous() and lse.is_contiguous()
        torch.library.opcheck(ops.bwd, (dot, q, kk, vv, out, lse, *args[3:10]))
    qs, cu = torch.randn(12, 2, 16, generator=g), torch.tensor([0, 5, 12], dtype=torch.int32)
    torch.library.opcheck(ops.varlen_fwd, (qs, qs, qs, cu, cu, 7, 7, None, True, -1, -1, 0.0, None, False))
    kc, vc = torch.randn(2, 32, 2, 16, generator=g), torch.randn(2, 32, 2, 16, generator=g)
    qd, kn = torch.randn(2, 1, 4, 16, generator=g), torch.randn(2, 1, 2, 16, generator=g)
    lens = torch.tensor([3, 7], dtype=torch.int32)
    cos, sin = torch.rand(40, 4, generator=g), torch.rand(40, 4, generator=g)
    idx, pad = torch.tensor([1, 0], dtype=torch.int32), torch.tensor([2, 0], dtype=torch.int32)
    torch.library.opcheck(ops.kvcache_fwd, (qd, kc, vc, kn, kn.clone(), None, None, lens, None, None, None, None,
                                            None, True, -1, -1, 0.0, True, None, 0))
    torch.library.opcheck(ops.kvcache_fwd, (qd, kc, vc, None, None, None, None, None, 5, None, None, None, 0.5,
                                            False, -1, -1, 0.0, True, None, 2))
    torch.library.opcheck(ops.kvcache_fwd, (qd, kc, vc, kn, kn.clone(), cos, sin, lens, None, idx, pad, None, None,
                                            True, -1, -1, 0.0, False, None, 0))
    torch.library.opcheck(ops.no_backward, (qd, [qd], "x"), test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph_matches_eager():
    """A module calling the packed forms and flash_attn_func (window, softcap, ALiBi,
    return_attn_probs, deterministic) compiles without a graph break (fullgraph=True) and
    gives eager's outputs and gradients (aot_eager runs the same kernels: the same bytes)."""
    torch = _torch_compile()

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(32, 3 * 32)

        def forward(self, x):
            b, n, _ = x.shape
            qkv = self.lin(x).view(b, n, 3, 2, 16)
            o = flashattn.flash_attn_qkvpacked_func(qkv, causal=True)
            q = qkv[:, :, 0]
            o2, lse, s_dmask = flashattn.flash_attn_kvpacked_func(
                q, qkv[:, :, 1:], window_size=(4, 0), softcap=5.0,
                alibi_slopes=torch.tensor([0.5, 0.25]), return_attn_probs=True,
            )
            o3 = flashattn.flash_attn_func(q, qkv[:, :, 1], qkv[:, :, 2], 0.0, 0.2, False, (-1, -1), 0.0, None, True)
            return (o + o2 + o3).sum(-1), lse, s_dmask

    torch.manual_seed(0)
    model, x = Block(), torch.randn(2, 20, 32)
    want = model(x)
    want[0].square().sum().backward()
    want_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch._dynamo.reset()
    got = torch.compile(model, fullgraph=True, backend="aot_eager")(x)
    got[0].square().sum().backward()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert got[2].shape == (0,) and got[2].dtype == x.dtype
    for p, w in zip(model.parameters(), want_grads):
        assert torch.equal(p.grad, w)


def test_torch_compile_varlen_and_kvcache():
    torch = _torch_compile()
    g = torch.Generator().manual_seed(1)

    def decode(q, kc, vc, kn, vn, lens, qs, cu):
        o = flashattn.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, causal=True)
        o1, l1 = flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=3, return_softmax_lse=True)
        ov = flashattn.flash_attn_varlen_func(qs, qs, qs, cu, cu, 7, 7, causal=True)
        oq = flashattn.flash_attn_varlen_qkvpacked_func(torch.stack([qs, qs, qs], 1), cu, 7)
        return o, o1, l1, ov, oq

    q, kc, vc = torch.randn(2, 1, 2, 16, generator=g), torch.randn(2, 32, 2, 16, generator=g), torch.randn(2, 32, 2, 16, generator=g)
    kn, vn = torch.randn(2, 1, 2, 16, generator=g), torch.randn(2, 1, 2, 16, generator=g)
    lens = torch.tensor([5, 9], dtype=torch.int32)
    qs, cu = torch.randn(12, 2, 16, generator=g), torch.tensor([0, 5, 12], dtype=torch.int32)
    kc2, vc2 = kc.clone(), vc.clone()
    want = decode(q, kc, vc, kn, vn, lens, qs, cu)
    torch._dynamo.reset()
    got = torch.compile(decode, fullgraph=True, backend="aot_eager")(q, kc2, vc2, kn, vn, lens, qs, cu)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc)  # the new rows, written in place
    # The varlen backward through the compiled graph: the eager gradients.
    qg, kg, ke = q.clone().requires_grad_(True), qs.clone().requires_grad_(True), qs.clone().requires_grad_(True)
    varlen = torch.compile(lambda x: flashattn.flash_attn_varlen_func(x, x, x, cu, cu, 7, 7), fullgraph=True, backend="aot_eager")
    out = varlen(kg)
    assert out.requires_grad
    out.sum().backward()
    flashattn.flash_attn_varlen_func(ke, ke, ke, cu, cu, 7, 7).sum().backward()
    assert torch.equal(kg.grad, ke.grad)
    # No backward through the KV cache: the forward runs on tensors that require grad;
    # running a backward raises.
    cache = torch.compile(lambda x: flashattn.flash_attn_with_kvcache(x, kc, vc, cache_seqlens=4), fullgraph=True, backend="aot_eager")
    out = cache(qg)
    assert out.requires_grad
    with pytest.raises(flashattn.FlashAttnUnsupportedError, match="no backward"):
        out.sum().backward()


def test_torch_is_optional_and_either_import_order_compiles():
    """import flashattn does not import torch; torch imported after flashattn still finds
    the custom ops registered (an import hook), so a first call inside a trace works."""
    _torch_compile()
    import subprocess
    import sys

    code = (
        "import sys, flashattn\n"
        "assert 'torch' not in sys.modules\n"
        "import torch\n"
        "assert 'flashattn._torch_ops' in sys.modules\n"
        "q = torch.randn(1, 16, 2, 16)\n"
        "f = lambda q: flashattn.flash_attn_func(q, q, q, causal=True)\n"
        "assert torch.equal(torch.compile(f, fullgraph=True, backend='aot_eager')(q), f(q))\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


# ---- learnable attention sinks (gpt-oss; issue 40 item 2) ----


def reference_sink(q, k, v, sink, scale=None, causal=False, window=(-1, -1)):
    """gpt-oss's attention in float64 (NumPy): each row's visible logits and its head's sink
    logit in one softmax, the sink's column dropped (it has no value row). Returns (out, lse),
    lse [batch, heads, seqlen_q] including the sink (a row that sees no key: out 0, lse sink)."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    g = hq // hkv
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    center = i + sk - sq
    visible = np.ones((sq, sk), dtype=bool)
    if causal:
        visible &= j <= center
    if window[0] >= 0:
        visible &= j >= center - window[0]
    if window[1] >= 0:
        visible &= j <= center + window[1]
    out = np.zeros_like(q)
    lse = np.zeros((b, hq, sq))
    for bb in range(b):
        for h in range(hq):
            s = np.where(visible, q[bb, :, h] @ k[bb, :, h // g].T * scale, -np.inf)
            logits = np.concatenate([s, np.full((sq, 1), float(sink[h]))], axis=1)
            m = logits.max(axis=1, keepdims=True)
            p = np.exp(logits - m)
            z = p.sum(axis=1, keepdims=True)
            out[bb, :, h] = (p[:, :-1] / z) @ v[bb, :, h // g]
            lse[bb, h] = m[:, 0] + np.log(z[:, 0])
    return out, lse


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize(
    "shape, causal, window",
    [
        ((2, 33, 47, 4, 2, 16), False, (-1, -1)),
        ((1, 40, 25, 4, 1, 32), True, (-1, -1)),  # sq > sk: rows that see no key
        ((2, 64, 64, 2, 2, 24), True, (8, -1)),
    ],
)
def test_learnable_sink_forward(dtype, shape, causal, window):
    """flash_attn_func and its packed forms with a sink (NumPy, the CPU backend) against
    gpt-oss's definition; s_aux is the same argument; lse includes the sink."""
    q, k, v = inputs(*shape, dtype=dtype, seed=31)
    hq = shape[3]
    sink = np.linspace(-1.0, 3.0, hq).astype(np.float32)
    want, want_lse = reference_sink(q, k, v, sink, causal=causal, window=window)
    out, lse, _ = flashattn.flash_attn_func(
        q, k, v, causal=causal, window_size=window, learnable_sink=sink, return_attn_probs=True
    )
    close(out, want, dtype)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-4, atol=1e-4)
    alias = flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window, s_aux=sink)
    np.testing.assert_array_equal(alias, out)
    as_list = flashattn.flash_attn_func(
        q, k, v, causal=causal, window_size=window, learnable_sink=sink.tolist()
    )
    np.testing.assert_array_equal(as_list, out)
    kv = np.stack([k, v], axis=2)
    packed = flashattn.flash_attn_kvpacked_func(
        q, kv, causal=causal, window_size=window, learnable_sink=sink
    )
    np.testing.assert_array_equal(packed, out)
    if causal and shape[1] > shape[2]:
        # Rows that see no key: out 0, lse the sink's logit.
        empty = shape[1] - shape[2]
        assert not out[:, :empty].any()
        np.testing.assert_allclose(lse[:, :, :empty], np.broadcast_to(sink[None, :, None], lse[:, :, :empty].shape), rtol=0, atol=0)
    # Without the sink the answer differs (the check can fail).
    plain = flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window)
    assert np.abs(plain.astype(np.float64) - want).max() > 1e-2


def test_learnable_sink_in_flash_attn_with_kvcache():
    """flash_attn_with_kvcache takes learnable_sink (and s_aux): each sequence as the dense call
    on its cache rows with the same sink, lse included; a sequence with an empty cache gets
    o = 0 and lse = the sink."""
    rng = np.random.default_rng(8)
    b, hq, hkv, d, cap = 3, 4, 2, 16, 20
    q = rng.standard_normal((b, 1, hq, d), dtype=np.float32)
    kc = rng.standard_normal((b, cap, hkv, d), dtype=np.float32)
    vc = rng.standard_normal((b, cap, hkv, d), dtype=np.float32)
    sink = np.array([0.5, -1.0, 2.0, 0.25], dtype=np.float32)
    lens = np.array([12, 20, 0], dtype=np.int32)
    out, lse = flashattn.flash_attn_with_kvcache(
        q, kc, vc, cache_seqlens=lens, learnable_sink=sink, return_softmax_lse=True
    )
    for i in range(2):
        n = int(lens[i])
        want, want_lse, _ = flashattn.flash_attn_func(
            q[i:i + 1], kc[i:i + 1, :n], vc[i:i + 1, :n], learnable_sink=sink,
            return_attn_probs=True,
        )
        assert np.abs(out[i:i + 1] - want).max() < 1e-5, i
        assert np.abs(lse[i:i + 1] - want_lse).max() < 1e-5, i
    assert not out[2].any() and np.allclose(lse[2, :, 0], sink)
    alias = flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, s_aux=sink)
    assert np.array_equal(alias, out)
    plain = flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens)
    assert np.abs(plain - out).max() > 1e-3  # the sink changed the rows: a check that can fail
    with pytest.raises(flashattn.FlashAttnError, match="learnable_sink"):
        flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, learnable_sink=sink[:3])


def test_learnable_sink_varlen_and_qkvpacked():
    q, k, v, cq, ck = varlen_inputs([5, 30, 9], [7, 40, 0], hq=4, hkv=2, d=16, seed=5)
    sink = np.array([0.5, -1.0, 2.0, 4.0], dtype=np.float32)
    out, lse, _ = flashattn.flash_attn_varlen_func(
        q, k, v, cq, ck, 30, 40, causal=True, learnable_sink=sink, return_attn_probs=True
    )
    for n in range(3):
        qs, ks, vs = q[cq[n]:cq[n + 1]][None], k[ck[n]:ck[n + 1]][None], v[ck[n]:ck[n + 1]][None]
        want, want_lse = reference_sink(qs, ks, vs, sink, causal=True)
        close(out[cq[n]:cq[n + 1]][None], want, np.float16)
        np.testing.assert_allclose(lse[:, cq[n]:cq[n + 1]], want_lse[0], rtol=1e-4, atol=1e-4)
    # The last sequence has no key: every row's lse is its head's sink.
    np.testing.assert_array_equal(lse[:, cq[2]:], np.repeat(sink[:, None], 9, axis=1))
    qkv = np.stack([q[:12], q[:12], q[:12]], axis=1)
    cu = np.array([0, 5, 12], dtype=np.int32)
    got = flashattn.flash_attn_varlen_qkvpacked_func(qkv, cu, 7, s_aux=sink)
    want = flashattn.flash_attn_varlen_func(q[:12], q[:12], q[:12], cu, cu, 7, 7, learnable_sink=sink)
    np.testing.assert_array_equal(got, want)


def test_learnable_sink_refusals():
    q, k, v = inputs(1, 8, 8, 4, 2, 16)
    sink = np.zeros(4, dtype=np.float32)
    for bad, says in [
        (np.zeros(3, dtype=np.float32), r"shape \(3,\); expected \(4,\)"),
        (np.zeros((1, 4), dtype=np.float32), r"shape \(1, 4\)"),
        (np.array([0.0, np.nan, 0.0, 0.0], dtype=np.float32), r"learnable_sink\[1\]"),
        (np.array([0.0, 0.0, np.inf, 0.0], dtype=np.float32), r"learnable_sink\[2\]"),
        (np.zeros(4, dtype=np.int32), "int32"),
        (np.zeros(4, dtype=np.float64), "float64"),
        ("sink", "not a tensor of logits"),
    ]:
        with pytest.raises(flashattn.FlashAttnError, match=says):
            flashattn.flash_attn_func(q, k, v, learnable_sink=bad)
    with pytest.raises(flashattn.FlashAttnError, match="alias"):
        flashattn.flash_attn_func(q, k, v, learnable_sink=sink, s_aux=sink)
    # Keyword only: after return_attn_probs and the three FP8 descales, no positional slot.
    with pytest.raises(TypeError):
        flashattn.flash_attn_func(
            q, k, v, 0.0, None, False, (-1, -1), 0.0, None, False, False, None, None, None, sink
        )
    # The native calls: d_sink without a sink, and of the wrong size.
    out, lse = np.zeros_like(q), np.zeros((1, 4, 8), dtype=np.float32)
    flashattn._native.forward(q, k, v, out, lse, None, False, -1, -1, 0.0, None, learnable_sink=sink)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for ls, ds, says in [
        (None, np.zeros(4, dtype=np.float32), "d_sink was given without learnable_sink"),
        (sink, np.zeros(3, dtype=np.float32), r"d_sink has shape \(3,\)"),
        (sink, np.zeros(4, dtype=np.float16), "d_sink has shape"),
    ]:
        with pytest.raises(flashattn.FlashAttnError, match=says):
            flashattn._native.backward(
                q, k, v, out, lse, out.copy(), dq, dk, dv, None, False, -1, -1, 0.0, None, False,
                learnable_sink=ls, d_sink=ds,
            )


def torch_reference_sink(q, k, v, sink, causal=False, window=(-1, -1), softcap=0.0):
    """gpt-oss's attention in PyTorch float64, differentiable in q, k, v and the sink."""
    import torch

    q, k, v = (x.double().transpose(1, 2) for x in (q, k, v))
    b, h, sq, d = q.shape
    sk = k.shape[2]
    g = h // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = q @ k.transpose(-1, -2) / d ** 0.5
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    center = i + sk - sq
    mask = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        mask &= j <= center
    if window[0] >= 0:
        mask &= j >= center - window[0]
    if window[1] >= 0:
        mask &= j <= center + window[1]
    s = s.masked_fill(~mask, float("-inf"))
    logits = torch.cat([s, sink.double().reshape(1, h, 1, 1).expand(b, h, sq, 1)], dim=-1)
    p = torch.softmax(logits, dim=-1)[..., :-1]
    return (p @ v).transpose(1, 2), torch.logsumexp(logits, dim=-1)


@pytest.mark.parametrize("sink_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    "shape, causal, window, softcap",
    [
        ((2, 33, 47, 4, 2, 16), False, (-1, -1), 0.0),
        ((1, 40, 25, 4, 1, 32), True, (-1, -1), 0.0),  # rows that see no key
        ((2, 30, 30, 2, 2, 8), True, (6, -1), 5.0),
    ],
)
def test_learnable_sink_gradients_against_pytorch(sink_dtype, shape, causal, window, softcap):
    """Forward, lse and the gradients of q, k, v and the sink (a parameter in float32 or
    bfloat16: its gradient comes back in its dtype) against PyTorch's autograd in float64."""
    torch = pytest.importorskip("torch")
    b, sq, sk, hq, hkv, d = shape
    g = torch.Generator().manual_seed(3)
    q = torch.randn(b, sq, hq, d, generator=g, requires_grad=True)
    k = torch.randn(b, sk, hkv, d, generator=g, requires_grad=True)
    v = torch.randn(b, sk, hkv, d, generator=g, requires_grad=True)
    dtype = getattr(torch, sink_dtype)
    sink = torch.linspace(-1.0, 2.5, hq).to(dtype).requires_grad_(True)
    out, lse, _ = flashattn.flash_attn_func(
        q, k, v, causal=causal, window_size=window, softcap=softcap, learnable_sink=sink,
        return_attn_probs=True,
    )
    refs = [x.detach().requires_grad_(True) for x in (q, k, v, sink)]
    want, want_lse = torch_reference_sink(*refs[:3], refs[3], causal, window, softcap)
    assert torch.allclose(out.double(), want, rtol=1e-4, atol=1e-5)
    assert torch.allclose(lse.double(), want_lse, rtol=1e-4, atol=1e-4)
    do = torch.randn(out.shape, generator=g)
    out.backward(do)
    want.backward(do.double())
    for name, x, r in zip(("dq", "dk", "dv", "d_sink"), (q, k, v, sink), refs):
        assert x.grad is not None and x.grad.dtype == x.dtype, name
        err = (x.grad.double() - r.grad).norm() / r.grad.norm()
        assert err < 1e-4, f"{name}: rel-L2 {err:.2e}"
    assert sink.grad.abs().sum() > 0  # a check that can fail


def test_learnable_sink_gradient_alone_and_through_varlen():
    """Only the sink requires grad: it alone gets a gradient. Through varlen the sink's
    gradient is the sum of the sequences' dense ones (and q's gradient theirs)."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 20, 2, 16, generator=g) for _ in range(3))
    sink = torch.tensor([0.3, -0.4], requires_grad=True)
    out = flashattn.flash_attn_func(q, k, v, causal=True, learnable_sink=sink)
    assert out.requires_grad
    out.sum().backward()
    ref = sink.detach().clone().requires_grad_(True)
    torch_reference_sink(q, k, v, ref, causal=True)[0].sum().backward()
    assert torch.allclose(sink.grad.double(), ref.grad.double(), rtol=1e-4, atol=1e-6)
    with pytest.raises(flashattn.FlashAttnError, match="is on meta but q is on cpu"):
        flashattn.flash_attn_func(q, k, v, learnable_sink=torch.zeros(2, device="meta"))
    with pytest.raises(flashattn.FlashAttnError, match="int64"):
        flashattn.flash_attn_func(q, k, v, learnable_sink=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(flashattn.FlashAttnError, match="PyTorch tensor but q is not"):
        flashattn.flash_attn_func(q.numpy(), k.numpy(), v.numpy(), learnable_sink=torch.zeros(2))
    cu = torch.tensor([0, 7, 20], dtype=torch.int32)
    qv = q[0].clone().requires_grad_(True)
    sv = sink.detach().clone().requires_grad_(True)
    got = flashattn.flash_attn_varlen_func(qv, k[0], v[0], cu, cu, 13, 13, causal=True,
                                           learnable_sink=sv)
    do = torch.randn(got.shape, generator=g)
    got.backward(do)
    qd = q[0].clone().requires_grad_(True)
    sd = sink.detach().clone().requires_grad_(True)
    for a, e in ((0, 7), (7, 20)):
        part = flashattn.flash_attn_func(qd[None, a:e], k[:, a:e], v[:, a:e], causal=True,
                                         learnable_sink=sd)
        part.backward(do[None, a:e])
    assert torch.allclose(sv.grad, sd.grad, rtol=1e-4, atol=1e-6), (sv.grad, sd.grad)
    assert torch.allclose(qv.grad, qd.grad, rtol=1e-4, atol=1e-5)
    assert sv.grad.abs().sum() > 0  # a check that can fail


def test_learnable_sink_custom_ops_and_torch_compile():
    """The ops carry the sink (opcheck), and a compiled module with a sink parameter gives
    eager's outputs and gradients (the sink's included)."""
    torch = _torch_compile()
    from flashattn import _torch_ops as ops

    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 9, 4, 16, generator=g, requires_grad=True)
    k = torch.randn(2, 11, 2, 16, generator=g, requires_grad=True)
    v = torch.randn(2, 11, 2, 16, generator=g, requires_grad=True)
    sink = torch.tensor([0.5, -1.0, 2.0, 0.0], requires_grad=True)
    args = (q, k, v, None, True, -1, -1, 0.0, None, False, True, sink)
    torch.library.opcheck(ops.fwd, args)
    out, lse = ops.fwd(*args)
    do = torch.randn(out.shape, generator=g)
    plain = [x.detach() for x in (q, k, v, out)]
    torch.library.opcheck(ops.bwd, (do, *plain, lse, None, True, -1, -1, 0.0, None, False, sink.detach()))
    qs, cu = torch.randn(12, 4, 16, generator=g), torch.tensor([0, 5, 12], dtype=torch.int32)
    torch.library.opcheck(ops.varlen_fwd, (qs, qs, qs, cu, cu, 7, 7, None, True, -1, -1, 0.0, None, False, sink.detach()))
    vout, vlse = ops.varlen_fwd(qs, qs, qs, cu, cu, 7, 7, None, True, -1, -1, 0.0, None, False, sink.detach())
    vargs = (torch.randn(vout.shape, generator=g), qs, qs, qs, vout, vlse, cu, cu, 7, 7, None, True,
             -1, -1, 0.0, None, False)
    torch.library.opcheck(ops.varlen_bwd, (*vargs, sink.detach()))
    assert ops.varlen_bwd(*vargs, sink.detach())[3].shape == (4,)
    assert ops.varlen_bwd(*vargs)[3].shape == (0,)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(32, 3 * 32)
            self.sinks = torch.nn.Parameter(torch.tensor([0.25, 1.5]))

        def forward(self, x):
            b, n, _ = x.shape
            qkv = self.lin(x).view(b, n, 3, 2, 16)
            o = flashattn.flash_attn_qkvpacked_func(qkv, causal=True, learnable_sink=self.sinks)
            o2 = flashattn.flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], s_aux=self.sinks)
            return (o + o2).sum(-1)

    torch.manual_seed(0)
    model, x = Block(), torch.randn(2, 20, 32)
    want = model(x)
    want.square().sum().backward()
    want_grads = [p.grad.clone() for p in model.parameters()]
    assert model.sinks.grad.abs().sum() > 0
    model.zero_grad()
    torch._dynamo.reset()
    got = torch.compile(model, fullgraph=True, backend="aot_eager")(x)
    got.square().sum().backward()
    assert torch.equal(got, want)
    for p, w in zip(model.parameters(), want_grads):
        assert torch.equal(p.grad, w)
