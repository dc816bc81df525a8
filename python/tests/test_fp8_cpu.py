"""FP8 (float8_e4m3fn) through flash_attn_func on CPU tensors (the library's FP8 CPU
backend), against a float64 PyTorch reference of the dequantised inputs with the FP8
tolerance (fp8_reference.py); the errors, autograd and torch.compile. Skipped without torch
or without its float8 dtypes."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch, "float8_e4m3fn"):
    pytest.skip("this torch has no float8_e4m3fn", allow_module_level=True)

import flashattn  # noqa: E402
from flashattn import _native, flash_attn_func  # noqa: E402
from fp8_reference import close_to_bf16_rounding, judge, quantise, reference  # noqa: E402

E4M3 = torch.float8_e4m3fn


def descales(kind, b, hkv, seed):
    """(q_descale, k_descale, v_descale) of one kind: None, Python floats, 0-d tensors,
    1-element tensors, or FlashAttention-3's (batch, heads_kv) float32 tensors."""
    g = torch.Generator().manual_seed(seed)
    if kind == "none":
        return None, None, None
    if kind == "float":
        return 0.37, 1.9, 0.8
    if kind == "0-d":
        return torch.tensor(0.6), torch.tensor(1.4), torch.tensor(2.5)
    if kind == "1-element":
        return torch.tensor([1.7]), torch.tensor([0.45]), torch.tensor([1.1])
    return tuple(torch.rand(b, hkv, generator=g) * 1.5 + 0.25 for _ in range(3))


def fp8_inputs(shape, kind="per (batch, kv head)", seed=0, device="cpu"):
    """q, k, v float8_e4m3fn (values about N(0, 1) once dequantised, never 0) and their
    descales."""
    b, sq, sk, hq, hkv, d = shape
    ds = descales(kind, b, hkv, seed + 100)
    g = torch.Generator().manual_seed(seed)
    x = [torch.randn(b, s, h, d, generator=g) for s, h in ((sq, hq), (sk, hkv), (sk, hkv))]
    heads = (hq, hkv, hkv)
    q, k, v = (quantise(t, dd, h).to(device) for t, dd, h in zip(x, ds, heads))
    ds = tuple(dd.to(device) if isinstance(dd, torch.Tensor) else dd for dd in ds)
    return q, k, v, ds


def check(out, lse, r):
    problems, numbers = judge(r, out, lse)
    assert not problems, f"{problems} ({numbers})"
    close_to_bf16_rounding(out, r)


KINDS = ["none", "float", "0-d", "1-element", "per (batch, kv head)"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "shape",
    [
        (2, 37, 61, 4, 2, 64),  # GQA, sq < sk
        (1, 70, 33, 3, 1, 128),  # MQA, sq > sk: causal rows that see no key
        (2, 20, 20, 2, 2, 40),  # a head_dim the GPU kernel does not take: the CPU does
    ],
)
def test_fp8_matches_the_dequantised_reference(kind, causal, shape):
    q, k, v, (qd, kd, vd) = fp8_inputs(shape, kind, seed=sum(shape))
    out, lse, s_dmask = flash_attn_func(
        q, k, v, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd, return_attn_probs=True
    )
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == (shape[0], shape[3], shape[1])
    assert s_dmask.shape == (0,)
    check(out, lse, reference(q, k, v, qd, kd, vd, causal=causal))


def test_every_score_modifier_on_the_cpu():
    q, k, v, (qd, kd, vd) = fp8_inputs((2, 45, 70, 4, 2, 32), seed=3)
    slopes = torch.tensor([[0.5, 0.25, 0.1, 0.05], [0.3, 0.2, 0.1, 0.01]])
    for kw in [
        dict(window_size=(16, 0), causal=True),
        dict(window_size=(-1, 5), softmax_scale=0.3),
        dict(softcap=5.0),
        dict(alibi_slopes=slopes, window_size=(20, 20), softcap=8.0),
    ]:
        out, lse, _ = flash_attn_func(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd,
                                      return_attn_probs=True, **kw)
        r = reference(q, k, v, qd, kd, vd, scale=kw.get("softmax_scale"),
                      causal=kw.get("causal", False), window=kw.get("window_size", (-1, -1)),
                      softcap=kw.get("softcap", 0.0), slopes=kw.get("alibi_slopes"))
        check(out, lse, r)


def test_packed_forms_and_strided_views():
    q, k, v, (qd, kd, vd) = fp8_inputs((2, 33, 33, 4, 4, 64), seed=5)
    r = reference(q, k, v, qd, kd, vd, causal=True)
    qkv = torch.stack([q, k, v], dim=2)
    out = flashattn.flash_attn_qkvpacked_func(qkv, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
    close_to_bf16_rounding(out, r)
    kv = torch.stack([k, v], dim=2)
    out2 = flashattn.flash_attn_kvpacked_func(q, kv, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
    assert torch.equal(out, out2)
    # q as a transposed view of [b, h, s, d] memory
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)
    assert torch.equal(flash_attn_func(qt, k, v, causal=True, q_descale=qd, k_descale=kd, v_descale=vd), out)


def test_descales_as_numpy_and_expanded_views():
    q, k, v, _ = fp8_inputs((2, 16, 16, 4, 2, 64), "none", seed=7)
    r = reference(q, k, v, 0.5, 1.5, 2.0)
    a = flash_attn_func(q, k, v, q_descale=np.float32(0.5), k_descale=np.array([1.5], np.float32),
                        v_descale=torch.tensor(2.0).expand(2, 2))
    close_to_bf16_rounding(a, r)
    b = flash_attn_func(q, k, v, q_descale=0.5, k_descale=1.5, v_descale=2.0)
    assert torch.equal(a, b)


def test_the_tolerance_catches_wrong_answers():
    """The judge is not vacuous: a missing descale, a zeroed output and a permuted row each
    fail it, while the real output passes."""
    q, k, v, (qd, kd, vd) = fp8_inputs((1, 64, 96, 2, 1, 64), seed=9)
    r = reference(q, k, v, qd, kd, vd)
    out, lse, _ = flash_attn_func(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd, return_attn_probs=True)
    assert not judge(r, out, lse)[0]
    wrong_v = flash_attn_func(q, k, v, q_descale=qd, k_descale=kd)
    assert judge(r, wrong_v, lse)[0]
    assert judge(r, torch.zeros_like(out), lse)[0]
    assert judge(r, out.roll(1, dims=1), lse)[0]
    assert judge(r, out, lse + 0.05)[0]


def test_poisoned_outputs_are_overwritten():
    """The native call writes every element of out and lse (NaN before)."""
    q, k, v, (qd, kd, vd) = fp8_inputs((2, 30, 41, 4, 2, 64), seed=11)
    out = torch.full(q.shape, torch.nan, dtype=torch.bfloat16)
    lse = torch.full((2, 4, 30), torch.nan)
    host = [(list(d.shape), d.reshape(-1).tolist()) for d in (qd, kd, vd)]
    _native.fp8_forward(*(x.view(torch.uint8) for x in (q, k, v)), out, lse, *host,
                        None, True, -1, -1, 0.0, None)
    check(out, lse, reference(q, k, v, qd, kd, vd, causal=True))


def test_tensors_that_require_grad_run_the_forward_and_refuse_the_backward():
    q, k, v, (qd, kd, vd) = fp8_inputs((1, 16, 16, 2, 2, 64), seed=13)
    qg = q.clone().requires_grad_(True)
    out = flash_attn_func(qg, k, v, q_descale=qd, k_descale=kd, v_descale=vd)
    assert out.requires_grad
    assert torch.equal(out, flash_attn_func(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd))
    with pytest.raises(flashattn.FlashAttnUnsupportedError, match="no backward"):
        out.float().sum().backward()
    with torch.no_grad():
        assert not flash_attn_func(qg, k, v).requires_grad


def test_errors():
    q, k, v, _ = fp8_inputs((2, 8, 8, 4, 2, 64), "none", seed=15)
    unsupported = [
        (lambda: flash_attn_func(q, k.to(torch.float8_e5m2), v), "float8_e5m2"),
        (lambda: flash_attn_func(q.to(torch.float8_e5m2), k.to(torch.float8_e5m2), v.to(torch.float8_e5m2)), "float8_e4m3fn only"),
        (lambda: flash_attn_func(q, k, v, dropout_p=0.1), "dropout"),
        # A learnable sink is refused by name (the FP8 kernels and CPU backend take none).
        (lambda: flash_attn_func(q, k, v, learnable_sink=torch.zeros(4)), "learnable_sink with FP8"),
        (lambda: flash_attn_func(q, k, v, s_aux=[0.0] * 4), "learnable_sink with FP8"),
    ]
    for call, match in unsupported:
        with pytest.raises(flashattn.FlashAttnUnsupportedError, match=match):
            call()
    ones = torch.ones(2, 2)
    invalid = [
        (lambda: flash_attn_func(q, k.bfloat16(), v), "q is float8_e4m3fn but k is bfloat16"),
        (lambda: flash_attn_func(q.half(), k, v), "k is float8_e4m3fn but q is float16"),
        (lambda: flash_attn_func(q.half(), k.half(), v.half(), v_descale=ones), "v_descale given"),
        (lambda: flash_attn_func(q.view(torch.uint8), k.view(torch.uint8), v.view(torch.uint8)), "one-byte inputs"),
        (lambda: flash_attn_func(q, k, v, q_descale=torch.ones(2, 4)), r"\[batch, heads_kv\] = \[2, 2\]"),
        (lambda: flash_attn_func(q, k, v, k_descale=torch.ones(3)), "shape"),
        (lambda: flash_attn_func(q, k, v, k_descale=ones.double()), "float64; descales are float32"),
        (lambda: flash_attn_func(q, k, v, k_descale=ones.half()), "float16; descales are float32"),
        (lambda: flash_attn_func(q, k, v, v_descale=0.0), "above 0"),
        (lambda: flash_attn_func(q, k, v, v_descale=float("nan")), "finite"),
        (lambda: flash_attn_func(q, k, v, v_descale=-ones), "above 0"),
        (lambda: flash_attn_func(q, k, v, v_descale=True), "bool"),
        (lambda: flash_attn_func(q, k, v, v_descale="1"), "str"),
        (lambda: flash_attn_func(q, k[:, :5], v), "shapes disagree"),
        (lambda: flash_attn_func(q[0], k[0], v[0]), "expected 4"),
        (lambda: flash_attn_func(np.zeros((1, 4, 2, 8), np.int8), np.zeros((1, 4, 2, 8), np.int8), np.zeros((1, 4, 2, 8), np.int8)), "one-byte"),
    ]
    for call, match in invalid:
        with pytest.raises(flashattn.FlashAttnError, match=match) as e:
            call()
        assert not isinstance(e.value, flashattn.FlashAttnUnsupportedError), match


def test_fp8_in_the_varlen_and_kvcache_functions_is_refused():
    """FP8 is flash_attn_func's only: the others say so (FlashAttnUnsupportedError where
    torch exports float8 through DLPack, 2.8 and later; a FlashAttnError before)."""
    q = quantise(torch.randn(12, 2, 64), None, 2)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    for call in (
        lambda: flashattn.flash_attn_varlen_func(q, q, q, cu, cu, 7, 7),
        lambda: flashattn.flash_attn_with_kvcache(q[None], q[None], q[None].clone()),
    ):
        with pytest.raises(flashattn.FlashAttnError, match="float8|DLPack"):
            call()


def test_signature_adds_fa3s_descales_after_fa2s_arguments():
    import inspect

    for fn in (flash_attn_func, flashattn.flash_attn_qkvpacked_func, flashattn.flash_attn_kvpacked_func):
        # The positional ones (flashattn's keyword-only extensions, learnable_sink, follow).
        names = [
            p.name for p in inspect.signature(fn).parameters.values()
            if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD
        ]
        assert names[-4:] == ["return_attn_probs", "q_descale", "k_descale", "v_descale"], fn


# ---- torch.compile ----


def _compile_ops():
    if not hasattr(torch.library, "custom_op"):
        pytest.skip("flashattn's custom ops need torch 2.4 or later")
    from flashattn import _fp8_ops

    return _fp8_ops


def test_fp8_custom_ops_pass_opcheck():
    """Fake implementations against the real ones, autograd registration and AOT dispatch
    (torch's schema test compares inputs with allclose, which float8 lacks on the CPU)."""
    ops = _compile_ops()
    q, k, v, (qd, kd, vd) = fp8_inputs((2, 9, 11, 4, 2, 64), seed=17)
    utils = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
    slopes = torch.tensor([0.5, 0.25, 0.1, 0.05])
    torch.library.opcheck(ops.fp8_fwd, (q, k, v, 1.0, 0.5, 2.0, None, True, -1, -1, 0.0, None), test_utils=utils)
    torch.library.opcheck(ops.fp8_fwd_descaled, (q, k, v, qd, None, torch.tensor(2.0), 0.3, False, 3, 2, 5.0, slopes), test_utils=utils)
    qg = q.clone().requires_grad_(True)
    torch.library.opcheck(ops.fp8_fwd, (qg, k, v, 1.0, 0.5, 2.0, None, True, -1, -1, 0.0, None), test_utils=utils[:2])


def test_torch_compile_fullgraph_matches_eager():
    _compile_ops()
    q, k, v, (qd, kd, vd) = fp8_inputs((2, 20, 24, 4, 2, 64), seed=19)

    def f(q, k, v, qd, kd, vd):
        a, lse, s = flash_attn_func(q, k, v, causal=True, q_descale=qd, k_descale=kd, v_descale=vd, return_attn_probs=True)
        b = flash_attn_func(q, k, v, q_descale=0.5, v_descale=2.0)  # flashattn::fp8_fwd
        c = flashattn.flash_attn_kvpacked_func(q, torch.stack([k, v], 2), k_descale=kd, v_descale=1.5)
        return a, lse, s, b, c

    want = f(q, k, v, qd, kd, vd)
    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v, qd, kd, vd)
    assert all(torch.equal(x, y) for x, y in zip(got, want))
    assert got[2].shape == (0,) and got[2].dtype == E4M3
    # No backward: the compiled forward runs on tensors that require grad, a backward raises.
    qg = q.clone().requires_grad_(True)
    g = torch.compile(lambda q: flash_attn_func(q, k, v, k_descale=0.5), fullgraph=True, backend="aot_eager")
    out = g(qg)
    assert out.requires_grad and torch.equal(out, flash_attn_func(q, k, v, k_descale=0.5))
    with pytest.raises(flashattn.FlashAttnUnsupportedError, match="no backward"):
        out.float().sum().backward()
