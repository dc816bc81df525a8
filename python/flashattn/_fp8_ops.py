"""The FP8 forward (:mod:`flashattn._fp8`) as ``torch.library`` custom ops, for
``torch.compile``: under a trace, ``flash_attn_func`` on float8_e4m3fn inputs calls these, as
its 16-bit calls call :mod:`flashattn._torch_ops`'s.

- ``flashattn::fp8_fwd``: descales given as Python floats (or None): the call enqueues its
  kernels only, so ``torch.compile(mode="reduce-overhead")`` may capture it.
- ``flashattn::fp8_fwd_descaled``: descales given as tensors, which the call reads on the host
  (and, per (batch, kv head), the library copies to the device): tagged
  ``cudagraph_unsafe`` where the torch version has the tag.
- ``flashattn::fp8_refuse_backward``: the backward of both, which raises
  ``FlashAttnUnsupportedError`` when it runs (FP8 has no backward), so that tracing a model's
  backward works and only running it raises, as in eager.

Each op's real implementation is the eager path's own code (the same checks and native call).
Registered by ``flashattn._register_torch_ops`` with :mod:`flashattn._torch_ops`.
"""

import numbers
from typing import List, Optional, Tuple

import torch
from torch import Tensor

import flashattn as _fa
from flashattn import _fp8
from flashattn._torch_ops import _OPS, _args, _fake_out_lse, _scores, _syncs, _tensor


def _run(q, k, v, descales, scale, causal, left, right, softcap, slopes):
    scores = _scores(scale, causal, left, right, softcap, slopes)
    return _fp8.call(q, k, v, scores, *descales).forward(q, k, v)


def _fake(q, *_args, **_kwargs):
    """Both ops' fake (out bfloat16 like q, lse float32)."""
    return _fake_out_lse(q, torch.bfloat16)


@torch.library.custom_op(f"{_OPS}::fp8_fwd", mutates_args=())
def fp8_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_descale: float,
    k_descale: float,
    v_descale: float,
    softmax_scale: Optional[float],
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    alibi_slopes: Optional[Tensor],
) -> Tuple[Tensor, Tensor]:
    """out bfloat16 like q and lse float32 ``[batch, heads_q, seqlen_q]`` of FP8 attention
    with one descale per tensor."""
    return _run(q, k, v, (q_descale, k_descale, v_descale), softmax_scale, causal, window_left,
                window_right, softcap, alibi_slopes)


@torch.library.custom_op(f"{_OPS}::fp8_fwd_descaled", mutates_args=(), **_syncs())
def fp8_fwd_descaled(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_descale: Optional[Tensor],
    k_descale: Optional[Tensor],
    v_descale: Optional[Tensor],
    softmax_scale: Optional[float],
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    alibi_slopes: Optional[Tensor],
) -> Tuple[Tensor, Tensor]:
    """As ``flashattn::fp8_fwd`` with the descales as float32 tensors (FlashAttention-3's
    ``(batch, heads_kv)``, or one element; None is 1)."""
    return _run(q, k, v, (q_descale, k_descale, v_descale), softmax_scale, causal, window_left,
                window_right, softcap, alibi_slopes)


@torch.library.custom_op(f"{_OPS}::fp8_refuse_backward", mutates_args=())
def fp8_refuse_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor) -> List[Tensor]:
    """Raises ``FlashAttnUnsupportedError``: the FP8 forward has no backward."""
    raise _fa.FlashAttnUnsupportedError(_fp8.NO_BACKWARD)


@fp8_refuse_backward.register_fake
def _(dout, q, k, v):
    return [x.new_empty(x.shape) for x in (q, k, v)]


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:3])
    ctx.mark_non_differentiable(output[1])


def _backward(ctx, dout, _dlse):
    dq, dk, dv = fp8_refuse_backward(dout, *ctx.saved_tensors)
    return (dq, dk, dv) + (None,) * 9


for _op in (fp8_fwd, fp8_fwd_descaled):
    _op.register_fake(_fake)
    _op.register_autograd(_backward, setup_context=_setup)


def fp8(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes, q_descale,
        k_descale, v_descale):
    """``flash_attn_func``'s (out, lse) on FP8 inputs while torch.compile traces it: through
    ``flashattn::fp8_fwd`` when every descale is a Python number or None, else
    ``flashattn::fp8_fwd_descaled`` (numbers made float32 tensors, arrays tensors)."""
    scale, causal, left, right = _args(softmax_scale, causal, window_size)
    slopes = _tensor(alibi_slopes, torch.float32)
    descales = (q_descale, k_descale, v_descale)
    number = [d is None or (isinstance(d, numbers.Real) and not isinstance(d, bool))
              for d in descales]
    if all(number):
        floats = [1.0 if d is None else float(d) for d in descales]
        return fp8_fwd(q, k, v, *floats, scale, causal, left, right, float(softcap), slopes)
    tensors = [
        d if d is None or isinstance(d, Tensor)
        else torch.tensor(float(d), dtype=torch.float32) if isnum
        else torch.as_tensor(d)  # its dtype kept: the real implementation judges it
        for d, isnum in zip(descales, number)
    ]
    return fp8_fwd_descaled(q, k, v, *tensors, scale, causal, left, right, float(softcap),
                            slopes)
