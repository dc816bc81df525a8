//! Packed variable-length batches on the GPU ([`crate::problem::varlen`]'s semantics): one `attn_mma`
//! launch over every sequence (attn_common.cuh `IS_VARLEN`), instead of one launch per
//! sequence. The grid covers the longest sequence; each block reads its sequence's offsets and
//! lengths from `cu_seqlens_q`/`cu_seqlens_k` and skips what lies past its end.
//!
//! `attn_wgmma` does not take packed batches yet: its TMA boxes would cross a sequence's end
//! (the copy engine zero-fills only at the end of the whole tensor). Where it serves (sm_90),
//! a call that asks for it runs each sequence as its own `attn_wgmma` launch instead, writing
//! into the packed o and lse in place, for batches of up to [`PER_SEQUENCE_MAX`] sequences
//! of [`PER_SEQUENCE_MIN_MEAN_ROWS`] query rows or more on average ([`per_sequence_pays`]):
//! measured on the H200 (run 38), 8 x 2k and a ragged mix of 64..8k ran 1.3-1.6x faster that
//! way than as one packed `attn_mma` launch; on the H100 shorter sequences ran faster packed
//! (the launches cost more than the kernel saves). Other batches, other GPUs and offsets on the
//! device ([`forward_device_offsets`]) take the packed `attn_mma` launch. The [`LaunchInfo`]
//! says which ran.

use crate::cuda::runtime::args::{check_aligned, check_contexts, check_gpu_problem, device_ptrs};
use crate::cuda::runtime::device::{Gpu, cuda_err};
use crate::cuda::runtime::launch::{
    GpuElement, KernelKind, Launch, LaunchInfo, PackedBatch, ScoreBuffers,
};
use crate::error::{AttnError, Result};
use crate::problem::varlen::VarlenProblem;
use crate::problem::varlen_device::DeviceVarlenProblem;
use crate::shape::{AttnProblem, AttnShape, Strides};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, sys};

/// Largest batch that [`forward_device`] runs as one `attn_wgmma` launch per sequence.
pub const PER_SEQUENCE_MAX: usize = 64;

/// The fewest query rows per sequence, on average, for which [`forward_device`] runs one
/// `attn_wgmma` launch per sequence: below it the launches cost more than the better kernel
/// saves. Measured on the H100 (scripts/device/varlen-offsets.py threshold, causal, d64 and
/// d128, 8-64 equal sequences): the packed `attn_mma` launch took 0.19-0.87x the time at 256-1k
/// rows, 1.03-1.44x at 2k, 1.55-1.91x at 4k.
pub const PER_SEQUENCE_MIN_MEAN_ROWS: usize = 2048;

/// Whether [`forward_device`] runs `p` as one `attn_wgmma` launch per sequence (where
/// attn_wgmma serves it): at most [`PER_SEQUENCE_MAX`] sequences of
/// [`PER_SEQUENCE_MIN_MEAN_ROWS`] query rows or more on average.
pub fn per_sequence_pays(p: &VarlenProblem) -> bool {
    let batch = p.batch();
    batch <= PER_SEQUENCE_MAX && p.total_q() >= PER_SEQUENCE_MIN_MEAN_ROWS * batch
}

/// The dense problem a packed batch is launched as: batch = sequences, seqlen_q / seqlen_k =
/// the longest (at least 1), rows `heads * head_dim` apart (the kernel offsets each sequence
/// by its `cu_seqlens` and ignores the batch strides), and the batch's mask, scale and
/// modifiers.
///
/// # Errors
/// [`AttnError::UnsupportedHeadDim`] for a head_dim that is not a multiple of 8 (the packed
/// kernel loads rows in 16-byte pieces; [`crate::dispatch::varlen::forward`] then runs the sequences one
/// by one through padded copies); the validation errors of the problem.
pub fn envelope(p: &VarlenProblem) -> Result<AttnProblem> {
    p.validate()?;
    device_envelope(&DeviceVarlenProblem::from(p))
}

/// [`envelope`] of a batch whose offsets stay on the device: the longest sequences as
/// [`DeviceVarlenProblem::covered`] says.
///
/// # Errors
/// As [`envelope`].
pub fn device_envelope(p: &DeviceVarlenProblem) -> Result<AttnProblem> {
    p.validate()?;
    if !p.head_dim.is_multiple_of(8) {
        return Err(AttnError::UnsupportedHeadDim {
            head_dim: p.head_dim,
            backend: "attn_mma (packed variable-length batches)".into(),
            supported: "multiples of 8 (other head dims run sequence by sequence)".into(),
        });
    }
    let (seqlen_q, seqlen_k) = p.covered();
    let shape = AttnShape {
        batch: p.batch,
        seqlen_q,
        seqlen_k,
        heads_q: p.heads_q,
        heads_kv: p.heads_kv,
        head_dim: p.head_dim,
    };
    // Rows `heads * head_dim` apart. The kernel places each sequence by its offsets and
    // ignores the batch strides; they are set as if every sequence had a slot of the longest
    // length, so that the envelope passes the rule that o's positions never overlap.
    let packed = |heads: usize, rows: usize| Strides {
        batch: rows * heads * p.head_dim,
        seq: heads * p.head_dim,
        head: p.head_dim,
    };
    let sq = packed(p.heads_q, shape.seqlen_q);
    let sk = packed(p.heads_kv, shape.seqlen_k);
    AttnProblem::new(shape)?
        .with_mask(p.mask)
        .with_scale(p.softmax_scale)?
        .with_scores(p.scores.clone())?
        .with_strides(sq, sk, sk, sq)
}

/// Runs a packed batch on device buffers: `q` `[total_q, heads_q, head_dim]`, `k`/`v`
/// `[total_k, heads_kv, head_dim]`, `o` like q, `lse` `[heads_q, total_q]` f32, all dense.
/// Asynchronous on `gpu.stream()` (the offsets and slopes are copied to the device first, so
/// not inside a CUDA graph capture: [`forward_device_offsets`] takes offsets already there).
/// Rows of sequences that see no key get o = 0 and lse = -inf (the sink's logit with a learnable
/// sink); sequences without queries write nothing.
///
/// # Errors
/// Those of [`envelope`] and [`check_gpu_problem`]; [`AttnError::BufferTooShort`];
/// [`AttnError::ShapeMismatch`] for a buffer of another device or context;
/// [`AttnError::InvalidStrides`] for a base address not 16-byte aligned;
/// [`AttnError::Compile`]/[`AttnError::Cuda`].
#[allow(clippy::too_many_arguments)]
pub fn forward_device<T, Q, K, V, O, L>(
    gpu: &Gpu,
    kernel: KernelKind,
    p: &VarlenProblem,
    q: &Q,
    k: &K,
    v: &V,
    o: &mut O,
    lse: &mut L,
) -> Result<LaunchInfo>
where
    T: GpuElement,
    Q: DevicePtr<T>,
    K: DevicePtr<T>,
    V: DevicePtr<T>,
    O: DevicePtrMut<T>,
    L: DevicePtrMut<f32>,
{
    p.validate()?;
    let dp = DeviceVarlenProblem::from(p);
    let env = device_envelope(&dp)?;
    check_gpu_problem(&env, KernelKind::Mma)?;
    dp.check_lengths(
        host_offsets(p),
        [q.len(), k.len(), v.len(), o.len(), lse.len()],
    )?;
    check_contexts!(gpu; "q" => q, "k" => k, "v" => v, "o" => o, "lse" => lse)?;
    if p.total_q() == 0 {
        return Ok(nothing_launched());
    }
    let stream = gpu.stream();
    device_ptrs!(stream; qp = q, kp = k, vp = v, op = mut o, lp = mut lse);
    check_aligned([("q", qp), ("k", kp), ("v", vp), ("o", op)])?;
    let mods = ScoreBuffers::upload(gpu, &p.scores)?;
    let ([alibi, sink], _mod_guards) = mods.ptrs(stream);
    if kernel == KernelKind::Wgmma
        && per_sequence_pays(p)
        && crate::cuda::fwd::wgmma::unsupported(gpu.info(), &env).is_none()
    {
        return per_sequence(gpu, p, T::DTYPE, [qp, kp, vp, op, lp, alibi, sink]);
    }
    // Stream-ordered copies: they precede the launch, and the buffers' frees follow it.
    let up = |x: &[i32], what: &str| -> Result<CudaSlice<i32>> {
        stream
            .clone_htod(x)
            .map_err(cuda_err(format!("copying {what} to the device")))
    };
    let cu_q = up(&p.cu_seqlens_q, "cu_seqlens_q")?;
    let cu_k = up(&p.cu_seqlens_k, "cu_seqlens_k")?;
    device_ptrs!(stream; cq = cu_q, ck = cu_k);
    let totals = [dp.total_q, dp.total_k];
    let tensors = [qp, kp, vp, op, lp];
    let launch = packed_launch(&env, T::DTYPE, totals, tensors, [alibi, sink], [cq, ck]);
    packed_mma(gpu, kernel, &launch)
}

/// Runs a packed batch whose offsets are on the device (`cu_seqlens_q`, `cu_seqlens_k`: i32,
/// `batch + 1` entries each, read by the kernel and never copied to the host), on device
/// buffers laid out as [`forward_device`]'s: one `attn_mma` launch, asynchronous on
/// `gpu.stream()`, so a CUDA graph can capture it and replay it with new offsets (without ALiBi
/// slopes or a sink: their values are host memory, copied per call). The offsets are not
/// validated ([`crate::problem::varlen_device`] says what the kernel does with bad ones);
/// valid offsets give [`forward_device`]'s results.
///
/// # Errors
/// Those of [`device_envelope`] and [`check_gpu_problem`]; [`AttnError::BufferTooShort`]
/// (offsets shorter than `batch + 1` included); [`AttnError::ShapeMismatch`] for a buffer of
/// another device or context; [`AttnError::InvalidStrides`] for a base address not 16-byte
/// aligned; [`AttnError::InvalidInput`] for ALiBi slopes or a sink inside a capture;
/// [`AttnError::Compile`]/[`AttnError::Cuda`].
#[allow(clippy::too_many_arguments)]
pub fn forward_device_offsets<T, C, Q, K, V, O, L>(
    gpu: &Gpu,
    p: &DeviceVarlenProblem,
    cu_seqlens_q: &C,
    cu_seqlens_k: &C,
    q: &Q,
    k: &K,
    v: &V,
    o: &mut O,
    lse: &mut L,
) -> Result<LaunchInfo>
where
    T: GpuElement,
    C: DevicePtr<i32>,
    Q: DevicePtr<T>,
    K: DevicePtr<T>,
    V: DevicePtr<T>,
    O: DevicePtrMut<T>,
    L: DevicePtrMut<f32>,
{
    let env = device_envelope(p)?;
    check_gpu_problem(&env, KernelKind::Mma)?;
    p.check_lengths(
        [cu_seqlens_q.len(), cu_seqlens_k.len()],
        [q.len(), k.len(), v.len(), o.len(), lse.len()],
    )?;
    check_contexts!(gpu; "q" => q, "k" => k, "v" => v, "o" => o, "lse" => lse,
        "cu_seqlens_q" => cu_seqlens_q, "cu_seqlens_k" => cu_seqlens_k)?;
    if p.total_q == 0 {
        return Ok(nothing_launched());
    }
    let stream = gpu.stream();
    device_ptrs!(stream; qp = q, kp = k, vp = v, op = mut o, lp = mut lse, cq = cu_seqlens_q, ck = cu_seqlens_k);
    check_aligned([("q", qp), ("k", kp), ("v", vp), ("o", op)])?;
    let mods = ScoreBuffers::upload(gpu, &p.scores)?;
    let (mod_ptrs, _mod_guards) = mods.ptrs(stream);
    let totals = [p.total_q, p.total_k];
    let tensors = [qp, kp, vp, op, lp];
    let launch = packed_launch(&env, T::DTYPE, totals, tensors, mod_ptrs, [cq, ck]);
    let mut info = packed_mma(gpu, KernelKind::Mma, &launch)?;
    info.why =
        "packed variable-length batch with its offsets on the device (one launch, no host copy)"
            .into();
    Ok(info)
}

/// The launch of a packed batch over `env` (its envelope) with `[total_q, total_k]` rows, from
/// the device addresses of the tensors `[q, k, v, o, lse]`, of the ALiBi slopes and sink logits
/// `[alibi, sink]` (0 without) and of the offsets `[cu_seqlens_q, cu_seqlens_k]`.
fn packed_launch(
    env: &AttnProblem,
    dtype: crate::DType,
    [total_q, total_k]: [usize; 2],
    tensors: [u64; 5],
    [alibi, sink]: [u64; 2],
    [cq, ck]: [u64; 2],
) -> Launch<'_> {
    Launch {
        alibi,
        sink,
        varlen: Some(PackedBatch {
            cu_seqlens_q: cq,
            cu_seqlens_k: ck,
            total_q,
            total_k,
        }),
        ..Launch::dense(env, dtype, tensors)
    }
}

/// The packed `attn_mma` launch over every sequence (validated by the caller). `kernel`: what
/// the caller asked for (the report says why attn_mma ran).
fn packed_mma(gpu: &Gpu, kernel: KernelKind, launch: &Launch) -> Result<LaunchInfo> {
    let mut info = crate::cuda::fwd::mma::launch(gpu, launch, None)?;
    info.why = match kernel {
        KernelKind::Mma => "asked for (packed variable-length batch)".into(),
        other => format!(
            "{other} does not take packed variable-length batches (TMA boxes would cross sequence ends): attn_mma ran"
        ),
    };
    Ok(info)
}

/// One `attn_wgmma` launch per sequence (see the module docs), each on its slice of the
/// packed q, k, v and o, and its lse written in place (heads `total_q` apart); rows of a
/// sequence without keys are set here (o = 0, lse = [`VarlenProblem::empty_lse`]). `ptrs`: q,
/// k, v, o, lse, the ALiBi slopes and the sink's logits (0 without), validated by the caller.
fn per_sequence(
    gpu: &Gpu,
    p: &VarlenProblem,
    dtype: crate::DType,
    [qp, kp, vp, op, lp, alibi, sink]: [u64; 7],
) -> Result<LaunchInfo> {
    let stream = gpu.stream();
    let (row_q, row_k) = (
        (p.heads_q * p.head_dim) as u64 * 2,
        (p.heads_kv * p.head_dim) as u64 * 2,
    );
    let total_q = p.total_q();
    let mut last = None;
    for b in 0..p.batch() {
        let (q0, q1) = (p.cu_seqlens_q[b] as u64, p.cu_seqlens_q[b + 1] as u64);
        let k0 = p.cu_seqlens_k[b] as u64;
        let Some((sp, _, _)) = p.sequence(b)? else {
            // No keys (or no queries): o = 0 and lse = -inf (or the sink) on its rows.
            let sq = (q1 - q0) as usize;
            if sq > 0 {
                // SAFETY: the rows lie inside o and lse (checked by the caller), on this
                // stream, ordered with the launches.
                unsafe {
                    sys::cuMemsetD16Async(
                        op + q0 * row_q,
                        0,
                        sq * p.heads_q * p.head_dim,
                        stream.cu_stream(),
                    )
                    .result()
                    .map_err(cuda_err("zeroing o of a sequence without keys"))?;
                    for h in 0..p.heads_q as u64 {
                        sys::cuMemsetD32Async(
                            lp + (h * total_q as u64 + q0) * 4,
                            p.empty_lse(h as usize).to_bits(),
                            sq,
                            stream.cu_stream(),
                        )
                        .result()
                        .map_err(cuda_err("setting lse of a sequence without keys"))?;
                    }
                }
            }
            continue;
        };
        let slopes = match &p.scores.alibi {
            Some(a) if a.per_batch => alibi + (b * p.heads_q * 4) as u64,
            _ => alibi,
        };
        let launch = Launch {
            alibi: slopes,
            sink,
            lse_head_stride: Some(total_q),
            ..Launch::dense(
                &sp,
                dtype,
                [
                    qp + q0 * row_q,
                    kp + k0 * row_k,
                    vp + k0 * row_k,
                    op + q0 * row_q,
                    lp + q0 * 4,
                ],
            )
        };
        last = Some(crate::cuda::fwd::wgmma::launch(gpu, &launch)?);
    }
    let mut info = last.unwrap_or_else(nothing_launched);
    info.why = format!(
        "{} sequences, one attn_{} launch each (wgmma does not take packed batches yet; at most {PER_SEQUENCE_MAX} sequences of {PER_SEQUENCE_MIN_MEAN_ROWS} rows or more on average run this way)",
        p.batch(),
        info.kernel
    );
    Ok(info)
}

/// The lengths of a host problem's offsets, for [`DeviceVarlenProblem::check_lengths`]
/// (`batch + 1` each once validated).
fn host_offsets(p: &VarlenProblem) -> [usize; 2] {
    [p.cu_seqlens_q.len(), p.cu_seqlens_k.len()]
}

/// What a call with no query rows reports: nothing to compute or write.
fn nothing_launched() -> LaunchInfo {
    LaunchInfo {
        kernel: KernelKind::Mma,
        why: "no query rows: nothing launched".into(),
        config: None,
        registers: 0,
        spill_bytes: 0,
        smem_bytes: 0,
    }
}

/// Host-memory convenience of [`forward_device`]: copies in, runs, copies `o` (packed) and
/// `lse` (`[heads_q, total_q]`) back.
///
/// # Errors
/// As [`forward_device`], plus allocation and copy failures as [`AttnError::Cuda`].
pub fn forward_host<T: GpuElement>(
    gpu: &Gpu,
    kernel: KernelKind,
    p: &VarlenProblem,
    q: &[T],
    k: &[T],
    v: &[T],
) -> Result<(Vec<T>, Vec<f32>, LaunchInfo)> {
    p.validate()?;
    let dp = DeviceVarlenProblem::from(p);
    check_gpu_problem(&device_envelope(&dp)?, KernelKind::Mma)?;
    let (nq, _) = dp.packed_lens()?;
    let nl = p.heads_q * p.total_q();
    dp.check_lengths(host_offsets(p), [q.len(), k.len(), v.len(), nq, nl])?;
    if p.total_q() == 0 {
        return Ok((Vec::new(), Vec::new(), nothing_launched()));
    }
    let stream = gpu.stream();
    let up = |x: &[T], what: &str| {
        stream
            .clone_htod(x)
            .map_err(cuda_err(format!("copying {what} to the device")))
    };
    let (dq, dk, dv) = (up(q, "q")?, up(k, "k")?, up(v, "v")?);
    let mut d_o: CudaSlice<T> = stream
        .alloc_zeros(p.total_q() * p.heads_q * p.head_dim)
        .map_err(cuda_err("allocating o"))?;
    let mut d_lse: CudaSlice<f32> = stream
        .alloc_zeros(p.heads_q * p.total_q())
        .map_err(cuda_err("allocating lse"))?;
    let info = forward_device(gpu, kernel, p, &dq, &dk, &dv, &mut d_o, &mut d_lse)?;
    let o = stream
        .clone_dtoh(&d_o)
        .map_err(cuda_err("varlen launch: copying o back"))?;
    let lse = stream
        .clone_dtoh(&d_lse)
        .map_err(cuda_err("varlen launch: copying lse back"))?;
    Ok((o, lse, info))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::varlen::offsets;

    #[test]
    fn one_launch_per_sequence_only_for_few_long_sequences() {
        let p = |lens: &[usize]| {
            VarlenProblem::new(offsets(lens), offsets(lens), 4, 2, 64).expect("valid batch")
        };
        assert!(per_sequence_pays(&p(&[2048; 8])));
        assert!(per_sequence_pays(&p(&[64, 8192, 100])));
        assert!(!per_sequence_pays(&p(&[1024; 8])));
        assert!(!per_sequence_pays(&p(&[2048; 65])));
    }
}
