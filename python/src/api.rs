//! The API.

use crate::dlpack::{Borrowed, handshake, placement, take_all};
use crate::rules::{
    bshd, bshd_problem, check_disjoint, compact, cuda_dtype, problem, same_dtype, score_mods,
};
use crate::{FlashAttnError, err, gpu};
use flashattn::shape::{AttnProblem, Strides};
use flashattn::{Element, Mask};
use half::{bf16, f16};
use pyo3::prelude::*;

/// Runs attention: `q` `[batch, seqlen_q, heads_q, head_dim]`, `k`/`v` `[batch, seqlen_k,
/// heads_kv, head_dim]`, written into `out` (q's shape, any strides with head_dim contiguous)
/// and `lse` (f32 `[batch, heads_q, seqlen_q]`, contiguous). CPU tensors run on the CPU
/// backend (f16, bf16, f32); CUDA tensors (f16, bf16) on the GPU kernels, enqueued on
/// `stream` (a raw `CUstream` handle; `None` or 0: the legacy default stream; `current`: it
/// is the tensors' producer's current stream, see [`handshake`]). Returns where it ran.
#[pyfunction]
#[pyo3(signature = (q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, stream=None, current=false, torch=false))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    q: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    lse: &Bound<'_, PyAny>,
    softmax_scale: Option<f32>,
    causal: bool,
    window_left: i64,
    window_right: i64,
    softcap: f32,
    alibi_slopes: Option<Vec<f32>>,
    stream: Option<usize>,
    current: bool,
    torch: bool,
) -> PyResult<String> {
    let hs = handshake(stream, current);
    let [tq, tk, tv, to, tl] = take_all(
        [(q, "q"), (k, "k"), (v, "v"), (out, "out"), (lse, "lse")],
        hs,
        torch,
    );
    let (tq, tk, tv, to, tl) = (tq?, tk?, tv?, to?, tl?);
    let place = placement(&[&tq, &tk, &tv, &to, &tl])?;
    let dtype = tq.dtype()?;
    same_dtype(dtype, &[&tk, &tv, &to], &tl)?;
    check_disjoint(&[&to, &tl], &[&tq, &tk, &tv])?;
    let p = bshd_problem(
        [&tq, &tk, &tv, &to, &tl],
        softmax_scale,
        causal,
        (window_left, window_right),
        softcap,
        alibi_slopes,
    )?;
    // SAFETY: dtypes and devices checked above; the slices cover what the strides address;
    // a CUDA tensor's stream is the one its framework hands out as current.
    unsafe {
        match (place, dtype) {
            (None, "float16") => run::<f16>(&p, &tq, &tk, &tv, &to, &tl),
            (None, "bfloat16") => run::<bf16>(&p, &tq, &tk, &tv, &to, &tl),
            (None, _) => run::<f32>(&p, &tq, &tk, &tv, &to, &tl),
            (Some(id), "float16") => {
                gpu::forward::<f16>(id, stream.unwrap_or(0), &p, &tq, &tk, &tv, &to, &tl)
            }
            (Some(id), "bfloat16") => {
                gpu::forward::<bf16>(id, stream.unwrap_or(0), &p, &tq, &tk, &tv, &to, &tl)
            }
            (Some(_), other) => Err(cuda_dtype(other)),
        }
    }
}

/// Gradients of attention: `q`, `k`, `v`, `out`, `lse` as [`forward`] took and wrote them,
/// `dout` with `out`'s shape and strides; writes `dq` (q's shape), `dk`, `dv` (k's shape), all
/// three contiguous (dk, dv summed over the query heads of each kv head). CPU tensors run on
/// the CPU backward, CUDA tensors on the GPU backward (softcap and ALiBi: CPU only), enqueued
/// on `stream`. `deterministic`: dq the same bytes run to run (GPU; the CPU always is).
#[pyfunction]
#[pyo3(signature = (q, k, v, out, lse, dout, dq, dk, dv, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, deterministic, stream=None, current=false, torch=false))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    q: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    lse: &Bound<'_, PyAny>,
    dout: &Bound<'_, PyAny>,
    dq: &Bound<'_, PyAny>,
    dk: &Bound<'_, PyAny>,
    dv: &Bound<'_, PyAny>,
    softmax_scale: Option<f32>,
    causal: bool,
    window_left: i64,
    window_right: i64,
    softcap: f32,
    alibi_slopes: Option<Vec<f32>>,
    deterministic: bool,
    stream: Option<usize>,
    current: bool,
    torch: bool,
) -> PyResult<String> {
    let hs = handshake(stream, current);
    let [tq, tk, tv, to, tl, tdo, tdq, tdk, tdv] = take_all(
        [
            (q, "q"),
            (k, "k"),
            (v, "v"),
            (out, "out"),
            (lse, "lse"),
            (dout, "dout"),
            (dq, "dq"),
            (dk, "dk"),
            (dv, "dv"),
        ],
        hs,
        torch,
    );
    let (tq, tk, tv, to, tl, tdo) = (tq?, tk?, tv?, to?, tl?, tdo?);
    let (tdq, tdk, tdv) = (tdq?, tdk?, tdv?);
    let place = placement(&[&tq, &tk, &tv, &to, &tl, &tdo, &tdq, &tdk, &tdv])?;
    let dtype = tq.dtype()?;
    same_dtype(dtype, &[&tk, &tv, &to, &tdo, &tdq, &tdk, &tdv], &tl)?;
    check_disjoint(&[&tdq, &tdk, &tdv], &[&tq, &tk, &tv, &to, &tl, &tdo])?;
    let p = bshd_problem(
        [&tq, &tk, &tv, &to, &tl],
        softmax_scale,
        causal,
        (window_left, window_right),
        softcap,
        alibi_slopes,
    )?;
    // Strides compared where a dimension has more than one element (see bshd_problem).
    let (dshape, dstr, ostr) = (tdo.shape(), tdo.strides()?, to.strides()?);
    let same_layout =
        dshape == to.shape() && (0..dshape.len()).all(|i| dshape[i] <= 1 || dstr[i] == ostr[i]);
    if !same_layout {
        return Err(FlashAttnError::new_err(format!(
            "dout has shape {:?} and strides {:?}; it must have out's ({:?}, {:?})",
            tdo.shape(),
            tdo.strides()?,
            to.shape(),
            to.strides()?
        )));
    }
    let (qshape, kshape) = (tq.shape(), tk.shape());
    for (t, want) in [(&tdq, &qshape), (&tdk, &kshape), (&tdv, &kshape)] {
        if compact(t, 4, "[batch, seqlen, heads, head_dim]")? != *want {
            return Err(FlashAttnError::new_err(format!(
                "{} has shape {:?}; expected {want:?}",
                t.name,
                t.shape()
            )));
        }
    }
    let ins = [&tq, &tk, &tv, &to, &tl, &tdo];
    let grads = [&tdq, &tdk, &tdv];
    // SAFETY: dtypes, devices, shapes and strides checked above.
    unsafe {
        match (place, dtype) {
            (None, "float16") => run_backward::<f16>(&p, ins, grads),
            (None, "bfloat16") => run_backward::<bf16>(&p, ins, grads),
            (None, _) => run_backward::<f32>(&p, ins, grads),
            (Some(id), "float16") => {
                gpu::backward::<f16>(id, stream.unwrap_or(0), &p, deterministic, ins, grads)
            }
            (Some(id), "bfloat16") => {
                gpu::backward::<bf16>(id, stream.unwrap_or(0), &p, deterministic, ins, grads)
            }
            (Some(_), other) => Err(cuda_dtype(other)),
        }
    }
}

/// # Safety
/// Every tensor holds `T` (lse f32) on the CPU; the gradients are compact.
unsafe fn run_backward<T: Element>(
    p: &AttnProblem,
    [q, k, v, o, lse, d_o]: [&Borrowed; 6],
    [dq, dk, dv]: [&Borrowed; 3],
) -> PyResult<String> {
    // SAFETY: the caller checked dtype and device; the gradients are distinct writable buffers.
    unsafe {
        flashattn::cpu_backward::backward(
            p,
            q.slice::<T>()?,
            k.slice::<T>()?,
            v.slice::<T>()?,
            o.slice::<T>()?,
            lse.slice::<f32>()?,
            d_o.slice::<T>()?,
            dq.slice_mut::<T>()?,
            dk.slice_mut::<T>()?,
            dv.slice_mut::<T>()?,
        )
        .map_err(err)?;
    }
    Ok(format!("cpu ({} threads)", rayon_threads()))
}

/// # Safety
/// Every tensor holds `T` (lse f32) on the CPU.
unsafe fn run<T: Element>(
    p: &AttnProblem,
    q: &Borrowed,
    k: &Borrowed,
    v: &Borrowed,
    o: &Borrowed,
    lse: &Borrowed,
) -> PyResult<String> {
    // SAFETY: the caller checked dtype and device.
    let (q, k, v) = unsafe { (q.slice::<T>()?, k.slice::<T>()?, v.slice::<T>()?) };
    // SAFETY: as above; out and lse are distinct writable buffers of the caller.
    let (o, lse) = unsafe { (o.slice_mut::<T>()?, lse.slice_mut::<f32>()?) };
    flashattn::cpu::forward(p, q, k, v, o, lse).map_err(err)?;
    Ok(format!("cpu ({} threads)", rayon_threads()))
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The exact f64 oracle on CPU tensors (q, k, v as for `forward`): returns `(o, lse)` as flat
/// f64 lists (o dense `[batch, seqlen_q, heads_q, head_dim]`, lse `[batch, heads_q, seqlen_q]`),
/// for tests.
#[pyfunction]
#[pyo3(signature = (q, k, v, softmax_scale, causal))]
pub(crate) fn reference(
    q: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    softmax_scale: Option<f32>,
    causal: bool,
) -> PyResult<(Vec<f64>, Vec<f64>)> {
    let tq = Borrowed::take(q, "q")?;
    let tk = Borrowed::take(k, "k")?;
    let tv = Borrowed::take(v, "v")?;
    for t in [&tq, &tk, &tv] {
        t.check_cpu()?;
    }
    let ([b, sq, hq, d], qs) = bshd(&tq)?;
    let ([_, sk, hkv, _], ks) = bshd(&tk)?;
    let (_, vs) = bshd(&tv)?;
    let dense = Strides::contiguous(sq, hq, d);
    let p = problem(
        [b, sq, sk, hq, hkv, d],
        causal,
        [qs, ks, vs, dense],
        softmax_scale,
    )?;
    let dtype = tq.dtype()?;
    // SAFETY: dtype and device checked.
    let r = unsafe {
        match dtype {
            "float16" => flashattn::reference::attention(
                &p,
                tq.slice::<f16>()?,
                tk.slice::<f16>()?,
                tv.slice::<f16>()?,
            ),
            "bfloat16" => flashattn::reference::attention(
                &p,
                tq.slice::<bf16>()?,
                tk.slice::<bf16>()?,
                tv.slice::<bf16>()?,
            ),
            _ => flashattn::reference::attention(
                &p,
                tq.slice::<f32>()?,
                tk.slice::<f32>()?,
                tv.slice::<f32>()?,
            ),
        }
    }
    .map_err(err)?;
    Ok((r.o, r.lse))
}

/// Runs a packed variable-length batch on CPU tensors (FlashAttention-2's varlen layout):
/// `q` `[total_q, heads_q, head_dim]`, `k`/`v` `[total_k, heads_kv, head_dim]`, all
/// contiguous, written into `out` (like q) and `lse` (f32 `[heads_q, total_q]`).
#[pyfunction]
#[pyo3(signature = (q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, stream=None, current=false, torch=false))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn varlen_forward(
    q: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    lse: &Bound<'_, PyAny>,
    cu_seqlens_q: Vec<i32>,
    cu_seqlens_k: Vec<i32>,
    softmax_scale: Option<f32>,
    causal: bool,
    window_left: i64,
    window_right: i64,
    softcap: f32,
    alibi_slopes: Option<Vec<f32>>,
    stream: Option<usize>,
    current: bool,
    torch: bool,
) -> PyResult<String> {
    let hs = handshake(stream, current);
    let [tq, tk, tv, to, tl] = take_all(
        [(q, "q"), (k, "k"), (v, "v"), (out, "out"), (lse, "lse")],
        hs,
        torch,
    );
    let (tq, tk, tv, to, tl) = (tq?, tk?, tv?, to?, tl?);
    let place = placement(&[&tq, &tk, &tv, &to, &tl])?;
    let packed = "[total, heads, head_dim]";
    let qs = compact(&tq, 3, packed)?;
    let ks = compact(&tk, 3, packed)?;
    let vs = compact(&tv, 3, packed)?;
    let os = compact(&to, 3, packed)?;
    let ls = compact(&tl, 2, "[heads_q, total_q]")?;
    if ks != vs || ks[2] != qs[2] || os != qs || ls != [qs[1], qs[0]] {
        return Err(FlashAttnError::new_err(format!(
            "shapes disagree: q {qs:?}, k {ks:?}, v {vs:?}, out {os:?}, lse {ls:?}"
        )));
    }
    let dtype = tq.dtype()?;
    same_dtype(dtype, &[&tk, &tv, &to], &tl)?;
    check_disjoint(&[&to, &tl], &[&tq, &tk, &tv])?;
    let batch = cu_seqlens_q.len().saturating_sub(1);
    let mut p =
        flashattn::varlen::VarlenProblem::new(cu_seqlens_q, cu_seqlens_k, qs[1], ks[1], qs[2])
            .map_err(err)?
            .with_mask(if causal { Mask::Causal } else { Mask::None });
    if let Some(s) = softmax_scale {
        p = p.with_scale(s).map_err(err)?;
    }
    p = p
        .with_scores(score_mods(
            (window_left, window_right),
            softcap,
            alibi_slopes,
            batch,
            qs[1],
        )?)
        .map_err(err)?;
    if p.total_q() != qs[0] || p.total_k() != ks[0] {
        return Err(FlashAttnError::new_err(format!(
            "cu_seqlens_q ends at {} and cu_seqlens_k at {}, but q has {} rows and k {}",
            p.total_q(),
            p.total_k(),
            qs[0],
            ks[0]
        )));
    }
    // SAFETY: dtypes and devices checked; the tensors are compact with the sizes checked.
    unsafe {
        let s = stream.unwrap_or(0);
        match (place, dtype) {
            (None, "float16") => run_varlen::<f16>(&p, &tq, &tk, &tv, &to, &tl),
            (None, "bfloat16") => run_varlen::<bf16>(&p, &tq, &tk, &tv, &to, &tl),
            (None, _) => run_varlen::<f32>(&p, &tq, &tk, &tv, &to, &tl),
            (Some(id), "float16") => gpu::varlen::<f16>(id, s, &p, &tq, &tk, &tv, &to, &tl),
            (Some(id), "bfloat16") => gpu::varlen::<bf16>(id, s, &p, &tq, &tk, &tv, &to, &tl),
            (Some(_), other) => Err(cuda_dtype(other)),
        }
    }
}

/// # Safety
/// Every tensor holds `T` (lse f32) on the CPU, compact, with the problem's sizes.
unsafe fn run_varlen<T: Element>(
    p: &flashattn::varlen::VarlenProblem,
    q: &Borrowed,
    k: &Borrowed,
    v: &Borrowed,
    o: &Borrowed,
    lse: &Borrowed,
) -> PyResult<String> {
    // SAFETY: the caller checked dtype, device and sizes.
    let (q, k, v) = unsafe { (q.slice::<T>()?, k.slice::<T>()?, v.slice::<T>()?) };
    let r = flashattn::varlen::forward(flashattn::BackendChoice::Cpu, p, q, k, v).map_err(err)?;
    // SAFETY: as above; out and lse are the caller's writable buffers of these sizes.
    unsafe {
        o.slice_mut::<T>()?.copy_from_slice(&r.o);
        lse.slice_mut::<f32>()?.copy_from_slice(&r.lse);
    }
    Ok(r.ran)
}

/// Decoding against a KV cache on CPU tensors (FlashAttention-2's `flash_attn_with_kvcache`):
/// `q` `[batch, seqlen_q, heads_q, head_dim]`; caches contiguous `[batch, seqlen_cache,
/// heads_kv, head_dim]`, or paged `[num_blocks, page_size, heads_kv, head_dim]` with
/// `block_table` (row-major `[batch, max_blocks]`); optional new rows `k_new`/`v_new`
/// `[batch, seqlen_new, heads_kv, head_dim]` appended to the caches in place; all compact.
/// Writes `out` (like q) and `lse` (f32 `[batch, heads_q, seqlen_q]`).
#[pyfunction]
#[pyo3(signature = (q, k_cache, v_cache, k_new, v_new, out, lse, cache_seqlens, block_table, max_blocks, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, num_splits, stream=None, current=false))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn kvcache_forward(
    q: &Bound<'_, PyAny>,
    k_cache: &Bound<'_, PyAny>,
    v_cache: &Bound<'_, PyAny>,
    k_new: Option<&Bound<'_, PyAny>>,
    v_new: Option<&Bound<'_, PyAny>>,
    out: &Bound<'_, PyAny>,
    lse: &Bound<'_, PyAny>,
    cache_seqlens: Option<Vec<i32>>,
    block_table: Option<Vec<i32>>,
    max_blocks: usize,
    softmax_scale: Option<f32>,
    causal: bool,
    window_left: i64,
    window_right: i64,
    softcap: f32,
    alibi_slopes: Option<Vec<f32>>,
    num_splits: usize,
    stream: Option<usize>,
    current: bool,
) -> PyResult<String> {
    let hs = handshake(stream, current);
    let tq = Borrowed::take_on(q, "q", hs)?;
    let tkc = Borrowed::take_on(k_cache, "k_cache", hs)?;
    let tvc = Borrowed::take_on(v_cache, "v_cache", hs)?;
    let to = Borrowed::take_on(out, "out", hs)?;
    let tl = Borrowed::take_on(lse, "lse", hs)?;
    let new = match (k_new, v_new) {
        (Some(k), Some(v)) => Some((
            Borrowed::take_on(k, "k", hs)?,
            Borrowed::take_on(v, "v", hs)?,
        )),
        (None, None) => None,
        _ => {
            return Err(FlashAttnError::new_err(
                "pass both k and v (new rows), or neither",
            ));
        }
    };
    let mut all = vec![&tq, &tkc, &tvc, &to, &tl];
    if let Some((k, v)) = &new {
        all.extend([k, v]);
    }
    let place = placement(&all)?;
    let bshd_c = "[batch, seqlen, heads, head_dim]";
    let qs = compact(&tq, 4, bshd_c)?;
    let cs = compact(
        &tkc,
        4,
        "[batch or num_blocks, seqlen_cache or page_size, heads_kv, head_dim]",
    )?;
    let (b, sq, hq, d, hkv) = (qs[0], qs[1], qs[2], qs[3], cs[2]);
    if compact(&tvc, 4, bshd_c)? != cs || cs[3] != d || compact(&to, 4, bshd_c)? != qs {
        return Err(FlashAttnError::new_err(format!(
            "shapes disagree: q {qs:?}, k_cache {cs:?}, v_cache {:?}, out {:?}",
            tvc.shape(),
            to.shape()
        )));
    }
    if compact(&tl, 3, "[batch, heads_q, seqlen_q]")? != [b, hq, sq] {
        return Err(FlashAttnError::new_err(format!(
            "lse has shape {:?}; expected [{b}, {hq}, {sq}]",
            tl.shape()
        )));
    }
    let seqlen_new = match &new {
        Some((k, v)) => {
            let ns = compact(k, 4, bshd_c)?;
            if compact(v, 4, bshd_c)? != ns || ns[0] != b || ns[2] != hkv || ns[3] != d {
                return Err(FlashAttnError::new_err(format!(
                    "new rows k {ns:?}, v {:?}; expected [{b}, seqlen_new, {hkv}, {d}]",
                    v.shape()
                )));
            }
            ns[1]
        }
        None => 0,
    };
    let dtype = tq.dtype()?;
    let others: Vec<&Borrowed> = all
        .iter()
        .copied()
        .filter(|t| t.name != "q" && t.name != "lse")
        .collect();
    same_dtype(dtype, &others, &tl)?;
    let layout = match block_table {
        Some(table) => flashattn::kvcache::CacheLayout::Paged {
            num_blocks: cs[0],
            page_size: cs[1],
            block_table: table,
            max_blocks,
        },
        None => flashattn::kvcache::CacheLayout::Contiguous {
            seqlen_cache: cs[1],
        },
    };
    let capacity = match &layout {
        flashattn::kvcache::CacheLayout::Paged { page_size, .. } => page_size * max_blocks,
        flashattn::kvcache::CacheLayout::Contiguous { seqlen_cache } => *seqlen_cache,
    };
    // No cache_seqlens: every cache is full (what FlashAttention-2 assumes).
    let lens = cache_seqlens.unwrap_or_else(|| vec![capacity.saturating_sub(seqlen_new) as i32; b]);
    let mut p =
        flashattn::kvcache::KvCacheProblem::new(b, sq, hq, hkv, d, layout, lens, seqlen_new)
            .map_err(err)?
            .with_mask(if causal { Mask::Causal } else { Mask::None });
    if let Some(s) = softmax_scale {
        p = p.with_scale(s).map_err(err)?;
    }
    p = p
        .with_scores(score_mods(
            (window_left, window_right),
            softcap,
            alibi_slopes,
            b,
            hq,
        )?)
        .map_err(err)?;
    // The caches (new rows appended in place), out and lse are written.
    let mut read = vec![&tq];
    if let Some((k, v)) = &new {
        read.extend([k, v]);
    }
    check_disjoint(&[&tkc, &tvc, &to, &tl], &read)?;
    // The CPU runs one split unless asked; the GPU picks its own count from 0.
    let splits = num_splits.max(1);
    let gpu_splits = (num_splits > 0).then_some(num_splits);
    let (caches, outs, s) = ((&tkc, &tvc), (&to, &tl), stream.unwrap_or(0));
    // SAFETY: dtypes, devices and sizes checked; caches are the caller's writable buffers.
    unsafe {
        match (place, dtype) {
            (None, "float16") => run_kvcache::<f16>(&p, &tq, caches, new.as_ref(), outs, splits),
            (None, "bfloat16") => run_kvcache::<bf16>(&p, &tq, caches, new.as_ref(), outs, splits),
            (None, _) => run_kvcache::<f32>(&p, &tq, caches, new.as_ref(), outs, splits),
            (Some(id), "float16") => {
                gpu::kvcache::<f16>(id, s, &p, &tq, caches, new.as_ref(), outs, gpu_splits)
            }
            (Some(id), "bfloat16") => {
                gpu::kvcache::<bf16>(id, s, &p, &tq, caches, new.as_ref(), outs, gpu_splits)
            }
            (Some(_), other) => Err(cuda_dtype(other)),
        }
    }
}

/// # Safety
/// Every tensor holds `T` (lse f32) on the CPU, compact, with the problem's sizes.
unsafe fn run_kvcache<T: Element>(
    p: &flashattn::kvcache::KvCacheProblem,
    q: &Borrowed,
    (kc, vc): (&Borrowed, &Borrowed),
    new: Option<&(Borrowed, Borrowed)>,
    (o, lse): (&Borrowed, &Borrowed),
    splits: usize,
) -> PyResult<String> {
    // SAFETY: the caller checked dtype, device and sizes; the caches are written in place.
    let r = unsafe {
        let (kn, vn): (&[T], &[T]) = match new {
            Some((k, v)) => (k.slice::<T>()?, v.slice::<T>()?),
            None => (&[], &[]),
        };
        flashattn::kvcache::forward_cpu(
            p,
            q.slice::<T>()?,
            kc.slice_mut::<T>()?,
            vc.slice_mut::<T>()?,
            kn,
            vn,
            splits,
        )
        .map_err(err)?
    };
    // SAFETY: as above.
    unsafe {
        o.slice_mut::<T>()?.copy_from_slice(&r.o);
        lse.slice_mut::<f32>()?.copy_from_slice(&r.lse);
    }
    Ok(format!("cpu ({splits} split(s))"))
}

/// NVRTC's version `(major, minor)` as the library loads it (from the `nvidia-cuda-nvrtc`
/// wheel that `flashattn/__init__.py` preloads, or the system's); raises when none loads.
#[pyfunction]
pub(crate) fn nvrtc_version() -> PyResult<(i32, i32)> {
    flashattn::cuda::nvrtc::nvrtc_version().map_err(err)
}
