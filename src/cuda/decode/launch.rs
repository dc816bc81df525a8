//! The launches of a decoding call: kv_append, attn_decode (with the copy engine's tensor
//! maps where its tile takes them), attn_combine. Each takes parameter blocks whose addresses
//! the caller checked ([`super::DecodeLaunch::run`]).

use super::kernels::PlanKernels;
use super::params::{AppendParams, CacheMap, CombineParams, DecodeParams, RotaryMap};
use super::tile::{BULK_ENV, DECODE_ROWS};
use crate::cuda::runtime::device::{Gpu, LoadedKernel, cuda_err};
use crate::cuda::runtime::launch::{
    FlashParams, KernelKind, Launch, LaunchInfo, launch_context, push_sink,
};
use crate::error::{AttnError, Result};
use crate::problem::kvcache::{CacheDims, KvCacheShape};
use crate::shape::{AttnProblem, Strides};
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

/// Row blocks per (sequence, kv head): the packed rows `seqlen_q x group` in blocks of 16.
pub(super) fn row_blocks(p: &KvCacheShape) -> usize {
    (p.seqlen_q * (p.heads_q / p.heads_kv)).div_ceil(DECODE_ROWS)
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
///
/// # Safety
/// `k_new`, `v_new` hold `[batch, seqlen_new, heads_kv, head_dim]` compact, the caches the
/// shape's elements, the map's arrays their shape's entries and the rotary tables theirs.
pub(super) unsafe fn append(
    gpu: &Gpu,
    k: &LoadedKernel,
    p: &KvCacheShape,
    env: &AttnProblem,
    [kp, vp, kcp, vcp]: [u64; 4],
    (map, rot): (CacheMap, RotaryMap),
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
        rot,
    };
    // SAFETY: the parameters mirror the kernel's struct; the kernel clamps every index value
    // it reads (a length to capacity - seqlen_new, a page to the pool, a cache sequence to
    // the cache), so each appended row lies inside its sequence's capacity in the cache.
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
    p: &KvCacheShape,
    l: &Launch,
    bc: usize,
) -> std::result::Result<[crate::cuda::runtime::tma::TmaMap; 2], String> {
    let (rows, blocks, box_rows) = match p.cache {
        CacheDims::Contiguous {
            cache_batch,
            seqlen_cache,
        } => (seqlen_cache, cache_batch, bc),
        CacheDims::Paged {
            num_blocks,
            page_size,
            ..
        } => (page_size, num_blocks, page_size.min(bc)),
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
///
/// # Safety
/// The launch's buffers hold the shape's elements, `dp`'s partials `splits x rows` entries
/// (with more than one split), its map's arrays their entries and the rotary tables theirs.
pub(super) unsafe fn decode(
    gpu: &Gpu,
    ks: &PlanKernels,
    p: &KvCacheShape,
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
    // sink: heads_q of them); the caller checked every buffer's
    // length; the kernel clamps every index value it reads (lengths to the capacity, pages to
    // the pool, cache sequences to the cache, rotary positions to the tables); the tensor maps
    // describe exactly the two caches, and the copy engine reads nothing outside.
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
///
/// # Safety
/// The partials hold `splits x rows` entries; o and lse the shape's.
pub(super) unsafe fn combine(
    gpu: &Gpu,
    k: &LoadedKernel,
    p: &KvCacheShape,
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
    // kernel is compiled with HAS_SINK exactly then); the caller's contract.
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
