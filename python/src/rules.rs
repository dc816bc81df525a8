//! Argument rules.

use crate::dlpack::Borrowed;
use crate::{FlashAttnError, err};
use flashattn::Mask;
use flashattn::scores::{Alibi, ScoreMods, Window};
use flashattn::shape::{AttnProblem, AttnShape, Strides};
use pyo3::prelude::*;

/// A bshd tensor's shape and strides (head_dim contiguous).
pub(crate) fn bshd(t: &Borrowed) -> PyResult<([usize; 4], Strides)> {
    let shape = t.shape();
    if shape.len() != 4 {
        return Err(FlashAttnError::new_err(format!(
            "{} has {} dimensions {shape:?}; expected 4: [batch, seqlen, heads, head_dim]",
            t.name,
            shape.len()
        )));
    }
    let st = t.strides()?;
    // An empty tensor's strides mean nothing (NumPy reports 0): the sizes are refused later.
    if st[3] != 1 && shape[3] > 1 && !shape.contains(&0) {
        return Err(FlashAttnError::new_err(format!(
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

/// Every tensor this call writes must be writable and share no memory with any other tensor
/// of the call (Rust may not read and write one place through two references).
pub(crate) fn check_disjoint(written: &[&Borrowed], read: &[&Borrowed]) -> PyResult<()> {
    for (i, w) in written.iter().enumerate() {
        w.check_writable()?;
        let (a0, a1) = w.span()?;
        for other in written[i + 1..].iter().chain(read) {
            let (b0, b1) = other.span()?;
            if a0 < b1 && b0 < a1 {
                return Err(FlashAttnError::new_err(format!(
                    "{} and {} share memory, and this call writes {}: pass separate buffers",
                    w.name, other.name, w.name
                )));
            }
        }
    }
    Ok(())
}

/// q's element type shared by `others`; lse f32.
pub(crate) fn same_dtype(dtype: &str, others: &[&Borrowed], lse: &Borrowed) -> PyResult<()> {
    for t in others {
        if t.dtype()? != dtype {
            return Err(FlashAttnError::new_err(format!(
                "q is {dtype} but {} is {}: pass q, k, v (and out, the caches) with one element type",
                t.name,
                t.dtype()?
            )));
        }
    }
    if lse.dtype()? != "float32" {
        return Err(FlashAttnError::new_err("lse must be float32"));
    }
    Ok(())
}

/// FlashAttention-2's `window_size`, `softcap` (0 = off) and `alibi_slopes` (`[heads_q]`, or
/// `[batch, heads_q]` flattened) as the library's score modifiers.
pub(crate) fn score_mods(
    (left, right): (i64, i64),
    softcap: f32,
    alibi_slopes: Option<Vec<f32>>,
    batch: usize,
    heads_q: usize,
) -> PyResult<ScoreMods> {
    Ok(ScoreMods {
        window: Window::from_fa(left, right).map_err(err)?,
        softcap: (softcap != 0.0).then_some(softcap),
        alibi: alibi_slopes.map(|slopes| {
            let per_batch = slopes.len() == batch * heads_q && batch > 1;
            Alibi { slopes, per_batch }
        }),
    })
}

/// The problem of a call: sizes `[batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim]`,
/// the mask, the strides of q, k, v, o and the scale (default `1/sqrt(head_dim)`).
pub(crate) fn problem(
    [b, sq, sk, hq, hkv, d]: [usize; 6],
    causal: bool,
    [qs, ks, vs, os]: [Strides; 4],
    softmax_scale: Option<f32>,
) -> PyResult<AttnProblem> {
    let p = AttnProblem::new(AttnShape {
        batch: b,
        seqlen_q: sq,
        seqlen_k: sk,
        heads_q: hq,
        heads_kv: hkv,
        head_dim: d,
    })
    .map_err(err)?
    .with_mask(if causal { Mask::Causal } else { Mask::None })
    .with_strides(qs, ks, vs, os)
    .map_err(err)?;
    match softmax_scale {
        Some(s) => p.with_scale(s).map_err(err),
        None => Ok(p),
    }
}

pub(crate) fn cuda_dtype(dtype: &str) -> PyErr {
    FlashAttnError::new_err(format!(
        "q is {dtype}: the CUDA kernels take float16 or bfloat16; convert the tensors (e.g. q.half()), or run float32 on the CPU"
    ))
}

/// The problem of a bshd call after checking its tensors: q, k, v, out (q's shape) and lse
/// (a contiguous f32 `[batch, heads_q, seqlen_q]`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn bshd_problem(
    [tq, tk, tv, to, tl]: [&Borrowed; 5],
    softmax_scale: Option<f32>,
    causal: bool,
    window: (i64, i64),
    softcap: f32,
    alibi_slopes: Option<Vec<f32>>,
) -> PyResult<AttnProblem> {
    let ([b, sq, hq, d], qs) = bshd(tq)?;
    let ([bk, sk, hkv, dk], ks) = bshd(tk)?;
    let (vshape, vs) = bshd(tv)?;
    let (oshape, os) = bshd(to)?;
    if bk != b || dk != d || vshape != [bk, sk, hkv, dk] || oshape != [b, sq, hq, d] {
        return Err(FlashAttnError::new_err(format!(
            "shapes disagree: q {:?}, k {:?}, v {vshape:?}, out {oshape:?}; k and v must be [batch, seqlen_k, heads_kv, head_dim] with q's batch and head_dim, out q's shape",
            [b, sq, hq, d],
            [bk, sk, hkv, dk]
        )));
    }
    let mods = score_mods(window, softcap, alibi_slopes, b, hq)?;
    let p = problem(
        [b, sq, sk, hq, hkv, d],
        causal,
        [qs, ks, vs, os],
        softmax_scale,
    )?
    .with_scores(mods)
    .map_err(err)?;
    let lshape = tl.shape();
    // (compact() judges strides only where a dimension has more than one element: DLPack
    // producers may report anything, e.g. 1, for the others.)
    if lshape != [b, hq, sq] || compact(tl, 3, "[batch, heads_q, seqlen_q]").is_err() {
        return Err(FlashAttnError::new_err(format!(
            "lse has shape {lshape:?}; expected a contiguous float32 [{b}, {hq}, {sq}]"
        )));
    }
    Ok(p)
}

/// A compact (row-major, no gaps) tensor of `ndim` dimensions: its shape.
pub(crate) fn compact(t: &Borrowed, ndim: usize, what: &str) -> PyResult<Vec<usize>> {
    let shape = t.shape();
    if shape.len() != ndim {
        return Err(FlashAttnError::new_err(format!(
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
            return Err(FlashAttnError::new_err(format!(
                "{} is not contiguous (strides {st:?} for shape {shape:?}); pass a contiguous tensor (.contiguous() / np.ascontiguousarray)",
                t.name
            )));
        }
        want *= shape[i];
    }
    Ok(shape)
}
