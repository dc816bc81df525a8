//! The backward of packed variable-length batches ([`crate::problem::varlen`]'s layout) in one
//! launch per kernel, over every sequence: `attn_bwd_dsum` over the packed rows, `attn_bwd`
//! with `IS_VARLEN` (kernels/bwd/bwd_varlen.cuh) on a grid of (key block of the longest key
//! sequence, kv head, sequence), and `attn_bwd_dq` over the packed dQ workspace. Each block
//! reads its sequence's offsets and lengths from `cu_seqlens_q`/`cu_seqlens_k`; blocks past
//! their sequence's keys leave at once; masks, windows and ALiBi distances are the sequence's
//! own (causal aligned bottom-right per sequence, as the varlen forward). Keys of a sequence
//! without queries get dK = dV = 0, and rows that see no key (a sequence without keys, or
//! causal rows above the diagonal) dQ = 0.
//!
//! attn_bwd_wgmma does not take packed batches (its TMA boxes would cross sequence ends, as
//! the forward's): calls run attn_bwd, the deterministic mode included (its dQ order
//! counters per (sequence, query head, step of rows)), but for one case: with host offsets,
//! few long sequences (the forward's [`crate::cuda::varlen::per_sequence_pays`]) and no sink
//! gradient, [`backward_device`] runs one dense backward per sequence on attn_bwd_wgmma where
//! it serves them (`per_sequence`). Head dims that attn_bwd does not take
//! as they are (not a multiple of 8, or between 128 and 256) run through padded copies of the
//! packed tensors ([`crate::cuda::runtime::pad::backward_padded`]), still in one launch.
//!
//! A learnable sink changes none of these kernels (the forward's lse includes it); its
//! gradient is the dense backward's sink_grad kernel over the packed `[heads_q, total_q]` lse
//! and D, one more launch.

use crate::cuda::bwd::backward::{
    BackwardInfo, BackwardOptions, BwdKernel, BwdParams, BwdTile, HostGradients, SinkRows,
    launch_sink_grad, run_head_dim,
};
use crate::cuda::runtime::args::{check_aligned, check_contexts, check_gpu_problem, device_ptrs};
use crate::cuda::runtime::device::{Gpu, cuda_err};
use crate::cuda::runtime::launch::{
    FlashParams, GpuElement, KernelKind, Launch, PackedBatch, launch_context, set_dynamic_smem,
    upload_slopes,
};
use crate::cuda::sources::KernelSource;
use crate::error::{AttnError, Result};
use crate::problem::varlen::VarlenProblem;
use crate::problem::varlen_device::DeviceVarlenProblem;
use crate::shape::{AttnProblem, AttnShape};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg, sys};

/// Static shared memory of attn_bwd's `IS_VARLEN` builds: the block's sequence's parameters
/// (bwd_varlen.cuh), on top of the tile's dynamic shared memory. The tile is chosen within the
/// device's limit less these bytes.
pub const STATIC_SMEM: usize = size_of::<BwdParams>();

/// Why attn_bwd_wgmma does not run packed batches (the report's `why_not_wgmma`).
const WHY_NOT_WGMMA: &str = "attn_bwd_wgmma does not take packed variable-length batches (its TMA boxes would cross sequence ends)";

/// Gradients of a packed batch on device buffers, every buffer dense and packed: `q`, `o`,
/// `d_o` `[total_q, heads_q, head_dim]`, `k`, `v` `[total_k, heads_kv, head_dim]`, `lse` the
/// forward's `[heads_q, total_q]` f32 (natural log; [`crate::cuda::varlen::forward_device`]
/// writes it so). Writes `dq` `[total_q, heads_q, head_dim]` and `dk`, `dv` `[total_k,
/// heads_kv, head_dim]` (summed over the query heads of each kv head) in the element type, in
/// full: dq = 0 on rows that see no key, dk = dv = 0 on keys no query sees. `opts.deterministic`
/// makes dq the same bytes run to run. With a learnable sink in the problem, `d_sink` (f32
/// `[heads_q]`, when given) receives its gradient, `-sum over packed rows of exp(sink_h - lse)
/// (do . o)` (written, not added to; the same bytes run to run); `None` skips it (a frozen
/// sink: dq, dk, dv need only the forward's lse, which includes the sink). Asynchronous on
/// `gpu.stream()`; `cu_seqlens`, the ALiBi slopes and the sink's logits are copied from host
/// memory first (not inside a CUDA graph capture), the workspaces are freed in stream order.
/// At most 64 sequences of 2048 query rows or more on average, without `d_sink`, run one
/// attn_bwd_wgmma backward per sequence on sm_90 (head_dim 64, 72..=128): another
/// summation order than the packed launch's, so the deterministic mode gives its own bytes
/// there, the same every run.
///
/// # Errors
/// [`VarlenProblem::validate`]'s errors; [`AttnError::BufferTooShort`] naming the first buffer
/// shorter than its packed size (`do`, `dq`, ... by name; `lse` shorter than `heads_q *
/// total_q`); [`AttnError::TooLarge`] for more than 2^31 - 1 packed rows or thread blocks;
/// [`AttnError::InvalidInput`] for [`BwdKernel::Wgmma`] (it does not take packed batches), a
/// malformed `FLASHATTN_BWD_TILE`, a call inside a CUDA graph capture, or `d_sink` given on a
/// problem without a sink; [`AttnError::BufferTooShort`] for `d_sink` shorter than `heads_q`;
/// [`AttnError::UnsupportedHeadDim`] where no tile fits the device's shared memory (head_dim
/// 256 on 99 KB GPUs); [`AttnError::InvalidStrides`] for a base address not 16-byte aligned
/// (head dims the kernels take as they are); [`AttnError::ShapeMismatch`] for a buffer of
/// another context; [`AttnError::Compile`] / [`AttnError::Cuda`].
#[allow(clippy::too_many_arguments)]
pub fn backward_device<T, Q, K, V, O, L, G, DQ, DK, DV>(
    gpu: &Gpu,
    p: &VarlenProblem,
    opts: BackwardOptions,
    q: &Q,
    k: &K,
    v: &V,
    o: &O,
    lse: &L,
    d_o: &G,
    dq: &mut DQ,
    dk: &mut DK,
    dv: &mut DV,
    d_sink: Option<&mut dyn DevicePtrMut<f32>>,
) -> Result<BackwardInfo>
where
    T: GpuElement,
    Q: DevicePtr<T>,
    K: DevicePtr<T>,
    V: DevicePtr<T>,
    O: DevicePtr<T>,
    L: DevicePtr<f32>,
    G: DevicePtr<T>,
    DQ: DevicePtrMut<T>,
    DK: DevicePtrMut<T>,
    DV: DevicePtrMut<T>,
{
    p.validate()?;
    let dp = DeviceVarlenProblem::from(p);
    dp.validate()?;
    refuse_wgmma(opts)?;
    dp.check_backward_lengths(
        [p.cu_seqlens_q.len(), p.cu_seqlens_k.len()],
        [q.len(), k.len(), v.len(), o.len(), lse.len(), d_o.len()],
        [dq.len(), dk.len(), dv.len()],
    )?;
    check_contexts!(gpu; "q" => q, "k" => k, "v" => v, "o" => o, "lse" => lse, "do" => d_o,
        "dq" => dq, "dk" => dk, "dv" => dv)?;
    check_d_sink(gpu, &p.scores, p.heads_q, d_sink.as_deref())?;
    if gpu.capturing() {
        return Err(AttnError::InvalidInput {
            what: "the varlen backward copies cu_seqlens from host memory, which a CUDA graph capture cannot record: call it outside the capture (or pass the offsets on the device: backward_device_offsets)".into(),
        });
    }
    let stream = gpu.stream();
    device_ptrs!(stream; qp = q, kp = k, vp = v, op = o, lp = lse, dop = d_o, dqp = mut dq, dkp = mut dk, dvp = mut dv);
    if d_sink.is_none() && per_sequence_serves(gpu.info(), p, opts) {
        return per_sequence::<T>(gpu, p, opts, [qp, kp, vp, op, lp, dop, dqp, dkp, dvp]);
    }
    // The packed launch reads the offsets on the device.
    let up = |x: &[i32], what: &str| -> Result<CudaSlice<i32>> {
        stream.clone_htod(x).map_err(cuda_err(format!(
            "varlen backward: copying {what} to the device"
        )))
    };
    let (cu_q, cu_k) = (
        up(&p.cu_seqlens_q, "cu_seqlens_q")?,
        up(&p.cu_seqlens_k, "cu_seqlens_k")?,
    );
    device_ptrs!(stream; cq = cu_q, ck = cu_k);
    packed::<T>(
        gpu,
        &dp,
        opts,
        [qp, kp, vp, op, lp, dop, dqp, dkp, dvp],
        [cq, ck],
        d_sink,
    )
}

/// [`backward_device`] on a packed batch whose offsets are on the device (`cu_seqlens_q`,
/// `cu_seqlens_k`: i32, `batch + 1` entries each, read by the kernels and never copied to the
/// host), so that a CUDA graph can capture it and replay it with new offsets (without ALiBi
/// slopes or a sink's gradient: their values are host memory, copied per call). The offsets
/// are not validated ([`crate::problem::varlen_device`] says what the kernels do with bad
/// ones); valid offsets give [`backward_device`]'s gradients.
///
/// # Errors
/// As [`backward_device`], less the capture refusal, plus [`AttnError::BufferTooShort`] for
/// offsets shorter than `batch + 1`; [`AttnError::InvalidInput`] for ALiBi slopes or a sink's
/// gradient inside a capture.
#[allow(clippy::too_many_arguments)]
pub fn backward_device_offsets<T, C, Q, K, V, O, L, G, DQ, DK, DV>(
    gpu: &Gpu,
    p: &DeviceVarlenProblem,
    opts: BackwardOptions,
    [cu_seqlens_q, cu_seqlens_k]: [&C; 2],
    q: &Q,
    k: &K,
    v: &V,
    o: &O,
    lse: &L,
    d_o: &G,
    dq: &mut DQ,
    dk: &mut DK,
    dv: &mut DV,
    d_sink: Option<&mut dyn DevicePtrMut<f32>>,
) -> Result<BackwardInfo>
where
    T: GpuElement,
    C: DevicePtr<i32>,
    Q: DevicePtr<T>,
    K: DevicePtr<T>,
    V: DevicePtr<T>,
    O: DevicePtr<T>,
    L: DevicePtr<f32>,
    G: DevicePtr<T>,
    DQ: DevicePtrMut<T>,
    DK: DevicePtrMut<T>,
    DV: DevicePtrMut<T>,
{
    p.validate()?;
    refuse_wgmma(opts)?;
    p.check_backward_lengths(
        [cu_seqlens_q.len(), cu_seqlens_k.len()],
        [q.len(), k.len(), v.len(), o.len(), lse.len(), d_o.len()],
        [dq.len(), dk.len(), dv.len()],
    )?;
    check_contexts!(gpu; "q" => q, "k" => k, "v" => v, "o" => o, "lse" => lse, "do" => d_o,
        "dq" => dq, "dk" => dk, "dv" => dv, "cu_seqlens_q" => cu_seqlens_q,
        "cu_seqlens_k" => cu_seqlens_k)?;
    check_d_sink(gpu, &p.scores, p.heads_q, d_sink.as_deref())?;
    let stream = gpu.stream();
    device_ptrs!(stream; qp = q, kp = k, vp = v, op = o, lp = lse, dop = d_o, dqp = mut dq, dkp = mut dk, dvp = mut dv, cq = cu_seqlens_q, ck = cu_seqlens_k);
    packed::<T>(
        gpu,
        p,
        opts,
        [qp, kp, vp, op, lp, dop, dqp, dkp, dvp],
        [cq, ck],
        d_sink,
    )
}

/// Checks `d_sink` (when given): the problem has a sink, it holds `heads_q` values, it lives in
/// `gpu`'s context.
fn check_d_sink(
    gpu: &Gpu,
    scores: &crate::scores::ScoreMods,
    heads_q: usize,
    d_sink: Option<&dyn DevicePtrMut<f32>>,
) -> Result<()> {
    if let Some(ds) = d_sink {
        if scores.sink.is_none() {
            return Err(AttnError::InvalidInput {
                what: "d_sink was given, but the problem has no learnable sink (ScoreMods::sink): pass None, or set the sink".into(),
            });
        }
        crate::error::check_len("d_sink", ds.len(), heads_q)?;
        check_contexts!(gpu; "d_sink" => ds)?;
    }
    Ok(())
}

/// The packed backward over every sequence: the tensors at the device addresses `[q, k, v, o,
/// lse, do, dq, dk, dv]` and the offsets at `[cu_seqlens_q, cu_seqlens_k]`, all validated by the
/// caller against `p`.
fn packed<T: GpuElement>(
    gpu: &Gpu,
    p: &DeviceVarlenProblem,
    opts: BackwardOptions,
    ptrs: [u64; 9],
    [cq, ck]: [u64; 2],
    d_sink: Option<&mut dyn DevicePtrMut<f32>>,
) -> Result<BackwardInfo> {
    let [qp, kp, vp, op, lp, dop, dqp, dkp, dvp] = ptrs;
    let stream = gpu.stream();
    let (total_q, total_k) = (p.total_q, p.total_k);
    if total_q == 0 || total_k == 0 {
        // No query or no key anywhere: nothing to compute, the gradients are zero.
        let (nq, nk) = p.packed_lens()?;
        for (ptr, n, what) in [(dqp, nq, "dq"), (dkp, nk, "dk"), (dvp, nk, "dv")] {
            if n > 0 {
                // SAFETY: the buffer holds at least n 16-bit elements (checked by the caller);
                // the memset is ordered on this stream.
                unsafe { sys::cuMemsetD16Async(ptr, 0, n, stream.cu_stream()) }
                    .result()
                    .map_err(cuda_err(format!("varlen backward: zeroing {what}")))?;
            }
        }
        if let Some(ds) = d_sink {
            // No row sees a key, so every o (the forward's) is 0, every D = do . o = 0, and
            // so is the sink's gradient.
            let (ptr, _g) = ds.device_ptr_mut(stream);
            // SAFETY: d_sink holds at least heads_q f32 elements (checked by the caller);
            // ordered on this stream.
            unsafe { sys::cuMemsetD32Async(ptr, 0, p.heads_q, stream.cu_stream()) }
                .result()
                .map_err(cuda_err("varlen backward: zeroing d_sink"))?;
        }
        return Ok(nothing_launched(opts));
    }
    let d = p.head_dim;
    if run_head_dim(d) != d {
        return padded::<T>(gpu, p, opts, ptrs, [cq, ck], d_sink);
    }
    check_aligned([
        ("q", qp),
        ("k", kp),
        ("v", vp),
        ("o", op),
        ("do", dop),
        ("dq", dqp),
        ("dk", dkp),
        ("dv", dvp),
    ])?;
    let env = crate::cuda::fwd::varlen::device_envelope(p)?;
    check_gpu_problem(&env, KernelKind::Mma)?;
    let ctx = format!("varlen {}", launch_context("attn_bwd", &env));
    let info = gpu.info();
    let limit = (info.smem_per_block_optin as usize).saturating_sub(STATIC_SMEM);
    let tile = BwdTile::for_call(&env, T::DTYPE, info.compute_capability, limit)?;
    let passes = BwdTile::passes(d);
    let s = env.shape;
    // The dQ order counters of the deterministic mode: per pass, a slot of heads_q x steps of
    // the longest sequence per sequence (bwd_varlen.cuh).
    let per_pass = s.batch * s.heads_q * s.seqlen_q.div_ceil(tile.br);
    let n_order = if opts.deterministic {
        per_pass * passes.len()
    } else {
        1
    };
    let zeros = |n: usize, what: &str| -> Result<CudaSlice<f32>> {
        stream
            .alloc_zeros(n)
            .map_err(cuda_err(format!("{ctx}: allocating {what}")))
    };
    let mut dsum = zeros(p.heads_q * total_q, "D")?;
    let n_q = total_q * p.heads_q * d;
    let mut dq_accum = zeros(n_q, "the dQ workspace")?;
    let mut dq_order: CudaSlice<i32> = stream
        .alloc_zeros(n_order)
        .map_err(cuda_err(format!("{ctx}: allocating the dQ order counters")))?;
    let slopes = upload_slopes(gpu, &p.scores)?;
    device_ptrs!(stream; dsp = mut dsum, dap = mut dq_accum, orp = mut dq_order);
    let alibi = slopes.as_ref().map(|x| x.device_ptr(stream));
    let launch = Launch {
        alibi: alibi.as_ref().map_or(0, |(ptr, _)| *ptr),
        varlen: Some(PackedBatch {
            cu_seqlens_q: cq,
            cu_seqlens_k: ck,
            total_q,
            total_k,
        }),
        ..Launch::dense(&env, T::DTYPE, [qp, kp, vp, op, lp])
    };
    let num_k_blocks = s.seqlen_k.div_ceil(tile.bc());
    let blocks = num_k_blocks as u64 * s.heads_kv as u64 * s.batch as u64;
    let blocks = u32::try_from(blocks)
        .ok()
        .filter(|&b| b <= i32::MAX as u32)
        .ok_or_else(|| AttnError::TooLarge {
            kernel: "attn_bwd",
            reason: format!("{blocks} thread blocks: split the batch"),
        })?;
    let st = |x: crate::shape::Strides| [x.batch as i64, x.seq as i64, x.head as i64];
    let params = BwdParams {
        p: FlashParams::new(&launch, tile.br as u32),
        d_o: dop,
        do_strides: st(env.o_strides),
        dsum: dsp,
        dq_accum: dap,
        dk: dkp,
        dv: dvp,
        scale: p.softmax_scale,
        heads_kv: p.heads_kv as i32,
        num_k_blocks: num_k_blocks as i32,
        dq_order: orp,
    };
    let defines = |ch0: usize| {
        let mut defs = tile.defines(T::DTYPE, &env, opts, ch0);
        defs.push(("IS_VARLEN".into(), "1".into()));
        defs
    };
    let source = KernelSource::AttnBwd;
    let defs = defines(0);
    let k_dsum = gpu.kernel(source, "attn_bwd_dsum", &defs)?;
    let k_dq = gpu.kernel(source, "attn_bwd_dq", &defs)?;
    let smem = tile.smem_bytes(d);
    let mains = passes
        .iter()
        .map(|&ch0| {
            let k = gpu.kernel(source, "attn_bwd", &defines(ch0))?;
            let total = smem + k.stats.shared as usize;
            if total > info.smem_per_block_optin as usize {
                return Err(AttnError::TooLarge {
                    kernel: "attn_bwd",
                    reason: format!(
                        "{total} bytes of shared memory per block ({smem} dynamic), the device allows {}",
                        info.smem_per_block_optin
                    ),
                });
            }
            set_dynamic_smem(&k.function, smem, &ctx)?;
            Ok(k)
        })
        .collect::<Result<Vec<_>>>()?;
    let grid_1d = |n: u64| -> Result<LaunchConfig> {
        let blocks = u32::try_from(n.div_ceil(256))
            .ok()
            .filter(|&b| b <= i32::MAX as u32)
            .ok_or_else(|| AttnError::TooLarge {
                kernel: "attn_bwd",
                reason: format!("{n} threads in one 1-D launch: split the batch"),
            })?;
        Ok(LaunchConfig {
            grid_dim: (blocks.max(1), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        })
    };

    // D = rowsum(do o) over the packed rows, eight threads per (row, head).
    let ost = st(env.o_strides);
    let mut b = stream.launch_builder(&k_dsum.function);
    b.arg(&params)
        .arg(&op)
        .arg(&ost[0])
        .arg(&ost[1])
        .arg(&ost[2]);
    let cfg = grid_1d((total_q * p.heads_q * 8) as u64)?;
    // SAFETY: the arguments mirror attn_bwd_dsum's; with IS_VARLEN it reads total_q x heads_q
    // rows of o and do and writes D [heads_q, total_q], all checked above.
    unsafe { b.launch(cfg) }.map_err(cuda_err(format!("{ctx} (D = rowsum(do o))")))?;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (32 * tile.nwarps as u32, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    // attn_bwd's IS_VARLEN parameter after BwdParams (VARLEN_PARAM): it bounds the offsets.
    let total_k_arg = total_k as i32;
    for (pass, k) in mains.iter().enumerate() {
        // Each pass counts its own dQ order: counters of pass i start at i x per_pass.
        let pass_params = BwdParams {
            dq_order: if opts.deterministic {
                orp + (pass * per_pass * size_of::<i32>()) as u64
            } else {
                orp
            },
            ..params
        };
        let mut b = stream.launch_builder(&k.function);
        b.arg(&pass_params).arg(&total_k_arg);
        // SAFETY: the parameters mirror BwdParams and VARLEN_PARAM; every block stays inside
        // its sequence's rows of the packed buffers (checked by the caller; the offsets
        // clamped by the kernel to total_q and total_k), the dQ workspace holds n_q floats and
        // the order counters passes x per_pass.
        unsafe { b.launch(cfg) }.map_err(cuda_err(format!(
            "{ctx} (attn_bwd, channels from {})",
            passes[pass]
        )))?;
    }
    let n = n_q as i64;
    let mut b = stream.launch_builder(&k_dq.function);
    b.arg(&dap).arg(&dqp).arg(&n);
    // SAFETY: dq and the workspace both hold n_q elements, the same packed layout.
    unsafe { b.launch(grid_1d(n_q as u64)?) }
        .map_err(cuda_err(format!("{ctx} (dQ to the element type)")))?;
    if let Some(ds) = d_sink {
        // lse and D are both [heads_q, total_q]: one "batch entry" of total_q rows.
        let rows = SinkRows {
            batch: 1,
            rows: total_q,
            batch_stride: p.heads_q * total_q,
            head_stride: total_q,
        };
        launch_sink_grad(gpu, &p.scores, p.heads_q, rows, [lp, dsp], ds, &ctx)?;
    }
    Ok(BackwardInfo {
        kernel: "attn_bwd",
        why_not_wgmma: match opts.kernel {
            BwdKernel::Auto => WHY_NOT_WGMMA.into(),
            _ => String::new(),
        },
        registers: mains[0].stats.registers,
        spill_bytes: mains[0].stats.spill_stores,
        smem_bytes: smem + mains[0].stats.shared as usize,
        blocks,
        persistent: false,
        tile: Some(tile),
        deterministic: opts.deterministic,
        padded_head_dim: None,
    })
}

/// Whether a host-offset call runs one dense backward per sequence on attn_bwd_wgmma
/// ([`per_sequence`]) instead of the packed attn_bwd: the library's choice (`opts.kernel`
/// Auto), attn_bwd_wgmma serves the sequences (sm_90, its head dims), and the forward's rule
/// for long sequences, few of them ([`crate::cuda::varlen::per_sequence_pays`]). Not with a
/// sink's gradient (attn_bwd's packed launch computes it over every packed row at once).
/// Head dims attn_bwd_wgmma does not take (not a multiple of 8 among them, which the packed
/// path pads) stay packed.
fn per_sequence_serves(
    info: &crate::cuda::runtime::device::DeviceInfo,
    p: &VarlenProblem,
    opts: BackwardOptions,
) -> bool {
    use crate::cuda::bwd::backward_wgmma as bw;
    if opts.kernel != BwdKernel::Auto
        || !crate::cuda::fwd::varlen::per_sequence_pays(p)
        || bw::padded_head_dim(p.head_dim).is_none()
    {
        return false;
    }
    crate::cuda::fwd::varlen::envelope(p).is_ok_and(|env| bw::unsupported(info, &env).is_none())
}

/// One dense backward per sequence ([`crate::cuda::backward::backward_device`]: attn_bwd_wgmma,
/// two to three times attn_bwd's speed at 2k+ rows) on its slices of the packed tensors, its
/// lse first copied dense (`[heads_q, seqlen_q]` out of the packed `[heads_q, total_q]`, one
/// 2-D copy); sequences without keys get dq = 0, without queries dk = dv = 0, as the packed
/// launch gives them. `ptrs`: q, k, v, o, lse, do, dq, dk, dv, checked by the caller.
fn per_sequence<T: GpuElement>(
    gpu: &Gpu,
    p: &VarlenProblem,
    opts: BackwardOptions,
    [qp, kp, vp, op, lp, dop, dqp, dkp, dvp]: [u64; 9],
) -> Result<BackwardInfo> {
    use crate::cuda::runtime::foreign::ForeignSlice;
    let stream = gpu.stream();
    let (hq, hkv, d) = (p.heads_q, p.heads_kv, p.head_dim);
    let es = size_of::<T>() as u64;
    let (row_q, row_k) = ((hq * d) as u64 * es, (hkv * d) as u64 * es);
    let total_q = p.total_q();
    let zero = |at: u64, n: usize, what: &str| -> Result<()> {
        // SAFETY: n 16-bit elements inside a gradient the caller checked, on this stream.
        unsafe { sys::cuMemsetD16Async(at, 0, n, stream.cu_stream()) }
            .result()
            .map_err(cuda_err(format!("varlen backward: zeroing {what}")))
    };
    let mut last = None;
    for b in 0..p.batch() {
        let (q0, q1) = (p.cu_seqlens_q[b] as usize, p.cu_seqlens_q[b + 1] as usize);
        let (k0, k1) = (p.cu_seqlens_k[b] as usize, p.cu_seqlens_k[b + 1] as usize);
        let (sq, sk) = (q1 - q0, k1 - k0);
        let Some((sp, _, _)) = p.sequence(b)? else {
            if sq > 0 {
                zero(
                    dqp + q0 as u64 * row_q,
                    sq * hq * d,
                    "dq of a sequence without keys",
                )?;
            }
            if sk > 0 {
                zero(
                    dkp + k0 as u64 * row_k,
                    sk * hkv * d,
                    "dk of a sequence without queries",
                )?;
                zero(
                    dvp + k0 as u64 * row_k,
                    sk * hkv * d,
                    "dv of a sequence without queries",
                )?;
            }
            continue;
        };
        let lse_b: CudaSlice<f32> = stream
            .alloc_zeros(hq * sq)
            .map_err(cuda_err("varlen backward: allocating a sequence's lse"))?;
        {
            let (to, _g) = lse_b.device_ptr(stream);
            let copy = sys::CUDA_MEMCPY2D_st {
                srcXInBytes: 0,
                srcY: 0,
                srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                srcHost: std::ptr::null(),
                srcDevice: lp + q0 as u64 * 4,
                srcArray: std::ptr::null_mut(),
                srcPitch: total_q * 4,
                dstXInBytes: 0,
                dstY: 0,
                dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                dstHost: std::ptr::null_mut(),
                dstDevice: to,
                dstArray: std::ptr::null_mut(),
                dstPitch: sq * 4,
                WidthInBytes: sq * 4,
                Height: hq,
            };
            // SAFETY: heads_q rows of sq floats, inside the packed lse (checked by the caller)
            // and the new buffer, on this stream.
            unsafe { sys::cuMemcpy2DAsync_v2(&copy, stream.cu_stream()) }
                .result()
                .map_err(cuda_err("varlen backward: copying a sequence's lse"))?;
        }
        // SAFETY: each view lies inside its packed tensor (the caller checked the packed
        // lengths), in the Gpu's context; the calls run on its stream, in order.
        let view = |at: u64, n: usize| unsafe { ForeignSlice::<T>::new(at, n, stream.clone()) };
        let (nq, nk) = (sq * hq * d, sk * hkv * d);
        let (qo, ko) = (q0 as u64 * row_q, k0 as u64 * row_k);
        let (qv, kv, vv) = (view(qp + qo, nq), view(kp + ko, nk), view(vp + ko, nk));
        let (ov, dov) = (view(op + qo, nq), view(dop + qo, nq));
        let (mut dqv, mut dkv, mut dvv) =
            (view(dqp + qo, nq), view(dkp + ko, nk), view(dvp + ko, nk));
        last = Some(crate::cuda::bwd::backward::backward_device(
            gpu, &sp, opts, &qv, &kv, &vv, &ov, &lse_b, &dov, &mut dqv, &mut dkv, &mut dvv, None,
        )?);
    }
    Ok(last.unwrap_or_else(|| nothing_launched(opts)))
}

/// [`BwdKernel::Wgmma`] asked for by name: refused, it does not take packed batches.
fn refuse_wgmma(opts: BackwardOptions) -> Result<()> {
    if opts.kernel == BwdKernel::Wgmma {
        return Err(AttnError::InvalidInput {
            what: format!(
                "{WHY_NOT_WGMMA}: ask for attn_bwd (BwdKernel::Mma) or leave the choice to the library"
            ),
        });
    }
    Ok(())
}

/// What a call with no query or no key reports: the gradients zeroed, no kernel launched.
fn nothing_launched(opts: BackwardOptions) -> BackwardInfo {
    BackwardInfo {
        kernel: "attn_bwd",
        why_not_wgmma: "no query or no key in the batch: gradients zeroed, nothing launched".into(),
        registers: 0,
        spill_bytes: 0,
        smem_bytes: 0,
        blocks: 0,
        persistent: false,
        tile: None,
        deterministic: opts.deterministic,
        padded_head_dim: None,
    }
}

/// [`backward_device`] at a head_dim attn_bwd does not take as it is: the packed tensors seen
/// as one dense sequence of total_q (total_k) rows, padded with zero channels to
/// [`run_head_dim`], the packed backward run on the copies (lse as it is), the gradients copied
/// back (`d_sink` passed on: it reads only lse and D). `ptrs`: q, k, v, o, do, dq, dk, dv,
/// validated by the caller (total_q, total_k > 0).
fn padded<T: GpuElement>(
    gpu: &Gpu,
    p: &DeviceVarlenProblem,
    opts: BackwardOptions,
    [q, k, v, o, lse, d_o, dq, dk, dv]: [u64; 9],
    offsets: [u64; 2],
    d_sink: Option<&mut dyn DevicePtrMut<f32>>,
) -> Result<BackwardInfo> {
    let dp = run_head_dim(p.head_dim);
    // The row map of the copies: one dense batch entry of all packed rows (no mask or
    // modifiers: only its layout is used).
    let rows = AttnProblem::new(AttnShape {
        batch: 1,
        seqlen_q: p.total_q,
        seqlen_k: p.total_k,
        heads_q: p.heads_q,
        heads_kv: p.heads_kv,
        head_dim: p.head_dim,
    })?;
    let wide = DeviceVarlenProblem {
        head_dim: dp,
        ..p.clone()
    };
    let b = crate::cuda::runtime::pad::BwdBuffers {
        q,
        k,
        v,
        o,
        d_o,
        dq,
        dk,
        dv,
    };
    let stream = gpu.stream();
    let mut info = crate::cuda::runtime::pad::backward_padded::<T, _, _>(
        gpu,
        &rows,
        dp,
        &b,
        |_, x| {
            let (q, k, v, o, d_o) = (&x.q, &x.k, &x.v, &x.o, &x.d_o);
            let (dq, dk, dv) = (&mut x.dq, &mut x.dk, &mut x.dv);
            device_ptrs!(stream; qp = q, kp = k, vp = v, op = o, dop = d_o, dqp = mut dq, dkp = mut dk, dvp = mut dv);
            let ptrs = [qp, kp, vp, op, lse, dop, dqp, dkp, dvp];
            packed::<T>(gpu, &wide, opts, ptrs, offsets, d_sink)
        },
    )?;
    info.padded_head_dim = Some(dp);
    Ok(info)
}

/// [`backward_device`] on host buffers (packed as there): copies in, runs, copies `dq`, `dk`
/// and `dv` back, and with a learnable sink its gradient (`d_sink`). The gradients start as
/// NaN on the device, so an element the kernels do not write comes back NaN.
///
/// # Errors
/// As [`backward_device`], plus allocation and copy failures as [`AttnError::Cuda`].
#[allow(clippy::too_many_arguments)]
pub fn backward_host<T: GpuElement>(
    gpu: &Gpu,
    p: &VarlenProblem,
    opts: BackwardOptions,
    q: &[T],
    k: &[T],
    v: &[T],
    o: &[T],
    lse: &[f32],
    d_o: &[T],
) -> Result<HostGradients<T>> {
    p.validate()?;
    refuse_wgmma(opts)?;
    let (nq, nk) = p.packed_lens()?;
    p.check_backward_lengths(
        [q.len(), k.len(), v.len(), o.len(), lse.len(), d_o.len()],
        [nq, nk, nk],
    )?;
    if p.total_q() == 0 || p.total_k() == 0 {
        // Nothing to compute (and nothing to allocate: empty device buffers are refused).
        let zero = T::from_f32(0.0);
        return Ok(HostGradients {
            dq: vec![zero; nq],
            dk: vec![zero; nk],
            dv: vec![zero; nk],
            // No row sees a key: o = 0, D = 0 and the sink's gradient 0 (backward_device).
            d_sink: p.scores.sink.as_ref().map(|_| vec![0.0; p.heads_q]),
            info: nothing_launched(opts),
        });
    }
    let nl = p.heads_q * p.total_q();
    let stream = gpu.stream();
    let up = |x: &[T], what: &str| {
        stream
            .clone_htod(x)
            .map_err(cuda_err(format!("copying {what} to the device")))
    };
    let (g_q, g_k, g_v, g_o, g_do) = (
        up(&q[..nq], "q")?,
        up(&k[..nk], "k")?,
        up(&v[..nk], "v")?,
        up(&o[..nq], "o")?,
        up(&d_o[..nq], "do")?,
    );
    let g_lse = stream
        .clone_htod(&lse[..nl])
        .map_err(cuda_err("copying lse to the device"))?;
    let poisoned = |n: usize, what: &str| -> Result<CudaSlice<T>> {
        stream
            .clone_htod(&vec![T::from_f32(f32::NAN); n])
            .map_err(cuda_err(format!("allocating {what}")))
    };
    let (mut g_dq, mut g_dk, mut g_dv) = (
        poisoned(nq, "dq")?,
        poisoned(nk, "dk")?,
        poisoned(nk, "dv")?,
    );
    let mut g_dsink = p
        .scores
        .sink
        .as_ref()
        .map(|_| {
            stream
                .clone_htod(&vec![f32::NAN; p.heads_q])
                .map_err(cuda_err("allocating d_sink"))
        })
        .transpose()?;
    let info = backward_device(
        gpu,
        p,
        opts,
        &g_q,
        &g_k,
        &g_v,
        &g_o,
        &g_lse,
        &g_do,
        &mut g_dq,
        &mut g_dk,
        &mut g_dv,
        g_dsink.as_mut().map(|x| x as &mut dyn DevicePtrMut<f32>),
    )?;
    let back = |x: &CudaSlice<T>, name: &str| {
        stream
            .clone_dtoh(x)
            .map_err(cuda_err(format!("varlen backward: copying {name} back")))
    };
    Ok(HostGradients {
        dq: back(&g_dq, "dq")?,
        dk: back(&g_dk, "dk")?,
        dv: back(&g_dv, "dv")?,
        d_sink: g_dsink
            .as_ref()
            .map(|x| {
                stream
                    .clone_dtoh(x)
                    .map_err(cuda_err("varlen backward: copying d_sink back"))
            })
            .transpose()?,
        info,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::runtime::device::DeviceInfo;
    use crate::problem::varlen::offsets;

    fn device(cc: (i32, i32)) -> DeviceInfo {
        DeviceInfo {
            name: "test".into(),
            compute_capability: cc,
            arch: format!("sm_{}{}", cc.0, cc.1),
            sm_count: 132,
            smem_per_block_optin: 227 * 1024,
            smem_per_sm: 228 * 1024,
            total_mem: 80 << 30,
            driver_version: 13000,
            nvrtc_version: (13, 0),
        }
    }

    #[test]
    fn per_sequence_only_for_few_long_sequences_attn_bwd_wgmma_takes() {
        let p =
            |lens: &[usize], d| VarlenProblem::new(offsets(lens), offsets(lens), 4, 2, d).unwrap();
        let auto = BackwardOptions::default();
        let h100 = device((9, 0));
        assert!(per_sequence_serves(&h100, &p(&[2048; 8], 128), auto));
        assert!(per_sequence_serves(&h100, &p(&[3000, 2048], 64), auto));
        // Short sequences, too many, a head_dim attn_bwd_wgmma does not take (not a multiple
        // of 8: the packed path pads it; 256), another GPU, attn_bwd by name: packed.
        assert!(!per_sequence_serves(&h100, &p(&[1024; 8], 128), auto));
        assert!(!per_sequence_serves(&h100, &p(&[2048; 65], 128), auto));
        for d in [100, 36, 256] {
            assert!(!per_sequence_serves(&h100, &p(&[2048; 8], d), auto), "d{d}");
        }
        assert!(!per_sequence_serves(
            &device((8, 0)),
            &p(&[2048; 8], 128),
            auto
        ));
        let mma = BackwardOptions {
            kernel: BwdKernel::Mma,
            ..auto
        };
        assert!(!per_sequence_serves(&h100, &p(&[2048; 8], 128), mma));
    }
}
