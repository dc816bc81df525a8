//! The sizes and options of a decoding call without the values of its index arrays
//! (`cache_seqlens`, `block_table`, `cache_batch_idx`, `cache_leftpad`): everything the GPU
//! path needs on the host when those arrays live on the device, as they do for
//! FlashAttention-2's `flash_attn_with_kvcache` on CUDA tensors. Such a call reads no device
//! memory on the host (no copy, no synchronisation), so it can be captured in a CUDA graph and
//! replayed with new values in its arrays. [`super::KvCacheProblem::shape`] gives the shape of a
//! call whose arrays are on the host.
//!
//! The values of device arrays are not validated (FlashAttention-2 does not validate them
//! either). The kernels clamp every entry they read, so that no value moves an access outside
//! the buffers; [`clamp_index`] states that rule on the host:
//! - `cache_seqlens[b]` to `0..=capacity - seqlen_new` (the appended rows always fit);
//! - `cache_leftpad[b]` to `0..=cache_seqlens[b]` (after the clamp above);
//! - `cache_batch_idx[b]` to `0..cache_batch`;
//! - each block-table entry a sequence reads to `0..num_blocks`;
//! - a query row's rotary position to the last row of the tables.
//!
//! A call with out-of-range values thus computes the call with the clamped values: a defined
//! result, but not the caller's intent; callers that need a refusal validate on the host
//! ([`super::KvCacheProblem::validate`]).

use crate::error::{AttnError, Result};
use crate::mask::Mask;
use crate::scores::ScoreMods;
use crate::shape::check_scale;

/// Page sizes must be a multiple of this (the GPU kernels' key tile).
pub const PAGE_MULTIPLE: usize = 16;

/// The cache's dimensions (the block table's values apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheDims {
    /// `[cache_batch, seqlen_cache, heads_kv, head_dim]`.
    Contiguous {
        /// Sequences the cache holds: `batch`, or any count with `cache_batch_idx`.
        cache_batch: usize,
        /// Capacity per sequence.
        seqlen_cache: usize,
    },
    /// `[num_blocks, page_size, heads_kv, head_dim]` with a block table `[batch, max_blocks]`.
    Paged {
        /// Pages in the pool.
        num_blocks: usize,
        /// Keys per page (a multiple of [`PAGE_MULTIPLE`]).
        page_size: usize,
        /// Columns of the block table.
        max_blocks: usize,
    },
}

/// Rotary position embedding of a call (FlashAttention-2's `rotary_cos`, `rotary_sin`,
/// `rotary_interleaved`): the tables `rotary_cos`, `rotary_sin` are `[seqlen_ro, dim / 2]`,
/// row-major, of the call's element type. The first `dim` channels of each new key (before
/// it is written into the cache) and of each query are rotated in pairs at their positions
/// ([`super::rotary`] states the rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotary {
    /// Rotated channels: even, at most head_dim.
    pub dim: usize,
    /// Rows of the tables: at least the cache's capacity.
    pub seqlen_ro: usize,
    /// Pairs `(2k, 2k + 1)` (GPT-J style, FlashAttention-2's default) instead of
    /// `(k, k + dim / 2)` (GPT-NeoX style).
    pub interleaved: bool,
}

/// A decoding call's sizes and options (see the module docs; [`super::KvCacheProblem`] has the
/// field meanings).
#[derive(Debug, Clone, PartialEq)]
pub struct KvCacheShape {
    /// Sequences.
    pub batch: usize,
    /// Query rows per sequence.
    pub seqlen_q: usize,
    /// Query heads.
    pub heads_q: usize,
    /// Key/value heads.
    pub heads_kv: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// The cache's dimensions.
    pub cache: CacheDims,
    /// New key/value rows appended per sequence before attending.
    pub seqlen_new: usize,
    /// Causal (bottom-right per sequence) or not.
    pub mask: Mask,
    /// Multiplies `q k^T`.
    pub softmax_scale: f32,
    /// Window, softcap, ALiBi.
    pub scores: ScoreMods,
    /// Rotary embedding of the new keys and the queries.
    pub rotary: Option<Rotary>,
    /// `cache_batch_idx` `[batch]` is given (contiguous caches only).
    pub batch_idx: bool,
    /// `cache_leftpad` `[batch]` is given (contiguous caches only).
    pub leftpad: bool,
}

/// The values of a call's index arrays on the host.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostIndex {
    /// `[batch]`: each sequence's cache length before the call (the row its new keys go to).
    pub cache_seqlens: Vec<i32>,
    /// `[batch, max_blocks]` row-major (paged caches; empty for contiguous ones).
    pub block_table: Vec<i32>,
    /// `[batch]`: the cache sequence each batch entry uses.
    pub cache_batch_idx: Option<Vec<i32>>,
    /// `[batch]`: each sequence's first valid cache row.
    pub cache_leftpad: Option<Vec<i32>>,
}

option_builders!(KvCacheShape, |p| p.batch);

impl KvCacheShape {
    /// Keys a sequence can hold.
    pub fn capacity(&self) -> usize {
        match self.cache {
            CacheDims::Contiguous { seqlen_cache, .. } => seqlen_cache,
            CacheDims::Paged {
                page_size,
                max_blocks,
                ..
            } => page_size * max_blocks,
        }
    }

    /// Whether the cache is paged.
    pub fn is_paged(&self) -> bool {
        matches!(self.cache, CacheDims::Paged { .. })
    }

    /// Rows (keys) of the whole cache: sequences x capacity, or pages x page size.
    pub fn cache_rows(&self) -> usize {
        match self.cache {
            CacheDims::Contiguous {
                cache_batch,
                seqlen_cache,
            } => cache_batch * seqlen_cache,
            CacheDims::Paged {
                num_blocks,
                page_size,
                ..
            } => num_blocks * page_size,
        }
    }

    /// Elements of `k_cache` (and `v_cache`).
    pub fn cache_len(&self) -> usize {
        self.cache_rows() * self.heads_kv * self.head_dim
    }

    /// Entries of the block table (0 for a contiguous cache).
    pub fn table_len(&self) -> usize {
        match self.cache {
            CacheDims::Paged { max_blocks, .. } => self.batch * max_blocks,
            CacheDims::Contiguous { .. } => 0,
        }
    }

    /// Whether each query row takes its own rotary position (`cache_seqlens[b] + i`) rather
    /// than all of them `cache_seqlens[b]`: FlashAttention-2's rule, causal or a local window,
    /// a window side of at least the capacity counting as unbounded (as FA2 folds it).
    pub fn rotary_per_row(&self) -> bool {
        let cap = self.capacity();
        let bounded = |side: Option<usize>| side.is_some_and(|x| x < cap);
        self.mask.is_causal()
            || bounded(self.scores.window.left)
            || bounded(self.scores.window.right)
    }

    /// Checks every size and option that the host knows without the index values, so that
    /// no value of the device arrays (clamped: see the module docs) reads or writes outside
    /// the buffers.
    ///
    /// # Errors
    /// [`AttnError::ZeroDim`], [`AttnError::HeadsNotMultiple`]; [`AttnError::ShapeMismatch`]
    /// for a contiguous cache of another batch without `cache_batch_idx`;
    /// [`AttnError::InvalidInput`] for a page size that is not a positive multiple of
    /// [`PAGE_MULTIPLE`], an empty page pool or cache behind a non-zero capacity, more
    /// new rows than the capacity, and a rotary embedding of odd, zero or more than head_dim
    /// channels, with tables shorter than the capacity, or without new rows;
    /// [`AttnError::UnsupportedFeature`] for `cache_batch_idx` or `cache_leftpad` with a paged
    /// cache (FlashAttention-2 refuses both); [`AttnError::Overflow`]; the scale's and the
    /// modifiers' errors.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(AttnError::InvalidInput { what });
        for (name, x) in [
            ("batch", self.batch),
            ("seqlen_q", self.seqlen_q),
            ("heads_q", self.heads_q),
            ("heads_kv", self.heads_kv),
            ("head_dim", self.head_dim),
        ] {
            if x == 0 {
                return Err(AttnError::ZeroDim { name });
            }
        }
        if !self.heads_q.is_multiple_of(self.heads_kv) {
            return Err(AttnError::HeadsNotMultiple {
                heads_q: self.heads_q,
                heads_kv: self.heads_kv,
            });
        }
        let unsupported = |feature: &str, hint: &str| {
            Err(AttnError::UnsupportedFeature {
                feature: feature.into(),
                backend: "flashattn (as FlashAttention-2)".into(),
                hint: hint.into(),
            })
        };
        match self.cache {
            CacheDims::Paged {
                num_blocks,
                page_size,
                max_blocks,
            } => {
                if page_size == 0 || !page_size.is_multiple_of(PAGE_MULTIPLE) {
                    return bad(format!(
                        "page_size {page_size} is not a positive multiple of {} (the kernels' key tile)",
                        PAGE_MULTIPLE
                    ));
                }
                if num_blocks == 0 && max_blocks > 0 {
                    return bad(
                        "the page pool is empty (k_cache has 0 pages) but the block table has columns: pass the pool".into(),
                    );
                }
                if self.batch_idx {
                    return unsupported(
                        "cache_batch_idx with a paged cache",
                        "pass the block table's rows in the batch's order instead (block_table[cache_batch_idx])",
                    );
                }
                if self.leftpad {
                    return unsupported(
                        "cache_leftpad with a paged cache",
                        "start each sequence's block-table row at its first page, or use a contiguous cache",
                    );
                }
            }
            CacheDims::Contiguous {
                cache_batch,
                seqlen_cache,
            } => {
                if !self.batch_idx && cache_batch != self.batch {
                    return Err(AttnError::ShapeMismatch {
                        what: format!(
                            "the cache holds {cache_batch} sequences but q {}: pass caches of q's batch, or cache_batch_idx to pick a cache sequence for each batch entry",
                            self.batch
                        ),
                    });
                }
                if cache_batch == 0 && seqlen_cache > 0 {
                    return bad(
                        "the cache holds no sequence (its first dimension is 0): cache_batch_idx has nothing to pick".into(),
                    );
                }
            }
        }
        let cap = self.capacity();
        if self.seqlen_new > cap {
            return bad(format!(
                "{} new rows per sequence exceed the cache's capacity of {cap} keys: grow the cache (or the block table)",
                self.seqlen_new
            ));
        }
        if let Some(r) = &self.rotary {
            if r.dim == 0 || !r.dim.is_multiple_of(2) || r.dim > self.head_dim {
                return bad(format!(
                    "rotary_dim = {} (twice the columns of rotary_cos/rotary_sin): it must be even, above 0 and at most head_dim = {}",
                    r.dim, self.head_dim
                ));
            }
            if r.seqlen_ro < cap {
                return bad(format!(
                    "rotary_cos/rotary_sin have {} rows but the cache holds up to {cap} keys per sequence: the tables need a row per position (FlashAttention-2's rule)",
                    r.seqlen_ro
                ));
            }
            if self.seqlen_new == 0 {
                return bad(
                    "rotary_cos/rotary_sin embed the new rows: pass k and v (new rows) with them, as FlashAttention-2 requires".into(),
                );
            }
        }
        self.cache_rows()
            .checked_mul(self.heads_kv)
            .and_then(|r| r.checked_mul(self.head_dim))
            .filter(|&n| n <= i64::MAX as usize)
            .ok_or_else(|| AttnError::Overflow {
                what: "the element count of the cache".into(),
            })?;
        check_scale(self.softmax_scale)?;
        self.scores.validate(self.batch, self.heads_q)
    }

    /// Checks buffer lengths: `q` (and `o`) `[batch, seqlen_q, heads_q, head_dim]`, `lse`
    /// `[batch, heads_q, seqlen_q]`, `k_cache` and `v_cache`, the new rows `k_new`, `v_new`
    /// `[batch, seqlen_new, heads_kv, head_dim]`, `rotary_cos` and `rotary_sin`
    /// `[seqlen_ro, rotary_dim / 2]` (none without rotary).
    ///
    /// # Errors
    /// [`AttnError::BufferTooShort`] naming the first buffer that is too short.
    pub fn check_buffers(&self, lens: &[(&'static str, usize)]) -> Result<()> {
        for &(tensor, len) in lens {
            let required = match tensor {
                "q" | "o" => self.batch * self.seqlen_q * self.heads_q * self.head_dim,
                "lse" => self.batch * self.heads_q * self.seqlen_q,
                "k_new" | "v_new" => self.batch * self.seqlen_new * self.heads_kv * self.head_dim,
                "rotary_cos" | "rotary_sin" => self.rotary.map_or(0, |r| r.seqlen_ro * r.dim / 2),
                _ => self.cache_len(),
            };
            crate::error::check_len(tensor, len, required)?;
        }
        Ok(())
    }

    /// Rows given in `k_new`/`v_new` (their element counts `new`) and rotary tables (`tables`)
    /// must match the shape: new rows only with `seqlen_new` > 0 (they would be dropped
    /// otherwise), tables only with a rotary embedding.
    ///
    /// # Errors
    /// [`AttnError::InvalidInput`] naming what would be ignored.
    pub fn check_extras(&self, new: [usize; 2], tables: [usize; 2]) -> Result<()> {
        if self.seqlen_new == 0 && new.iter().any(|&n| n > 0) {
            return Err(AttnError::InvalidInput {
                what: "new k/v rows were given but seqlen_new is 0: set seqlen_new to their row count (or pass empty slices)".into(),
            });
        }
        if self.rotary.is_none() && tables.iter().any(|&n| n > 0) {
            return Err(AttnError::InvalidInput {
                what: "rotary tables were given but the call has no rotary embedding: set it (with_rotary) or pass empty tables".into(),
            });
        }
        Ok(())
    }
}

/// The device's clamping rule (see the module docs) applied to index values on the host:
/// what a GPU call with the device arrays `raw` computes is the call with these values. The
/// block table and the optional arrays are clamped entry by entry; entries a shape lacks
/// (a table on a contiguous cache) are dropped.
pub fn clamp_index(shape: &KvCacheShape, raw: &HostIndex) -> HostIndex {
    let most = shape.capacity().saturating_sub(shape.seqlen_new) as i64;
    let lens: Vec<i32> = raw
        .cache_seqlens
        .iter()
        .map(|&l| i64::from(l).clamp(0, most) as i32)
        .collect();
    let block_table = match shape.cache {
        CacheDims::Paged { num_blocks, .. } => raw
            .block_table
            .iter()
            .map(|&x| x.clamp(0, num_blocks.saturating_sub(1) as i32))
            .collect(),
        CacheDims::Contiguous { .. } => Vec::new(),
    };
    let cache_batch = match shape.cache {
        CacheDims::Contiguous { cache_batch, .. } => cache_batch,
        CacheDims::Paged { .. } => shape.batch,
    };
    let cache_batch_idx = raw.cache_batch_idx.as_ref().map(|idx| {
        idx.iter()
            .map(|&x| x.clamp(0, cache_batch.saturating_sub(1) as i32))
            .collect()
    });
    let cache_leftpad = raw.cache_leftpad.as_ref().map(|pad| {
        pad.iter()
            .zip(&lens)
            .map(|(&x, &l)| x.clamp(0, l))
            .collect()
    });
    HostIndex {
        cache_seqlens: lens,
        block_table,
        cache_batch_idx,
        cache_leftpad,
    }
}
