//! Decoding against a KV cache on the GPU ([`crate::problem::kvcache`]'s semantics): new rows
//! appended in place (kv_append.cu; keys rotated first with a rotary embedding), then
//! attn_decode.cu over split-KV blocks with the query heads of each kv head packed into one
//! block (q rotated in shared memory with a rotary embedding), then attn_combine.cu merging
//! the splits exactly (only when there is more than one split: with one, attn_decode writes o
//! and lse itself).
//!
//! Two ways in:
//! - [`DecodeLaunch`]: a call whose index arrays (`cache_seqlens`, `block_table`,
//!   `cache_batch_idx`, `cache_leftpad`) live on the device ([`DeviceIndex`]), as
//!   FlashAttention-2's do. It is planned from its [`KvCacheShape`] alone: the grid from the
//!   shapes (each block reads its sequence's length on the device; blocks past a sequence's
//!   end do nothing), the split count from the cache's capacity. [`DecodeLaunch::run`]
//!   checks the buffers and enqueues the kernels on `gpu.stream()`, nothing else: no copy, no
//!   allocation (the split-KV workspace is the caller's), no synchronisation, so that a call
//!   can be captured in a CUDA graph and replayed with new values in the arrays. ALiBi slopes
//!   and a learnable sink's logits can be given there too ([`DeviceIndex::alibi_slopes`],
//!   [`DeviceIndex::sink`]); those the shape holds on the host instead are copied per call,
//!   which a capture refuses. The first call of a configuration compiles its kernels, which a
//!   capture refuses too: warm up first. The arrays' values are not validated: the kernels
//!   clamp what they read ([`crate::problem::kvcache::shape`] states the rule).
//! - [`DecodePlan`]: a call whose index arrays are on the host, validated there
//!   ([`KvCacheProblem::validate`]), copied to the device once (a decoding loop hands each
//!   step's new values to [`DecodePlan::update`]), the split count chosen from the actual
//!   lengths; [`forward_device`] plans and runs in one call, [`forward_host`] on host buffers.

mod host;
mod kernels;
mod launch;
mod params;
mod tile;

pub use host::forward_host;
pub use kernels::append_defines;
pub use tile::{BULK_ENV, CacheRows, DECODE_ROWS, DecodeTile};

use kernels::PlanKernels;
use launch::row_blocks;

use crate::cuda::runtime::args::{check_aligned, check_contexts, check_streams};
use crate::cuda::runtime::device::{Gpu, cuda_err};
use crate::cuda::runtime::launch::{
    GpuElement, Launch, LaunchInfo, ScoreBuffers, upload_sink, upload_slopes,
};
use crate::dtype::DType;
use crate::error::{AttnError, Result};
use crate::problem::kvcache::{
    CacheDims, CacheLayout, KvCacheProblem, KvCacheShape, MAX_SPLITS, num_splits,
};
use crate::shape::{AttnProblem, AttnShape, Strides};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use params::{CacheMap, DecodeParams, RotaryMap};

/// The split count a call gets: `splits` when given (1..=[`MAX_SPLITS`]), else
/// [`num_splits`] over the blocks of one split (kv heads x row blocks x batch) against
/// `slots` (the SM count: see [`DecodeLaunch::new`]) for sequences of up to `max_seqlen_k`
/// keys.
///
/// # Errors
/// [`AttnError::InvalidInput`] for a given count outside 1..=[`MAX_SPLITS`].
pub fn splits_for(
    p: &KvCacheShape,
    slots: usize,
    max_seqlen_k: usize,
    splits: Option<usize>,
) -> Result<usize> {
    match splits {
        Some(s) if s == 0 || s > MAX_SPLITS => Err(AttnError::InvalidInput {
            what: format!("num_splits = {s}: use 1..={MAX_SPLITS}, or None for the heuristic"),
        }),
        Some(s) => Ok(s),
        None => Ok(num_splits(
            row_blocks(p) * p.heads_kv * p.batch,
            slots,
            max_seqlen_k,
        )),
    }
}

/// The dense problem whose parameter block attn_decode reads: q and o dense
/// `[batch, seqlen_q, heads_q, head_dim]`, the caches' strides (batch stride = the page stride
/// when paged), seqlen_k = capacity (each block reads its sequence's own length).
fn envelope(p: &KvCacheShape) -> Result<AttnProblem> {
    let row_k = p.heads_kv * p.head_dim;
    let sb = match p.cache {
        CacheDims::Contiguous { seqlen_cache, .. } => seqlen_cache * row_k,
        CacheDims::Paged { page_size, .. } => page_size * row_k,
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
    // refuse as overlapping; the kernels clamp every page index and cache sequence instead.
    e.q_strides = dense;
    e.o_strides = dense;
    e.k_strides = cache;
    e.v_strides = cache;
    Ok(e)
}

/// Checks what only the GPU path needs: head_dim, and sizes against the kernels' 32-bit
/// indices and grid limits.
fn check_gpu(p: &KvCacheShape) -> Result<()> {
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
    let big = |n: usize| n > i32::MAX as usize;
    match p.cache {
        CacheDims::Paged { num_blocks, .. } if big(num_blocks) || big(p.table_len()) => {
            return too_large("more than 2^31-1 pages or block-table entries".into());
        }
        CacheDims::Contiguous { cache_batch, .. } if big(cache_batch) => {
            return too_large("more than 2^31-1 cache sequences".into());
        }
        _ => {}
    }
    if p.rotary.is_some_and(|r| big(r.seqlen_ro)) {
        return too_large("rotary tables of more than 2^31-1 rows".into());
    }
    Ok(())
}

/// A call's index arrays on the device, int32, dense: read by the kernels only (see the
/// module docs; their values are clamped, not validated).
#[derive(Clone, Copy)]
pub struct DeviceIndex<'a> {
    /// `[batch]`: each sequence's cache length before the call.
    pub cache_seqlens: &'a dyn DevicePtr<i32>,
    /// `[batch, max_blocks]` row-major: a paged cache's block table (`None` for a contiguous
    /// cache).
    pub block_table: Option<&'a dyn DevicePtr<i32>>,
    /// `[batch]`: the cache sequence of each batch entry (where the shape has it).
    pub cache_batch_idx: Option<&'a dyn DevicePtr<i32>>,
    /// `[batch]`: each sequence's first valid cache row (where the shape has it).
    pub cache_leftpad: Option<&'a dyn DevicePtr<i32>>,
    /// ALiBi slopes on the device, f32, dense as the shape's `scores.alibi` lays them out
    /// (`[heads_q]`, or `[batch, heads_q]` when `per_batch`), read in place of the shape's
    /// host slopes (which then only state ALiBi and its layout): nothing is copied, so a call
    /// with ALiBi can be captured in a CUDA graph and replayed with new slopes. `None`: the
    /// shape's slopes are copied per call.
    pub alibi_slopes: Option<&'a dyn DevicePtr<f32>>,
    /// A learnable sink's logits on the device, f32 `[heads_q]`, read in place of the shape's
    /// `scores.sink` (as `alibi_slopes`). `None`: the shape's logits are copied per call.
    pub sink: Option<&'a dyn DevicePtr<f32>>,
}

impl<'a> DeviceIndex<'a> {
    /// The cache lengths alone (no block table, batch index, left padding or score values on
    /// the device): fill in the others with struct update syntax.
    pub fn new(cache_seqlens: &'a dyn DevicePtr<i32>) -> Self {
        DeviceIndex {
            cache_seqlens,
            block_table: None,
            cache_batch_idx: None,
            cache_leftpad: None,
            alibi_slopes: None,
            sink: None,
        }
    }
}

/// A device array of 4-byte elements (`kind` names them): on the Gpu's stream, its address
/// 4-byte aligned; with the guard to hold until the launch is enqueued.
fn word_array<'a, U>(
    gpu: &'a Gpu,
    name: &'static str,
    a: &'a dyn DevicePtr<U>,
    kind: &str,
) -> Result<(u64, cudarc::driver::SyncOnDrop<'a>)> {
    check_streams(gpu, [(name, a.stream())])?;
    let (ptr, guard) = a.device_ptr(gpu.stream());
    if !ptr.is_multiple_of(4) {
        return Err(AttnError::InvalidStrides {
            tensor: name,
            reason: format!("device address {ptr:#x} is not 4-byte aligned ({kind})"),
        });
    }
    Ok((ptr, guard))
}

/// The tensors of a decoding call on the device, all dense and 16-byte aligned (the rotary
/// tables 2-byte aligned), in the Gpu's context: `q` `[batch, seqlen_q, heads_q, head_dim]`,
/// the caches in the shape's layout (written in place when new rows are given), the new rows
/// `(k, v)` `[batch, seqlen_new, heads_kv, head_dim]` when `seqlen_new > 0`, the rotary tables
/// `(cos, sin)` `[seqlen_ro, rotary_dim / 2]` when the shape has a rotary embedding, `o` like
/// q, `lse` `[batch, heads_q, seqlen_q]` f32.
pub struct DecodeTensors<'a, T> {
    /// Queries.
    pub q: &'a dyn DevicePtr<T>,
    /// The key cache.
    pub k_cache: &'a mut dyn DevicePtrMut<T>,
    /// The value cache.
    pub v_cache: &'a mut dyn DevicePtrMut<T>,
    /// New key and value rows.
    pub new: Option<(&'a dyn DevicePtr<T>, &'a dyn DevicePtr<T>)>,
    /// `rotary_cos`, `rotary_sin`.
    pub rotary: Option<(&'a dyn DevicePtr<T>, &'a dyn DevicePtr<T>)>,
    /// The output.
    pub o: &'a mut dyn DevicePtrMut<T>,
    /// The log-sum-exp of each row.
    pub lse: &'a mut dyn DevicePtrMut<f32>,
}

/// Device addresses a launch reads besides the tensors: the index arrays (cache_seqlens,
/// block_table, cache_batch_idx, cache_leftpad; 0 where absent), the ALiBi slopes, the
/// learnable sink's logits (0 where absent) and the split-KV partials (o, lse; 0 with one
/// split).
struct Extras {
    index: [u64; 4],
    slopes: u64,
    sink: u64,
    accum: [u64; 2],
}

/// The kernels, tile and split count of a decoding call planned from its shape (see the
/// module docs): what a decoding loop whose index arrays live on the device keeps from step
/// to step, or makes per call (planning compiles nothing once the configuration is cached,
/// and allocates nothing).
pub struct DecodeLaunch {
    shape: KvCacheShape,
    env: AttnProblem,
    dtype: DType,
    splits: usize,
    kernels: PlanKernels,
}

impl DecodeLaunch {
    /// Validates `shape` for the GPU and element type `dtype` (f16 or bf16), picks the split
    /// count (`splits`, or the heuristic for `None`, sized for sequences as long as the
    /// capacity: [`splits_for`]) and compiles (or finds) the kernels.
    ///
    /// # Errors
    /// [`KvCacheShape::validate`]'s; [`AttnError::UnsupportedHeadDim`] for a head_dim that is
    /// not a multiple of 8 up to 256; [`AttnError::DTypeMismatch`] for f32;
    /// [`AttnError::InvalidInput`] for a split count out of range, or a configuration not
    /// compiled yet while the stream captures a CUDA graph; [`AttnError::TooLarge`] (the
    /// head_dim's shared memory on this device too); [`AttnError::Compile`].
    pub fn new(
        gpu: &Gpu,
        shape: &KvCacheShape,
        dtype: DType,
        splits: Option<usize>,
    ) -> Result<Self> {
        Self::with_tile(gpu, shape, dtype, splits, None)
    }

    /// [`DecodeLaunch::new`] with the tile forced (`None`: the library's choice,
    /// [`DecodeTile::for_call`]), for benchmarks.
    ///
    /// # Errors
    /// Those of [`DecodeLaunch::new`]; [`AttnError::InvalidInput`] for a tile other than 4 or
    /// 8 warps and 2 to 4 stages, or a copy-engine tile the device or shape cannot take.
    pub fn with_tile(
        gpu: &Gpu,
        shape: &KvCacheShape,
        dtype: DType,
        splits: Option<usize>,
        tile: Option<DecodeTile>,
    ) -> Result<Self> {
        Self::planned(gpu, shape, dtype, splits, tile, shape.capacity())
    }

    /// The plan of a call whose sequences hold up to `max_seqlen_k` keys.
    fn planned(
        gpu: &Gpu,
        p: &KvCacheShape,
        dtype: DType,
        splits: Option<usize>,
        tile: Option<DecodeTile>,
        max_seqlen_k: usize,
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
        let rows = CacheRows::of(&p.cache);
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
        let splits = splits_for(p, sms, max_seqlen_k, splits)?;
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
        Ok(DecodeLaunch {
            shape: p.clone(),
            env,
            dtype,
            splits,
            kernels,
        })
    }

    /// The split count the call runs.
    pub fn splits(&self) -> usize {
        self.splits
    }

    /// The planned shape.
    pub fn shape(&self) -> &KvCacheShape {
        &self.shape
    }

    /// f32 elements of the split-KV workspace that [`DecodeLaunch::run`] needs: the partial
    /// o and lse of every split, `splits x batch x heads_q x seqlen_q x (head_dim + 1)`; 0
    /// with one split.
    pub fn workspace_len(&self) -> usize {
        let p = &self.shape;
        if self.splits > 1 {
            self.splits * p.batch * p.heads_q * p.seqlen_q * (p.head_dim + 1)
        } else {
            0
        }
    }

    /// Runs the call on device tensors `t` with the index arrays `index` and, with more than
    /// one split, a `workspace` of at least [`DecodeLaunch::workspace_len`] f32 elements
    /// (16-byte aligned; its contents are overwritten). Asynchronous on `gpu.stream()`:
    /// kv_append (with new rows), attn_decode, attn_combine (with more than one split). The
    /// same bytes run to run; rows that see no key get o = 0 and lse = -inf (the sink's logit
    /// with a learnable sink).
    ///
    /// # Errors
    /// [`AttnError::DTypeMismatch`] for buffers of another element type than the plan's;
    /// [`AttnError::BufferTooShort`] (a tensor, an index array or the workspace);
    /// [`AttnError::InvalidInput`] for new rows, rotary tables, index arrays or a workspace
    /// missing or given against the shape (device ALiBi slopes or sink logits included), or
    /// host ALiBi slopes or sink logits (not given in `index`) inside a CUDA graph capture;
    /// [`AttnError::ShapeMismatch`] for a buffer of another context;
    /// [`AttnError::InvalidStrides`] for a misaligned buffer; [`AttnError::Cuda`].
    pub fn run<T: GpuElement>(
        &self,
        gpu: &Gpu,
        index: &DeviceIndex<'_>,
        t: DecodeTensors<'_, T>,
        workspace: Option<&mut dyn DevicePtrMut<f32>>,
    ) -> Result<LaunchInfo> {
        let p = &self.shape;
        let stream = gpu.stream();
        let given = |what: &str, want: bool, got: bool| {
            if want == got {
                return Ok(());
            }
            Err(AttnError::InvalidInput {
                what: format!(
                    "{what} {}: the call was planned {}",
                    if got { "was given" } else { "is missing" },
                    if want { "with it" } else { "without it" }
                ),
            })
        };
        given("block_table", p.is_paged(), index.block_table.is_some())?;
        given(
            "cache_batch_idx",
            p.batch_idx,
            index.cache_batch_idx.is_some(),
        )?;
        given("cache_leftpad", p.leftpad, index.cache_leftpad.is_some())?;
        given("a workspace", self.splits > 1, workspace.is_some())?;
        let arrays = [
            ("cache_seqlens", Some(index.cache_seqlens), p.batch),
            ("block_table", index.block_table, p.table_len()),
            ("cache_batch_idx", index.cache_batch_idx, p.batch),
            ("cache_leftpad", index.cache_leftpad, p.batch),
        ];
        let mut ptrs = [0u64; 4];
        let mut guards = Vec::with_capacity(4);
        for (slot, (name, array, len)) in ptrs.iter_mut().zip(arrays) {
            let Some(a) = array else { continue };
            crate::error::check_len(name, a.len(), len)?;
            let (ptr, guard) = word_array(gpu, name, a, "int32")?;
            *slot = ptr;
            guards.push(guard);
        }
        let mut accum = [0u64; 2];
        let mut ws_guard = None;
        if let Some(ws) = workspace {
            crate::error::check_len("workspace", ws.len(), self.workspace_len())?;
            check_streams(gpu, [("workspace", ws.stream())])?;
            let (ptr, guard) = ws.device_ptr_mut(stream);
            check_aligned([("workspace", ptr)])?;
            let o_len = self.workspace_len() / (p.head_dim + 1) * p.head_dim;
            accum = [ptr, ptr + 4 * o_len as u64];
            ws_guard = Some(guard);
        }
        // The score values: the caller's device arrays where given (only where the shape has
        // the modifier, as long as its host values), else the shape's host values copied for
        // this call.
        let values = [
            (
                "alibi_slopes",
                index.alibi_slopes,
                p.scores.alibi.as_ref().map(|a| a.slopes.len()),
                "ALiBi (ScoreMods::alibi)",
            ),
            (
                "sink",
                index.sink,
                p.scores.sink.as_ref().map(Vec::len),
                "a learnable sink (ScoreMods::sink)",
            ),
        ];
        let mut value_ptrs = [0u64; 2];
        for (slot, (name, array, len, what)) in value_ptrs.iter_mut().zip(values) {
            let Some(a) = array else { continue };
            let Some(len) = len else {
                return Err(AttnError::InvalidInput {
                    what: format!(
                        "{name} was given on the device, but the call was planned without {what}: plan the shape with it, or pass None"
                    ),
                });
            };
            crate::error::check_len(name, a.len(), len)?;
            let (ptr, guard) = word_array(gpu, name, a, "float32")?;
            *slot = ptr;
            guards.push(guard);
        }
        let host_scores = crate::scores::ScoreMods {
            alibi: p
                .scores
                .alibi
                .clone()
                .filter(|_| index.alibi_slopes.is_none()),
            sink: p.scores.sink.clone().filter(|_| index.sink.is_none()),
            ..p.scores.clone()
        };
        let mods = ScoreBuffers::upload(gpu, &host_scores)?;
        let ([host_slopes, host_sink], mod_guards) = mods.ptrs(stream);
        let pick = |device: u64, host: u64| if device != 0 { device } else { host };
        let (slopes, sink) = (
            pick(value_ptrs[0], host_slopes),
            pick(value_ptrs[1], host_sink),
        );
        let extras = Extras {
            index: ptrs,
            slopes,
            sink,
            accum,
        };
        // SAFETY: every address in `extras` was checked against the shape above (lengths,
        // context, alignment) and stays alive with its guard to the end of this function.
        let result = unsafe { self.launch_all(gpu, t, &extras) };
        drop((guards, ws_guard, mod_guards));
        result
    }

    /// Checks the tensors and launches the kernels.
    ///
    /// # Safety
    /// Every address of `x` holds what the shape says (its lengths, in the Gpu's context).
    unsafe fn launch_all<T: GpuElement>(
        &self,
        gpu: &Gpu,
        t: DecodeTensors<'_, T>,
        x: &Extras,
    ) -> Result<LaunchInfo> {
        let p = &self.shape;
        if T::DTYPE != self.dtype {
            return Err(AttnError::DTypeMismatch {
                what: format!(
                    "the call was planned for {} buffers, these are {}",
                    self.dtype,
                    T::DTYPE
                ),
            });
        }
        let len2 = |x: &Option<(&dyn DevicePtr<T>, &dyn DevicePtr<T>)>| {
            x.as_ref().map_or([0, 0], |(a, b)| [a.len(), b.len()])
        };
        let (new_lens, table_lens) = (len2(&t.new), len2(&t.rotary));
        if p.seqlen_new > 0 && t.new.is_none() {
            return Err(AttnError::InvalidInput {
                what: format!(
                    "seqlen_new is {} but no new k/v rows were given",
                    p.seqlen_new
                ),
            });
        }
        if p.rotary.is_some() && t.rotary.is_none() {
            return Err(AttnError::InvalidInput {
                what: "the call has a rotary embedding but no rotary_cos/rotary_sin were given"
                    .into(),
            });
        }
        // Given where the shape has none (new rows with seqlen_new 0, tables without rotary).
        let present = |x: bool| [usize::from(x), usize::from(x)];
        p.check_extras(present(t.new.is_some()), present(t.rotary.is_some()))?;
        p.check_buffers(&[
            ("q", t.q.len()),
            ("k_cache", t.k_cache.len()),
            ("v_cache", t.v_cache.len()),
            ("k_new", new_lens[0]),
            ("v_new", new_lens[1]),
            ("rotary_cos", table_lens[0]),
            ("rotary_sin", table_lens[1]),
            ("o", t.o.len()),
            ("lse", t.lse.len()),
        ])?;
        check_contexts!(gpu; "q" => t.q, "k_cache" => t.k_cache, "v_cache" => t.v_cache,
            "o" => t.o, "lse" => t.lse)?;
        let stream = gpu.stream();
        let (qp, _gq) = t.q.device_ptr(stream);
        let (kcp, _gk) = t.k_cache.device_ptr_mut(stream);
        let (vcp, _gv) = t.v_cache.device_ptr_mut(stream);
        let (op, _go) = t.o.device_ptr_mut(stream);
        let (lp, _gl) = t.lse.device_ptr_mut(stream);
        check_aligned([("q", qp), ("k_cache", kcp), ("v_cache", vcp), ("o", op)])?;
        let mut rot = RotaryMap::default();
        let mut _rot_guards = None;
        if let (Some((cos, sin)), Some(r)) = (&t.rotary, &p.rotary) {
            check_contexts!(gpu; "rotary_cos" => cos, "rotary_sin" => sin)?;
            let ((cp, gc), (sp, gs)) = (cos.device_ptr(stream), sin.device_ptr(stream));
            if !cp.is_multiple_of(2) || !sp.is_multiple_of(2) {
                return Err(AttnError::InvalidStrides {
                    tensor: "rotary_cos",
                    reason: "the rotary tables must be 2-byte aligned".into(),
                });
            }
            rot = RotaryMap {
                cos: cp,
                sin: sp,
                dim: r.dim as i32,
                seqlen_ro: r.seqlen_ro as i32,
                per_row: i32::from(p.rotary_per_row()),
            };
            _rot_guards = Some((gc, gs));
        }
        let map = cache_map(p, x.index);
        if let Some((k, v)) = &t.new {
            check_contexts!(gpu; "k_new" => k, "v_new" => v)?;
            let ((kp, _gkn), (vp, _gvn)) = (k.device_ptr(stream), v.device_ptr(stream));
            check_aligned([("k_new", kp), ("v_new", vp)])?;
            if let Some(k) = &self.kernels.append {
                // SAFETY: the buffers were checked above, the index arrays by the caller.
                unsafe { launch::append(gpu, k, p, &self.env, [kp, vp, kcp, vcp], (map, rot))? };
            }
        }
        let launch = Launch {
            alibi: x.slopes,
            sink: x.sink,
            ..Launch::dense(&self.env, T::DTYPE, [qp, kcp, vcp, op, lp])
        };
        let dp = DecodeParams {
            o_accum: x.accum[0],
            lse_accum: x.accum[1],
            num_splits: self.splits as i32,
            map,
            rot,
        };
        // SAFETY: as above; the partials hold splits x rows entries (the workspace's length
        // was checked) with more than one split.
        let mut result = unsafe { launch::decode(gpu, &self.kernels, p, &launch, dp)? };
        if let Some(k) = &self.kernels.combine {
            // SAFETY: as above.
            unsafe { launch::combine(gpu, k, p, &launch, x.accum, self.splits)? };
        }
        let splits = self.splits;
        let mut features: Vec<String> = Vec::new();
        if p.seqlen_new > 0 {
            features.push(format!("{} rows appended by kv_append", p.seqlen_new));
        }
        if let Some(r) = &p.rotary {
            features.push(format!(
                "rotary {}{}",
                r.dim,
                if r.interleaved { " interleaved" } else { "" }
            ));
        }
        if p.batch_idx {
            features.push("cache_batch_idx".into());
        }
        if p.leftpad {
            features.push("cache_leftpad".into());
        }
        result.why = format!(
            "KV-cache decode: {} cache, {splits} split{}{}",
            if p.is_paged() { "paged" } else { "contiguous" },
            if splits == 1 { "" } else { "s + attn_combine" },
            features
                .iter()
                .map(|f| format!(", {f}"))
                .collect::<String>()
        );
        Ok(result)
    }
}

/// The kernels' CacheMap of a shape with the index arrays at `index`.
fn cache_map(p: &KvCacheShape, index: [u64; 4]) -> CacheMap {
    let (page_size, max_blocks, num_blocks, cache_batch) = match p.cache {
        CacheDims::Paged {
            num_blocks,
            page_size,
            max_blocks,
        } => (page_size, max_blocks, num_blocks, p.batch),
        CacheDims::Contiguous { cache_batch, .. } => (0, 0, 0, cache_batch),
    };
    // check_gpu bounds every size below i32::MAX.
    CacheMap {
        cache_seqlens: index[0],
        block_table: index[1],
        max_blocks: max_blocks as i32,
        page_size: page_size as i32,
        seqlen_new: p.seqlen_new as i32,
        capacity: p.capacity() as i32,
        num_blocks: num_blocks as i32,
        cache_batch: cache_batch as i32,
        cache_batch_idx: index[2],
        cache_leftpad: index[3],
    }
}

/// A decoding call whose index arrays are on the host, prepared for the GPU (see the module
/// docs): the problem validated, the split count chosen from its lengths, its index arrays,
/// ALiBi slopes, learnable sink and split-KV workspace on the device. [`DecodePlan::run`] then only launches
/// kernels, so a decoding loop that keeps its shapes pays for this once; [`forward_device`]
/// plans and runs in one call.
pub struct DecodePlan {
    problem: KvCacheProblem,
    launch: DecodeLaunch,
    seqlens: CudaSlice<i32>,
    table: Option<CudaSlice<i32>>,
    batch_idx: Option<CudaSlice<i32>>,
    leftpad: Option<CudaSlice<i32>>,
    slopes: Option<CudaSlice<f32>>,
    sink: Option<CudaSlice<f32>>,
    workspace: Option<CudaSlice<f32>>,
}

impl DecodePlan {
    /// Validates `p` for the GPU and element type `dtype` (f16 or bf16), picks the split count
    /// (`splits`, or the heuristic for `None`: [`splits_for`] with the longest sequence),
    /// compiles (or finds) the kernels and copies the index arrays to the device (on
    /// `gpu.stream()`).
    ///
    /// # Errors
    /// [`KvCacheProblem::validate`]'s; those of [`DecodeLaunch::new`]; allocation and copy
    /// failures as [`AttnError::Cuda`].
    pub fn new(gpu: &Gpu, p: &KvCacheProblem, dtype: DType, splits: Option<usize>) -> Result<Self> {
        Self::with_tile(gpu, p, dtype, splits, None)
    }

    /// [`DecodePlan::new`] with the tile forced (`None`: the library's choice,
    /// [`DecodeTile::for_call`]), for benchmarks.
    ///
    /// # Errors
    /// Those of [`DecodePlan::new`] and [`DecodeLaunch::with_tile`].
    pub fn with_tile(
        gpu: &Gpu,
        p: &KvCacheProblem,
        dtype: DType,
        splits: Option<usize>,
        tile: Option<DecodeTile>,
    ) -> Result<Self> {
        p.validate()?;
        let launch = DecodeLaunch::planned(gpu, &p.shape(), dtype, splits, tile, p.max_seqlen_k())?;
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
        let opt = |x: &Option<Vec<i32>>, what: &str| x.as_deref().map(|v| up(v, what)).transpose();
        let workspace = match launch.workspace_len() {
            0 => None,
            n => Some(
                stream
                    .alloc_zeros(n)
                    .map_err(cuda_err("allocating the split-KV partials"))?,
            ),
        };
        Ok(DecodePlan {
            seqlens: up(&p.cache_seqlens, "cache_seqlens")?,
            table,
            batch_idx: opt(&p.cache_batch_idx, "cache_batch_idx")?,
            leftpad: opt(&p.cache_leftpad, "cache_leftpad")?,
            slopes: upload_slopes(gpu, &p.scores)?,
            sink: upload_sink(gpu, &p.scores)?,
            workspace,
            launch,
            problem: p.clone(),
        })
    }

    /// Takes the next decoding step's index values (cache lengths, block table, cache
    /// sequences, left padding), the only things that change from step to step of a loop:
    /// `p` must be the planned problem in everything else (batch, heads, head_dim, seqlen_q,
    /// seqlen_new, layout sizes, mask, scale, modifiers, rotary). Copies them to the device on
    /// `gpu.stream()`, ordered after the launches already queued (the previous step reads the
    /// old values). The split count stays the planned one.
    ///
    /// # Errors
    /// [`KvCacheProblem::validate`]'s; [`AttnError::InvalidInput`] when `p` differs from the
    /// plan in anything else (make a new plan); copy failures as [`AttnError::Cuda`].
    pub fn update(&mut self, gpu: &Gpu, p: &KvCacheProblem) -> Result<()> {
        p.validate()?;
        if p.shape() != self.problem.shape() {
            return Err(AttnError::InvalidInput {
                what: "DecodePlan::update takes new index values only; this problem differs in its sizes, layout, mask, modifiers or rotary embedding: make a new plan".into(),
            });
        }
        let stream = gpu.stream();
        let copy = |x: &[i32], to: &mut CudaSlice<i32>, what: &str| {
            stream
                .memcpy_htod(x, to)
                .map_err(cuda_err(format!("copying {what} to the device")))
        };
        copy(&p.cache_seqlens, &mut self.seqlens, "cache_seqlens")?;
        if let (CacheLayout::Paged { block_table, .. }, Some(table)) = (&p.layout, &mut self.table)
        {
            copy(block_table, table, "block_table")?;
        }
        if let (Some(x), Some(to)) = (&p.cache_batch_idx, &mut self.batch_idx) {
            copy(x, to, "cache_batch_idx")?;
        }
        if let (Some(x), Some(to)) = (&p.cache_leftpad, &mut self.leftpad) {
            copy(x, to, "cache_leftpad")?;
        }
        self.problem = p.clone();
        Ok(())
    }

    /// The split count the plan runs.
    pub fn splits(&self) -> usize {
        self.launch.splits()
    }

    /// The planned problem.
    pub fn problem(&self) -> &KvCacheProblem {
        &self.problem
    }

    /// Runs the planned call on device buffers ([`DecodeTensors`] says what each holds):
    /// asynchronous on `gpu.stream()`; the same bytes run to run.
    ///
    /// # Errors
    /// Those of [`DecodeLaunch::run`].
    pub fn run<T: GpuElement>(&self, gpu: &Gpu, t: DecodeTensors<'_, T>) -> Result<LaunchInfo> {
        let stream = gpu.stream();
        let (seqlens, _g) = self.seqlens.device_ptr(stream);
        let (table, batch_idx, leftpad) = (
            self.table.as_ref().map(|s| s.device_ptr(stream)),
            self.batch_idx.as_ref().map(|s| s.device_ptr(stream)),
            self.leftpad.as_ref().map(|s| s.device_ptr(stream)),
        );
        let alibi = self.slopes.as_ref().map(|d| d.device_ptr(stream));
        let sink = self.sink.as_ref().map(|d| d.device_ptr(stream));
        let ws = self.workspace.as_ref().map(|w| w.device_ptr(stream));
        let addr = |x: &Option<(u64, _)>| x.as_ref().map_or(0, |(p, _)| *p);
        let o_len =
            self.launch.workspace_len() / (self.problem.head_dim + 1) * self.problem.head_dim;
        let extras = Extras {
            index: [seqlens, addr(&table), addr(&batch_idx), addr(&leftpad)],
            slopes: addr(&alibi),
            sink: addr(&sink),
            accum: ws
                .as_ref()
                .map_or([0, 0], |(p, _)| [*p, p + 4 * o_len as u64]),
        };
        // SAFETY: the plan's own arrays and workspace, of the planned problem's lengths,
        // alive (with their guards) to the end of this function.
        unsafe { self.launch.launch_all(gpu, t, &extras) }
    }
}

/// Plans and runs one decoding call whose index arrays are on the host ([`DecodePlan::new`],
/// then [`DecodePlan::run`]).
///
/// # Errors
/// Those of both.
pub fn forward_device<T: GpuElement>(
    gpu: &Gpu,
    p: &KvCacheProblem,
    t: DecodeTensors<'_, T>,
    splits: Option<usize>,
) -> Result<LaunchInfo> {
    DecodePlan::new(gpu, p, T::DTYPE, splits)?.run(gpu, t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem() -> KvCacheProblem {
        KvCacheProblem::new(
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
        .unwrap()
    }

    #[test]
    fn split_counts_are_checked_and_chosen_per_sm() {
        let p = problem().shape();
        assert!(matches!(
            splits_for(&p, 132, 32768, Some(0)),
            Err(AttnError::InvalidInput { .. })
        ));
        assert!(splits_for(&p, 132, 32768, Some(MAX_SPLITS + 1)).is_err());
        assert_eq!(splits_for(&p, 132, 32768, Some(7)).unwrap(), 7);
        // 8 blocks per split on 132 SMs: 16 splits (128 blocks), as measured best (run 47).
        assert_eq!(splits_for(&p, 132, 32768, None).unwrap(), 16);
        assert!(
            check_gpu(&KvCacheShape {
                head_dim: 36,
                ..p.clone()
            })
            .is_err()
        );
    }

    /// DecodePlan::update takes a problem whose shape is the plan's: new index values only.
    #[test]
    fn a_plan_takes_new_index_values_only() {
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
        assert_eq!(next.shape(), p.shape());
        assert_ne!(next.index(), p.index());
        let other = KvCacheProblem {
            seqlen_new: 2,
            ..next.clone()
        };
        assert_ne!(other.shape(), p.shape());
        assert_ne!(
            next.clone().with_mask(crate::Mask::Causal).shape(),
            p.shape()
        );
    }
}
