"""``flash_attn_with_kvcache``'s rotary embeddings, ``cache_batch_idx`` and ``cache_leftpad``
on the CPU (PyTorch tensors) against the PyTorch reference (:mod:`kvcache_reference`), and
every misuse of them refused with the documented exception types. Skipped without torch;
the CUDA versions are in test_cuda.py."""

import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from flashattn import flash_attn_with_kvcache  # noqa: E402
from kvcache_cases import CASES, check_call, make_call  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(CASES))
def test_kvcache_arguments_match_the_reference(name, dtype):
    kw = make_call(name, "cpu", dtype, seed=list(CASES).index(name))
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    for splits in (0, 3):
        check_call(flash_attn_with_kvcache, dict(kw, num_splits=splits), tol, f"{name} {dtype} splits {splits}")


def test_rotary_changes_the_result_and_its_layout_matters():
    """A check that could not fail would pass here too: the rotation must move the output,
    and interleaved and half-split pairs must differ."""
    kw = make_call("rotary-causal", "cpu", torch.float32)
    outs = []
    for extra in ({}, {"rotary_interleaved": True}, {"rotary_cos": None, "rotary_sin": None}):
        call = dict(kw, k_cache=kw["k_cache"].clone(), v_cache=kw["v_cache"].clone(), **extra)
        outs.append(flash_attn_with_kvcache(**call))
    assert not torch.allclose(outs[0], outs[1]) and not torch.allclose(outs[0], outs[2])


def test_misuse_is_refused_with_the_documented_types():
    kw = make_call("everything", "cpu", torch.float32)
    paged = make_call("rotary-paged", "cpu", torch.float32)
    d = kw["q"].shape[-1]

    def call(base, **changes):
        args = dict(base, k_cache=base["k_cache"].clone(), v_cache=base["v_cache"].clone())
        args.update(changes)
        return flash_attn_with_kvcache(**args)

    cos = kw["rotary_cos"]
    invalid = {
        "one element type": dict(rotary_cos=cos.bfloat16(), rotary_sin=kw["rotary_sin"].bfloat16()),
        "rotary_cos was given without": dict(rotary_sin=None),
        "dimensions": dict(rotary_cos=cos[:, 0], rotary_sin=kw["rotary_sin"][:, 0]),
        "at most head_dim": dict(rotary_cos=torch.ones(80, d), rotary_sin=torch.ones(80, d)),
        "rows": dict(rotary_cos=cos[:10], rotary_sin=kw["rotary_sin"][:10]),
        "pass k and v": dict(k=None, v=None),
        "outside int32": dict(cache_leftpad=kw["cache_leftpad"].long() + 2**40),
        "expected \\[batch\\]": dict(cache_leftpad=kw["cache_leftpad"][:2]),
        "cache_leftpad\\[": dict(cache_leftpad=kw["cache_seqlens"] + 1),
        "outside the cache's": dict(cache_batch_idx=kw["cache_batch_idx"] + 10),
    }
    for match, changes in invalid.items():
        with pytest.raises(flashattn.FlashAttnError, match=match) as e:
            call(kw, **changes)
        assert not isinstance(e.value, flashattn.FlashAttnUnsupportedError), match
    # Paged caches take neither cache_batch_idx nor cache_leftpad, as FlashAttention-2.
    b = paged["q"].shape[0]
    for arg in ("cache_batch_idx", "cache_leftpad"):
        with pytest.raises(flashattn.FlashAttnUnsupportedError, match=f"{arg} with a paged cache"):
            call(paged, **{arg: torch.zeros(b, dtype=torch.int32)})
    # A refused call writes nothing.
    before = kw["k_cache"].clone()
    with pytest.raises(flashattn.FlashAttnError):
        flash_attn_with_kvcache(**dict(kw, rotary_sin=None))
    assert torch.equal(kw["k_cache"], before)


def test_compiled_kvcache_with_the_new_arguments():
    """torch.compile (fullgraph) traces the new arguments through flashattn::kvcache_fwd and
    gives eager's bytes (aot_eager runs the same native calls)."""
    kw = make_call("everything", "cpu", torch.float32)

    def step(q, kc, vc, k, v, cos, sin, lens, idx, pad):
        return flash_attn_with_kvcache(q, kc, vc, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens,
                                       cache_batch_idx=idx, cache_leftpad=pad, causal=True,
                                       rotary_interleaved=False)

    args = [kw[n] for n in ("q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin", "cache_seqlens",
                            "cache_batch_idx", "cache_leftpad")]
    eager_args = list(args)
    eager_args[1], eager_args[2] = args[1].clone(), args[2].clone()
    want = step(*eager_args)
    compiled_args = list(args)
    compiled_args[1], compiled_args[2] = args[1].clone(), args[2].clone()
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(*compiled_args)
    assert torch.equal(got, want)
    assert torch.equal(compiled_args[1], eager_args[1]) and torch.equal(compiled_args[2], eager_args[2])
