//! The argument rules of the native calls, each written once: tensor ranks, layouts and the
//! shapes that must agree, element types, memory that a call writes, and FlashAttention-2's
//! score arguments (`softmax_scale`, `causal`, `window_size`, `softcap`, `alibi_slopes`) and a
//! learnable sink (`learnable_sink`) as the library's problem options.
//!
//! What the library checks with a typed error is not checked here: sizes (zero, GQA,
//! `head_dim` <= 256, overflow), the scale (finite, above 0; its `1/sqrt(head_dim)` default
//! when `None`), the window's sides (>= -1), softcap (finite, above 0), the slopes' count and
//! values, the offsets of a packed batch, cache lengths, block tables and split counts: its
//! [`flashattn::AttnError`] becomes a `FlashAttnError` ([`crate::error::err`]). What only Python can
//! check (dropout, frameworks, autograd, host copies of index arrays, `max_seqlen_*`) is in
//! `flashattn/__init__.py`.

use crate::dlpack::Borrowed;
use crate::error::{FlashAttnError, err};
use flashattn::kvcache::{CacheDims, HostIndex, KvCacheShape, Rotary};
use flashattn::scores::{Alibi, ScoreMods, Window};
use flashattn::shape::{AttnProblem, AttnShape, Strides};
use flashattn::varlen::{DeviceVarlenProblem, VarlenProblem};
use flashattn::{AttnError, Mask};
use pyo3::prelude::*;

/// `[batch, seqlen, heads, head_dim]`, the layout of every dense tensor.
pub(crate) const BSHD: &str = "[batch, seqlen, heads, head_dim]";

fn invalid(msg: String) -> PyErr {
    FlashAttnError::new_err(msg)
}

/// A bshd tensor's shape and strides (head_dim contiguous).
pub(crate) fn bshd(t: &Borrowed) -> PyResult<([usize; 4], Strides)> {
    let shape = t.shape();
    if shape.len() != 4 {
        return Err(invalid(format!(
            "{} has {} dimensions {shape:?}; expected 4: {BSHD}",
            t.name,
            shape.len()
        )));
    }
    let st = t.strides()?;
    // An empty tensor's strides mean nothing (NumPy reports 0): the sizes are refused later.
    if st[3] != 1 && shape[3] > 1 && !shape.contains(&0) {
        return Err(invalid(format!(
            "{}: the last dimension (head_dim) has stride {}; it must be contiguous (call .contiguous() / np.ascontiguousarray)",
            t.name, st[3]
        )));
    }
    Ok((
        [shape[0], shape[1], shape[2], shape[3]],
        Strides {
            batch: st[0],
            seq: st[1],
            head: st[2],
        },
    ))
}

/// A compact (row-major, no gaps) tensor of `ndim` dimensions: its shape.
pub(crate) fn compact(t: &Borrowed, ndim: usize, what: &str) -> PyResult<Vec<usize>> {
    let shape = t.shape();
    if shape.len() != ndim {
        return Err(invalid(format!(
            "{} has {} dimensions {shape:?}; expected {ndim}: {what}",
            t.name,
            shape.len()
        )));
    }
    if shape.contains(&0) {
        return Ok(shape); // nothing addressed; the sizes are judged by the library
    }
    let st = t.strides()?;
    let mut want = 1usize;
    for i in (0..ndim).rev() {
        if shape[i] > 1 && st[i] != want {
            return Err(invalid(format!(
                "{} is not contiguous (strides {st:?} for shape {shape:?}); pass a contiguous tensor (.contiguous() / np.ascontiguousarray)",
                t.name
            )));
        }
        want *= shape[i];
    }
    Ok(shape)
}

/// The element type of a call: q's (the first tensor), shared by every tensor but `lse`,
/// which is float32.
pub(crate) fn one_dtype(ts: &[&Borrowed]) -> PyResult<&'static str> {
    let dtype = ts[0].dtype()?;
    for t in &ts[1..] {
        let here = t.dtype()?;
        if t.name == "lse" {
            if here != "float32" {
                return Err(invalid("lse must be float32".into()));
            }
        } else if here != dtype {
            return Err(invalid(format!(
                "q is {dtype} but {} is {here}: pass q, k, v (and out, the caches) with one element type",
                t.name
            )));
        }
    }
    Ok(dtype)
}

/// The CUDA kernels take float16 and bfloat16 only.
pub(crate) fn cuda_dtype(dtype: &str) -> PyErr {
    invalid(format!(
        "q is {dtype}: the CUDA kernels take float16 or bfloat16; convert the tensors (e.g. q.half()), or run float32 on the CPU"
    ))
}

/// Every tensor this call writes must be writable and share no memory with any other tensor
/// of the call (Rust may not read and write one place through two references).
pub(crate) fn check_disjoint(written: &[&Borrowed], read: &[&Borrowed]) -> PyResult<()> {
    for (i, w) in written.iter().enumerate() {
        w.check_writable()?;
        let (a0, a1) = w.span()?;
        for other in written[i + 1..].iter().chain(read) {
            let (b0, b1) = other.span()?;
            if a0 < b1 && b0 < a1 {
                return Err(invalid(format!(
                    "{} and {} share memory, and this call writes {}: pass separate buffers",
                    w.name, other.name, w.name
                )));
            }
        }
    }
    Ok(())
}

/// FlashAttention-2's score arguments of a call, as the natives take them.
pub(crate) struct Scores<'py> {
    /// `None`: the library's default, `1/sqrt(head_dim)`.
    pub softmax_scale: Option<f32>,
    pub causal: bool,
    /// `window_size`, -1 for an unbounded side.
    pub window: (i64, i64),
    /// 0 = off.
    pub softcap: f32,
    /// A host float32 array `[heads_q]` or `[batch, heads_q]` (Python copies it there), or a
    /// device one where [`Scores::device`] holds it.
    pub alibi_slopes: Option<Bound<'py, PyAny>>,
    /// A host float32 array `[heads_q]`: the learnable sink's logits (Python copies it there),
    /// or a device one where [`Scores::device`] holds it.
    pub learnable_sink: Option<Bound<'py, PyAny>>,
    /// The slopes and sink as device arrays, already taken (the CUDA KV-cache call, which
    /// reads them where they are, [`Scores::with_device_values`]): the problem then gets
    /// zeros of their shape, which only state the modifier; the call passes these arrays to
    /// the kernels.
    pub device: [Option<Borrowed>; 2],
}

impl<'py> Scores<'py> {
    /// The arguments in the natives' order.
    pub(crate) fn new(
        softmax_scale: Option<f32>,
        causal: bool,
        window: (i64, i64),
        softcap: f32,
        alibi_slopes: Option<Bound<'py, PyAny>>,
    ) -> Self {
        Scores {
            softmax_scale,
            causal,
            window,
            softcap,
            alibi_slopes,
            learnable_sink: None,
            device: [None, None],
        }
    }

    /// These options with the slopes and the sink's logits as the caller took them on the
    /// device (`[slopes, sink]`, each `None` where not there: [`Scores::device`]).
    pub(crate) fn with_device_values(mut self, device: [Option<Borrowed>; 2]) -> Self {
        self.device = device;
        self
    }

    /// These options with a learnable sink (`None`: none).
    pub(crate) fn with_sink(mut self, learnable_sink: Option<Bound<'py, PyAny>>) -> Self {
        self.learnable_sink = learnable_sink;
        self
    }

    /// Causal or not, with the default scale or `softmax_scale`, and nothing else.
    pub(crate) fn plain(softmax_scale: Option<f32>, causal: bool) -> Self {
        Self::new(softmax_scale, causal, (-1, -1), 0.0, None)
    }

    /// `p` with these options; `batch` and `heads_q` judge the slopes' shape.
    pub(crate) fn apply<P: Problem>(&self, p: P, batch: usize, heads_q: usize) -> PyResult<P> {
        let mods = ScoreMods {
            window: Window::from_fa(self.window.0, self.window.1).map_err(err)?,
            softcap: (self.softcap != 0.0).then_some(self.softcap),
            alibi: alibi(
                self.alibi_slopes.as_ref(),
                batch,
                heads_q,
                self.device[0].as_ref(),
            )?,
            sink: sink(
                self.learnable_sink.as_ref(),
                heads_q,
                self.device[1].as_ref(),
            )?,
        };
        let p = p.mask(if self.causal {
            Mask::Causal
        } else {
            Mask::None
        });
        let p = match self.softmax_scale {
            Some(s) => p.scale(s).map_err(err)?,
            None => p,
        };
        p.scores(mods).map_err(err)
    }
}

/// The library's problems (dense, packed, KV cache), which take the same options.
pub(crate) trait Problem: Sized {
    fn mask(self, mask: Mask) -> Self;
    fn scale(self, softmax_scale: f32) -> Result<Self, AttnError>;
    fn scores(self, scores: ScoreMods) -> Result<Self, AttnError>;
}

macro_rules! problem {
    ($($t:ty),*) => {$(
        impl Problem for $t {
            fn mask(self, mask: Mask) -> Self {
                self.with_mask(mask)
            }
            fn scale(self, softmax_scale: f32) -> Result<Self, AttnError> {
                self.with_scale(softmax_scale)
            }
            fn scores(self, scores: ScoreMods) -> Result<Self, AttnError> {
                self.with_scores(scores)
            }
        }
    )*};
}
problem!(
    AttnProblem,
    VarlenProblem,
    DeviceVarlenProblem,
    KvCacheShape
);

/// A shape as Python writes it: `(3,)`, `(2, 4)`.
fn tuple(shape: &[usize]) -> String {
    match shape {
        [x] => format!("({x},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The argument `x` as a tensor: `device` where the caller took it on the device already,
/// else taken here (a host array, or a device one that [`alibi`] and [`sink`] refuse).
fn taken<'b>(
    x: &Bound<'_, PyAny>,
    name: &'static str,
    device: Option<&'b Borrowed>,
    here: &'b mut Option<Borrowed>,
) -> PyResult<&'b Borrowed> {
    match device {
        Some(t) => Ok(t),
        None => Ok(here.insert(Borrowed::take_on(x, name, None)?)),
    }
}

/// `alibi_slopes` `[heads_q]`, or `[batch, heads_q]` (per batch entry), as the library's
/// slopes (their count and values are the library's to judge); zeros of their shape where
/// the call reads them on the `device`.
fn alibi(
    slopes: Option<&Bound<'_, PyAny>>,
    batch: usize,
    heads_q: usize,
    device: Option<&Borrowed>,
) -> PyResult<Option<Alibi>> {
    let Some(x) = slopes else {
        return Ok(None);
    };
    let mut here = None;
    let t = taken(x, "alibi_slopes", device, &mut here)?;
    let shape = t.shape();
    if shape != [heads_q] && shape != [batch, heads_q] {
        return Err(invalid(format!(
            "alibi_slopes has shape {}; expected ({heads_q},) or ({batch}, {heads_q})",
            tuple(&shape)
        )));
    }
    if (t.place()?.is_some() && device.is_none()) || t.dtype()? != "float32" {
        return Err(invalid(match device {
            Some(_) => "alibi_slopes: pass float32 values, on the host or on q's device (flashattn's functions convert them)".into(),
            None => "alibi_slopes: pass a host float32 array (flashattn's functions copy it there)".into(),
        }));
    }
    compact(t, shape.len(), "[heads_q] or [batch, heads_q]")?;
    let slopes = if device.is_some() {
        vec![0.0; t.extent()?] // the device array is the call's
    } else {
        // SAFETY: a compact float32 tensor on the host.
        unsafe { t.slice::<f32>()? }.to_vec()
    };
    Ok(Some(Alibi {
        slopes,
        per_batch: shape.len() == 2 && batch > 1,
    }))
}

/// `learnable_sink` `[heads_q]` as the library's sink logits (their values are the library's
/// to judge: finite); zeros where the call reads them on the `device`.
fn sink(
    logits: Option<&Bound<'_, PyAny>>,
    heads_q: usize,
    device: Option<&Borrowed>,
) -> PyResult<Option<Vec<f32>>> {
    let Some(x) = logits else {
        return Ok(None);
    };
    let mut here = None;
    let t = taken(x, "learnable_sink", device, &mut here)?;
    let shape = t.shape();
    if shape != [heads_q] {
        return Err(invalid(format!(
            "learnable_sink has shape {}; expected ({heads_q},): one logit per query head",
            tuple(&shape)
        )));
    }
    if (t.place()?.is_some() && device.is_none()) || t.dtype()? != "float32" {
        return Err(invalid(match device {
            Some(_) => "learnable_sink: pass float32 logits, on the host or on q's device (flashattn's functions convert them)".into(),
            None => "learnable_sink: pass a host float32 array (flashattn's functions copy it there)".into(),
        }));
    }
    compact(t, 1, "[heads_q]")?;
    if device.is_some() {
        return Ok(Some(vec![0.0; heads_q])); // the device array is the call's
    }
    // SAFETY: a compact float32 tensor on the host.
    Ok(Some(unsafe { t.slice::<f32>()? }.to_vec()))
}

/// The gradient buffer of a learnable sink, `d_sink`: float32, compact `[heads_q]`, on the
/// call's device (checked with the others), and the problem must have a sink.
pub(crate) fn check_d_sink(t: &Borrowed, scores: &ScoreMods, hq: usize) -> PyResult<()> {
    if scores.sink.is_none() {
        return Err(invalid(
            "d_sink was given without learnable_sink: pass both, or neither".into(),
        ));
    }
    if t.dtype()? != "float32" || compact(t, 1, "[heads_q]")? != [hq] {
        return Err(invalid(format!(
            "d_sink has shape {} and dtype {}; expected a contiguous float32 ({hq},)",
            tuple(&t.shape()),
            t.dtype()?
        )));
    }
    Ok(())
}

/// The problem of a dense call: sizes `[batch, seqlen_q, seqlen_k, heads_q, heads_kv,
/// head_dim]` and the strides of q, k, v, o.
pub(crate) fn problem(
    [b, sq, sk, hq, hkv, d]: [usize; 6],
    [qs, ks, vs, os]: [Strides; 4],
    scores: &Scores,
) -> PyResult<AttnProblem> {
    let p = AttnProblem::new(AttnShape::from_sizes([b, sq, sk, hq, hkv, d]))
        .map_err(err)?
        .with_strides(qs, ks, vs, os)
        .map_err(err)?;
    scores.apply(p, b, hq)
}

/// The problem of a bshd call after checking its tensors: q, k, v, out (q's shape) and lse
/// (a contiguous f32 `[batch, heads_q, seqlen_q]`).
pub(crate) fn bshd_problem(
    [tq, tk, tv, to, tl]: [&Borrowed; 5],
    scores: &Scores,
) -> PyResult<AttnProblem> {
    let ([b, sq, hq, d], qs) = bshd(tq)?;
    let ([bk, sk, hkv, dk], ks) = bshd(tk)?;
    let (vshape, vs) = bshd(tv)?;
    let (oshape, os) = bshd(to)?;
    if bk != b || dk != d || vshape != [bk, sk, hkv, dk] || oshape != [b, sq, hq, d] {
        return Err(invalid(format!(
            "shapes disagree: q {:?}, k {:?}, v {vshape:?}, out {oshape:?}; k and v must be [batch, seqlen_k, heads_kv, head_dim] with q's batch and head_dim, out q's shape",
            [b, sq, hq, d],
            [bk, sk, hkv, dk]
        )));
    }
    let p = problem([b, sq, sk, hq, hkv, d], [qs, ks, vs, os], scores)?;
    let lshape = tl.shape();
    // (compact() judges strides only where a dimension has more than one element: DLPack
    // producers may report anything, e.g. 1, for the others.)
    if lshape != [b, hq, sq] || compact(tl, 3, "[batch, heads_q, seqlen_q]").is_err() {
        return Err(invalid(format!(
            "lse has shape {lshape:?}; expected a contiguous float32 [{b}, {hq}, {sq}]"
        )));
    }
    Ok(p)
}

/// The backward's extra tensors: `dout` with out's shape and strides; `dq` (q's shape), `dk`,
/// `dv` (k's shape) compact.
pub(crate) fn check_grads(
    [tq, tk, to, tdo]: [&Borrowed; 4],
    [tdq, tdk, tdv]: [&Borrowed; 3],
) -> PyResult<()> {
    // Strides compared where a dimension has more than one element (see bshd_problem).
    let (dshape, dstr, ostr) = (tdo.shape(), tdo.strides()?, to.strides()?);
    let same_layout =
        dshape == to.shape() && (0..dshape.len()).all(|i| dshape[i] <= 1 || dstr[i] == ostr[i]);
    if !same_layout {
        return Err(invalid(format!(
            "dout has shape {dshape:?} and strides {dstr:?}; it must have out's ({:?}, {ostr:?})",
            to.shape(),
        )));
    }
    let (qshape, kshape) = (tq.shape(), tk.shape());
    for (t, want) in [(tdq, &qshape), (tdk, &kshape), (tdv, &kshape)] {
        if compact(t, 4, BSHD)? != *want {
            return Err(invalid(format!(
                "{} has shape {:?}; expected {want:?}",
                t.name,
                t.shape()
            )));
        }
    }
    Ok(())
}

/// The problem of a packed variable-length call: q `[total_q, heads_q, head_dim]`, k, v
/// `[total_k, heads_kv, head_dim]`, out like q, lse `[heads_q, total_q]`, all compact, with the
/// offsets' totals.
pub(crate) fn varlen_problem(
    t: [&Borrowed; 5],
    cu_seqlens_q: Vec<i32>,
    cu_seqlens_k: Vec<i32>,
    scores: &Scores,
) -> PyResult<VarlenProblem> {
    let (qs, ks) = packed_shapes(t)?;
    let batch = cu_seqlens_q.len().saturating_sub(1);
    let p = VarlenProblem::new(cu_seqlens_q, cu_seqlens_k, qs[1], ks[1], qs[2]).map_err(err)?;
    let p = scores.apply(p, batch, qs[1])?;
    if p.total_q() != qs[0] || p.total_k() != ks[0] {
        return Err(invalid(format!(
            "cu_seqlens_q ends at {} and cu_seqlens_k at {}, but q has {} rows and k {}",
            p.total_q(),
            p.total_k(),
            qs[0],
            ks[0]
        )));
    }
    Ok(p)
}

/// The shapes of a packed call's q, k, v, out, lse: each compact, q and out `[total_q,
/// heads_q, head_dim]`, k and v `[total_k, heads_kv, head_dim]`, lse `[heads_q, total_q]`.
/// Returns q's and k's.
fn packed_shapes([tq, tk, tv, to, tl]: [&Borrowed; 5]) -> PyResult<(Vec<usize>, Vec<usize>)> {
    let packed = "[total, heads, head_dim]";
    let qs = compact(tq, 3, packed)?;
    let ks = compact(tk, 3, packed)?;
    let vs = compact(tv, 3, packed)?;
    let os = compact(to, 3, packed)?;
    let ls = compact(tl, 2, "[heads_q, total_q]")?;
    if ks != vs || ks[2] != qs[2] || os != qs || ls != [qs[1], qs[0]] {
        return Err(invalid(format!(
            "shapes disagree: q {qs:?}, k {ks:?}, v {vs:?}, out {os:?}, lse {ls:?}"
        )));
    }
    Ok((qs, ks))
}

/// The packed problem of a varlen call whose offsets stay on the device: q, k, v, out, lse
/// as [`varlen_problem`] checks them; `cu_seqlens_q`/`cu_seqlens_k` int32, compact `[batch + 1]`
/// (the same length), on q's device (`place`); `max_seqlen` the caller's (FlashAttention-2's
/// `max_seqlen_q`, `max_seqlen_k`: the kernels cover no more, the offsets are not read here).
pub(crate) fn device_varlen_problem(
    t: [&Borrowed; 5],
    [cq, ck]: [&Borrowed; 2],
    (max_seqlen_q, max_seqlen_k): (usize, usize),
    scores: &Scores,
    place: Option<i32>,
) -> PyResult<DeviceVarlenProblem> {
    let (qs, ks) = packed_shapes(t)?;
    let mut batch = None;
    for t in [cq, ck] {
        if t.place()? != place {
            return Err(invalid(format!(
                "{} is not on q's device: pass the offsets as an int32 tensor on q's device (read there, without a copy)",
                t.name
            )));
        }
        if !t.is_int32() {
            return Err(invalid(format!(
                "{} is {}; it must be int32 (FlashAttention-2's type): convert it (e.g. .int())",
                t.name,
                t.type_name()
            )));
        }
        let n = compact(t, 1, "[batch + 1]")?[0];
        if n < 2 || batch.is_some_and(|b| b + 1 != n) {
            return Err(invalid(format!(
                "cu_seqlens_q and cu_seqlens_k must both hold batch + 1 >= 2 offsets; {} has {n}",
                t.name
            )));
        }
        batch = Some(n - 1);
    }
    let batch = batch.unwrap_or(0);
    let p = DeviceVarlenProblem::new(
        batch,
        [qs[0], ks[0]],
        [max_seqlen_q, max_seqlen_k],
        qs[1],
        ks[1],
        qs[2],
    )
    .map_err(err)?;
    scores.apply(p, batch, qs[1])
}

/// The varlen backward's extra tensors: `dout` like out, `dq` like q, `dk` and `dv` like k,
/// all compact `[total, heads, head_dim]` (the packed layout the kernels read).
pub(crate) fn check_varlen_grads(
    [tq, tk, tdo]: [&Borrowed; 3],
    [tdq, tdk, tdv]: [&Borrowed; 3],
) -> PyResult<()> {
    let packed = "[total, heads, head_dim]";
    let (qshape, kshape) = (tq.shape(), tk.shape());
    for (t, want) in [
        (tdo, &qshape),
        (tdq, &qshape),
        (tdk, &kshape),
        (tdv, &kshape),
    ] {
        if compact(t, 3, packed)? != *want {
            return Err(invalid(format!(
                "{} has shape {:?}; expected {want:?}",
                t.name,
                t.shape()
            )));
        }
    }
    Ok(())
}

/// `cache_seqlens` as Python passes it: one length for every sequence (on the CPU), or an
/// int32 tensor `[batch]`.
#[derive(FromPyObject)]
pub(crate) enum CacheSeqlens<'py> {
    All(i32),
    Each(Bound<'py, PyAny>),
}

/// `cache_seqlens` taken: one length, a tensor, or none (every cache full, as
/// FlashAttention-2 assumes).
pub(crate) enum Seqlens {
    All(i32),
    Each(Borrowed),
    Full,
}

/// The KV cache's index arguments, taken: `cache_seqlens`, and the int32 tensors
/// `block_table` `[batch, max_blocks]` (`None`: a contiguous cache), `cache_batch_idx` and
/// `cache_leftpad` `[batch]`.
pub(crate) struct CacheIndex {
    pub cache_seqlens: Seqlens,
    pub block_table: Option<Borrowed>,
    pub cache_batch_idx: Option<Borrowed>,
    pub cache_leftpad: Option<Borrowed>,
}

impl CacheIndex {
    /// The index tensors given.
    pub(crate) fn tensors(&self) -> Vec<&Borrowed> {
        let lens = match &self.cache_seqlens {
            Seqlens::Each(t) => Some(t),
            _ => None,
        };
        [
            lens,
            self.block_table.as_ref(),
            self.cache_batch_idx.as_ref(),
            self.cache_leftpad.as_ref(),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// Each index tensor: int32, compact, on q's device (`place`), of `shape` (a block
    /// table's columns are its own).
    fn check(&self, place: Option<i32>, batch: usize) -> PyResult<()> {
        let on = |p: Option<i32>| p.map_or("cpu".to_string(), |i| format!("cuda:{i}"));
        for t in self.tensors() {
            let here = t.place()?;
            if here != place {
                return Err(invalid(format!(
                    "{} is on {} but q on {}: pass the index arrays on q's device (a CUDA call reads them there, without a copy: e.g. .to(q.device))",
                    t.name,
                    on(here),
                    on(place)
                )));
            }
            if !t.is_int32() {
                return Err(invalid(format!(
                    "{} is {}; it must be int32 (FlashAttention-2's type): convert it (e.g. .int() / .astype(np.int32))",
                    t.name,
                    t.type_name()
                )));
            }
            let shape = t.shape();
            let table = t.name == "block_table";
            let want = if table {
                "[batch, max_blocks]"
            } else {
                "[batch]"
            };
            let ok = if table {
                shape.len() == 2 && shape[0] == batch
            } else {
                shape == [batch]
            };
            if !ok {
                return Err(invalid(format!(
                    "{} has shape {}; expected {want} with q's batch {batch}",
                    t.name,
                    tuple(&shape)
                )));
            }
            compact(t, shape.len(), want)?;
        }
        Ok(())
    }
}

/// The KV cache's new rows: both `k` and `v`, or neither.
pub(crate) fn new_rows<T>(k: Option<T>, v: Option<T>) -> PyResult<Option<(T, T)>> {
    match (k, v) {
        (Some(k), Some(v)) => Ok(Some((k, v))),
        (None, None) => Ok(None),
        _ => Err(invalid("pass both k and v (new rows), or neither".into())),
    }
}

/// The rotary tables: both `rotary_cos` and `rotary_sin`, or neither.
pub(crate) fn rotary_tables<T>(cos: Option<T>, sin: Option<T>) -> PyResult<Option<(T, T)>> {
    match (cos, sin) {
        (Some(c), Some(s)) => Ok(Some((c, s))),
        (None, None) => Ok(None),
        (Some(_), None) => Err(invalid(
            "rotary_cos was given without rotary_sin: pass both, or neither".into(),
        )),
        (None, Some(_)) => Err(invalid(
            "rotary_sin was given without rotary_cos: pass both, or neither".into(),
        )),
    }
}

/// The shape of a KV-cache call: q `[batch, seqlen_q, heads_q, head_dim]`; caches
/// `[cache_batch, seqlen_cache, heads_kv, head_dim]` or paged `[num_blocks, page_size,
/// heads_kv, head_dim]`; new rows `[batch, seqlen_new, heads_kv, head_dim]`; out like q; lse
/// `[batch, heads_q, seqlen_q]`; rotary tables `[seqlen_ro, rotary_dim / 2]` (q's dtype, the
/// caller checked); index tensors as [`CacheIndex::check`] says; all compact, the index
/// tensors on q's device (`place`).
pub(crate) fn kvcache_shape(
    [tq, tkc, tvc, to, tl]: [&Borrowed; 5],
    new: Option<&(Borrowed, Borrowed)>,
    index: &CacheIndex,
    rotary: Option<(&(Borrowed, Borrowed), bool)>,
    (scores, place): (&Scores, Option<i32>),
) -> PyResult<KvCacheShape> {
    let qs = compact(tq, 4, BSHD)?;
    let cs = compact(
        tkc,
        4,
        "[batch or num_blocks, seqlen_cache or page_size, heads_kv, head_dim]",
    )?;
    let (b, sq, hq, d, hkv) = (qs[0], qs[1], qs[2], qs[3], cs[2]);
    if compact(tvc, 4, BSHD)? != cs || cs[3] != d || compact(to, 4, BSHD)? != qs {
        return Err(invalid(format!(
            "shapes disagree: q {qs:?}, k_cache {cs:?}, v_cache {:?}, out {:?}",
            tvc.shape(),
            to.shape()
        )));
    }
    if compact(tl, 3, "[batch, heads_q, seqlen_q]")? != [b, hq, sq] {
        return Err(invalid(format!(
            "lse has shape {:?}; expected [{b}, {hq}, {sq}]",
            tl.shape()
        )));
    }
    index.check(place, b)?;
    let seqlen_new = match new {
        Some((k, v)) => {
            let ns = compact(k, 4, BSHD)?;
            if compact(v, 4, BSHD)? != ns || ns[0] != b || ns[2] != hkv || ns[3] != d {
                return Err(invalid(format!(
                    "new rows k {ns:?}, v {:?}; expected [{b}, seqlen_new, {hkv}, {d}]",
                    v.shape()
                )));
            }
            ns[1]
        }
        None => 0,
    };
    let cache = match &index.block_table {
        Some(table) => CacheDims::Paged {
            num_blocks: cs[0],
            page_size: cs[1],
            max_blocks: table.shape()[1],
        },
        None => CacheDims::Contiguous {
            cache_batch: cs[0],
            seqlen_cache: cs[1],
        },
    };
    let rotary = match rotary {
        Some(((cos, sin), interleaved)) => {
            let what = "[seqlen_ro, rotary_dim / 2]";
            let shape = compact(cos, 2, what)?;
            if compact(sin, 2, what)? != shape {
                return Err(invalid(format!(
                    "rotary_cos has shape {} but rotary_sin {}: pass tables of one shape {what}",
                    tuple(&shape),
                    tuple(&sin.shape())
                )));
            }
            Some(Rotary {
                dim: 2 * shape[1],
                seqlen_ro: shape[0],
                interleaved,
            })
        }
        None => None,
    };
    let shape = KvCacheShape {
        batch: b,
        seqlen_q: sq,
        heads_q: hq,
        heads_kv: hkv,
        head_dim: d,
        cache,
        seqlen_new,
        mask: Mask::None,
        softmax_scale: flashattn::shape::default_scale(d),
        scores: ScoreMods::default(),
        rotary,
        batch_idx: index.cache_batch_idx.is_some(),
        leftpad: index.cache_leftpad.is_some(),
    };
    let shape = scores.apply(shape, b, hq)?;
    shape.validate().map_err(err)?;
    Ok(shape)
}

/// The index values of a call on the CPU (its tensors are host int32 arrays, checked by
/// [`kvcache_shape`]).
pub(crate) fn host_index(shape: &KvCacheShape, index: &CacheIndex) -> PyResult<HostIndex> {
    // SAFETY: compact int32 tensors on the host (CacheIndex::check).
    let values = |t: &Borrowed| -> PyResult<Vec<i32>> { Ok(unsafe { t.slice::<i32>()? }.to_vec()) };
    let opt = |t: &Option<Borrowed>| t.as_ref().map(values).transpose();
    let cache_seqlens = match &index.cache_seqlens {
        Seqlens::Each(t) => values(t)?,
        Seqlens::All(len) => vec![*len; shape.batch],
        Seqlens::Full => {
            let full = shape.capacity().saturating_sub(shape.seqlen_new);
            vec![i32::try_from(full).unwrap_or(i32::MAX); shape.batch]
        }
    };
    Ok(HostIndex {
        cache_seqlens,
        block_table: index
            .block_table
            .as_ref()
            .map(values)
            .transpose()?
            .unwrap_or_default(),
        cache_batch_idx: opt(&index.cache_batch_idx)?,
        cache_leftpad: opt(&index.cache_leftpad)?,
    })
}
