//! What every kernel launcher shares: the kernel rungs, the raw launch description, the
//! parameter block of the flash kernels, what a launch reports, and the one-block-per-tile
//! launch of attn_simt and attn_mma. The rung modules (naive, simt, mma, wgmma) import from
//! here and nothing else of each other; `attention` dispatches to them.

use crate::cuda::runtime::device::{Gpu, cuda_err};
use crate::cuda::sources::KernelSource;
use crate::dtype::{DType, Element};
use crate::error::{AttnError, Result};
use crate::shape::AttnProblem;
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits, sys};
use serde::Serialize;
use std::fmt;

/// Element types the GPU kernels take: f16 and bf16.
pub trait GpuElement: Element + DeviceRepr + ValidAsZeroBits {}
impl GpuElement for half::f16 {}
impl GpuElement for half::bf16 {}

/// The rungs of the kernel ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum KernelKind {
    /// S in global memory, softmax, P V: three launches, O(seqlen^2) memory.
    Naive,
    /// Flash forward on CUDA cores (FFMA), O(seqlen) memory.
    Simt,
    /// Flash forward on Tensor Cores (`mma.sync.m16n8k16`).
    Mma,
    /// Hopper flash forward (sm_90a): `wgmma` + TMA + warp specialisation. A call it cannot
    /// serve (another arch, a head_dim or stride it lacks) runs [`KernelKind::Mma`], and the
    /// [`LaunchInfo`] says so and why.
    Wgmma,
}

impl KernelKind {
    /// Every kernel, slowest first.
    pub const ALL: [KernelKind; 4] = [
        KernelKind::Naive,
        KernelKind::Simt,
        KernelKind::Mma,
        KernelKind::Wgmma,
    ];

    /// Whether the kernel applies a sliding window, softcap, ALiBi and a learnable sink
    /// ([`crate::scores::ScoreMods`]): `mma` and `wgmma` do; `naive` and `simt` refuse them.
    pub fn has_score_mods(self) -> bool {
        matches!(self, KernelKind::Mma | KernelKind::Wgmma)
    }

    /// Name used on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            KernelKind::Naive => "naive",
            KernelKind::Simt => "simt",
            KernelKind::Mma => "mma",
            KernelKind::Wgmma => "wgmma",
        }
    }

    /// Parses a name. `auto` is the best rung, [`KernelKind::Wgmma`]: it runs on sm_90 and
    /// hands every call it cannot serve (other archs included) to `mma`.
    ///
    /// # Errors
    /// [`AttnError::UnknownKernel`].
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "auto" | "wgmma" | "attn_wgmma" => Ok(KernelKind::Wgmma),
            "mma" | "attn_mma" => Ok(KernelKind::Mma),
            "simt" | "attn_simt" => Ok(KernelKind::Simt),
            "naive" | "attn_naive" => Ok(KernelKind::Naive),
            _ => Err(AttnError::UnknownKernel {
                name: name.into(),
                available: "auto (= wgmma, which hands what it cannot serve to mma), wgmma, mma, simt, naive".into(),
            }),
        }
    }
}

impl fmt::Display for KernelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Raw device pointers and the problem, as every launcher takes them.
#[derive(Debug, Clone, Copy)]
pub struct Launch<'a> {
    /// The problem (validated).
    pub problem: &'a AttnProblem,
    /// Element type of q, k, v, o.
    pub dtype: DType,
    /// Device addresses.
    pub q: u64,
    /// Device address of k.
    pub k: u64,
    /// Device address of v.
    pub v: u64,
    /// Device address of o.
    pub o: u64,
    /// Device address of lse (f32).
    pub lse: u64,
    /// Device address of the ALiBi slopes (f32, laid out as [`crate::scores::Alibi`]), 0
    /// when the problem has none.
    pub alibi: u64,
    /// Device address of the learnable sink's logits (f32 `[heads_q]`,
    /// [`crate::scores::ScoreMods::sink`]), 0 when the problem has none. The kernels that serve
    /// a sink take it as one more parameter ([`push_sink`]).
    pub sink: u64,
    /// A packed variable-length batch ([`crate::problem::varlen`]): `problem` is then its envelope
    /// (batch = sequences, seqlen = the longest).
    pub varlen: Option<PackedBatch>,
    /// Elements between the lse of consecutive heads when not `seqlen_q` (one sequence of a
    /// packed batch launched alone writes into the batch's `[heads_q, total_q]` lse).
    pub lse_head_stride: Option<usize>,
}

impl<'a> Launch<'a> {
    /// A launch over dense buffers at the device addresses `[q, k, v, o, lse]`: no ALiBi slopes
    /// (`alibi` 0), no sink (`sink` 0), not a packed batch, lse heads `seqlen_q` apart.
    /// Launchers that need more set those fields with struct update syntax (`Launch { alibi,
    /// ..Launch::dense(..) }`).
    pub fn dense(problem: &'a AttnProblem, dtype: DType, [q, k, v, o, lse]: [u64; 5]) -> Self {
        Launch {
            problem,
            dtype,
            q,
            k,
            v,
            o,
            lse,
            alibi: 0,
            sink: 0,
            varlen: None,
            lse_head_stride: None,
        }
    }
}

/// Device side of a packed variable-length batch (attn_common.cuh `IS_VARLEN`).
#[derive(Debug, Clone, Copy)]
pub struct PackedBatch {
    /// Device address of `cu_seqlens_q` (i32, batch + 1).
    pub cu_seqlens_q: u64,
    /// Device address of `cu_seqlens_k` (i32, batch + 1).
    pub cu_seqlens_k: u64,
    /// Packed query rows (lse is `[heads_q, total_q]`).
    pub total_q: usize,
    /// Packed key rows: the IS_VARLEN kernels' last parameter (attn_common.cuh
    /// `VARLEN_PARAM`), which bounds the offsets they read.
    pub total_k: usize,
}

/// Kernel parameters of attn_mma.cu's `Params` (same field order and types).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct FlashParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
    pub q_strides: [i64; 3],
    pub k_strides: [i64; 3],
    pub v_strides: [i64; 3],
    pub o_strides: [i64; 3],
    pub seqlen_q: i32,
    pub seqlen_k: i32,
    pub heads_q: i32,
    pub group: i32,
    pub batch: i32,
    pub num_m_blocks: i32,
    pub scale_log2: f32,
    pub window_left: i32,
    pub window_right: i32,
    pub softcap_pre: f32,
    pub alibi_unit: f32,
    pub total_q: i32,
    pub alibi: u64,
    pub alibi_sb: i64,
    pub cu_seqlens_q: u64,
    pub cu_seqlens_k: u64,
    pub lse_sh: i64,
}
// SAFETY: plain old data with C layout, mirrored field by field in the kernel.
unsafe impl DeviceRepr for FlashParams {}

impl FlashParams {
    pub(crate) fn new(l: &Launch, br: u32) -> Self {
        let p = l.problem;
        let s = &p.shape;
        let st = |x: crate::shape::Strides| [x.batch as i64, x.seq as i64, x.head as i64];
        let m = &p.scores;
        // exp(x * scale) = 2^(x * scale_log2). With a softcap c the kernel's S is
        // tanh(q.k * scale / c) and the score c * S, so the factor becomes c * log2(e).
        let scale_log2 = match m.softcap {
            Some(c) => c * std::f32::consts::LOG2_E,
            None => p.softmax_scale * std::f32::consts::LOG2_E,
        };
        // An unbounded window side as 2^30 keys (more than any sequence the kernels take).
        let side = |x: Option<usize>| {
            x.map_or(UNBOUNDED_WINDOW, |w| {
                w.min(UNBOUNDED_WINDOW as usize) as i32
            })
        };
        FlashParams {
            q: l.q,
            k: l.k,
            v: l.v,
            o: l.o,
            lse: l.lse,
            q_strides: st(p.q_strides),
            k_strides: st(p.k_strides),
            v_strides: st(p.v_strides),
            o_strides: st(p.o_strides),
            seqlen_q: s.seqlen_q as i32,
            seqlen_k: s.seqlen_k as i32,
            heads_q: s.heads_q as i32,
            group: s.group_size() as i32,
            batch: s.batch as i32,
            num_m_blocks: s.seqlen_q.div_ceil(br as usize) as i32,
            scale_log2,
            window_left: side(m.window.left),
            window_right: side(m.window.right),
            // tanh(s * scale / c) as tanh_exp2(s * 2 log2(e) * scale / c) (ptx.cuh).
            softcap_pre: m.softcap.map_or(0.0, |c| {
                2.0 * std::f32::consts::LOG2_E * p.softmax_scale / c
            }),
            alibi_unit: std::f32::consts::LOG2_E / scale_log2,
            total_q: l.varlen.map_or(0, |v| v.total_q as i32),
            alibi: l.alibi,
            alibi_sb: match &m.alibi {
                Some(a) if a.per_batch => s.heads_q as i64,
                _ => 0,
            },
            cu_seqlens_q: l.varlen.map_or(0, |v| v.cu_seqlens_q),
            cu_seqlens_k: l.varlen.map_or(0, |v| v.cu_seqlens_k),
            lse_sh: l.lse_head_stride.unwrap_or(s.seqlen_q) as i64,
        }
    }

    /// The query tiles of a tile-scheduled launch (attn_wgmma, attn_wgmma_fp8):
    /// `num_m_blocks * batch * heads_q` tiles of `br` rows (`br` as passed to [`Self::new`]).
    /// The kernels index tiles, plus up to a grid of failed counter draws, with an int.
    ///
    /// # Errors
    /// [`AttnError::TooLarge`] naming `kernel` when the count passes `i32::MAX - 4096`.
    pub(crate) fn scheduled_tiles(&self, kernel: &'static str, br: u32) -> Result<u32> {
        let tiles = self.num_m_blocks as u64 * self.batch as u64 * self.heads_q as u64;
        u32::try_from(tiles)
            .ok()
            .filter(|&t| t <= i32::MAX as u32 - 4096)
            .ok_or_else(|| AttnError::TooLarge {
                kernel,
                reason: format!("{tiles} tiles of {br} query rows: split the batch"),
            })
    }
}

/// An unbounded window side, as the kernels take it (attn_common.cuh `Params`).
const UNBOUNDED_WINDOW: i32 = 1 << 30;

/// NVRTC defines of the problem's score modifiers (attn_common.cuh): `IS_LOCAL` for a sliding
/// window, `HAS_SOFTCAP`, `HAS_ALIBI`; none for a plain problem, so that its kernels stay the
/// same specialisation as before the modifiers existed.
pub fn score_defines(p: &AttnProblem) -> Vec<(String, String)> {
    let m = &p.scores;
    [
        ("IS_LOCAL", !m.window.is_unbounded()),
        ("HAS_SOFTCAP", m.softcap.is_some()),
        ("HAS_ALIBI", m.alibi.is_some()),
    ]
    .into_iter()
    .filter(|(_, on)| *on)
    .map(|(name, _)| (name.to_string(), "1".to_string()))
    .collect()
}

/// The NVRTC define of a learnable sink (attn_common.cuh `HAS_SINK`), for the forward kernels
/// that serve one (attn_mma, attn_wgmma, attn_decode, attn_combine); none without a sink, so
/// that those kernels stay the specialisation they were. The backward kernels never take it:
/// they need only the forward's lse.
pub fn sink_defines(p: &AttnProblem) -> Vec<(String, String)> {
    p.scores
        .sink
        .iter()
        .map(|_| ("HAS_SINK".to_string(), "1".to_string()))
        .collect()
}

/// Pushes the sink's device address after a kernel's own parameters: attn_common.cuh's
/// `SINK_PARAM`, which a kernel has exactly when it is compiled with [`sink_defines`], i.e.
/// when the problem has a sink.
///
/// # Errors
/// [`AttnError::InvalidInput`] when the launch's sink address and the problem disagree (a
/// launcher that did not upload the sink): the kernel would read a parameter that is not there.
pub(crate) fn push_sink<'a>(b: &mut cudarc::driver::LaunchArgs<'a>, l: &'a Launch) -> Result<()> {
    match (l.problem.scores.sink.is_some(), l.sink != 0) {
        (true, true) => {
            b.arg(&l.sink);
            Ok(())
        }
        (false, false) => Ok(()),
        _ => Err(AttnError::InvalidInput {
            what:
                "internal: a launch's sink address does not match its problem's sink (report this)"
                    .into(),
        }),
    }
}

/// What a launch did: the kernel that ran (and why that one), its tile, and the compiler's
/// statistics.
#[derive(Debug, Clone, Serialize)]
pub struct LaunchInfo {
    /// Kernel rung that ran (`mma` when `wgmma` was asked for a call it cannot serve).
    pub kernel: KernelKind,
    /// Why this kernel ran: the request, or why the asked-for kernel handed the call on.
    pub why: String,
    /// The tile, for reports: mma's `spec (description)`, e.g. `2,4,64,l,e,h (Br128xBc64 ..)`,
    /// or wgmma's description, e.g. `Br128xBc128 d128 (2 stages, pingpong, ..)`; `None` for
    /// naive and simt.
    pub config: Option<String>,
    /// Registers per thread of the main kernel at launch (wgmma: before `setmaxnreg`).
    pub registers: u32,
    /// Spill stores in bytes.
    pub spill_bytes: u32,
    /// Dynamic shared memory per block.
    pub smem_bytes: usize,
}

/// Names the kernel and shape in a driver error (also used by the tools' check and bench).
pub fn launch_context(kernel: &str, p: &AttnProblem) -> String {
    format!("{kernel} launch ({}, mask {})", p.shape, p.mask.name())
}

/// Raises a function's dynamic shared-memory limit when it needs more than the default 48 KB,
/// and asks for the largest shared-memory carveout (so that as many blocks fit per SM as the
/// registers allow).
///
/// # Errors
/// [`AttnError::Cuda`] when the driver refuses either attribute.
pub fn set_dynamic_smem(f: &cudarc::driver::CudaFunction, bytes: usize, what: &str) -> Result<()> {
    if bytes > 48 * 1024 {
        f.set_attribute(
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
        )
        .map_err(cuda_err(format!(
            "{what}: raising dynamic shared memory to {bytes} bytes"
        )))?;
    }
    // Prefer the largest shared-memory carveout (a hint, in percent): the kernels stage K/V
    // with cp.async.cg, which bypasses L1, so L1 capacity buys nothing and the shared memory
    // decides how many blocks fit per SM.
    f.set_attribute(
        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
        100,
    )
    .map_err(cuda_err(format!(
        "{what}: setting the shared-memory carveout"
    )))?;
    Ok(())
}

/// A flash kernel (attn_simt, attn_mma) specialised for one launch.
pub(crate) struct FlashKernel {
    /// Its rung.
    pub kernel: KernelKind,
    /// Its source file.
    pub source: KernelSource,
    /// Its entry point.
    pub function: &'static str,
    /// NVRTC defines.
    pub defines: Vec<(String, String)>,
    /// Query rows per block.
    pub br: u32,
    /// Warps per block.
    pub nwarps: u32,
    /// Dynamic shared memory per block.
    pub smem: usize,
    /// The tile, for the report ([`LaunchInfo::config`]).
    pub config: Option<String>,
}

/// Launches a flash kernel: one block per (query block, head, batch), [`FlashParams`] by value.
pub(crate) fn launch_flash(gpu: &Gpu, l: &Launch, f: FlashKernel) -> Result<LaunchInfo> {
    let p = l.problem;
    let s = &p.shape;
    let allowed = gpu.info().smem_per_block_optin as usize;
    if f.smem > allowed {
        return Err(AttnError::TooLarge {
            kernel: f.function,
            reason: format!(
                "head_dim {} needs {} bytes of shared memory per block, the device allows {allowed}: pick a smaller tile",
                s.head_dim, f.smem
            ),
        });
    }
    let k = gpu.kernel(f.source, f.function, &f.defines)?;
    let ctx = launch_context(f.function, p);
    set_dynamic_smem(&k.function, f.smem, &ctx)?;
    let params = FlashParams::new(l, f.br);
    // check_gpu_problem bounds ceil(seqlen_q / 16) * batch * heads_q by 2^31 - 1, and Br >= 16.
    let blocks = params.num_m_blocks as u64 * s.batch as u64 * s.heads_q as u64;
    let blocks = u32::try_from(blocks).map_err(|_| AttnError::TooLarge {
        kernel: f.function,
        reason: format!("{blocks} thread blocks: split the batch"),
    })?;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (32 * f.nwarps, 1, 1),
        shared_mem_bytes: f.smem as u32,
    };
    let mut b = gpu.stream().launch_builder(&k.function);
    b.arg(&params);
    push_sink(&mut b, l)?;
    let total_k = l.varlen.map(|v| v.total_k as i32);
    if let Some(total_k) = &total_k {
        b.arg(total_k);
    }
    // SAFETY: the parameters mirror the kernel's struct (and its sink and packed-batch
    // parameters, with them); forward_device checked every buffer against the shape and
    // strides, and the kernel reads/writes only inside those bounds (the sink's heads_q logits
    // included; a packed batch's offsets clamped to total_q and total_k).
    unsafe { b.launch(cfg) }.map_err(cuda_err(ctx))?;
    Ok(LaunchInfo {
        kernel: f.kernel,
        why: "asked for".into(),
        config: f.config,
        registers: k.stats.registers,
        spill_bytes: k.stats.spill_stores,
        smem_bytes: f.smem,
    })
}

/// The learnable sink's logits on the device, for one call (stream-ordered, as
/// [`upload_slopes`]); `None` without a sink.
///
/// # Errors
/// [`AttnError::InvalidInput`] inside a CUDA graph capture (the logits are copied from host
/// memory); copy failures as [`AttnError::Cuda`].
pub(crate) fn upload_sink(
    gpu: &Gpu,
    scores: &crate::scores::ScoreMods,
) -> Result<Option<CudaSlice<f32>>> {
    scores
        .sink
        .as_ref()
        .map(|s| {
            if gpu.capturing() {
                return Err(AttnError::InvalidInput {
                    what: "the learnable sink's logits are copied from host memory, which a CUDA graph capture cannot record: call with a sink outside the capture".into(),
                });
            }
            gpu.stream()
                .clone_htod(s)
                .map_err(cuda_err("copying the learnable sink to the device"))
        })
        .transpose()
}

/// The ALiBi slopes on the device, for one call (stream-ordered: the copy precedes the launch,
/// and the buffer's free follows it on the same stream); `None` without ALiBi.
pub(crate) fn upload_slopes(
    gpu: &Gpu,
    scores: &crate::scores::ScoreMods,
) -> Result<Option<CudaSlice<f32>>> {
    scores
        .alibi
        .as_ref()
        .map(|a| {
            if gpu.capturing() {
                return Err(AttnError::InvalidInput {
                    what: "ALiBi slopes are copied from host memory, which a CUDA graph capture cannot record: call with ALiBi outside the capture".into(),
                });
            }
            gpu.stream()
                .clone_htod(&a.slopes)
                .map_err(cuda_err("copying the ALiBi slopes to the device"))
        })
        .transpose()
}

/// The ALiBi slopes and the learnable sink's logits of one call on the device
/// ([`upload_slopes`], [`upload_sink`]: stream-ordered, freed after the call on the same
/// stream), for the launchers that take both as addresses.
pub(crate) struct ScoreBuffers {
    slopes: Option<CudaSlice<f32>>,
    sink: Option<CudaSlice<f32>>,
}

impl ScoreBuffers {
    /// Copies the call's slopes and sink logits (whichever it has) to the device.
    ///
    /// # Errors
    /// Those of [`upload_slopes`] and [`upload_sink`].
    pub(crate) fn upload(gpu: &Gpu, scores: &crate::scores::ScoreMods) -> Result<Self> {
        Ok(ScoreBuffers {
            slopes: upload_slopes(gpu, scores)?,
            sink: upload_sink(gpu, scores)?,
        })
    }

    /// Their device addresses `[alibi, sink]` (0 where the call has none), with the guards to
    /// hold until the launch is enqueued.
    pub(crate) fn ptrs<'a>(
        &'a self,
        stream: &'a cudarc::driver::CudaStream,
    ) -> ([u64; 2], [Option<cudarc::driver::SyncOnDrop<'a>>; 2]) {
        use cudarc::driver::DevicePtr;
        let [(alibi, g_alibi), (sink, g_sink)] = [&self.slopes, &self.sink].map(|x| {
            x.as_ref()
                .map(|d| d.device_ptr(stream))
                .map_or((0, None), |(ptr, guard)| (ptr, Some(guard)))
        });
        ([alibi, sink], [g_alibi, g_sink])
    }
}
