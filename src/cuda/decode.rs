//! Decoding against a KV cache on the GPU ([`crate::problem::kvcache`]'s semantics): new rows appended
//! in place (kv_append.cu), then attn_decode.cu over split-KV blocks with the query heads of
//! each kv head packed into one block, then attn_combine.cu merging the splits exactly (only
//! when there is more than one split: with one, attn_decode writes o and lse itself).
//!
//! Every call is validated on the host before anything is launched or written: the problem
//! ([`KvCacheProblem::validate`]: cache lengths, capacity, page indices), buffer lengths,
//! contexts and 16-byte alignment. A [`DecodePlan`] copies the cache lengths and the block
//! table to the device once; a decoding loop hands each step's new ones to
//! [`DecodePlan::update`] (stream-ordered on `gpu.stream()`) before [`DecodePlan::run`].

use crate::cuda::runtime::args::{check_aligned, check_contexts, device_ptrs};
use crate::cuda::runtime::device::{Gpu, LoadedKernel, cuda_err};
use crate::cuda::runtime::launch::{
    FlashParams, GpuElement, KernelKind, Launch, LaunchInfo, launch_context, push_sink,
    score_defines, set_dynamic_smem, sink_defines, upload_sink, upload_slopes,
};
use crate::cuda::sources::KernelSource;
use crate::dtype::DType;
use crate::error::{AttnError, Result};
use crate::problem::kvcache::{CacheLayout, KvCacheProblem, MAX_SPLITS, num_splits};
use crate::shape::{AttnProblem, AttnShape, Strides};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg};

/// Packed (query, head) rows per attn_decode block.
pub const DECODE_ROWS: usize = 16;
/// The warps, pipeline depth and Q placement of attn_decode, and its shared memory. A tile
/// holds 16 keys per warp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeTile {
    /// Warps per block (4 or 8); a tile holds `16 x warps` keys.
    pub warps: usize,
    /// cp.async stages of K and V (2 to 4).
    pub stages: usize,
    /// Keep Q's A fragments in registers (up to d128; d256 would spill).
    pub q_in_regs: bool,
    /// Stream K and V with the copy engine (sm_90, head_dim a multiple of 64; see
    /// [`DecodeTile::bulk_refusal`]): a
    /// producer warp beside the `warps` consumer warps loads boxes of 64 channels x the tile's
    /// keys (or a page's) through tensor maps over the cache (`cp.async.bulk.tensor`, PTX ISA
    /// 9.7.9.25.5.1, 128-byte swizzle), completing on an mbarrier per stage, and the consumers
    /// release each stage on another mbarrier instead of meeting at a block barrier every tile.
    pub bulk: bool,
}

impl DecodeTile {
    /// The first of these that fits in `smem_limit` bytes per block: 8 warps and 3 stages
    /// (head_dim <= 128), 8 warps and 2 stages, 4 warps and 2 stages. Eight warps stream one
    /// (sequence, kv head) twice as fast as four, so the split heuristic needs half the
    /// concurrent streams, which read the cache faster (runs 47-49).
    pub fn for_head_dim(head_dim: usize, smem_limit: usize) -> Self {
        let q_in_regs = head_dim <= 128;
        let tile = |warps, stages| DecodeTile {
            warps,
            stages,
            q_in_regs,
            bulk: false,
        };
        let mut options = vec![tile(8, 2), tile(4, 2)];
        if head_dim <= 128 {
            options.insert(0, tile(8, 3));
        }
        options
            .into_iter()
            .find(|t| t.smem_bytes(head_dim) <= smem_limit)
            .unwrap_or(tile(4, 2))
    }

    /// The tile of a call: [`DecodeTile::for_head_dim`], except that a call with one split and
    /// at least two blocks per SM takes 4 warps and 3 stages where they fit (two blocks per SM
    /// then overlap one block's start with the other's stream: 0.5-1.6 % at batch 64, run 49).
    pub fn for_call(
        head_dim: usize,
        smem_limit: usize,
        splits: usize,
        blocks: usize,
        sms: usize,
    ) -> Self {
        let four = DecodeTile {
            warps: 4,
            stages: 3,
            q_in_regs: head_dim <= 128,
            bulk: false,
        };
        if splits == 1
            && blocks >= 2 * sms
            && head_dim <= 128
            && four.smem_bytes(head_dim) <= smem_limit
        {
            four
        } else {
            Self::for_head_dim(head_dim, smem_limit)
        }
    }

    /// Keys per tile.
    pub fn bc(&self) -> usize {
        16 * self.warps
    }

    /// Dynamic shared memory: the Q rows, then `stages` tiles of K and of V (rows padded by one
    /// 16-byte chunk), or the warps' f32 partial results when those are larger, then three
    /// tiles' group offsets (attn_decode.cu `SMEM_PAGES`).
    pub fn smem_bytes(&self, head_dim: usize) -> usize {
        let dp = head_dim.div_ceil(16) * 16;
        let row = (dp / 8 + 1) * 16;
        let merge = self.warps * DECODE_ROWS * (dp + 2) * 4;
        if self.bulk {
            // unpadded swizzled stages from a 1024-byte boundary, then the 2 x stages mbarriers
            let stages = 2 * self.stages * self.bc() * head_dim * 2;
            return DECODE_ROWS * row + 1024 + stages.max(merge) + 16 * self.stages;
        }
        let stages = 2 * self.stages * self.bc() * row;
        let pages = 3 * (self.bc() / 16) * 8;
        DECODE_ROWS * row + stages.max(merge) + pages
    }

    /// NVRTC defines of attn_decode.cu (score modifiers apart: [`score_defines`]).
    pub fn defines(
        &self,
        dtype: DType,
        head_dim: usize,
        causal: bool,
        paged: bool,
    ) -> Vec<(String, String)> {
        let flag = |x: bool| u8::from(x).to_string();
        vec![
            ("HEAD_DIM".into(), head_dim.to_string()),
            ("IS_BF16".into(), flag(dtype == DType::BF16)),
            ("IS_CAUSAL".into(), flag(causal)),
            ("IS_PAGED".into(), flag(paged)),
            ("NWARPS".into(), self.warps.to_string()),
            ("NSTAGES".into(), self.stages.to_string()),
            ("Q_IN_REGS".into(), flag(self.q_in_regs)),
            ("BULK".into(), flag(self.bulk)),
        ]
    }

    /// This tile with [`Self::bulk`] where the device and head_dim allow it (Hopper, sm_90: the
    /// only architecture it was measured on; a multiple of 64) and its shared memory fits in
    /// `smem_limit`, unless [`BULK_ENV`] is `0`. Run 92 (H200): level with the cp.async path on
    /// contiguous caches (0.98-1.05), 2-5 % faster on pages of 16 with 8 warps, 4-18 % with 4.
    pub fn with_bulk_where_it_fits(
        self,
        compute_capability: (i32, i32),
        head_dim: usize,
        cache: CacheRows,
        smem_limit: usize,
    ) -> Self {
        let bulk = DecodeTile { bulk: true, ..self };
        let off = std::env::var(BULK_ENV).is_ok_and(|v| v.trim() == "0");
        if !off
            && bulk
                .bulk_refusal(compute_capability, head_dim, cache)
                .is_none()
            && bulk.smem_bytes(head_dim) <= smem_limit
        {
            bulk
        } else {
            self
        }
    }

    /// Why the copy engine path cannot serve a call with this tile's key count, or `None`:
    /// it runs on sm_90 (where it was measured), with a head_dim that is a multiple of 64 (boxes
    /// of 64 channels), on a cache with rows (a tensor map has no empty dimension), and with
    /// pages that divide the tile's keys or are a multiple of them, so that each box lies in
    /// one page.
    pub fn bulk_refusal(
        &self,
        compute_capability: (i32, i32),
        head_dim: usize,
        cache: CacheRows,
    ) -> Option<String> {
        if compute_capability.0 != 9 {
            return Some(format!(
                "it runs on sm_90 only (measured there), not on compute capability {}.{}",
                compute_capability.0, compute_capability.1
            ));
        }
        if !head_dim.is_multiple_of(64) {
            return Some(format!("head_dim {head_dim} is not a multiple of 64"));
        }
        let bc = self.bc();
        match cache {
            CacheRows::Contiguous { seqlen_cache: 0 } | CacheRows::Paged { num_blocks: 0, .. } => {
                Some("the cache has no rows".into())
            }
            CacheRows::Paged { page_size, .. }
                if page_size == 0
                    || !(bc.is_multiple_of(page_size) || page_size.is_multiple_of(bc)) =>
            {
                Some(format!(
                    "pages of {page_size} keys neither divide the tile's {bc} keys nor are a multiple of them"
                ))
            }
            _ => None,
        }
    }

    /// Threads per block: the consumer warps, and the producer warp with [`Self::bulk`].
    pub fn threads(&self) -> u32 {
        32 * (self.warps as u32 + u32::from(self.bulk))
    }
}

/// The row dimensions of a cache, as [`DecodeTile::bulk_refusal`] needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheRows {
    /// `[batch, seqlen_cache, heads_kv, head_dim]`.
    Contiguous {
        /// Capacity per sequence.
        seqlen_cache: usize,
    },
    /// `[num_blocks, page_size, heads_kv, head_dim]`.
    Paged {
        /// Pages in the pool.
        num_blocks: usize,
        /// Keys per page.
        page_size: usize,
    },
}

impl CacheRows {
    /// The rows of `layout`.
    pub fn of(layout: &CacheLayout) -> Self {
        match layout {
            CacheLayout::Contiguous { seqlen_cache } => CacheRows::Contiguous {
                seqlen_cache: *seqlen_cache,
            },
            CacheLayout::Paged {
                num_blocks,
                page_size,
                ..
            } => CacheRows::Paged {
                num_blocks: *num_blocks,
                page_size: *page_size,
            },
        }
    }
}

/// Environment variable that turns the copy engine path of the library's decode tiles
/// ([`DecodeTile::bulk`]) off: `0`.
pub const BULK_ENV: &str = "FLASHATTN_DECODE_BULK";

/// kv_cache.cuh's `CacheMap`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct CacheMap {
    cache_seqlens: u64,
    block_table: u64,
    max_blocks: i32,
    page_size: i32,
    seqlen_new: i32,
}

/// attn_decode.cu's `DecodeParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DecodeParams {
    o_accum: u64,
    lse_accum: u64,
    num_splits: i32,
    map: CacheMap,
}

/// kv_append.cu's `AppendParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct AppendParams {
    k_new: u64,
    v_new: u64,
    k_cache: u64,
    v_cache: u64,
    kn: [i64; 3],
    vn: [i64; 3],
    kc: [i64; 3],
    vc: [i64; 3],
    batch: i32,
    heads_kv: i32,
    chunks: i64,
    map: CacheMap,
}

/// attn_combine.cu's `CombineParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct CombineParams {
    o_accum: u64,
    lse_accum: u64,
    o: u64,
    lse: u64,
    o_strides: [i64; 3],
    batch: i32,
    heads_q: i32,
    seqlen_q: i32,
    num_splits: i32,
}

// SAFETY: plain old data with C layout, mirrored field by field in the kernels.
unsafe impl DeviceRepr for CacheMap {}
unsafe impl DeviceRepr for DecodeParams {}
unsafe impl DeviceRepr for AppendParams {}
unsafe impl DeviceRepr for CombineParams {}

/// The split count a call gets: `splits` when given (1..=[`MAX_SPLITS`]), else
/// [`num_splits`] over the blocks of one split (kv heads x row blocks x batch) against
/// `slots` (the SM count: see [`DecodePlan::new`]).
///
/// # Errors
/// [`AttnError::InvalidInput`] for a given count outside 1..=[`MAX_SPLITS`].
pub fn splits_for(p: &KvCacheProblem, slots: usize, splits: Option<usize>) -> Result<usize> {
    match splits {
        Some(s) if s == 0 || s > MAX_SPLITS => Err(AttnError::InvalidInput {
            what: format!("num_splits = {s}: use 1..={MAX_SPLITS}, or None for the heuristic"),
        }),
        Some(s) => Ok(s),
        None => Ok(num_splits(
            row_blocks(p) * p.heads_kv * p.batch,
            slots,
            p.max_seqlen_k(),
        )),
    }
}

/// Row blocks per (sequence, kv head): the packed rows `seqlen_q x group` in blocks of 16.
fn row_blocks(p: &KvCacheProblem) -> usize {
    (p.seqlen_q * (p.heads_q / p.heads_kv)).div_ceil(DECODE_ROWS)
}

/// The dense problem whose parameter block attn_decode reads: q and o dense
/// `[batch, seqlen_q, heads_q, head_dim]`, the caches' strides (batch stride = the page stride
/// when paged), seqlen_k = capacity (each block reads its sequence's own length).
fn envelope(p: &KvCacheProblem) -> Result<AttnProblem> {
    let row_k = p.heads_kv * p.head_dim;
    let sb = match &p.layout {
        CacheLayout::Contiguous { seqlen_cache } => seqlen_cache * row_k,
        CacheLayout::Paged { page_size, .. } => page_size * row_k,
    };
    let shape = AttnShape {
        batch: p.batch,
        seqlen_q: p.seqlen_q,
        seqlen_k: p.capacity().max(1),
        heads_q: p.heads_q,
        heads_kv: p.heads_kv,
        head_dim: p.head_dim,
    };
    let dense = Strides::contiguous(p.seqlen_q, p.heads_q, p.head_dim);
    let cache = Strides {
        batch: sb,
        seq: row_k,
        head: p.head_dim,
    };
    let mut e = AttnProblem::new(shape)?
        .with_mask(p.mask)
        .with_scale(p.softmax_scale)?
        .with_scores(p.scores.clone())?;
    // Set directly: a paged cache's "batch" stride is a page, which the dense rules would
    // refuse as overlapping; KvCacheProblem::validate has checked every page index instead.
    e.q_strides = dense;
    e.o_strides = dense;
    e.k_strides = cache;
    e.v_strides = cache;
    Ok(e)
}

/// Checks what only the GPU path needs: head_dim, and sizes against the kernels' 32-bit
/// indices and grid limits.
fn check_gpu(p: &KvCacheProblem) -> Result<()> {
    if !p.head_dim.is_multiple_of(8) || p.head_dim > 256 {
        return Err(AttnError::UnsupportedHeadDim {
            head_dim: p.head_dim,
            backend: "attn_decode".into(),
            supported: "multiples of 8 up to 256 (use the CPU backend for others)".into(),
        });
    }
    let too_large = |reason: String| {
        Err(AttnError::TooLarge {
            kernel: "attn_decode",
            reason,
        })
    };
    if p.batch > 65_535 {
        return too_large(format!(
            "batch {} is above the grid's 65535: split the batch",
            p.batch
        ));
    }
    if p.capacity() > i32::MAX as usize / 2 || p.seqlen_q * p.heads_q > i32::MAX as usize / 2 {
        return too_large("a cache or query count above 2^30 rows".into());
    }
    if let CacheLayout::Paged {
        num_blocks,
        max_blocks,
        ..
    } = &p.layout
        && (*num_blocks > i32::MAX as usize || p.batch * max_blocks > i32::MAX as usize)
    {
        return too_large("more than 2^31-1 pages or block-table entries".into());
    }
    Ok(())
}

/// A decoding call prepared for the GPU: the problem validated, the split count chosen, and
/// its metadata (cache lengths, block table, ALiBi slopes) and split-KV workspace on the
/// device. [`DecodePlan::run`] then only launches kernels, so a decoding loop that keeps its
/// shapes pays for this once; [`forward_device`] plans and runs in one call.
pub struct DecodePlan {
    problem: KvCacheProblem,
    env: AttnProblem,
    dtype: DType,
    splits: usize,
    kernels: PlanKernels,
    seqlens: CudaSlice<i32>,
    table: Option<CudaSlice<i32>>,
    slopes: Option<CudaSlice<f32>>,
    sink: Option<CudaSlice<f32>>,
    partials: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
}

impl DecodePlan {
    /// Validates `p` for the GPU and element type `dtype` (f16 or bf16), picks the split count
    /// (`splits`, or the heuristic for `None`: [`splits_for`]), compiles (or finds) the
    /// kernels and copies the metadata to the device (on `gpu.stream()`).
    ///
    /// # Errors
    /// [`KvCacheProblem::validate`]'s; [`AttnError::UnsupportedHeadDim`] for a head_dim that
    /// is not a multiple of 8 up to 256; [`AttnError::DTypeMismatch`] for f32;
    /// [`AttnError::InvalidInput`] for a split count out of range; [`AttnError::TooLarge`]
    /// (the head_dim's shared memory on this device too); [`AttnError::Compile`]; allocation
    /// and copy failures as [`AttnError::Cuda`].
    pub fn new(gpu: &Gpu, p: &KvCacheProblem, dtype: DType, splits: Option<usize>) -> Result<Self> {
        Self::with_tile(gpu, p, dtype, splits, None)
    }

    /// [`DecodePlan::new`] with the tile forced (`None`: the library's choice,
    /// [`DecodeTile::for_call`]), for benchmarks.
    ///
    /// # Errors
    /// Those of [`DecodePlan::new`]; [`AttnError::InvalidInput`] for a tile other than 4 or 8
    /// warps and 2 to 4 stages.
    pub fn with_tile(
        gpu: &Gpu,
        p: &KvCacheProblem,
        dtype: DType,
        splits: Option<usize>,
        tile: Option<DecodeTile>,
    ) -> Result<Self> {
        p.validate()?;
        check_gpu(p)?;
        if dtype == DType::F32 {
            return Err(AttnError::DTypeMismatch {
                what:
                    "the decode kernels take f16 or bf16: convert the inputs or use the CPU backend"
                        .into(),
            });
        }
        if let Some(t) = tile
            && (!(2..=4).contains(&t.stages) || !matches!(t.warps, 4 | 8))
        {
            return Err(AttnError::InvalidInput {
                what: format!(
                    "decode tile of {} warps and {} stages: use 4 or 8 warps and 2 to 4 stages",
                    t.warps, t.stages
                ),
            });
        }
        let rows = CacheRows::of(&p.layout);
        if let Some(t) = tile
            && t.bulk
            && let Some(why) = t.bulk_refusal(gpu.info().compute_capability, p.head_dim, rows)
        {
            return Err(AttnError::InvalidInput {
                what: format!(
                    "decode tile with the copy engine on {} ({}): {why}; use a tile without it",
                    gpu.info().name,
                    gpu.info().arch
                ),
            });
        }
        let env = envelope(p)?;
        // One block per SM: blocks sharing an SM share its slice of the bandwidth, so a grid
        // of 1.2 blocks per SM ends with some SMs doing twice the work (measured in run 47:
        // batch 1 ran fastest with 16 splits, 128 blocks, and slower with 20 to 128).
        let sms = gpu.info().sm_count.max(1) as usize;
        let splits = splits_for(p, sms, splits)?;
        let allowed = gpu.info().smem_per_block_optin as usize;
        let blocks = row_blocks(p) * p.heads_kv * p.batch;
        let tile = tile.unwrap_or_else(|| {
            DecodeTile::for_call(p.head_dim, allowed, splits, blocks, sms).with_bulk_where_it_fits(
                gpu.info().compute_capability,
                p.head_dim,
                rows,
                allowed,
            )
        });
        let mut kernels = PlanKernels::new(gpu, p, &env, dtype, tile)?;
        if splits > 1 {
            kernels.add_combine(gpu, p, dtype)?;
        }
        let stream = gpu.stream();
        let up = |x: &[i32], what: &str| -> Result<CudaSlice<i32>> {
            stream
                .clone_htod(x)
                .map_err(cuda_err(format!("copying {what} to the device")))
        };
        let table = match &p.layout {
            CacheLayout::Paged { block_table, .. } => Some(up(block_table, "block_table")?),
            CacheLayout::Contiguous { .. } => None,
        };
        let rows = p.batch * p.heads_q * p.seqlen_q;
        let partials = if splits > 1 {
            let alloc = |n: usize, what: &str| -> Result<CudaSlice<f32>> {
                stream
                    .alloc_zeros(n)
                    .map_err(cuda_err(format!("allocating the split-KV partial {what}")))
            };
            Some((
                alloc(splits * rows * p.head_dim, "o")?,
                alloc(splits * rows, "lse")?,
            ))
        } else {
            None
        };
        Ok(DecodePlan {
            env,
            dtype,
            splits,
            kernels,
            seqlens: up(&p.cache_seqlens, "cache_seqlens")?,
            table,
            slopes: upload_slopes(gpu, &p.scores)?,
            sink: upload_sink(gpu, &p.scores)?,
            partials,
            problem: p.clone(),
        })
    }

    /// Takes the next decoding step's cache lengths and block table, the only things that
    /// change from step to step of a loop: `p` must be the planned problem in everything else
    /// (batch, heads, head_dim, seqlen_q, seqlen_new, layout sizes, mask, scale, modifiers).
    /// Copies them to the device on `gpu.stream()`, ordered after the launches already queued
    /// (the previous step reads the old values). The split count stays the planned one.
    ///
    /// # Errors
    /// [`KvCacheProblem::validate`]'s; [`AttnError::InvalidInput`] when `p` differs from the
    /// plan in anything else (make a new plan); copy failures as [`AttnError::Cuda`].
    pub fn update(&mut self, gpu: &Gpu, p: &KvCacheProblem) -> Result<()> {
        p.validate()?;
        if !same_but_lengths(&self.problem, p) {
            return Err(AttnError::InvalidInput {
                what: "DecodePlan::update takes new cache lengths and block-table entries only; this problem differs in its sizes, layout, mask or modifiers: make a new plan".into(),
            });
        }
        let stream = gpu.stream();
        stream
            .memcpy_htod(&p.cache_seqlens, &mut self.seqlens)
            .map_err(cuda_err("copying cache_seqlens to the device"))?;
        if let (CacheLayout::Paged { block_table, .. }, Some(table)) = (&p.layout, &mut self.table)
        {
            stream
                .memcpy_htod(block_table, table)
                .map_err(cuda_err("copying block_table to the device"))?;
        }
        self.problem = p.clone();
        Ok(())
    }

    /// The split count the plan runs.
    pub fn splits(&self) -> usize {
        self.splits
    }

    /// The planned problem.
    pub fn problem(&self) -> &KvCacheProblem {
        &self.problem
    }

    /// Runs the planned call on device buffers: `q` `[batch, seqlen_q, heads_q, head_dim]`,
    /// the caches in the problem's layout (modified in place when `new` rows are given),
    /// `new` = (k, v) `[batch, seqlen_new, heads_kv, head_dim]` when `seqlen_new > 0`, `o`
    /// like q, `lse` `[batch, heads_q, seqlen_q]` f32; all dense, 16-byte aligned, in `gpu`'s
    /// context. Asynchronous on `gpu.stream()`: kv_append (with new rows), attn_decode, and
    /// attn_combine (with more than one split). The same bytes run to run; rows that see no
    /// key get o = 0 and lse = -inf (the sink's logit with a learnable sink).
    ///
    /// # Errors
    /// [`AttnError::BufferTooShort`]; [`AttnError::InvalidInput`] for new rows missing or
    /// given against `seqlen_new`; [`AttnError::ShapeMismatch`] for a buffer of another
    /// context; [`AttnError::InvalidStrides`] for a misaligned buffer; [`AttnError::TooLarge`];
    /// [`AttnError::Compile`]/[`AttnError::Cuda`].
    #[allow(clippy::too_many_arguments)]
    pub fn run<T, Q, KC, VC, O, L>(
        &self,
        gpu: &Gpu,
        q: &Q,
        k_cache: &mut KC,
        v_cache: &mut VC,
        new: Option<(&dyn DevicePtr<T>, &dyn DevicePtr<T>)>,
        o: &mut O,
        lse: &mut L,
    ) -> Result<LaunchInfo>
    where
        T: GpuElement,
        Q: DevicePtr<T>,
        KC: DevicePtrMut<T>,
        VC: DevicePtrMut<T>,
        O: DevicePtrMut<T>,
        L: DevicePtrMut<f32>,
    {
        let p = &self.problem;
        if T::DTYPE != self.dtype {
            return Err(AttnError::DTypeMismatch {
                what: format!(
                    "the plan was made for {} buffers, these are {}",
                    self.dtype,
                    T::DTYPE
                ),
            });
        }
        let (new_k_len, new_v_len) = match (&new, p.seqlen_new) {
            (Some((k, v)), n) if n > 0 => (k.len(), v.len()),
            (None, 0) => (0, 0),
            (Some(_), _) => {
                return Err(AttnError::InvalidInput {
                    what: "new k/v rows were given but seqlen_new is 0: set seqlen_new to their row count".into(),
                });
            }
            (None, n) => {
                return Err(AttnError::InvalidInput {
                    what: format!("seqlen_new is {n} but no new k/v rows were given"),
                });
            }
        };
        p.check_buffers(&[
            ("q", q.len()),
            ("k_cache", k_cache.len()),
            ("v_cache", v_cache.len()),
            ("k_new", new_k_len),
            ("v_new", new_v_len),
            ("o", o.len()),
            ("lse", lse.len()),
        ])?;
        check_contexts!(gpu; "q" => q, "k_cache" => k_cache, "v_cache" => v_cache, "o" => o,
            "lse" => lse)?;
        let stream = gpu.stream();
        device_ptrs!(stream; qp = q, kcp = mut k_cache, vcp = mut v_cache, op = mut o, lp = mut lse);
        check_aligned([("q", qp), ("k_cache", kcp), ("v_cache", vcp), ("o", op)])?;
        let (sl, _gsl) = self.seqlens.device_ptr(stream);
        let bt = self.table.as_ref().map(|t| t.device_ptr(stream));
        let (page_size, max_blocks) = match &p.layout {
            CacheLayout::Paged {
                page_size,
                max_blocks,
                ..
            } => (*page_size as i32, *max_blocks as i32),
            CacheLayout::Contiguous { .. } => (0, 0),
        };
        let map = CacheMap {
            cache_seqlens: sl,
            block_table: bt.as_ref().map_or(0, |(ptr, _)| *ptr),
            max_blocks,
            page_size,
            seqlen_new: p.seqlen_new as i32,
        };
        let paged = self.table.is_some();
        if let Some((k, v)) = &new {
            check_contexts!(gpu; "k_new" => k, "v_new" => v)?;
            device_ptrs!(stream; kp = k, vp = v);
            check_aligned([("k_new", kp), ("v_new", vp)])?;
            if let Some(k) = &self.kernels.append {
                append(gpu, k, p, &self.env, [kp, vp, kcp, vcp], map)?;
            }
        }
        if p.batch * p.seqlen_q == 0 {
            return Ok(info(
                KernelKind::Mma,
                "no query rows: nothing launched".into(),
                0,
            ));
        }
        let alibi = self.slopes.as_ref().map(|d| d.device_ptr(stream));
        let sink = self.sink.as_ref().map(|d| d.device_ptr(stream));
        let launch = Launch {
            alibi: alibi.as_ref().map_or(0, |(ptr, _)| *ptr),
            sink: sink.as_ref().map_or(0, |(ptr, _)| *ptr),
            ..Launch::dense(&self.env, T::DTYPE, [qp, kcp, vcp, op, lp])
        };
        let acc = self
            .partials
            .as_ref()
            .map(|(o, l)| (o.device_ptr(stream), l.device_ptr(stream)));
        let dp = DecodeParams {
            o_accum: acc.as_ref().map_or(0, |((ptr, _), _)| *ptr),
            lse_accum: acc.as_ref().map_or(0, |(_, (ptr, _))| *ptr),
            num_splits: self.splits as i32,
            map,
        };
        let mut result = decode(gpu, &self.kernels, p, &launch, dp)?;
        if let (Some(((oa, _), (la, _))), Some(k)) = (&acc, &self.kernels.combine) {
            combine(gpu, k, p, &launch, [*oa, *la], self.splits)?;
        }
        let splits = self.splits;
        result.why = format!(
            "KV-cache decode: {} cache, {splits} split{}{}",
            if paged { "paged" } else { "contiguous" },
            if splits == 1 { "" } else { "s + attn_combine" },
            if p.seqlen_new > 0 {
                format!(", {} rows appended by kv_append", p.seqlen_new)
            } else {
                String::new()
            }
        );
        Ok(result)
    }
}

/// Whether `p` is `planned` but for its cache lengths and block-table entries.
fn same_but_lengths(planned: &KvCacheProblem, p: &KvCacheProblem) -> bool {
    let mut same = p.clone();
    same.cache_seqlens = planned.cache_seqlens.clone();
    if let (
        CacheLayout::Paged { block_table, .. },
        CacheLayout::Paged {
            block_table: old, ..
        },
    ) = (&mut same.layout, &planned.layout)
    {
        block_table.clone_from(old);
    }
    same == *planned
}

/// Plans and runs one decoding call ([`DecodePlan::new`], then [`DecodePlan::run`]).
///
/// # Errors
/// Those of both.
#[allow(clippy::too_many_arguments)]
pub fn forward_device<T, Q, KC, VC, O, L>(
    gpu: &Gpu,
    p: &KvCacheProblem,
    q: &Q,
    k_cache: &mut KC,
    v_cache: &mut VC,
    new: Option<(&dyn DevicePtr<T>, &dyn DevicePtr<T>)>,
    o: &mut O,
    lse: &mut L,
    splits: Option<usize>,
) -> Result<LaunchInfo>
where
    T: GpuElement,
    Q: DevicePtr<T>,
    KC: DevicePtrMut<T>,
    VC: DevicePtrMut<T>,
    O: DevicePtrMut<T>,
    L: DevicePtrMut<f32>,
{
    DecodePlan::new(gpu, p, T::DTYPE, splits)?.run(gpu, q, k_cache, v_cache, new, o, lse)
}

/// The kernels of a plan, compiled (or found in the module cache) once, with attn_decode's
/// shared-memory limit raised once.
struct PlanKernels {
    decode: LoadedKernel,
    tile: DecodeTile,
    smem: usize,
    combine: Option<LoadedKernel>,
    append: Option<LoadedKernel>,
}

impl PlanKernels {
    fn new(
        gpu: &Gpu,
        p: &KvCacheProblem,
        env: &AttnProblem,
        dtype: DType,
        tile: DecodeTile,
    ) -> Result<Self> {
        let allowed = gpu.info().smem_per_block_optin as usize;
        let smem = tile.smem_bytes(p.head_dim);
        if smem > allowed {
            return Err(AttnError::TooLarge {
                kernel: "attn_decode",
                reason: format!(
                    "head_dim {} needs {smem} bytes of shared memory per block, the device allows {allowed}: use the CPU backend",
                    p.head_dim
                ),
            });
        }
        let paged = matches!(p.layout, CacheLayout::Paged { .. });
        let mut defines = tile.defines(dtype, p.head_dim, p.mask.is_causal(), paged);
        defines.extend(score_defines(env));
        defines.extend(sink_defines(env));
        let decode = gpu.kernel(KernelSource::AttnDecode, "attn_decode", &defines)?;
        set_dynamic_smem(&decode.function, smem, &launch_context("attn_decode", env))?;
        let head_dim = ("HEAD_DIM".to_string(), p.head_dim.to_string());
        let append = (p.seqlen_new > 0)
            .then(|| {
                let defines = [
                    head_dim.clone(),
                    ("IS_PAGED".to_string(), u8::from(paged).to_string()),
                ];
                gpu.kernel(KernelSource::KvAppend, "kv_append", &defines)
            })
            .transpose()?;
        Ok(PlanKernels {
            decode,
            tile,
            smem,
            combine: None,
            append,
        })
    }

    /// Compiles (or finds) attn_combine for a plan with more than one split (with the sink's
    /// define when the problem has one: the combine then adds it).
    fn add_combine(&mut self, gpu: &Gpu, p: &KvCacheProblem, dtype: DType) -> Result<()> {
        let mut defines = vec![
            ("HEAD_DIM".to_string(), p.head_dim.to_string()),
            (
                "IS_BF16".to_string(),
                u8::from(dtype == DType::BF16).to_string(),
            ),
        ];
        if p.scores.sink.is_some() {
            defines.push(("HAS_SINK".to_string(), "1".to_string()));
        }
        self.combine = Some(gpu.kernel(KernelSource::AttnCombine, "attn_combine", &defines)?);
        Ok(())
    }
}

/// Launches `k` on a 1-D grid of `items.div_ceil(per_block)` blocks of `threads` threads with
/// one parameter block, then the sink's logits of `sink`'s launch ([`push_sink`]) when given.
///
/// # Safety
/// `params` must mirror the kernel's parameter struct, and every address in it must be valid
/// for what the kernel reads and writes over that grid.
unsafe fn launch_1d<P: DeviceRepr>(
    gpu: &Gpu,
    k: &LoadedKernel,
    (items, per_block, threads): (usize, usize, u32),
    params: &P,
    sink: Option<&Launch>,
    (kernel, ctx): (&'static str, String),
) -> Result<()> {
    let blocks = u32::try_from(items.div_ceil(per_block)).map_err(|_| AttnError::TooLarge {
        kernel,
        reason: "more than 2^32 blocks: split the batch".into(),
    })?;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = gpu.stream().launch_builder(&k.function);
    b.arg(params);
    if let Some(l) = sink {
        push_sink(&mut b, l)?;
    }
    // SAFETY: the caller's contract.
    unsafe { b.launch(cfg) }.map_err(cuda_err(ctx))?;
    Ok(())
}

/// Launches kv_append: one thread per 16-byte chunk of the new rows.
fn append(
    gpu: &Gpu,
    k: &LoadedKernel,
    p: &KvCacheProblem,
    env: &AttnProblem,
    [kp, vp, kcp, vcp]: [u64; 4],
    map: CacheMap,
) -> Result<()> {
    let rows = p.batch * p.seqlen_new * p.heads_kv;
    if rows == 0 {
        return Ok(());
    }
    let new = [
        (p.seqlen_new * p.heads_kv * p.head_dim) as i64,
        (p.heads_kv * p.head_dim) as i64,
        p.head_dim as i64,
    ];
    let st = |s: Strides| [s.batch as i64, s.seq as i64, s.head as i64];
    let chunks = rows * p.head_dim / 8;
    let params = AppendParams {
        k_new: kp,
        v_new: vp,
        k_cache: kcp,
        v_cache: vcp,
        kn: new,
        vn: new,
        kc: st(env.k_strides),
        vc: st(env.v_strides),
        batch: p.batch as i32,
        heads_kv: p.heads_kv as i32,
        chunks: chunks as i64,
        map,
    };
    // SAFETY: the parameters mirror the kernel's struct; validate() checked that every
    // appended row lies inside its sequence's capacity and every page index inside the pool.
    unsafe {
        launch_1d(
            gpu,
            k,
            (chunks, 256, 256),
            &params,
            None,
            ("kv_append", launch_context("kv_append", env)),
        )
    }
}

/// The tensor maps of the K and V caches for attn_decode's copy engine path: (head_dim,
/// rows, heads_kv, sequences or pages) with boxes of 64 channels x the tile's `bc` keys, or a
/// page's keys when pages are shorter than the tile.
fn cache_maps(
    p: &KvCacheProblem,
    l: &Launch,
    bc: usize,
) -> std::result::Result<[crate::cuda::runtime::tma::TmaMap; 2], String> {
    let (rows, blocks, box_rows) = match &p.layout {
        CacheLayout::Contiguous { seqlen_cache } => (*seqlen_cache, p.batch, bc),
        CacheLayout::Paged {
            num_blocks,
            page_size,
            ..
        } => (*page_size, *num_blocks, (*page_size).min(bc)),
    };
    let dims = [p.head_dim, rows, p.heads_kv, blocks];
    let env = l.problem;
    let k = crate::cuda::runtime::tma::bshd_map(l.dtype, l.k, dims, env.k_strides, box_rows as u32);
    let v = crate::cuda::runtime::tma::bshd_map(l.dtype, l.v, dims, env.v_strides, box_rows as u32);
    Ok([
        k.encode().map_err(|e| format!("k_cache: {e}"))?,
        v.encode().map_err(|e| format!("v_cache: {e}"))?,
    ])
}

/// Launches attn_decode: grid (row blocks x kv heads, splits, batch).
fn decode(
    gpu: &Gpu,
    ks: &PlanKernels,
    p: &KvCacheProblem,
    l: &Launch,
    dp: DecodeParams,
) -> Result<LaunchInfo> {
    let mut params = FlashParams::new(l, DECODE_ROWS as u32);
    let m_blocks = row_blocks(p);
    params.num_m_blocks = m_blocks as i32;
    let cfg = LaunchConfig {
        grid_dim: (
            (m_blocks * p.heads_kv) as u32,
            dp.num_splits as u32,
            p.batch as u32,
        ),
        block_dim: (ks.tile.threads(), 1, 1),
        shared_mem_bytes: ks.smem as u32,
    };
    let maps = if ks.tile.bulk {
        Some(cache_maps(p, l, ks.tile.bc()).map_err(|why| AttnError::InvalidInput {
            what: format!("attn_decode with the copy engine: it cannot describe {why}; pass a tile without it, or set {BULK_ENV}=0"),
        })?)
    } else {
        None
    };
    let mut b = gpu.stream().launch_builder(&ks.decode.function);
    b.arg(&params);
    b.arg(&dp);
    if let Some([tk, tv]) = &maps {
        b.arg(tk);
        b.arg(tv);
    }
    push_sink(&mut b, l)?;
    // SAFETY: the parameters mirror the kernel's structs (the sink's logits last, with a
    // sink: heads_q of them); the caller validated the problem
    // (lengths within capacity, page indices within the pool) and every buffer's length; the
    // tensor maps describe exactly the two caches, and the copy engine reads nothing outside.
    unsafe { b.launch(cfg) }.map_err(cuda_err(launch_context("attn_decode", l.problem)))?;
    Ok(LaunchInfo {
        kernel: KernelKind::Mma,
        why: String::new(),
        config: Some(format!(
            "attn_decode 16 rows x Bc{}, {} warps, {} stages{}{}",
            ks.tile.bc(),
            ks.tile.warps,
            ks.tile.stages,
            if ks.tile.q_in_regs {
                ", Q in registers"
            } else {
                ""
            },
            if ks.tile.bulk {
                ", K/V by the copy engine"
            } else {
                ""
            }
        )),
        registers: ks.decode.stats.registers,
        spill_bytes: ks.decode.stats.spill_stores,
        smem_bytes: ks.smem,
    })
}

/// Launches attn_combine: one warp per query row, four per block.
fn combine(
    gpu: &Gpu,
    k: &LoadedKernel,
    p: &KvCacheProblem,
    l: &Launch,
    [oa, la]: [u64; 2],
    splits: usize,
) -> Result<()> {
    let rows = p.batch * p.heads_q * p.seqlen_q;
    let o = l.problem.o_strides;
    let params = CombineParams {
        o_accum: oa,
        lse_accum: la,
        o: l.o,
        lse: l.lse,
        o_strides: [o.batch as i64, o.seq as i64, o.head as i64],
        batch: p.batch as i32,
        heads_q: p.heads_q as i32,
        seqlen_q: p.seqlen_q as i32,
        num_splits: splits as i32,
    };
    // SAFETY: the parameters mirror the kernel's struct (and, with a sink, its logits: the
    // kernel is compiled with HAS_SINK exactly then); the partials hold splits x rows entries
    // (allocated by the plan) and o/lse were checked against the problem.
    unsafe {
        launch_1d(
            gpu,
            k,
            (rows, 4, 128),
            &params,
            Some(l),
            ("attn_combine", launch_context("attn_combine", l.problem)),
        )
    }
}

/// A LaunchInfo with no kernel statistics.
fn info(kernel: KernelKind, why: String, smem_bytes: usize) -> LaunchInfo {
    LaunchInfo {
        kernel,
        why,
        config: None,
        registers: 0,
        spill_bytes: 0,
        smem_bytes,
    }
}

/// Host-memory convenience of [`forward_device`]: copies q, the caches and the new rows in,
/// runs, and copies o, lse and the caches (with the appended rows) back; like
/// [`crate::problem::kvcache::forward_cpu`], the caches are updated in place. Pass empty `k_new` /
/// `v_new` when `seqlen_new` is 0.
///
/// # Errors
/// As [`forward_device`], plus allocation and copy failures as [`AttnError::Cuda`].
#[allow(clippy::too_many_arguments)]
pub fn forward_host<T: GpuElement>(
    gpu: &Gpu,
    p: &KvCacheProblem,
    q: &[T],
    k_cache: &mut [T],
    v_cache: &mut [T],
    k_new: &[T],
    v_new: &[T],
    splits: Option<usize>,
) -> Result<(crate::problem::kvcache::KvCacheOutput<T>, LaunchInfo)> {
    p.validate()?;
    check_gpu(p)?;
    p.check_call(
        q.len(),
        [k_cache.len(), v_cache.len()],
        [k_new.len(), v_new.len()],
    )?;
    let stream = gpu.stream();
    let up = |x: &[T], what: &str| {
        stream
            .clone_htod(x)
            .map_err(cuda_err(format!("copying {what} to the device")))
    };
    let dq = up(q, "q")?;
    let (mut dkc, mut dvc) = (up(k_cache, "k_cache")?, up(v_cache, "v_cache")?);
    // One element at least, so that a call without new rows still has buffers to view.
    let one = [T::from_f32(0.0)];
    let nonempty = |x: &'_ [T]| -> Vec<T> {
        if x.is_empty() {
            one.to_vec()
        } else {
            x.to_vec()
        }
    };
    let (dkn, dvn) = (up(&nonempty(k_new), "k")?, up(&nonempty(v_new), "v")?);
    let n_lse = p.batch * p.heads_q * p.seqlen_q;
    let mut d_o: CudaSlice<T> = stream
        .alloc_zeros(q.len().max(1))
        .map_err(cuda_err("allocating o"))?;
    let mut d_lse: CudaSlice<f32> = stream
        .alloc_zeros(n_lse.max(1))
        .map_err(cuda_err("allocating lse"))?;
    let new = (p.seqlen_new > 0).then(|| (dkn.as_view(), dvn.as_view()));
    let info = forward_device(
        gpu,
        p,
        &dq,
        &mut dkc,
        &mut dvc,
        new.as_ref()
            .map(|(k, v)| (k as &dyn DevicePtr<T>, v as &dyn DevicePtr<T>)),
        &mut d_o,
        &mut d_lse,
        splits,
    )?;
    let back = |d: &CudaSlice<T>, what: &str| {
        stream
            .clone_dtoh(d)
            .map_err(cuda_err(format!("decode: copying {what} back")))
    };
    let mut o = back(&d_o, "o")?;
    o.truncate(q.len());
    let mut lse = stream
        .clone_dtoh(&d_lse)
        .map_err(cuda_err("decode: copying lse back"))?;
    lse.truncate(n_lse);
    k_cache.copy_from_slice(&back(&dkc, "k_cache")?);
    v_cache.copy_from_slice(&back(&dvc, "v_cache")?);
    Ok((crate::problem::kvcache::KvCacheOutput { o, lse }, info))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_copy_engine_serves_hopper_multiples_of_64_and_pages_aligned_with_the_tile() {
        let eight = DecodeTile::for_head_dim(128, 227 * 1024); // 128 keys per tile
        let four = DecodeTile { warps: 4, ..eight }; // 64 keys
        let h = (9, 0);
        let dense = CacheRows::Contiguous { seqlen_cache: 4096 };
        let paged = |page_size| CacheRows::Paged {
            num_blocks: 64,
            page_size,
        };
        assert_eq!(eight.bulk_refusal(h, 128, dense), None);
        assert_eq!(eight.bulk_refusal(h, 64, paged(16)), None);
        for ps in [16, 32, 64, 128, 256, 512] {
            assert_eq!(eight.bulk_refusal(h, 128, paged(ps)), None, "page {ps}");
        }
        // a box would straddle two pages, or not cover the tile
        for ps in [48, 80, 96, 144, 192, 320] {
            assert!(eight.bulk_refusal(h, 128, paged(ps)).is_some(), "page {ps}");
        }
        assert_eq!(four.bulk_refusal(h, 128, paged(192)), None);
        assert!(four.bulk_refusal(h, 128, paged(96)).is_some());
        // no rows: a tensor map has no empty dimension
        let empty = CacheRows::Contiguous { seqlen_cache: 0 };
        assert!(eight.bulk_refusal(h, 128, empty).is_some());
        let empty_pool = CacheRows::Paged {
            num_blocks: 0,
            page_size: 16,
        };
        assert!(eight.bulk_refusal(h, 128, empty_pool).is_some());
        assert!(eight.bulk_refusal(h, 96, dense).is_some());
        assert!(eight.bulk_refusal((8, 0), 128, dense).is_some());
        assert!(eight.bulk_refusal((10, 0), 128, dense).is_some());
        // the default takes it only where it is served and fits
        let t = eight.with_bulk_where_it_fits(h, 128, paged(48), 227 * 1024);
        assert!(!t.bulk);
        let t = eight.with_bulk_where_it_fits(h, 128, paged(16), 227 * 1024);
        assert!(t.bulk && t.threads() == 9 * 32);
        let t = eight.with_bulk_where_it_fits(h, 128, dense, 99 * 1024);
        assert!(!t.bulk);
    }

    #[test]
    fn tiles_fit_the_shared_memory_they_are_chosen_for() {
        for limit in [99 * 1024, 163 * 1024, 227 * 1024] {
            for d in (8..=256).step_by(8) {
                let t = DecodeTile::for_head_dim(d, limit);
                // Only d > 128 on a 99 KB part is left without a fitting tile (refused as
                // TooLarge by the plan).
                assert!(
                    t.smem_bytes(d) <= limit || (d > 128 && limit < 140 * 1024),
                    "d{d} limit {limit}: {t:?} needs {}",
                    t.smem_bytes(d)
                );
                assert_eq!(t.q_in_regs, d <= 128);
                let c = DecodeTile::for_call(d, limit, 1, 512, 132);
                assert!(c.smem_bytes(d) <= limit || c == t);
            }
        }
        // The H200 defaults: 8 warps x 3 stages at d128; 4 x 3 for big one-split calls.
        let h200 = 227 * 1024;
        assert_eq!(
            (
                DecodeTile::for_head_dim(128, h200).warps,
                DecodeTile::for_head_dim(128, h200).stages
            ),
            (8, 3)
        );
        let big = DecodeTile::for_call(128, h200, 1, 512, 132);
        assert_eq!((big.warps, big.stages), (4, 3));
        let split = DecodeTile::for_call(128, h200, 16, 8, 132);
        assert_eq!((split.warps, split.stages), (8, 3));
    }

    #[test]
    fn split_counts_are_checked_and_chosen_per_sm() {
        let p = KvCacheProblem::new(
            1,
            1,
            32,
            8,
            128,
            CacheLayout::Contiguous {
                seqlen_cache: 32768,
            },
            vec![32768],
            0,
        )
        .unwrap();
        assert!(matches!(
            splits_for(&p, 132, Some(0)),
            Err(AttnError::InvalidInput { .. })
        ));
        assert!(splits_for(&p, 132, Some(MAX_SPLITS + 1)).is_err());
        assert_eq!(splits_for(&p, 132, Some(7)).unwrap(), 7);
        // 8 blocks per split on 132 SMs: 16 splits (128 blocks), as measured best (run 47).
        assert_eq!(splits_for(&p, 132, None).unwrap(), 16);
        assert!(
            check_gpu(&KvCacheProblem {
                head_dim: 36,
                ..p.clone()
            })
            .is_err()
        );
    }

    #[test]
    fn a_plan_takes_new_lengths_and_pages_only() {
        let p = KvCacheProblem::new(
            2,
            1,
            8,
            2,
            64,
            CacheLayout::Paged {
                num_blocks: 8,
                page_size: 16,
                block_table: vec![0, 1, 2, 3, 4, 5, 6, 7],
                max_blocks: 4,
            },
            vec![10, 20],
            1,
        )
        .unwrap();
        let mut next = p.clone();
        next.cache_seqlens = vec![11, 21];
        if let CacheLayout::Paged { block_table, .. } = &mut next.layout {
            block_table.swap(0, 1);
        }
        assert!(same_but_lengths(&p, &next));
        let other = KvCacheProblem {
            seqlen_new: 2,
            ..next.clone()
        };
        assert!(!same_but_lengths(&p, &other));
        let causal = next.clone().with_mask(crate::Mask::Causal);
        assert!(!same_but_lengths(&p, &causal));
    }
}
