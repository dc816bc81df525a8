"""FP8 (float8_e4m3fn) attention through ``flash_attn_func``, FlashAttention-3 style.

``flash_attn_func`` (and its packed forms) comes here when q, k or v has one-byte elements or
a descale is given. q, k and v must all be PyTorch ``torch.float8_e4m3fn`` tensors; the real
value of an element ``x`` of q is ``x * q_descale`` (likewise k, v). Each descale is, as
FlashAttention-3 takes it, a float32 tensor of shape ``(batch, heads_kv)`` (query head ``h``
takes the factor of its kv head ``h // (heads_q // heads_kv)``), or, beyond FlashAttention-3,
one factor for the whole tensor: a 0-d or 1-element float32 tensor, or a Python float;
``None`` is 1. The output is bfloat16 (lse float32), accumulation f32.

CPU tensors run on the library's FP8 CPU backend (the inputs dequantised to f32, every score
modifier); CUDA tensors on ``attn_wgmma_fp8`` (sm_90, head_dim 64 or 128, no mask or causal),
which refuses everything else with :class:`flashattn.FlashAttnUnsupportedError`.

The descales are read on the host (the library takes their values): a descale tensor on the
GPU is copied to the host (a synchronisation), and per-(batch, kv head) descales are copied
back to the device by the library, so on CUDA only a call whose descales are Python floats or
host tensors of one element enqueues nothing but its kernels and can be captured in a CUDA
graph. No backward: tensors that require grad run the forward; a backward through its output
raises :class:`flashattn.FlashAttnUnsupportedError` (FlashAttention-3 has no FP8 backward).
"""

import numbers

import flashattn as _fa

# float8 dtypes that flashattn does not take (torch's names, without "torch.").
_OTHER_FP8 = ("float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
E4M3 = "float8_e4m3fn"


def one_byte(q, k, v):
    """Whether any of q, k, v has one-byte elements (float8, or int8/uint8, which the FP8
    path refuses with a message), so that ``flash_attn_func`` takes the FP8 path. Every
    16-bit call pays for this: about 0.3 us when q, k, v share one dtype object (torch's
    and NumPy's are singletons)."""
    try:
        d = q.dtype
        if d is k.dtype and d is v.dtype:
            return d.itemsize == 1
    except AttributeError:  # no dtype (refused later), or a torch without dtype.itemsize
        pass
    for x in (q, k, v):
        dt = getattr(x, "dtype", None)
        size = getattr(dt, "itemsize", None)
        if size == 1 or (size is None and dt is not None and "float8" in str(dt)):
            return True
    return False


def _dtype_name(x):
    """x's element type as torch and NumPy write it, without ``torch.``."""
    return str(getattr(x, "dtype", type(x).__name__)).replace("torch.", "")


def check_inputs(q, k, v, descales_given):
    """Refuses what the FP8 path does not take: inputs other than PyTorch float8_e4m3fn
    tensors (another float8 format: FlashAttnUnsupportedError; mixed element types, or
    descales with 16-bit inputs: FlashAttnError). Returns torch."""
    names = {"q": _dtype_name(q), "k": _dtype_name(k), "v": _dtype_name(v)}
    for name, dt in names.items():
        if dt in _OTHER_FP8:
            raise _fa.FlashAttnUnsupportedError(
                f"{name} is {dt}: flashattn's FP8 attention takes float8_e4m3fn only "
                "(FlashAttention-3's FP8 format); quantise to torch.float8_e4m3fn (with its descale)"
            )
    fp8 = [n for n, dt in names.items() if dt == E4M3]
    if not fp8:
        what = f"{', '.join(descales_given)} given" if descales_given else "one-byte inputs"
        raise _fa.FlashAttnError(
            f"{what}, but q, k, v are {names['q']}, {names['k']}, {names['v']}: descales (and "
            "one-byte inputs) are for FP8 attention, which takes q, k and v all "
            "float8_e4m3fn: quantise them (x.to(torch.float8_e4m3fn)) or drop the descales"
        )
    others = [n for n in names if n not in fp8]
    if others:
        o = others[0]
        raise _fa.FlashAttnError(
            f"{fp8[0]} is float8_e4m3fn but {o} is {names[o]}: FP8 attention takes q, k and v "
            f"all float8_e4m3fn; quantise {o} too (with its descale)"
        )
    if not all(_fa._is_torch(x) for x in (q, k, v)):
        raise _fa.FlashAttnError(
            "FP8 attention takes PyTorch tensors (torch.float8_e4m3fn), on the CPU or a CUDA "
            "device: flashattn allocates the bfloat16 output in PyTorch"
        )
    return _fa._torch_module()


def host_descale(name, x, q):
    """A descale as the native call takes it: None, or (shape, values) read on the host.
    Its shape and values are the library's to judge ([] or [1], or [batch, heads_kv];
    finite and above 0)."""
    if x is None:
        return None
    if isinstance(x, numbers.Real) and not isinstance(x, bool):
        return [], [float(x)]
    what = (
        "pass a float32 tensor of shape (batch, heads_kv) (FlashAttention-3's), a float32 "
        "tensor of one element, or a Python float"
    )
    if _fa._is_torch(x):
        torch = _fa._torch_module()
        if x.dtype != torch.float32:
            raise _fa.FlashAttnError(f"{name} is {_dtype_name(x)}; descales are float32: {what}")
        if x.is_cuda:
            if not q.is_cuda or x.get_device() != q.get_device():
                raise _fa.FlashAttnError(
                    f"{name} is on {x.device} but q is on {q.device}: pass the descales on "
                    "q's device (or on the CPU)"
                )
            if torch.cuda.is_current_stream_capturing():
                raise _fa.FlashAttnError(
                    f"{name} is a CUDA tensor, which flashattn reads on the host (a "
                    "synchronisation a CUDA graph capture cannot record): pass per-tensor "
                    "descales as Python floats inside a capture, or call outside it"
                )
        return list(x.shape), x.detach().reshape(-1).tolist()
    if type(x).__module__.split(".")[0] == "numpy":
        import numpy

        a = numpy.asarray(x)
        if a.dtype != numpy.float32:
            raise _fa.FlashAttnError(f"{name} is {a.dtype}; descales are float32: {what}")
        return list(a.shape), a.reshape(-1).tolist()
    raise _fa.FlashAttnError(f"{name} is a {type(x).__name__}: {what}")


class Fp8Call:
    """An FP8 call (inputs, descales and score arguments checked) for
    ``flashattn._function`` or for a direct run: ``forward(q, k, v)`` -> (out bf16, lse)."""

    def __init__(self, scores, descales):
        self.scores, self.descales = scores, descales

    def forward(self, q, k, v):
        torch = _fa._torch_module()
        shape = tuple(q.shape)
        out = q.new_empty(shape, dtype=torch.bfloat16)
        lse = q.new_empty((shape[0], shape[2], shape[1]) if len(shape) == 4 else (0,),
                          dtype=torch.float32)
        stream, current = _fa._stream(q)
        qb, kb, vb = (_fa._dl(x).view(torch.uint8) for x in (q, k, v))
        _fa._native.fp8_forward(
            qb, kb, vb, out, lse, *self.descales, *self.scores, stream, current
        )
        return out, lse

    def backward(self, saved, dout):
        raise _fa.FlashAttnUnsupportedError(NO_BACKWARD)


NO_BACKWARD = (
    "flash_attn_func on float8_e4m3fn inputs (FP8) has no backward (FlashAttention-3 has none "
    "either): its forward ran, but a gradient through it cannot be computed; compute this "
    "loss without it, or train with float16/bfloat16 inputs"
)


def call(q, k, v, scores, q_descale, k_descale, v_descale):
    """A checked FP8 call: inputs, then the descales read on the host."""
    given = [n for n, d in (("q_descale", q_descale), ("k_descale", k_descale),
                            ("v_descale", v_descale)) if d is not None]
    check_inputs(q, k, v, given)
    descales = [
        host_descale(n, d, q)
        for n, d in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))
    ]
    return Fp8Call(scores, descales)


def _ops():
    """:mod:`flashattn._fp8_ops`, registered with the other custom ops when torch was
    imported (see ``flashattn._ops``)."""
    _fa._ops()  # the same report when the ops could not be registered
    # A module global, not sys.modules: Dynamo traces this and guards on what it reads, and
    # iterating sys.modules while inductor's compile threads import fails.
    ops = _fa._fp8_ops_module
    if ops is None:
        raise _fa.FlashAttnUnsupportedError(
            f"torch.compile: flashattn's FP8 custom ops are not registered ({_fa._torch_ops_error})"
        )
    return ops


def forward(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes, q_descale,
            k_descale, v_descale):
    """flash_attn_func's work on FP8 inputs: (out bf16, lse f32)."""
    if _fa._compiling():
        return _ops().fp8(
            q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes, q_descale,
            k_descale, v_descale,
        )
    _fa._tensors(q=q, k=k, v=v)
    scores = _fa._scores(softmax_scale, causal, window_size, softcap, alibi_slopes)
    c = call(q, k, v, scores, q_descale, k_descale, v_descale)
    if _fa._wants_grad(q, k, v):
        return _fa._function().apply(c, q, k, v)
    return c.forward(q, k, v)
