"""The Python package on the CPU with NumPy inputs, against an independent float64 reference
written here with FlashAttention-2's semantics, and against the library's own f64 oracle."""

import numpy as np
import pytest

import flashattn
from flashattn import _native


def reference(q, k, v, scale=None, causal=False, window=(-1, -1), softcap=0.0, slopes=None):
    """Attention in float64, FA2 semantics (bottom-right causal and window, softcap, ALiBi)."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    g = hq // hkv
    out = np.zeros_like(q)
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
    return out


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
    with pytest.raises(NotImplementedError, match="dropout"):
        flashattn.flash_attn_func(q, k, v, dropout_p=0.1)
    with pytest.raises(NotImplementedError, match="return_attn_probs"):
        flashattn.flash_attn_func(q, k, v, return_attn_probs=True)
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
    with pytest.raises(ValueError, match=r"probability in \[0, 1\]"):
        flashattn.flash_attn_func(q, k, v, dropout_p=-0.1)
    with pytest.raises(flashattn.FlashAttnError, match="q is None"):
        flashattn.flash_attn_func(None, k, v)
    with pytest.raises(flashattn.FlashAttnError, match="softcap"):
        flashattn.flash_attn_func(q, k, v, softcap=-1.0)
    with pytest.raises(flashattn.FlashAttnError, match="alibi_slopes"):
        flashattn.flash_attn_func(q, k, v, alibi_slopes=np.ones(3, np.float32))
    with pytest.raises(flashattn.FlashAttnError, match="contiguous"):
        flashattn.flash_attn_func(np.asfortranarray(q), k, v)
    with pytest.raises(ValueError, match="DLPack"):
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
    with pytest.raises(NotImplementedError, match="rotary_cos"):
        flashattn.flash_attn_with_kvcache(q, kc, vc, rotary_cos=np.ones(1))
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
    with pytest.raises(ValueError, match="DLPack"):
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
