//! Launcher of the backward pass on Tensor Cores (FlashAttention-2's Algorithm 2, Dao 2023,
//! arXiv 2307.08691): `D = rowsum(do * o)`, then one block per (key block, kv head, batch)
//! accumulating dK and dV in registers and adding dQ tiles to an f32 workspace, then the
//! workspace converted to the element type. Two main kernels:
//! - attn_bwd_wgmma ([`crate::cuda::bwd::backward_wgmma`]; wgmma + TMA, FlashAttention-3's structure):
//!   the default on sm_90 at head_dim 64 and 72..=128 (every mask, softcap and ALiBi);
//! - attn_bwd (`mma.sync`, bulk reductions on sm_90, atomics before): every other call
//!   (other head dims, other GPUs, varlen), and any call that asks for it ([`BwdKernel::Mma`]).
//!
//! Both have the deterministic mode.
//!
//! A learnable sink ([`crate::scores`]) changes neither: the forward's lse includes it, so P and
//! dS recomputed from it are the sink-aware ones ([`crate::reference_grad`] derives it). Its own
//! gradient, `d_sink[h] = -sum_{b,i} exp(sink_h - lse_bhi) D_bhi`, is one more small kernel
//! (kernels/bwd/sink_grad.cu, one block per query head, the same bytes run to run) reading the
//! lse and the D workspace the backward computes anyway.
//!
//! Serves every head_dim up to 256 ([`run_head_dim`]: some padded with zero channels, 256 in
//! two channel passes), no mask, causal, sliding windows, softcap and ALiBi (the forward's
//! score modifiers, [`crate::scores`]).
//! dQ's additions make its last bits depend on the order the blocks run in, unless the call
//! asks for [`BackwardOptions::deterministic`]; dK and dV are the same bytes run to run.
//!
//! Status: compiled for every CI arch without spills; checked on the H200 by `flashattn
//! check` (the `backward` cases on both kernels, runs 58-73); `run --backward` still uses the
//! CPU backward.

use crate::cpu_backward::check_buffers;
pub use crate::cuda::bwd::backward_wgmma::BwdKernel;
use crate::cuda::bwd::backward_wgmma::{self as bw, MapAddrs};
use crate::cuda::runtime::args::{check_aligned, check_contexts, check_gpu_problem, device_ptrs};
use crate::cuda::runtime::device::{Gpu, cuda_err};
use crate::cuda::runtime::launch::{
    FlashParams, GpuElement, KernelKind, Launch, launch_context, score_defines, set_dynamic_smem,
    upload_sink, upload_slopes,
};
use crate::cuda::runtime::tma::TmaMap;
use crate::cuda::sources::KernelSource;
use crate::dtype::DType;
use crate::error::{AttnError, Result};
use crate::shape::AttnProblem;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg};
use serde::Serialize;

/// The largest head_dim served. attn_bwd keeps dK and dV of 128 channels of a warp's 16 keys
/// in registers: at head_dim 256 it runs two passes of 128 channels (each recomputing S^T and
/// dP^T over all 256); head dims between 128 and 256 run padded to 256, and those not a
/// multiple of 8 padded to the next multiple ([`run_head_dim`]).
pub const MAX_HEAD_DIM: usize = 256;

/// The head_dim the kernels run a call's head_dim at: itself (a multiple of 8 up to 128, or
/// 256), else padded with zero channels to the next multiple of 8 (up to 128) or to 256.
pub fn run_head_dim(head_dim: usize) -> usize {
    if head_dim > 128 {
        256
    } else {
        head_dim.next_multiple_of(8)
    }
}

/// Options of a backward call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BackwardOptions {
    /// Which main kernel runs: attn_bwd_wgmma where it serves the call (the default), or
    /// one of the two by name.
    pub kernel: BwdKernel,
    /// dQ the same bytes run to run: the key blocks add their dQ tiles of each step of rows
    /// in a fixed order, the last key block first (a counter per dQ tile), instead of as they
    /// come.
    /// dK and dV are the same bytes either way. FlashAttention-2's `deterministic=True`.
    pub deterministic: bool,
    /// Whether attn_bwd_wgmma runs persistent: [`bw::persistent_grid`] blocks (one per SM),
    /// each looping over tiles (key block, kv head, batch: its own index first, then those
    /// an atomic counter hands out, so that blocks with short causal tiles take more),
    /// loading the next tile's K, V and first Q/dO stage while it finishes the last, instead
    /// of one block per tile. `None`: the library's choice,
    /// [`persistent_default`]. attn_bwd ignores it.
    pub persistent: Option<bool>,
    /// The persistent grid's blocks at most (`None`: one per SM); a smaller grid gives each
    /// block more tiles (the check's way to change tiles on small problems; slower). Must
    /// not be 0.
    pub persistent_blocks: Option<u32>,
}

/// Whether attn_bwd_wgmma runs persistent where the call leaves it to the library
/// ([`BackwardOptions::persistent`] `None`): for causal masks (tiles of unequal work, which the
/// tile counter balances) and head dims up to 64 (short tiles, where the next tile's loads
/// overlap a larger share), outside the deterministic mode. Measured on the H100 in one
/// interleaved run with the peers (docs/perf-notes.md): persistent +2-8 % on d64 causal,
/// +1-4 % on d128 causal, 0-2 % on d64 without a mask; d128 without a mask 2-6 % slower at
/// 4k and 16k, so it stays on one block per tile. The deterministic mode's persistent form is
/// checked but was not timed. A softcap at head_dim 64 without a causal mask stays on one
/// block per tile too: its persistent build spills 16 bytes (128-row steps, the softcap's
/// MUFU work; 0 on one block per tile), which costs more than persistence gains there.
pub fn persistent_default(p: &AttnProblem, deterministic: bool) -> bool {
    let small = p.shape.head_dim <= 64 && p.scores.softcap.is_none();
    !deterministic && (p.mask.is_causal() || small)
}

/// What a backward call ran.
#[derive(Debug, Clone, Serialize)]
pub struct BackwardInfo {
    /// The main kernel: `attn_bwd` or `attn_bwd_wgmma`.
    pub kernel: &'static str,
    /// Why attn_bwd ran where the caller left the choice to the library (empty otherwise).
    pub why_not_wgmma: String,
    /// Registers per thread of attn_bwd.
    pub registers: u32,
    /// Its spill stores in bytes.
    pub spill_bytes: u32,
    /// Its dynamic shared memory per block.
    pub smem_bytes: usize,
    /// Its blocks: key blocks x kv heads x batch, or the persistent grid (`persistent`).
    pub blocks: u32,
    /// Whether attn_bwd_wgmma ran persistent (each block looping over tiles).
    pub persistent: bool,
    /// attn_bwd's geometry (attn_bwd_wgmma's is fixed: 128 keys, 64 rows per step).
    pub tile: Option<BwdTile>,
    /// Whether dQ was added in key-block order.
    pub deterministic: bool,
    /// The head_dim the kernels ran at when the call's is not a multiple of 8 (q, k, v, o and
    /// do padded with zero channels, the gradients copied back: [`crate::cuda::runtime::pad::backward_padded`]).
    pub padded_head_dim: Option<usize>,
}

/// Why the GPU backward cannot take this problem, as the error a call would return; `None`
/// when it can. Every mask and score modifier is taken; only a head_dim above
/// [`MAX_HEAD_DIM`] is refused (which [`AttnProblem::validate`] refuses first). The CPU
/// backward ([`crate::cpu_backward::backward`]) takes every problem.
pub fn unsupported(p: &AttnProblem) -> Option<AttnError> {
    let d = p.shape.head_dim;
    (d > MAX_HEAD_DIM).then(|| AttnError::UnsupportedHeadDim {
        head_dim: d,
        backend: "the GPU backward (attn_bwd)".into(),
        supported: format!(
            "up to {MAX_HEAD_DIM} (padded where the kernels need it); the CPU backward takes every head_dim"
        ),
    })
}

/// Environment variable that overrides attn_bwd's tile for experiments: `nwarps,br[,keys_per_warp]`,
/// e.g. `4,32` or `4,32,32` (the bench's way of timing one geometry against another).
pub const TILE_ENV: &str = "FLASHATTN_BWD_TILE";

/// The block geometry of attn_bwd: `nwarps` warps of `keys_per_warp` keys each (their dK and
/// dV in registers) and `br` query rows per step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BwdTile {
    /// Warps per block: 4 or 8.
    pub nwarps: usize,
    /// Query rows per step: 32 or 64 (64 spills at head_dim above 64).
    pub br: usize,
    /// Keys per warp: 16, or 32 at head_dim <= 64 (each shared-memory fragment of Q and dO
    /// then serves two m-tiles of keys).
    pub keys_per_warp: usize,
}

impl BwdTile {
    /// The default for a head_dim, element type, compute capability and the device's opt-in
    /// shared memory per block:
    /// - f16 on sm_90 at head_dim <= 64 except 56: 4 warps of 32 keys, 32 rows per step, two
    ///   blocks per SM; each shared-memory fragment of Q and dO serves two m-tiles of keys
    ///   (+11-19 % over 8 warps of 16 keys at d64 f16 on the H200, run 64). Elsewhere (bf16,
    ///   sm_80, d56) ptxas spills it at 255 registers;
    /// - else 8 warps of 16 keys (128 keys: half the dQ traffic and the Q/dO loads of 64)
    ///   where their shared memory fits (sm_80, sm_90), else 4; 64 rows per step at
    ///   head_dim <= 64 (registers allow it there).
    pub fn for_head_dim(head_dim: usize, dtype: DType, cc: (i32, i32), smem_limit: usize) -> Self {
        let two_m_tiles = head_dim <= 64 && head_dim != 56 && dtype == DType::F16 && cc == (9, 0);
        Self::choose(head_dim, two_m_tiles, smem_limit)
    }

    /// [`BwdTile::for_head_dim`] for a problem's score modifiers: with a softcap, 16 keys per
    /// warp where the default takes 32 (ptxas spilled 32 with the softcap at d64 f16 on
    /// sm_90, the kernel being at 255 registers there without it).
    pub fn for_problem(p: &AttnProblem, dtype: DType, cc: (i32, i32), smem_limit: usize) -> Self {
        let d = p.shape.head_dim;
        let t = Self::for_head_dim(d, dtype, cc, smem_limit);
        if p.scores.softcap.is_some() && t.keys_per_warp == 32 {
            return Self::choose(d, false, smem_limit);
        }
        t
    }

    /// The first tile that fits of: 4 warps of 32 keys (where `two_m_tiles`), 8 warps of 16
    /// keys (64 rows at head_dim <= 64, else 32), 8 of 16 with 32 rows, 4 of 16 with 32 rows
    /// (the only one above head_dim 128).
    fn choose(head_dim: usize, two_m_tiles: bool, smem_limit: usize) -> Self {
        let tile = |nwarps, br, keys_per_warp| BwdTile {
            nwarps,
            br,
            keys_per_warp,
        };
        let br = if head_dim <= 64 { 64 } else { 32 };
        let mut options = vec![tile(8, br, 16), tile(8, 32, 16), tile(4, 32, 16)];
        if head_dim > 128 {
            options = vec![tile(4, 32, 16)];
        }
        if two_m_tiles {
            options.insert(0, tile(4, 32, 32));
        }
        options
            .into_iter()
            .find(|t| t.check(head_dim, smem_limit).is_ok())
            .unwrap_or(tile(4, 32, 16))
    }

    /// [`BwdTile::for_problem`], or the tile `FLASHATTN_BWD_TILE` names.
    ///
    /// # Errors
    /// [`AttnError::InvalidInput`] for a malformed variable, or a tile this head_dim or device
    /// cannot take (64 rows above head_dim 64 would spill; shared memory past the limit).
    pub fn for_call(
        p: &AttnProblem,
        dtype: DType,
        cc: (i32, i32),
        smem_limit: usize,
    ) -> Result<Self> {
        let head_dim = p.shape.head_dim;
        let Ok(v) = std::env::var(TILE_ENV) else {
            let t = Self::for_problem(p, dtype, cc, smem_limit);
            t.check(head_dim, smem_limit)
                .map_err(|why| AttnError::UnsupportedHeadDim {
                    head_dim,
                    backend: "the GPU backward (attn_bwd) on this device".into(),
                    supported: format!("{why}; the CPU backward takes every head_dim"),
                })?;
            return Ok(t);
        };
        let t = Self::parse(&v)?;
        t.check(head_dim, smem_limit)
            .map_err(|why| AttnError::InvalidInput {
                what: format!("{TILE_ENV}='{v}': {why}"),
            })?;
        Ok(t)
    }

    /// Whether this tile can take a head_dim on a device with `smem_limit` bytes of opt-in
    /// shared memory per block; `Err` says why not and what to use instead.
    fn check(&self, head_dim: usize, smem_limit: usize) -> std::result::Result<(), String> {
        if head_dim > 128 && (self.nwarps, self.br, self.keys_per_warp) != (4, 32, 16) {
            return Err(format!(
                "head_dim {head_dim} runs on 4 warps of 16 keys and 32 rows per step only"
            ));
        }
        if self.keys_per_warp == 32 && (head_dim > 64 || self.br == 64) {
            return Err(format!(
                "32 keys per warp take head_dim <= 64 and 32 rows per step (this call has head_dim {head_dim})"
            ));
        }
        if self.br == 64 && head_dim > 64 {
            return Err(format!(
                "64 rows per step spill above head_dim 64 (this call has {head_dim}); use 32"
            ));
        }
        let bytes = self.smem_bytes(head_dim);
        if bytes > smem_limit {
            return Err(format!(
                "{bytes} bytes of shared memory at head_dim {head_dim}, the device allows {smem_limit} per block; use 4 warps"
            ));
        }
        Ok(())
    }

    /// Parses `nwarps,br[,keys_per_warp]` (4 or 8, 32 or 64, 16 or 32; 16 by default).
    ///
    /// # Errors
    /// [`AttnError::InvalidInput`] naming the expected form.
    pub fn parse(s: &str) -> Result<Self> {
        let bad = || AttnError::InvalidInput {
            what: format!(
                "{TILE_ENV}='{s}': expected nwarps,br[,keys_per_warp] with nwarps 4 or 8, br 32 or 64, keys_per_warp 16 or 32"
            ),
        };
        let parts: Vec<usize> = s
            .split(',')
            .map(|x| x.trim().parse().map_err(|_| bad()))
            .collect::<Result<_>>()?;
        let (nwarps, br, keys_per_warp) = match parts[..] {
            [n, b] => (n, b, 16),
            [n, b, k] => (n, b, k),
            _ => return Err(bad()),
        };
        match (nwarps, br, keys_per_warp) {
            (4 | 8, 32 | 64, 16 | 32) => Ok(BwdTile {
                nwarps,
                br,
                keys_per_warp,
            }),
            _ => Err(bad()),
        }
    }

    /// Keys per block.
    pub fn bc(&self) -> usize {
        self.keys_per_warp * self.nwarps
    }

    /// Dynamic shared memory for a head_dim (attn_bwd.cu's layout: K and V of the block's
    /// keys; two buffers each of Q, dO, lse and D; dS^T; the f32 dQ tile).
    pub fn smem_bytes(&self, head_dim: usize) -> usize {
        let dp = head_dim.div_ceil(16) * 16;
        let dkv = dp.min(128); // channels of the dQ tile per pass
        let rs = (dp / 8 + 1) * 8;
        let (bc, br) = (self.bc(), self.br);
        (2 * bc * rs + 4 * br * rs + bc * (br + 8)) * 2 + br * (dkv + 8) * 4 + 4 * br * 4
    }

    /// The passes of a head_dim: the first channel of each ([`MAX_HEAD_DIM`]).
    pub fn passes(head_dim: usize) -> Vec<usize> {
        if head_dim > 128 {
            vec![0, 128]
        } else {
            vec![0]
        }
    }

    /// NVRTC defines of attn_bwd for a problem under this tile.
    /// `ch0` is the pass's first channel ([`BwdTile::passes`]).
    pub fn defines(
        &self,
        dtype: DType,
        p: &AttnProblem,
        opts: BackwardOptions,
        ch0: usize,
    ) -> Vec<(String, String)> {
        let b = |x: bool| u8::from(x).to_string();
        let mut d = vec![
            ("HEAD_DIM".to_string(), p.shape.head_dim.to_string()),
            ("CH0".to_string(), ch0.to_string()),
            ("NWARPS".to_string(), self.nwarps.to_string()),
            ("BWD_BR".to_string(), self.br.to_string()),
            ("KEYS_PER_WARP".to_string(), self.keys_per_warp.to_string()),
            ("IS_BF16".to_string(), b(dtype == DType::BF16)),
            ("IS_CAUSAL".to_string(), b(p.mask.is_causal())),
            ("DETERMINISTIC".to_string(), b(opts.deterministic)),
        ];
        d.extend(score_defines(p));
        d
    }
}

/// sink_grad.cu's `SinkGradParams` (same field order and types).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct SinkGradParams {
    lse: u64,
    dsum: u64,
    sink: u64,
    d_sink: u64,
    lse_sb: i64,
    lse_sh: i64,
    batch: i32,
    rows: i32,
}
// SAFETY: plain old data with C layout, mirrored field by field by the kernel's struct.
unsafe impl DeviceRepr for SinkGradParams {}

/// attn_bwd.cu's `BwdParams` (same field order and types; also the packed launcher's,
/// [`crate::cuda::bwd::varlen`]).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct BwdParams {
    pub(crate) p: FlashParams,
    pub(crate) d_o: u64,
    pub(crate) do_strides: [i64; 3],
    pub(crate) dsum: u64,
    pub(crate) dq_accum: u64,
    pub(crate) dk: u64,
    pub(crate) dv: u64,
    pub(crate) scale: f32,
    pub(crate) heads_kv: i32,
    pub(crate) num_k_blocks: i32,
    pub(crate) dq_order: u64,
}
// SAFETY: plain old data with C layout, mirrored field by field by the kernel's struct.
unsafe impl DeviceRepr for BwdParams {}

/// attn_bwd_wgmma.cu's `BwdWgmmaParams`: the tensor maps of q, k, v and do, then BwdParams.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct BwdWgmmaParams {
    maps: [TmaMap; 4],
    bp: BwdParams,
}
// SAFETY: as BwdParams; TmaMap is 64-byte aligned in both.
unsafe impl DeviceRepr for BwdWgmmaParams {}

/// Gradients on device buffers: `q`, `k`, `v` in the problem's layout, `o` and `d_o` through
/// `o_strides`, `lse` the forward's (dense `[batch, heads_q, seqlen_q]` f32, natural log).
/// Writes `dq` dense `[batch, seqlen_q, heads_q, head_dim]` and `dk`, `dv` dense `[batch,
/// seqlen_k, heads_kv, head_dim]` (summed over the query heads of each kv head), in the
/// element type. `opts.deterministic` makes dQ the same bytes run to run (dK, dV always are).
/// With a learnable sink in the problem, `d_sink` (f32 `[heads_q]`, when given) receives its
/// gradient (written, not added to; the same bytes run to run); `None` skips it (a frozen
/// sink: dq, dk, dv need only the forward's lse, which includes the sink).
/// Asynchronous on `gpu.stream()`; the workspaces (D, dQ in f32, the order counters) are
/// freed in stream order.
///
/// # Errors
/// [`unsupported`]'s errors; every error of [`check_gpu_problem`]; [`AttnError::InvalidInput`]
/// for a malformed `FLASHATTN_BWD_TILE` ([`BwdTile::for_call`]), for [`BwdKernel::Wgmma`] on
/// a call attn_bwd_wgmma cannot serve (another head_dim or GPU), for ALiBi or a sink's
/// gradient inside a CUDA graph capture (slopes and logits are copied from host memory), and
/// for `d_sink` given on a problem without a sink;
/// [`AttnError::BufferTooShort`] for any buffer shorter than its layout needs (`do` named as
/// such); [`AttnError::InvalidStrides`] for a base address not 16-byte aligned;
/// [`AttnError::ShapeMismatch`] for a buffer of another context; [`AttnError::Compile`] /
/// [`AttnError::Cuda`] with the kernel and shape.
#[allow(clippy::too_many_arguments)]
pub fn backward_device<T, Q, K, V, O, L, G, DQ, DK, DV>(
    gpu: &Gpu,
    p: &AttnProblem,
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
    check_gpu_problem(p, KernelKind::Mma)?;
    if let Some(e) = unsupported(p) {
        return Err(e);
    }
    check_buffers(
        p,
        [q.len(), k.len(), v.len(), o.len(), lse.len(), d_o.len()],
        [dq.len(), dk.len(), dv.len()],
    )?;
    check_contexts!(gpu; "q" => q, "k" => k, "v" => v, "o" => o, "lse" => lse, "do" => d_o,
        "dq" => dq, "dk" => dk, "dv" => dv)?;
    if let Some(ds) = &d_sink {
        if p.scores.sink.is_none() {
            return Err(AttnError::InvalidInput {
                what: "d_sink was given, but the problem has no learnable sink (ScoreMods::sink): pass None, or set the sink".into(),
            });
        }
        crate::error::check_len("d_sink", ds.len(), p.shape.heads_q)?;
        check_contexts!(gpu; "d_sink" => ds)?;
    }
    let stream = gpu.stream();
    device_ptrs!(stream; qp = q, kp = k, vp = v, op = o, lp = lse, dop = d_o, dqp = mut dq, dkp = mut dk, dvp = mut dv);
    let s = &p.shape;
    if run_head_dim(s.head_dim) != s.head_dim {
        let b = crate::cuda::runtime::pad::BwdBuffers {
            q: qp,
            k: kp,
            v: vp,
            o: op,
            d_o: dop,
            dq: dqp,
            dk: dkp,
            dv: dvp,
        };
        let dp = run_head_dim(s.head_dim);
        let mut info =
            crate::cuda::runtime::pad::backward_padded::<T, _, _>(gpu, p, dp, &b, |pp, d| {
                backward_device(
                    gpu, pp, opts, &d.q, &d.k, &d.v, &d.o, lse, &d.d_o, &mut d.dq, &mut d.dk,
                    &mut d.dv, d_sink,
                )
            })?;
        info.padded_head_dim = Some(dp);
        return Ok(info);
    }
    // (The padded path copies element by element: its buffers need no alignment.)
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
    let ctx = launch_context("attn_bwd", p);
    let mut dsum: CudaSlice<f32> = stream
        .alloc_zeros(s.lse_len())
        .map_err(cuda_err(format!("{ctx}: allocating D")))?;
    let (dsp, _gds) = dsum.device_ptr_mut(stream);
    let info = gpu.info();
    let tile = BwdTile::for_call(
        p,
        T::DTYPE,
        info.compute_capability,
        info.smem_per_block_optin as usize,
    )?;
    // attn_bwd_wgmma where it serves the call and its tensor maps encode; else attn_bwd.
    let wgmma_maps = match opts.kernel {
        BwdKernel::Mma => Err("the call asked for attn_bwd".to_string()),
        BwdKernel::Auto | BwdKernel::Wgmma => match bw::unsupported(info, p) {
            Some(why) => Err(why),
            None => bw::maps(
                T::DTYPE,
                p,
                &MapAddrs {
                    q: qp,
                    k: kp,
                    v: vp,
                    d_o: dop,
                },
            ),
        },
    };
    let wgmma_maps = match (wgmma_maps, opts.kernel) {
        (Err(why), BwdKernel::Wgmma) => {
            return Err(AttnError::InvalidInput {
                what: format!("{ctx}: attn_bwd_wgmma cannot serve this call: {why}"),
            });
        }
        (m, _) => m,
    };
    let wgmma = wgmma_maps.is_ok();
    let persistent = wgmma
        && opts
            .persistent
            .unwrap_or_else(|| persistent_default(p, opts.deterministic));
    if opts.persistent_blocks == Some(0) {
        return Err(AttnError::InvalidInput {
            what: format!(
                "{ctx}: BackwardOptions::persistent_blocks is 0; give at least 1, or None for one block per SM"
            ),
        });
    }
    let bc = if wgmma { bw::BC } else { tile.bc() };
    // attn_bwd's passes over the channels of dK, dV and dQ (two at head_dim 256).
    let passes = BwdTile::passes(s.head_dim);
    // The key-block counters of the deterministic mode: attn_bwd's one per (batch, query
    // head, step), for each pass; attn_bwd_wgmma's one per dQ tile.
    let per_pass = s.batch * s.heads_q * s.seqlen_q.div_ceil(tile.br);
    // The persistent attn_bwd_wgmma's tile counter: the word after them (the only one
    // without the deterministic mode).
    let n_order = match (opts.deterministic, wgmma) {
        (false, _) => 1,
        (true, true) => bw::dq_order_len(p) + usize::from(persistent),
        (true, false) => per_pass * passes.len(),
    };
    let mut dq_order: CudaSlice<i32> = stream
        .alloc_zeros(n_order)
        .map_err(cuda_err(format!("{ctx}: allocating the dQ order counters")))?;
    let (dop_order, _gor) = dq_order.device_ptr_mut(stream);
    // The f32 dQ workspace: dense as dq for attn_bwd; tile by tile for attn_bwd_wgmma (its
    // rows rounded up to whole steps, its channels to the padded head_dim).
    let n_q = s.batch * s.seqlen_q * s.heads_q * s.head_dim;
    let n_accum = if wgmma { bw::dq_accum_len(p) } else { n_q };
    let mut dq_accum: CudaSlice<f32> = stream
        .alloc_zeros(n_accum)
        .map_err(cuda_err(format!("{ctx}: allocating the dQ workspace")))?;
    let (dap, _gda) = dq_accum.device_ptr_mut(stream);

    // ALiBi's slopes on the device (freed in stream order after the launches), as the forward.
    let slopes = upload_slopes(gpu, &p.scores)?;
    let alibi = slopes.as_ref().map(|d| d.device_ptr(stream));
    let launch = Launch {
        alibi: alibi.as_ref().map_or(0, |(ptr, _)| *ptr),
        ..Launch::dense(p, T::DTYPE, [qp, kp, vp, op, lp])
    };
    let num_k_blocks = s.seqlen_k.div_ceil(bc);
    let blocks = num_k_blocks as u64 * s.heads_kv as u64 * s.batch as u64;
    // gridDim.x is at most 2^31 - 1.
    let blocks = u32::try_from(blocks)
        .ok()
        .filter(|&b| b <= i32::MAX as u32)
        .ok_or_else(|| AttnError::TooLarge {
            kernel: "attn_bwd",
            reason: format!("{blocks} thread blocks: split the batch"),
        })?;
    // The persistent grid: at most one block per SM, each over several tiles.
    let blocks = if persistent {
        bw::persistent_grid(blocks, info.sm_count, opts.persistent_blocks)
    } else {
        blocks
    };
    let st = |x: crate::shape::Strides| [x.batch as i64, x.seq as i64, x.head as i64];
    let params = BwdParams {
        p: FlashParams::new(&launch, tile.br as u32),
        d_o: dop,
        do_strides: st(p.o_strides),
        dsum: dsp,
        dq_accum: dap,
        dk: dkp,
        dv: dvp,
        scale: p.softmax_scale,
        heads_kv: s.heads_kv as i32,
        num_k_blocks: num_k_blocks as i32,
        dq_order: dop_order,
    };
    // The main kernel, and the dQ conversion of its workspace (tiled: one thread per 8
    // channels; dense: one per element).
    let (source, main_name, dq_name, defs, smem, threads, convert_threads) = if wgmma {
        (
            KernelSource::AttnBwdWgmma,
            "attn_bwd_wgmma",
            "attn_bwd_dq_tiled",
            bw::defines(T::DTYPE, p, opts.deterministic, persistent),
            bw::smem_bytes(s.head_dim, persistent),
            bw::THREADS,
            n_q / 8,
        )
    } else {
        (
            KernelSource::AttnBwd,
            "attn_bwd",
            "attn_bwd_dq",
            tile.defines(T::DTYPE, p, opts, 0),
            tile.smem_bytes(s.head_dim),
            32 * tile.nwarps as u32,
            n_q,
        )
    };
    let k_dsum = gpu.kernel(source, "attn_bwd_dsum", &defs)?;
    let k_main = gpu.kernel(source, main_name, &defs)?;
    // attn_bwd's later passes: the same kernel at their first channel.
    let later = if wgmma { &[][..] } else { &passes[1..] };
    let k_later = later
        .iter()
        .map(|&ch0| {
            let k = gpu.kernel(source, main_name, &tile.defines(T::DTYPE, p, opts, ch0))?;
            set_dynamic_smem(&k.function, smem, &ctx)?;
            Ok(k)
        })
        .collect::<Result<Vec<_>>>()?;
    let k_dq = gpu.kernel(source, dq_name, &defs)?;
    set_dynamic_smem(&k_main.function, smem, &ctx)?;

    let rows = (s.batch * s.seqlen_q * s.heads_q) as u64;
    let grid_1d = |n: u64| -> Result<LaunchConfig> {
        let blocks = u32::try_from(n.div_ceil(256))
            .ok()
            .filter(|&b| b <= i32::MAX as u32)
            .ok_or_else(|| AttnError::TooLarge {
                kernel: "attn_bwd",
                reason: format!("{n} elements in one 1-D launch: split the batch"),
            })?;
        Ok(LaunchConfig {
            grid_dim: (blocks.max(1), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        })
    };
    let ost = st(p.o_strides);
    let mut b = stream.launch_builder(&k_dsum.function);
    b.arg(&params)
        .arg(&op)
        .arg(&ost[0])
        .arg(&ost[1])
        .arg(&ost[2]);
    let cfg_dsum = grid_1d(rows * 8)?; // eight threads per row
    // SAFETY: the arguments mirror attn_bwd_dsum's; every buffer was checked against the
    // shape and strides above, and the kernel reads and writes only inside them.
    unsafe { b.launch(cfg_dsum) }.map_err(cuda_err(format!("{ctx} (D = rowsum(do o))")))?;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    let mut b = stream.launch_builder(&k_main.function);
    let wparams;
    match &wgmma_maps {
        Ok(maps) => {
            wparams = BwdWgmmaParams {
                maps: *maps,
                bp: params,
            };
            b.arg(&wparams);
        }
        Err(_) => {
            b.arg(&params);
        }
    }
    // SAFETY: as above; dq_accum holds n_q floats, dk and dv their dense sizes; the tensor
    // maps describe q, k, v and do within their checked extents.
    unsafe { b.launch(cfg) }.map_err(cuda_err(format!("{ctx} ({main_name})")))?;
    for (pass, (k, &ch0)) in k_later.iter().zip(later).enumerate() {
        // Each pass counts its own dQ order (the deterministic mode): counters of pass i
        // start at i x per_pass.
        let pass_params = BwdParams {
            dq_order: if opts.deterministic {
                dop_order + ((pass + 1) * per_pass * size_of::<i32>()) as u64
            } else {
                dop_order
            },
            ..params
        };
        let mut b = stream.launch_builder(&k.function);
        b.arg(&pass_params);
        // SAFETY: as the first pass; the order counters hold passes x per_pass entries.
        unsafe { b.launch(cfg) }.map_err(cuda_err(format!(
            "{ctx} ({main_name}, channels from {ch0})"
        )))?;
    }
    let n = n_q as i64;
    let mut b = stream.launch_builder(&k_dq.function);
    if wgmma {
        b.arg(&params).arg(&dqp);
    } else {
        b.arg(&dap).arg(&dqp).arg(&n);
    }
    let cfg_dq = grid_1d(convert_threads as u64)?;
    // SAFETY: dq holds n_q elements (checked above); dq_accum n_q (attn_bwd) or the tiled
    // length the kernel indexes (attn_bwd_dq_tiled, bw::dq_accum_len).
    unsafe { b.launch(cfg_dq) }.map_err(cuda_err(format!("{ctx} (dQ to the element type)")))?;
    if let Some(ds) = d_sink {
        let rows = SinkRows {
            batch: s.batch,
            rows: s.seqlen_q,
            batch_stride: s.heads_q * s.seqlen_q,
            head_stride: s.seqlen_q,
        };
        launch_sink_grad(gpu, &p.scores, s.heads_q, rows, [lp, dsp], ds, &ctx)?;
    }
    Ok(BackwardInfo {
        kernel: main_name,
        why_not_wgmma: match (&wgmma_maps, opts.kernel) {
            (Err(why), BwdKernel::Auto) => why.clone(),
            _ => String::new(),
        },
        registers: k_main.stats.registers,
        spill_bytes: k_main.stats.spill_stores,
        smem_bytes: smem,
        blocks,
        persistent,
        tile: (!wgmma).then_some(tile),
        deterministic: opts.deterministic,
        padded_head_dim: None,
    })
}

/// Where the rows of one query head lie in the lse and D that sink_grad reads (f32 elements;
/// both share it): row `i` of batch entry `b` at `b * batch_stride + h * head_stride + i`.
/// Dense `[batch, heads_q, seqlen_q]`: `batch_stride = heads_q * seqlen_q`, `head_stride =
/// seqlen_q`; a packed batch's `[heads_q, total_q]`: one batch entry of `total_q` rows,
/// `head_stride = total_q`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SinkRows {
    pub(crate) batch: usize,
    pub(crate) rows: usize,
    pub(crate) batch_stride: usize,
    pub(crate) head_stride: usize,
}

/// Launches sink_grad: `d_sink[h] = -sum_{b,i} exp(sink_h - lse) D` over the lse at `lse_d[0]`
/// and D at `lse_d[1]` (written by attn_bwd_dsum on this stream), both laid out as `rows`
/// says, one block per query head (`heads_q` of them); the logits are `scores`' sink.
///
/// # Errors
/// [`AttnError::InvalidInput`] when `scores` has no sink, or inside a CUDA graph capture
/// (the logits are copied from host memory); [`AttnError::TooLarge`] for more than 2^31 - 1
/// rows or batch entries; [`AttnError::Compile`] / [`AttnError::Cuda`].
pub(crate) fn launch_sink_grad(
    gpu: &Gpu,
    scores: &crate::scores::ScoreMods,
    heads_q: usize,
    rows: SinkRows,
    [lp, dsp]: [u64; 2],
    d_sink: &mut dyn DevicePtrMut<f32>,
    ctx: &str,
) -> Result<()> {
    let stream = gpu.stream();
    let logits = upload_sink(gpu, scores)?.ok_or_else(|| AttnError::InvalidInput {
        what: "d_sink was given, but the problem has no learnable sink".into(),
    })?;
    let (sp, _gs) = logits.device_ptr(stream);
    let (dp, _gd) = d_sink.device_ptr_mut(stream);
    let int = |n: usize, what: &str| {
        i32::try_from(n).map_err(|_| AttnError::TooLarge {
            kernel: "sink_grad",
            reason: format!("{what} {n} above 2^31 - 1"),
        })
    };
    let params = SinkGradParams {
        lse: lp,
        dsum: dsp,
        sink: sp,
        d_sink: dp,
        lse_sb: rows.batch_stride as i64,
        lse_sh: rows.head_stride as i64,
        batch: int(rows.batch, "batch")?,
        rows: int(rows.rows, "rows per sequence")?,
    };
    let k = gpu.kernel(KernelSource::SinkGrad, "sink_grad", &[])?;
    let cfg = LaunchConfig {
        grid_dim: (heads_q as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = stream.launch_builder(&k.function);
    b.arg(&params);
    // SAFETY: the parameters mirror the kernel's struct; lse and D hold every row `rows`
    // describes (checked against the problem / allocated so by the caller), the logits
    // heads_q, and d_sink at least heads_q (checked by the caller); block h reads and writes
    // only its head.
    unsafe { b.launch(cfg) }.map_err(cuda_err(format!("{ctx} (sink_grad)")))?;
    Ok(())
}

/// Gradients of a host call: dense `dq`, `dk`, `dv` as [`backward_device`] writes them.
#[derive(Debug, Clone)]
pub struct HostGradients<T> {
    /// Gradient of q, dense `[batch, seqlen_q, heads_q, head_dim]`.
    pub dq: Vec<T>,
    /// Gradient of k, dense `[batch, seqlen_k, heads_kv, head_dim]`.
    pub dk: Vec<T>,
    /// Gradient of v, dense as `dk`.
    pub dv: Vec<T>,
    /// Gradient of the learnable sink (`[heads_q]`, f32) when the problem has one.
    pub d_sink: Option<Vec<f32>>,
    /// What ran.
    pub info: BackwardInfo,
}

/// [`backward_device`] on host buffers: copies in, runs, copies the gradients back.
///
/// # Errors
/// As [`backward_device`], plus allocation and copy failures as [`AttnError::Cuda`].
#[allow(clippy::too_many_arguments)]
pub fn backward_host<T: GpuElement>(
    gpu: &Gpu,
    p: &AttnProblem,
    opts: BackwardOptions,
    q: &[T],
    k: &[T],
    v: &[T],
    o: &[T],
    lse: &[f32],
    d_o: &[T],
) -> Result<HostGradients<T>> {
    check_gpu_problem(p, KernelKind::Mma)?;
    if let Some(e) = unsupported(p) {
        return Err(e);
    }
    let s = p.shape;
    let n_q = s.batch * s.seqlen_q * s.heads_q * s.head_dim;
    let n_k = s.batch * s.seqlen_k * s.heads_kv * s.head_dim;
    check_buffers(
        p,
        [q.len(), k.len(), v.len(), o.len(), lse.len(), d_o.len()],
        [n_q, n_k, n_k],
    )?;
    let stream = gpu.stream();
    let up = |x: &[T], what: &str| {
        stream
            .clone_htod(x)
            .map_err(cuda_err(format!("copying {what} to the device")))
    };
    let (dq_in, dk_in, dv_in, do_in, d_do) = (
        up(q, "q")?,
        up(k, "k")?,
        up(v, "v")?,
        up(o, "o")?,
        up(d_o, "do")?,
    );
    let d_lse = stream
        .clone_htod(lse)
        .map_err(cuda_err("copying lse to the device"))?;
    // The gradients start as NaN: an element the kernels do not write comes back NaN.
    let poisoned = |n: usize, what: &str| -> Result<CudaSlice<T>> {
        stream
            .clone_htod(&vec![T::from_f32(f32::NAN); n])
            .map_err(cuda_err(format!("allocating {what}")))
    };
    let (mut g_dq, mut g_dk, mut g_dv) = (
        poisoned(n_q, "dq")?,
        poisoned(n_k, "dk")?,
        poisoned(n_k, "dv")?,
    );
    let mut g_dsink = p
        .scores
        .sink
        .as_ref()
        .map(|_| {
            stream
                .clone_htod(&vec![f32::NAN; s.heads_q])
                .map_err(cuda_err("allocating d_sink"))
        })
        .transpose()?;
    let info = backward_device(
        gpu,
        p,
        opts,
        &dq_in,
        &dk_in,
        &dv_in,
        &do_in,
        &d_lse,
        &d_do,
        &mut g_dq,
        &mut g_dk,
        &mut g_dv,
        g_dsink.as_mut().map(|x| x as &mut dyn DevicePtrMut<f32>),
    )?;
    let what = launch_context("attn_bwd", p);
    let back = |x: &CudaSlice<T>, name: &str| {
        stream
            .clone_dtoh(x)
            .map_err(cuda_err(format!("{what}: copying {name} back")))
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
                    .map_err(cuda_err(format!("{what}: copying d_sink back")))
            })
            .transpose()?,
        info,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AttnShape, Mask};

    #[test]
    fn shared_memory_matches_the_kernel_layout() {
        // d128, 8 warps, 32 rows: K, V 128 x 136, two buffers of Q and dO 32 x 136, dS^T
        // 128 x 40 (16-bit); the dQ tile 32 x 136 f32; two buffers of lse and D (32 f32 each).
        let t = BwdTile {
            nwarps: 8,
            br: 32,
            keys_per_warp: 16,
        };
        assert_eq!(
            t.smem_bytes(128),
            (2 * 128 * 136 + 4 * 32 * 136 + 128 * 40) * 2 + 32 * 136 * 4 + 512
        );
        // Every head_dim up to 128 has a tile on every arch we build for (99 KB on
        // sm_86/89/120, 163 KB on sm_80, 227 KB on sm_90); sm_80 and sm_90 take 128 keys per
        // block. head_dim 256 (two passes of 128 channels) takes 4 warps of 16 keys where its
        // 154.5 KB fit (sm_80, sm_90); the 99 KB GPUs refuse it with a typed error.
        let t256 = BwdTile::for_head_dim(256, DType::F16, (9, 0), 227 * 1024);
        assert_eq!((t256.nwarps, t256.br, t256.keys_per_warp), (4, 32, 16));
        assert_eq!(t256.smem_bytes(256), 158_208);
        assert!(t256.check(256, 163 * 1024).is_ok() && t256.check(256, 99 * 1024).is_err());
        assert_eq!(BwdTile::passes(256), vec![0, 128]);
        assert_eq!(BwdTile::passes(128), vec![0]);
        for (d, run) in [
            (36, 40),
            (64, 64),
            (100, 104),
            (128, 128),
            (136, 256),
            (256, 256),
        ] {
            assert_eq!(run_head_dim(d), run, "d{d}");
        }
        for d in (8..=128).step_by(8) {
            for (cc, limit) in [
                ((8, 6), 99 * 1024),
                ((8, 0), 163 * 1024),
                ((9, 0), 227 * 1024),
            ] {
                for dtype in [DType::F16, DType::BF16] {
                    let t = BwdTile::for_head_dim(d, dtype, cc, limit);
                    assert!(t.smem_bytes(d) <= limit, "d{d} {cc:?}: {t:?}");
                    if limit > 99 * 1024 {
                        assert_eq!(t.bc(), 128, "d{d} {cc:?}");
                    }
                    let kpw32 = cc == (9, 0) && dtype == DType::F16 && d <= 64 && d != 56;
                    assert_eq!(t.keys_per_warp == 32, kpw32, "d{d} {cc:?} {dtype}");
                }
            }
        }
    }

    #[test]
    fn softcap_takes_16_keys_per_warp() {
        let p = AttnProblem::new(AttnShape::new(1, 64, 2, 64)).unwrap();
        let sm90 = |p: &AttnProblem| BwdTile::for_problem(p, DType::F16, (9, 0), 227 * 1024);
        assert_eq!(sm90(&p).keys_per_warp, 32);
        let alibi = crate::scores::ScoreMods {
            alibi: Some(crate::scores::Alibi::geometric(2)),
            ..Default::default()
        };
        assert_eq!(
            sm90(&p.clone().with_scores(alibi).unwrap()).keys_per_warp,
            32
        );
        let softcap = crate::scores::ScoreMods {
            softcap: Some(30.0),
            ..Default::default()
        };
        let t = sm90(&p.with_scores(softcap).unwrap());
        assert_eq!((t.nwarps, t.br, t.keys_per_warp), (8, 64, 16));
    }

    #[test]
    fn tiles_parse_or_name_the_form() {
        assert_eq!(
            BwdTile::parse("4, 64").unwrap(),
            BwdTile {
                nwarps: 4,
                br: 64,
                keys_per_warp: 16
            }
        );
        assert_eq!(BwdTile::parse("4,32,32").unwrap().bc(), 128);
        for bad in ["", "8", "8,48", "6,32", "8,32,1", "x,32", "4,32,32,1"] {
            let e = BwdTile::parse(bad).unwrap_err();
            assert!(e.to_string().contains("nwarps,br"), "{bad}: {e}");
        }
    }

    #[test]
    fn persistent_by_default_for_causal_and_small_head_dims() {
        let p = |d| AttnProblem::new(AttnShape::new(1, 64, 2, d)).unwrap();
        assert!(persistent_default(&p(64), false));
        assert!(persistent_default(&p(32), false));
        assert!(!persistent_default(&p(128), false));
        assert!(persistent_default(&p(128).with_mask(Mask::Causal), false));
        // The deterministic mode keeps one block per tile (its persistent form is not timed).
        assert!(!persistent_default(&p(64).with_mask(Mask::Causal), true));
        // A softcap at d64 without a causal mask: one block per tile (the persistent build
        // spills).
        let softcap = crate::scores::ScoreMods {
            softcap: Some(30.0),
            ..Default::default()
        };
        assert!(!persistent_default(
            &p(64).with_scores(softcap.clone()).unwrap(),
            false
        ));
        assert!(persistent_default(
            &p(64).with_mask(Mask::Causal).with_scores(softcap).unwrap(),
            false
        ));
    }

    #[test]
    fn unsupported_problems_name_the_reason() {
        let p = |d| AttnProblem::new(AttnShape::new(1, 64, 2, d)).unwrap();
        assert!(unsupported(&p(64)).is_none());
        assert!(unsupported(&p(128).with_mask(Mask::Causal)).is_none());
        // Every head_dim a problem can have is taken (padded where the kernels need it), and
        // every score modifier; only a hand-built problem past 256 (which validation refuses
        // first) is not.
        for d in [1, 36, 136, 256] {
            assert!(unsupported(&p(d)).is_none(), "d{d}");
        }
        let mods = crate::scores::ScoreMods {
            window: crate::scores::Window::from_fa(40, 8).unwrap(),
            softcap: Some(30.0),
            alibi: Some(crate::scores::Alibi::geometric(2)),
            sink: Some(vec![0.5, -1.0]),
        };
        let modified = p(64).with_mask(Mask::Causal).with_scores(mods).unwrap();
        assert!(unsupported(&modified).is_none());
        let mut big = p(256);
        big.shape.head_dim = 264;
        let e = unsupported(&big).expect("refused");
        assert!(e.to_string().contains("CPU backward"), "{e}");
    }
}
