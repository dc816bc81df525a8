//! attn_decode's tile: warps, pipeline depth, Q placement and the copy engine path, chosen per
//! head_dim, device and call, and its shared memory.

use crate::dtype::DType;
use crate::problem::kvcache::CacheDims;

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
    /// The rows of a cache of dimensions `dims`.
    pub fn of(dims: &CacheDims) -> Self {
        match *dims {
            CacheDims::Contiguous { seqlen_cache, .. } => CacheRows::Contiguous { seqlen_cache },
            CacheDims::Paged {
                num_blocks,
                page_size,
                ..
            } => CacheRows::Paged {
                num_blocks,
                page_size,
            },
        }
    }
}

/// Environment variable that turns the copy engine path of the library's decode tiles
/// ([`DecodeTile::bulk`]) off: `0`.
pub const BULK_ENV: &str = "FLASHATTN_DECODE_BULK";

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
}
