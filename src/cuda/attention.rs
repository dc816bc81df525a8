//! Attention on device buffers: validation, kernel choice, tile configuration and launch.

use super::device::{Gpu, cuda_err};
use super::sources::KernelSource;
use crate::dtype::{DType, Element};
use crate::error::{AttnError, Result};
use crate::shape::AttnProblem;
use cudarc::driver::{
    CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits,
    sys,
};
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
}

impl KernelKind {
    /// Every kernel, slowest first.
    pub const ALL: [KernelKind; 3] = [KernelKind::Naive, KernelKind::Simt, KernelKind::Mma];

    /// Name used on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            KernelKind::Naive => "naive",
            KernelKind::Simt => "simt",
            KernelKind::Mma => "mma",
        }
    }

    /// Parses a name; `auto` is the best available kernel (`mma`).
    ///
    /// # Errors
    /// [`AttnError::UnknownKernel`].
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "auto" | "mma" | "attn_mma" => Ok(KernelKind::Mma),
            "simt" | "attn_simt" => Ok(KernelKind::Simt),
            "naive" | "attn_naive" => Ok(KernelKind::Naive),
            _ => Err(AttnError::UnknownKernel {
                name: name.into(),
                available: "auto, mma, simt, naive".into(),
            }),
        }
    }
}

impl fmt::Display for KernelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Tile shape of `attn_mma`: each of `nwarps` warps owns `16 * mt` query rows; K/V tiles hold
/// `bc` keys. Chosen per (arch, head_dim) by [`MmaTile::default_for`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct MmaTile {
    /// m16 tiles per warp (1 or 2): 2 halves shared-memory traffic for K and V fragments.
    pub mt: u32,
    /// Warps per block.
    pub nwarps: u32,
    /// Keys per K/V tile (multiple of 16).
    pub bc: u32,
    /// Keep Q's A fragments in registers for the whole loop.
    pub q_in_regs: bool,
    /// Let a row's running max go stale by up to 2^8 before O is rescaled (exact result;
    /// most key tiles then skip the rescale).
    pub lazy_rescale: bool,
    /// Double-buffer the fragments of `S = Q K^T` in registers (load k-step kk+1 before the
    /// mma of kk).
    pub pipe_frags: bool,
    /// Write O through shared memory in coalesced 16-byte pieces.
    pub smem_epilogue: bool,
    /// Non-causal only: order blocks head by head so that resident blocks share K/V in L2.
    pub head_major: bool,
    /// Blocks per SM that ptxas must fit (`__launch_bounds__` minimum, 1..=8): caps registers
    /// at 64K / (threads × blocks) so that more warps share each scheduler.
    pub min_blocks: u32,
}

/// The optional flags of a tile spec, in their written order: (letter, define).
const TILE_FLAGS: [(&str, &str); 5] = [
    ("q", "Q_IN_REGS"),
    ("l", "RESCALE_SLACK"),
    ("p", "PIPE_FRAGS"),
    ("e", "SMEM_EPILOGUE"),
    ("h", "HEAD_MAJOR"),
];

impl MmaTile {
    /// Query rows per block (`Br`).
    pub fn br(&self) -> u32 {
        16 * self.mt * self.nwarps
    }

    /// Dynamic shared memory in bytes: Q tile plus two stages of K and V, rows padded by one
    /// 16-byte chunk (see attn_mma.cu).
    pub fn smem_bytes(&self, head_dim: usize) -> usize {
        let dp = head_dim.div_ceil(16) * 16;
        let row = (dp / 8 + 1) * 16;
        (self.br() as usize + 4 * self.bc as usize) * row
    }

    /// The measured default for an arch (compute capability) and head_dim; see
    /// docs/perf-notes.md. All keep registers at or under 255 with no spills (checked in CI).
    pub fn default_for(cc: (i32, i32), head_dim: usize) -> Self {
        let big_smem = matches!(cc, (8, 0) | (9, 0)); // 163/227 KB per block; others 99 KB
        let tile = |mt, nwarps, bc, q_in_regs| MmaTile {
            mt,
            nwarps,
            bc,
            q_in_regs,
            lazy_rescale: true,
            pipe_frags: false,
            smem_epilogue: true,
            head_major: true,
            min_blocks: 1,
        };
        // The tightest register budgets below need rows of 16, 32, 64 or 128 halves with no
        // zero pad chunk: then every thread's K/V chunks share one column (attn_mma's fast
        // loads), and no chunk needs a bounds test (d56, padded to 64, spills 12 bytes at 168).
        let unpadded = head_dim >= 16 && head_dim.is_power_of_two();
        if head_dim <= 64 && cc == (9, 0) && unpadded {
            // Three blocks (12 warps) per SM instead of two: Q leaves the registers (168 per
            // thread, spill-free on sm_90 only) so that more warps hide the softmax latency.
            MmaTile {
                min_blocks: 3,
                ..tile(2, 4, 64, false)
            }
        } else if head_dim <= 64 {
            tile(2, 4, 64, true)
        } else if head_dim > 112 && head_dim <= 128 && big_smem {
            // Bc 64 halves the per-key softmax and barrier overhead; its 104 KB of shared
            // memory needs sm_80/sm_90, and the one-column K/V loads of 128-wide rows keep
            // ptxas from spilling (measured at d128 on sm_90; d120 compiles spill-free too).
            tile(2, 4, 64, false)
        } else if head_dim <= 128 {
            tile(2, 4, 32, false)
        } else if big_smem {
            tile(1, 4, 32, false)
        } else {
            tile(1, 4, 16, false)
        }
    }

    /// Parses `mt,nwarps,bc[,flag...]` with flags q (Q in registers), l (lazy rescale),
    /// p (pipelined fragments), e (shared-memory epilogue), h (head-major block order) and
    /// bN (at least N blocks per SM), e.g. `2,4,64` or `2,4,32,l,p,e,b2`.
    ///
    /// # Errors
    /// [`AttnError::InvalidInput`] describing the expected form.
    pub fn parse(s: &str) -> Result<Self> {
        let bad = || AttnError::InvalidInput {
            what: format!(
                "tile '{s}': expected mt,nwarps,bc[,q][,l][,p][,e][,h][,bN] with mt in 1..=4, nwarps in 1..=16, bc a multiple of 16 up to 128, N in 1..=8 and 32 * nwarps * N <= 2048 threads per SM"
            ),
        };
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        let flags = parts.get(3..).unwrap_or_default();
        let min_blocks = |f: &str| f.strip_prefix('b').and_then(|n| n.parse::<u32>().ok());
        if parts.len() < 3
            || flags
                .iter()
                .any(|f| !TILE_FLAGS.iter().any(|(l, _)| l == f) && min_blocks(f).is_none())
        {
            return Err(bad());
        }
        let num = |x: &str| x.parse::<u32>().map_err(|_| bad());
        let t = MmaTile {
            mt: num(parts[0])?,
            nwarps: num(parts[1])?,
            bc: num(parts[2])?,
            q_in_regs: flags.contains(&"q"),
            lazy_rescale: flags.contains(&"l"),
            pipe_frags: flags.contains(&"p"),
            smem_epilogue: flags.contains(&"e"),
            head_major: flags.contains(&"h"),
            min_blocks: flags.iter().find_map(|f| min_blocks(f)).unwrap_or(1),
        };
        let b_flags = flags.iter().filter(|f| min_blocks(f).is_some()).count();
        if !(1..=4).contains(&t.mt)
            || b_flags > 1
            || !(1..=8).contains(&t.min_blocks)
            // 2048 threads is the most an SM holds (sm_80/sm_90; 1536 on sm_86/89/120)
            || 32 * t.nwarps * t.min_blocks > 2048
            || !(1..=16).contains(&t.nwarps)
            || t.bc == 0
            || !t.bc.is_multiple_of(16)
            || t.bc > 128
        {
            return Err(bad());
        }
        Ok(t)
    }

    /// The flags set, in [`TILE_FLAGS`] order.
    fn flags(&self) -> [bool; 5] {
        [
            self.q_in_regs,
            self.lazy_rescale,
            self.pipe_frags,
            self.smem_epilogue,
            self.head_major,
        ]
    }

    /// The `mt,nwarps,bc[,flag...]` form that [`Self::parse`] reads.
    pub fn spec(&self) -> String {
        let mut s = format!("{},{},{}", self.mt, self.nwarps, self.bc);
        for ((letter, _), on) in TILE_FLAGS.iter().zip(self.flags()) {
            if on {
                s.push(',');
                s.push_str(letter);
            }
        }
        if self.min_blocks > 1 {
            s.push_str(&format!(",b{}", self.min_blocks));
        }
        s
    }

    /// NVRTC defines for this tile.
    pub fn defines(&self, dtype: DType, head_dim: usize, causal: bool) -> Vec<(String, String)> {
        let mut d = vec![
            ("HEAD_DIM".to_string(), head_dim.to_string()),
            ("MT".to_string(), self.mt.to_string()),
            ("NWARPS".to_string(), self.nwarps.to_string()),
            ("BC".to_string(), self.bc.to_string()),
            (
                "IS_BF16".to_string(),
                u8::from(dtype == DType::BF16).to_string(),
            ),
            ("IS_CAUSAL".to_string(), u8::from(causal).to_string()),
        ];
        for ((_, define), on) in TILE_FLAGS.iter().zip(self.flags()) {
            if on {
                // The rescale slack is in log2 units: p = 2^(s - m) stays <= 256.
                let value = if *define == "RESCALE_SLACK" { "8" } else { "1" };
                d.push((define.to_string(), value.to_string()));
            }
        }
        d.push(("MIN_BLOCKS".to_string(), self.min_blocks.to_string()));
        d
    }
}

impl fmt::Display for MmaTile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Br{}xBc{} ({}w x {}m16)",
            self.br(),
            self.bc,
            self.nwarps,
            self.mt
        )?;
        let names = [
            "Q in regs",
            "lazy rescale",
            "pipelined frags",
            "smem epilogue",
            "head-major grid",
        ];
        for (name, on) in names.iter().zip(self.flags()) {
            if on {
                write!(f, ", {name}")?;
            }
        }
        if self.min_blocks > 1 {
            write!(f, ", {} blocks/SM", self.min_blocks)?;
        }
        Ok(())
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
    pub pad: i32,
}
// SAFETY: plain old data with C layout, mirrored field by field in the kernel.
unsafe impl DeviceRepr for FlashParams {}

impl FlashParams {
    pub(crate) fn new(l: &Launch, br: u32) -> Self {
        let p = l.problem;
        let s = &p.shape;
        let st = |x: crate::shape::Strides| [x.batch as i64, x.seq as i64, x.head as i64];
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
            scale_log2: p.softmax_scale * std::f32::consts::LOG2_E,
            pad: 0,
        }
    }
}

/// Largest seqlen the kernels index with 32-bit row numbers (offsets are 64-bit).
pub const MAX_SEQLEN: usize = 1 << 30;

/// Checks everything the GPU kernels need beyond [`AttnProblem::validate`].
///
/// # Errors
/// [`AttnError::UnsupportedHeadDim`] (not a multiple of 8), [`AttnError::InvalidStrides`]
/// (a stride not a multiple of 8 elements: rows are moved in 16-byte pieces),
/// [`AttnError::TooLarge`] (seqlen over 2^30, or more than 2^31-1 blocks).
pub fn check_gpu_problem(p: &AttnProblem, kernel: KernelKind) -> Result<()> {
    p.validate()?;
    let s = &p.shape;
    if !s.head_dim.is_multiple_of(8) {
        return Err(AttnError::UnsupportedHeadDim {
            head_dim: s.head_dim,
            backend: format!("the CUDA kernel {kernel}"),
            supported: "multiples of 8 from 8 to 256 (rows move in 16-byte pieces); use the CPU backend for others".into(),
        });
    }
    for (name, st, _, _) in p.tensors() {
        for (axis, v) in [("batch", st.batch), ("seq", st.seq), ("head", st.head)] {
            if !v.is_multiple_of(8) {
                return Err(AttnError::InvalidStrides {
                    tensor: name,
                    reason: format!(
                        "{axis} stride {v} is not a multiple of 8 elements; the GPU kernels load rows in 16-byte pieces: copy the tensor to a dense layout first"
                    ),
                });
            }
        }
    }
    if s.seqlen_q > MAX_SEQLEN || s.seqlen_k > MAX_SEQLEN {
        return Err(AttnError::TooLarge {
            kernel: "cuda",
            reason: format!(
                "seqlen over 2^30 (seqlen_q {}, seqlen_k {}): split the sequence",
                s.seqlen_q, s.seqlen_k
            ),
        });
    }
    let blocks = (s.seqlen_q.div_ceil(16) as u128) * s.batch as u128 * s.heads_q as u128;
    if blocks > i32::MAX as u128 {
        return Err(AttnError::TooLarge {
            kernel: "cuda",
            reason: "more than 2^31-1 thread blocks: split the batch".into(),
        });
    }
    Ok(())
}

fn check_alignment(name: &'static str, ptr: u64) -> Result<()> {
    if !ptr.is_multiple_of(16) {
        return Err(AttnError::InvalidStrides {
            tensor: name,
            reason: format!(
                "device address {ptr:#x} is not 16-byte aligned; the kernels load 16-byte pieces: pass a buffer (or view) that starts on a 16-byte boundary"
            ),
        });
    }
    Ok(())
}

/// What a launch did: kernel, tile, grid, and the compiler's statistics.
#[derive(Debug, Clone, Serialize)]
pub struct LaunchInfo {
    /// Kernel rung.
    pub kernel: KernelKind,
    /// Tile (mma only).
    pub tile: Option<MmaTile>,
    /// Registers per thread of the main kernel.
    pub registers: u32,
    /// Spill stores in bytes.
    pub spill_bytes: u32,
    /// Dynamic shared memory per block.
    pub smem_bytes: usize,
}

/// Runs attention on device buffers: `q`, `k`, `v` in the problem's layout, `o` written through
/// `o_strides`, `lse` dense `[batch, heads_q, seqlen_q]` f32. Asynchronous on `gpu.stream()`.
///
/// `tile` overrides the `mma` tile (benchmarks); `None` takes [`MmaTile::default_for`].
///
/// # Errors
/// Every validation error of [`check_gpu_problem`]; [`AttnError::BufferTooShort`];
/// [`AttnError::InvalidStrides`] for a base address not 16-byte aligned;
/// [`AttnError::ShapeMismatch`] for a buffer of another device/context;
/// [`AttnError::Compile`]/[`AttnError::Cuda`] with the kernel name and shape.
#[allow(clippy::too_many_arguments)]
pub fn forward_device<T, Q, K, V, O, L>(
    gpu: &Gpu,
    kernel: KernelKind,
    tile: Option<MmaTile>,
    p: &AttnProblem,
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
    check_gpu_problem(p, kernel)?;
    p.check_lengths(q.len(), k.len(), v.len(), o.len(), lse.len())?;
    let ctx = gpu.context().cu_ctx();
    for (name, c) in [
        ("q", q.stream().context().cu_ctx()),
        ("k", k.stream().context().cu_ctx()),
        ("v", v.stream().context().cu_ctx()),
        ("o", o.stream().context().cu_ctx()),
        ("lse", lse.stream().context().cu_ctx()),
    ] {
        if c != ctx {
            return Err(AttnError::ShapeMismatch {
                what: format!(
                    "{name} lives on another device or context than this Gpu: allocate it from gpu.stream()"
                ),
            });
        }
    }
    let stream = gpu.stream();
    let (qp, _gq) = q.device_ptr(stream);
    let (kp, _gk) = k.device_ptr(stream);
    let (vp, _gv) = v.device_ptr(stream);
    let (op, _go) = o.device_ptr_mut(stream);
    let (lp, _gl) = lse.device_ptr_mut(stream);
    for (name, ptr) in [("q", qp), ("k", kp), ("v", vp), ("o", op)] {
        check_alignment(name, ptr)?;
    }
    let launch = Launch {
        problem: p,
        dtype: T::DTYPE,
        q: qp,
        k: kp,
        v: vp,
        o: op,
        lse: lp,
    };
    match kernel {
        KernelKind::Mma => launch_mma(gpu, &launch, tile),
        KernelKind::Simt => super::simt::launch(gpu, &launch),
        KernelKind::Naive => super::naive::launch(gpu, &launch),
    }
}

/// Compiles and loads the module a launch of `kernel` on this problem will use, so that a
/// timed launch afterwards measures the kernel, not NVRTC. (Launches compile on first use
/// anyway; this only moves the cost.)
///
/// # Errors
/// [`AttnError::Compile`] or [`AttnError::Cuda`] from loading the module.
pub fn prepare(
    gpu: &Gpu,
    kernel: KernelKind,
    tile: Option<MmaTile>,
    p: &AttnProblem,
    dtype: DType,
) -> Result<()> {
    // The same specialisation the launch will ask for, from the same functions.
    let flash = match kernel {
        KernelKind::Mma => mma_kernel(gpu, dtype, p, tile),
        KernelKind::Simt => super::simt::flash_kernel(dtype, p),
        KernelKind::Naive => {
            let defines = super::naive::defines(dtype, p.shape.head_dim, p.mask.is_causal());
            gpu.kernel(KernelSource::AttnNaive, "attn_naive_scores", &defines)?;
            return Ok(());
        }
    };
    gpu.kernel(flash.source, flash.function, &flash.defines)?;
    Ok(())
}

/// Names the kernel and shape in a driver error.
pub(crate) fn launch_context(kernel: &str, p: &AttnProblem) -> String {
    format!("{kernel} launch ({}, mask {})", p.shape, p.mask.name())
}

/// Raises a function's dynamic shared-memory limit when it needs more than the default 48 KB,
/// and asks for the largest shared-memory carveout (so that as many blocks fit per SM as the
/// registers allow).
///
/// # Errors
/// [`AttnError::Cuda`] when the driver refuses either attribute.
pub(crate) fn set_dynamic_smem(
    f: &cudarc::driver::CudaFunction,
    bytes: usize,
    what: &str,
) -> Result<()> {
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

fn launch_mma(gpu: &Gpu, l: &Launch, tile: Option<MmaTile>) -> Result<LaunchInfo> {
    launch_flash(gpu, l, mma_kernel(gpu, l.dtype, l.problem, tile))
}

/// attn_mma specialised for this problem: `tile`, or the arch's default.
fn mma_kernel(gpu: &Gpu, dtype: DType, p: &AttnProblem, tile: Option<MmaTile>) -> FlashKernel {
    let d = p.shape.head_dim;
    let tile = tile.unwrap_or_else(|| MmaTile::default_for(gpu.info().compute_capability, d));
    FlashKernel {
        kernel: KernelKind::Mma,
        source: KernelSource::AttnMma,
        function: "attn_mma",
        defines: tile.defines(dtype, d, p.mask.is_causal()),
        br: tile.br(),
        nwarps: tile.nwarps,
        smem: tile.smem_bytes(d),
        tile: Some(tile),
    }
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
    /// The mma tile, for the report.
    pub tile: Option<MmaTile>,
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
    // SAFETY: the parameters mirror the kernel's struct; forward_device checked every buffer
    // against the shape and strides, and the kernel reads/writes only inside those bounds.
    unsafe { b.launch(cfg) }.map_err(cuda_err(ctx))?;
    Ok(LaunchInfo {
        kernel: f.kernel,
        tile: f.tile,
        registers: k.stats.registers,
        spill_bytes: k.stats.spill_stores,
        smem_bytes: f.smem,
    })
}

/// Host-memory convenience: copies inputs to the device, runs, copies o (dense) and lse back.
/// Returns the kernel time in seconds (CUDA events around the launch only).
///
/// # Errors
/// As [`forward_device`], plus allocation/copy failures as [`AttnError::Cuda`].
pub fn forward_host<T: GpuElement>(
    gpu: &Gpu,
    kernel: KernelKind,
    p: &AttnProblem,
    q: &[T],
    k: &[T],
    v: &[T],
) -> Result<(Vec<T>, Vec<f32>, f64)> {
    let s = &p.shape;
    // Output is written dense regardless of the caller's o_strides.
    let dense = AttnProblem {
        o_strides: crate::shape::Strides::contiguous(s.seqlen_q, s.heads_q, s.head_dim),
        ..*p
    };
    check_gpu_problem(&dense, kernel)?;
    dense.check_lengths(q.len(), k.len(), v.len(), usize::MAX, usize::MAX)?;
    let stream = gpu.stream();
    let up = |x: &[T], what: &str| {
        stream
            .clone_htod(x)
            .map_err(cuda_err(format!("copying {what} to the device")))
    };
    let (dq, dk, dv) = (up(q, "q")?, up(k, "k")?, up(v, "v")?);
    let o_len = s.batch * s.seqlen_q * s.heads_q * s.head_dim;
    let mut d_o: CudaSlice<T> = stream
        .alloc_zeros(o_len)
        .map_err(cuda_err("allocating o"))?;
    let mut d_lse: CudaSlice<f32> = stream
        .alloc_zeros(s.lse_len())
        .map_err(cuda_err("allocating lse"))?;
    prepare(gpu, kernel, None, &dense, T::DTYPE)?;
    let ctx = gpu.context();
    let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = ctx
        .new_event(timing)
        .map_err(cuda_err("creating an event"))?;
    let end = ctx
        .new_event(timing)
        .map_err(cuda_err("creating an event"))?;
    start
        .record(stream)
        .map_err(cuda_err("recording an event"))?;
    forward_device(
        gpu, kernel, None, &dense, &dq, &dk, &dv, &mut d_o, &mut d_lse,
    )?;
    end.record(stream).map_err(cuda_err("recording an event"))?;
    let what = launch_context(kernel.name(), p);
    let o = stream
        .clone_dtoh(&d_o)
        .map_err(cuda_err(format!("{what}: copying o back")))?;
    let lse = stream
        .clone_dtoh(&d_lse)
        .map_err(cuda_err(format!("{what}: copying lse back")))?;
    let ms = start
        .elapsed_ms(&end)
        .map_err(cuda_err("reading event time"))?;
    Ok((o, lse, ms as f64 / 1e3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tile_flag_parses_round_trips_and_defines() {
        for (letter, define) in TILE_FLAGS {
            let spec = format!("2,4,32,{letter}");
            let t = MmaTile::parse(&spec).unwrap();
            assert_eq!(t.spec(), spec);
            assert!(
                t.defines(DType::F16, 128, false)
                    .iter()
                    .any(|(k, _)| k == define),
                "{define}"
            );
        }
        let all = MmaTile::parse("1,8,64,q,l,p,e,h").unwrap();
        assert_eq!(all.spec(), "1,8,64,q,l,p,e,h");
        assert_eq!(all.min_blocks, 1);
        let b3 = MmaTile::parse("2,4,64,l,e,h,b3").unwrap();
        assert_eq!((b3.min_blocks, b3.spec().as_str()), (3, "2,4,64,l,e,h,b3"));
        assert!(
            b3.defines(DType::F16, 64, false)
                .contains(&("MIN_BLOCKS".to_string(), "3".to_string()))
        );
        assert!(b3.to_string().ends_with("3 blocks/SM"), "{b3}");
        for bad in [
            "2,4",
            "2,4,33",
            "0,4,32",
            "2,4,32,x",
            "2,4,32,q,z",
            "2,4,32,b0",
            "2,4,32,b9",
            "2,4,32,bx",
            "2,4,32,b2,b3",
            "1,16,64,b8",
        ] {
            assert!(MmaTile::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn defaults_follow_the_arch_and_head_dim() {
        let h200 = (9, 0);
        assert_eq!(MmaTile::default_for(h200, 64).spec(), "2,4,64,l,e,h,b3");
        assert_eq!(MmaTile::default_for(h200, 128).spec(), "2,4,64,l,e,h");
        // 40 pads to 48-wide rows (no fast loads) and 56 to 64 (a zero chunk): no three-block
        // budget for either.
        assert_eq!(MmaTile::default_for(h200, 40).spec(), "2,4,64,q,l,e,h");
        assert_eq!(MmaTile::default_for(h200, 56).spec(), "2,4,64,q,l,e,h");
        assert_eq!(MmaTile::default_for(h200, 32).spec(), "2,4,64,l,e,h,b3");
        assert_eq!(MmaTile::default_for((8, 0), 64).spec(), "2,4,64,q,l,e,h");
        // 99 KB of shared memory per block: Bc 64 at d128 (104 KB) does not fit.
        for cc in [(8, 6), (8, 9), (12, 0)] {
            let t = MmaTile::default_for(cc, 128);
            assert_eq!(t.spec(), "2,4,32,l,e,h");
            assert!(t.smem_bytes(128) <= 99 * 1024);
        }
    }
}
