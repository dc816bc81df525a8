//! Decoding against a KV cache (FlashAttention-2's `flash_attn_with_kvcache`): the problem
//! description, its validation, appending new keys and values in place, the exact oracle and
//! the CPU backend with split-KV and its exact combine ([`cpu`]).
//!
//! - `k_cache`/`v_cache`: contiguous `[cache_batch, seqlen_cache, heads_kv, head_dim]`
//!   (`cache_batch` = `batch` unless `cache_batch_idx` is given), or paged
//!   `[num_blocks, page_size, heads_kv, head_dim]` with `block_table` `[batch, max_blocks]`
//!   (i32): key `j` of sequence `b` sits in page `block_table[b][j / page_size]`, row
//!   `j % page_size`;
//! - `cache_seqlens` `[batch]` (i32): the end of each sequence's cached keys before this call,
//!   the cache row its new keys go to;
//! - `cache_batch_idx` `[batch]` (i32, contiguous caches): batch entry `b` uses cache sequence
//!   `cache_batch_idx[b]` (default `b`);
//! - `cache_leftpad` `[batch]` (i32, contiguous caches): sequence `b`'s keys start at cache
//!   row `cache_leftpad[b]` (default 0); rows before it are not read;
//! - optional new `k`/`v` `[batch, seqlen_new, heads_kv, head_dim]`, written into the cache at
//!   rows `cache_seqlens[b]..cache_seqlens[b] + seqlen_new` before attending (in place, as
//!   FA2), k rotated first with a rotary embedding ([`rotary`]);
//! - `q` `[batch, seqlen_q, heads_q, head_dim]` (rotated with a rotary embedding); sequence
//!   `b` attends to its `seqlen_k(b) = cache_seqlens[b] - cache_leftpad[b] + seqlen_new` keys
//!   (rows `cache_leftpad[b]..`); causal aligns its queries to that length (bottom right), and
//!   the window, softcap and ALiBi are [`crate::scores`]'s, in those key indices;
//! - `o` like q; `lse` `[batch, heads_q, seqlen_q]`.
//!
//! [`KvCacheProblem`] holds the index arrays' values (on the host); [`KvCacheShape`] is the
//! same call without them, which is all that the GPU path needs when the arrays live on the
//! device (its module says how the kernels clamp the values they read).
//!
//! Split-KV: the keys of each sequence are cut into `splits` runs of whole 64-key blocks, each
//! run gives a partial `(o, lse)`, and [`crate::merge`] combines them exactly; a split with no
//! keys contributes nothing. [`num_splits`] picks the count from the SM count and the lengths.
//! The GPU path ([`crate::cuda::decode`], reached through [`crate::dispatch::kvcache::forward`])
//! cuts splits the same way in whole tiles of its own key block (64 or 128 keys).

pub mod cpu;
pub mod rotary;
pub mod shape;

pub use cpu::{
    KvCacheOutput, MAX_SPLITS, SPLIT_BLOCK, forward_cpu, num_splits, reference, split_range,
};
pub use rotary::RotaryTables;
pub use shape::{CacheDims, HostIndex, KvCacheShape, PAGE_MULTIPLE, Rotary, clamp_index};

use crate::dtype::Element;
use crate::error::{AttnError, Result};
use crate::mask::Mask;
use crate::problem::varlen::VarlenProblem;
use crate::scores::ScoreMods;

/// Where the cache lives.
#[derive(Debug, Clone, PartialEq)]
pub enum CacheLayout {
    /// `[cache_batch, seqlen_cache, heads_kv, head_dim]`.
    Contiguous {
        /// Capacity per sequence.
        seqlen_cache: usize,
    },
    /// `[num_blocks, page_size, heads_kv, head_dim]` with a block table.
    Paged {
        /// Pages in the pool.
        num_blocks: usize,
        /// Keys per page (a multiple of [`PAGE_MULTIPLE`]).
        page_size: usize,
        /// `[batch, max_blocks]`, row-major: the pages of each sequence in order.
        block_table: Vec<i32>,
        /// Columns of the block table (pages a sequence can hold).
        max_blocks: usize,
    },
}

/// A decoding call against a KV cache (see the module docs), its index arrays on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct KvCacheProblem {
    /// Sequences.
    pub batch: usize,
    /// Query rows per sequence.
    pub seqlen_q: usize,
    /// Query heads.
    pub heads_q: usize,
    /// Key/value heads (divides `heads_q`).
    pub heads_kv: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// The cache's layout.
    pub layout: CacheLayout,
    /// The end of each sequence's cached keys before this call, `[batch]`.
    pub cache_seqlens: Vec<i32>,
    /// New key/value rows appended per sequence before attending (0: none).
    pub seqlen_new: usize,
    /// Causal (bottom-right per sequence) or not.
    pub mask: Mask,
    /// Multiplies `q k^T`; default `1/sqrt(head_dim)`.
    pub softmax_scale: f32,
    /// Window, softcap, ALiBi.
    pub scores: ScoreMods,
    /// Sequences of a contiguous cache (`batch` unless `cache_batch_idx` picks among them).
    pub cache_batch: usize,
    /// The cache sequence of each batch entry, `[batch]` (contiguous caches).
    pub cache_batch_idx: Option<Vec<i32>>,
    /// Each sequence's first valid cache row, `[batch]` (contiguous caches).
    pub cache_leftpad: Option<Vec<i32>>,
    /// Rotary embedding of the new keys and the queries.
    pub rotary: Option<Rotary>,
}

option_builders!(KvCacheProblem, |p| p.batch);

impl KvCacheProblem {
    /// A problem with the default scale, no mask, no modifiers, a cache of `batch`
    /// sequences (contiguous) and no rotary embedding.
    ///
    /// # Errors
    /// Those of [`Self::validate`].
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        batch: usize,
        seqlen_q: usize,
        heads_q: usize,
        heads_kv: usize,
        head_dim: usize,
        layout: CacheLayout,
        cache_seqlens: Vec<i32>,
        seqlen_new: usize,
    ) -> Result<Self> {
        let p = KvCacheProblem {
            batch,
            seqlen_q,
            heads_q,
            heads_kv,
            head_dim,
            layout,
            cache_seqlens,
            seqlen_new,
            mask: Mask::None,
            softmax_scale: crate::shape::default_scale(head_dim),
            scores: ScoreMods::default(),
            cache_batch: batch,
            cache_batch_idx: None,
            cache_leftpad: None,
            rotary: None,
        };
        p.validate()?;
        Ok(p)
    }

    /// The call of `shape` with the index values `index` (the block table ignored for a
    /// contiguous cache).
    ///
    /// # Errors
    /// Those of [`Self::validate`].
    pub fn from_shape(shape: &KvCacheShape, index: HostIndex) -> Result<Self> {
        let (layout, cache_batch) = match shape.cache {
            CacheDims::Contiguous {
                cache_batch,
                seqlen_cache,
            } => (CacheLayout::Contiguous { seqlen_cache }, cache_batch),
            CacheDims::Paged {
                num_blocks,
                page_size,
                max_blocks,
            } => (
                CacheLayout::Paged {
                    num_blocks,
                    page_size,
                    block_table: index.block_table,
                    max_blocks,
                },
                shape.batch,
            ),
        };
        let present = |given: bool, what: &str, x: &Option<Vec<i32>>| {
            if given != x.is_some() {
                return Err(AttnError::InvalidInput {
                    what: format!(
                        "{what}: the shape says {}, the index {}",
                        if given { "given" } else { "absent" },
                        if x.is_some() { "has it" } else { "lacks it" }
                    ),
                });
            }
            Ok(())
        };
        present(shape.batch_idx, "cache_batch_idx", &index.cache_batch_idx)?;
        present(shape.leftpad, "cache_leftpad", &index.cache_leftpad)?;
        let p = KvCacheProblem {
            batch: shape.batch,
            seqlen_q: shape.seqlen_q,
            heads_q: shape.heads_q,
            heads_kv: shape.heads_kv,
            head_dim: shape.head_dim,
            layout,
            cache_seqlens: index.cache_seqlens,
            seqlen_new: shape.seqlen_new,
            mask: shape.mask,
            softmax_scale: shape.softmax_scale,
            scores: shape.scores.clone(),
            cache_batch,
            cache_batch_idx: index.cache_batch_idx,
            cache_leftpad: index.cache_leftpad,
            rotary: shape.rotary,
        };
        p.validate()?;
        Ok(p)
    }

    /// This call with a rotary embedding.
    ///
    /// # Errors
    /// Those of [`Self::validate`].
    pub fn with_rotary(mut self, rotary: Rotary) -> Result<Self> {
        self.rotary = Some(rotary);
        self.validate()?;
        Ok(self)
    }

    /// This call on a contiguous cache of `cache_batch` sequences, batch entry `b` using
    /// sequence `idx[b]`.
    ///
    /// # Errors
    /// Those of [`Self::validate`].
    pub fn with_cache_batch_idx(mut self, cache_batch: usize, idx: Vec<i32>) -> Result<Self> {
        self.cache_batch = cache_batch;
        self.cache_batch_idx = Some(idx);
        self.validate()?;
        Ok(self)
    }

    /// This call with each sequence's keys starting at cache row `leftpad[b]`.
    ///
    /// # Errors
    /// Those of [`Self::validate`].
    pub fn with_leftpad(mut self, leftpad: Vec<i32>) -> Result<Self> {
        self.cache_leftpad = Some(leftpad);
        self.validate()?;
        Ok(self)
    }

    /// The call's sizes and options without its index values.
    pub fn shape(&self) -> KvCacheShape {
        let cache = match &self.layout {
            CacheLayout::Contiguous { seqlen_cache } => CacheDims::Contiguous {
                cache_batch: self.cache_batch,
                seqlen_cache: *seqlen_cache,
            },
            CacheLayout::Paged {
                num_blocks,
                page_size,
                max_blocks,
                ..
            } => CacheDims::Paged {
                num_blocks: *num_blocks,
                page_size: *page_size,
                max_blocks: *max_blocks,
            },
        };
        KvCacheShape {
            batch: self.batch,
            seqlen_q: self.seqlen_q,
            heads_q: self.heads_q,
            heads_kv: self.heads_kv,
            head_dim: self.head_dim,
            cache,
            seqlen_new: self.seqlen_new,
            mask: self.mask,
            softmax_scale: self.softmax_scale,
            scores: self.scores.clone(),
            rotary: self.rotary,
            batch_idx: self.cache_batch_idx.is_some(),
            leftpad: self.cache_leftpad.is_some(),
        }
    }

    /// The call's index values.
    pub fn index(&self) -> HostIndex {
        HostIndex {
            cache_seqlens: self.cache_seqlens.clone(),
            block_table: match &self.layout {
                CacheLayout::Paged { block_table, .. } => block_table.clone(),
                CacheLayout::Contiguous { .. } => Vec::new(),
            },
            cache_batch_idx: self.cache_batch_idx.clone(),
            cache_leftpad: self.cache_leftpad.clone(),
        }
    }

    /// Keys a sequence can hold.
    pub fn capacity(&self) -> usize {
        match &self.layout {
            CacheLayout::Contiguous { seqlen_cache } => *seqlen_cache,
            CacheLayout::Paged {
                page_size,
                max_blocks,
                ..
            } => page_size * max_blocks,
        }
    }

    /// The most keys any sequence attends to.
    pub fn max_seqlen_k(&self) -> usize {
        (0..self.batch).map(|b| self.seqlen_k(b)).max().unwrap_or(0)
    }

    /// The first cache row of sequence `b` (its `cache_leftpad`, 0 without).
    pub fn start(&self, b: usize) -> usize {
        self.cache_leftpad
            .as_ref()
            .map_or(0, |pad| pad[b].max(0) as usize)
    }

    /// The cache sequence batch entry `b` uses (its `cache_batch_idx`, `b` without).
    pub fn cache_sequence(&self, b: usize) -> usize {
        self.cache_batch_idx
            .as_ref()
            .map_or(b, |idx| idx[b].max(0) as usize)
    }

    /// Keys sequence `b` attends to (its cached keys from its first row, plus the appended
    /// rows).
    pub fn seqlen_k(&self, b: usize) -> usize {
        (self.cache_seqlens[b].max(0) as usize).saturating_sub(self.start(b)) + self.seqlen_new
    }

    /// Checks every size, offset and index value, so that nothing reads or writes outside the
    /// buffers, and that the call means one thing.
    ///
    /// # Errors
    /// [`KvCacheShape::validate`]'s; [`AttnError::InvalidInput`] naming the entry:
    /// `cache_seqlens` of the wrong length or negative, a sequence whose cache plus the
    /// appended rows exceed its capacity, a block table of the wrong size, a page index
    /// outside `0..num_blocks` among the pages a sequence uses, or a page that two sequences
    /// both append to; `cache_batch_idx` of the wrong length, an entry outside
    /// `0..cache_batch`, or one repeated in a call with new rows (two sequences would append
    /// to one cache sequence); `cache_leftpad` of the wrong length or an entry outside
    /// `0..=cache_seqlens[b]`; a query row whose rotary position is past the tables' end.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(AttnError::InvalidInput { what });
        let shape = self.shape();
        shape.validate()?;
        let counted = |name: &str, n: usize| {
            if n != self.batch {
                return bad(format!(
                    "{name} has {n} entries; expected one per sequence ({})",
                    self.batch
                ));
            }
            Ok(())
        };
        counted("cache_seqlens", self.cache_seqlens.len())?;
        let cap = self.capacity();
        for (b, &l) in self.cache_seqlens.iter().enumerate() {
            if l < 0 {
                return bad(format!("cache_seqlens[{b}] = {l} is negative"));
            }
            if l as usize + self.seqlen_new > cap {
                return bad(format!(
                    "sequence {b}: cache_seqlens {l} + {} new rows exceed the cache's capacity of {cap} keys; grow the cache (or the block table) or evict",
                    self.seqlen_new
                ));
            }
        }
        if let Some(idx) = &self.cache_batch_idx {
            counted("cache_batch_idx", idx.len())?;
            let mut seen = vec![usize::MAX; self.cache_batch];
            for (b, &c) in idx.iter().enumerate() {
                if c < 0 || c as usize >= self.cache_batch {
                    return bad(format!(
                        "cache_batch_idx[{b}] = {c} is outside the cache's {} sequences",
                        self.cache_batch
                    ));
                }
                let first = &mut seen[c as usize];
                if self.seqlen_new > 0 && *first != usize::MAX {
                    return bad(format!(
                        "cache_batch_idx[{}] and cache_batch_idx[{b}] are both {c} in a call that appends rows: each appending sequence needs its own cache sequence",
                        *first
                    ));
                }
                *first = b;
            }
        }
        if let Some(pad) = &self.cache_leftpad {
            counted("cache_leftpad", pad.len())?;
            for (b, (&x, &l)) in pad.iter().zip(&self.cache_seqlens).enumerate() {
                if x < 0 || x > l {
                    return bad(format!(
                        "cache_leftpad[{b}] = {x} is outside 0..=cache_seqlens[{b}] = {l}: a sequence starts at or before its end"
                    ));
                }
            }
        }
        if let Some(r) = &self.rotary {
            for (b, &l) in self.cache_seqlens.iter().enumerate() {
                let last = l as usize
                    + if shape.rotary_per_row() {
                        self.seqlen_q - 1
                    } else {
                        0
                    };
                if last >= r.seqlen_ro {
                    return bad(format!(
                        "sequence {b}: query rows take rotary positions up to {last}, past the {} rows of rotary_cos/rotary_sin: pass longer tables",
                        r.seqlen_ro
                    ));
                }
            }
        }
        if let CacheLayout::Paged {
            num_blocks,
            page_size,
            block_table,
            max_blocks,
        } = &self.layout
        {
            if block_table.len() != self.batch * max_blocks {
                return bad(format!(
                    "block_table has {} entries; expected batch x max_blocks = {} x {max_blocks}",
                    block_table.len(),
                    self.batch
                ));
            }
            let mut appender = vec![usize::MAX; *num_blocks];
            for b in 0..self.batch {
                let used = self.seqlen_k(b).div_ceil(*page_size);
                for (c, &page) in block_table[b * max_blocks..b * max_blocks + used]
                    .iter()
                    .enumerate()
                {
                    if page < 0 || page as usize >= *num_blocks {
                        return bad(format!(
                            "block_table[{b}][{c}] = {page} is outside the pool of {num_blocks} pages"
                        ));
                    }
                    // Pages this call writes (the appended rows) must belong to one sequence.
                    let first_new = self.cache_seqlens[b] as usize / page_size;
                    if self.seqlen_new > 0 && c >= first_new {
                        let owner = &mut appender[page as usize];
                        if *owner != usize::MAX && *owner != b {
                            return bad(format!(
                                "page {page} receives appended rows of sequences {owner} and {b}: each written page must belong to one sequence"
                            ));
                        }
                        *owner = b;
                    }
                }
            }
        }
        Ok(())
    }

    /// Elements of `k_cache` (and `v_cache`).
    pub fn cache_len(&self) -> usize {
        self.shape().cache_len()
    }

    /// Element offset of key `j` (kv head 0) of sequence `b` in the cache: cache row
    /// `cache_leftpad[b] + j` of cache sequence `cache_batch_idx[b]` (contiguous), or row
    /// `j % page_size` of page `block_table[b][j / page_size]`.
    pub fn key_offset(&self, b: usize, j: usize) -> usize {
        let row = match &self.layout {
            CacheLayout::Contiguous { seqlen_cache } => {
                self.cache_sequence(b) * seqlen_cache + self.start(b) + j
            }
            CacheLayout::Paged {
                page_size,
                block_table,
                max_blocks,
                ..
            } => block_table[b * max_blocks + j / page_size] as usize * page_size + j % page_size,
        };
        row * self.heads_kv * self.head_dim
    }

    /// Checks buffer lengths ([`KvCacheShape::check_buffers`]).
    ///
    /// # Errors
    /// [`AttnError::BufferTooShort`] naming the first buffer that is too short.
    pub fn check_buffers(&self, lens: &[(&'static str, usize)]) -> Result<()> {
        self.shape().check_buffers(lens)
    }

    /// [`Self::check_buffers`] for a whole call: q, the two caches, the two new-row tensors
    /// (which must be empty when `seqlen_new` is 0) and the two rotary tables (empty without
    /// rotary).
    ///
    /// # Errors
    /// [`AttnError::BufferTooShort`]; [`AttnError::InvalidInput`] for new rows with
    /// `seqlen_new` 0 or tables without rotary.
    pub fn check_call(
        &self,
        q: usize,
        caches: [usize; 2],
        new: [usize; 2],
        tables: [usize; 2],
    ) -> Result<()> {
        let shape = self.shape();
        shape.check_extras(new, tables)?;
        shape.check_buffers(&[
            ("q", q),
            ("k_cache", caches[0]),
            ("v_cache", caches[1]),
            ("k_new", new[0]),
            ("v_new", new[1]),
            ("rotary_cos", tables[0]),
            ("rotary_sin", tables[1]),
        ])
    }

    /// The keys of every sequence gathered into packed `[total_k, heads_kv, head_dim]` tensors,
    /// and the same call as a [`VarlenProblem`] (queries packed `[batch * seqlen_q, ...]`, which
    /// is q's own layout).
    fn gathered<T: Element>(
        &self,
        k_cache: &[T],
        v_cache: &[T],
    ) -> Result<(VarlenProblem, Vec<T>, Vec<T>)> {
        let row = self.heads_kv * self.head_dim;
        let (mut k, mut v) = (Vec::new(), Vec::new());
        let mut cu_k = vec![0i32];
        for b in 0..self.batch {
            for j in 0..self.seqlen_k(b) {
                let at = self.key_offset(b, j);
                k.extend_from_slice(&k_cache[at..at + row]);
                v.extend_from_slice(&v_cache[at..at + row]);
            }
            cu_k.push(cu_k[b] + self.seqlen_k(b) as i32);
        }
        let cu_q = (0..=self.batch)
            .map(|b| (b * self.seqlen_q) as i32)
            .collect();
        let p = VarlenProblem::new(cu_q, cu_k, self.heads_q, self.heads_kv, self.head_dim)?
            .with_mask(self.mask)
            .with_scale(self.softmax_scale)?
            .with_scores(self.scores.clone())?;
        Ok((p, k, v))
    }
}

/// The same call on a paged cache with pages of `page_size` keys: a pool of
/// `batch x max_blocks + 3` pages (three that nobody uses), handed out in an order shuffled by
/// `seed`, so that consecutive keys of a sequence sit in scattered pages. For tests, checks
/// and benchmarks of the paged path against the contiguous one.
///
/// # Errors
/// Validation errors (a page size that is not a multiple of [`PAGE_MULTIPLE`]; a call with
/// `cache_batch_idx` or `cache_leftpad`, which paged caches do not take).
pub fn shuffled_pages(p: &KvCacheProblem, page_size: usize, seed: u64) -> Result<KvCacheProblem> {
    let max_blocks = p.capacity().div_ceil(page_size.max(1));
    let num_blocks = p.batch * max_blocks + 3;
    // A permutation of the pool (Fisher-Yates over an LCG).
    let mut pages: Vec<i32> = (0..num_blocks as i32).collect();
    let mut x = seed | 1;
    for i in (1..pages.len()).rev() {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        pages.swap(i, (x >> 33) as usize % (i + 1));
    }
    let paged = KvCacheProblem {
        layout: CacheLayout::Paged {
            num_blocks,
            page_size,
            block_table: pages[..p.batch * max_blocks].to_vec(),
            max_blocks,
        },
        cache_batch: p.batch,
        ..p.clone()
    };
    paged.validate()?;
    Ok(paged)
}

/// A cache under `p`'s layout holding the logical keys `logical[b]` (rows of
/// `heads_kv x head_dim`, `logical[b].len() / row` keys of sequence `b`, from its first row);
/// every other element is NaN, a value no call may read.
pub fn place<T: Element>(p: &KvCacheProblem, logical: &[Vec<T>]) -> Vec<T> {
    let row = p.heads_kv * p.head_dim;
    let mut cache = vec![T::from_f32(f32::NAN); p.cache_len()];
    for (b, keys) in logical.iter().enumerate() {
        for j in 0..keys.len() / row {
            let at = p.key_offset(b, j);
            cache[at..at + row].copy_from_slice(&keys[j * row..(j + 1) * row]);
        }
    }
    cache
}

/// Writes the new rows `k_new`/`v_new` (`[batch, seqlen_new, heads_kv, head_dim]`) into the
/// caches at rows `cache_seqlens[b]..`, as a call with them does before attending; with a
/// rotary embedding the keys are rotated first, new row `t` at position `cache_seqlens[b] + t`
/// ([`rotary`]).
///
/// # Errors
/// Those of [`KvCacheProblem::validate`] and [`AttnError::BufferTooShort`].
pub fn append<T: Element>(
    p: &KvCacheProblem,
    k_cache: &mut [T],
    v_cache: &mut [T],
    k_new: &[T],
    v_new: &[T],
    tables: RotaryTables<'_, T>,
) -> Result<()> {
    p.validate()?;
    let shape = p.shape();
    shape.check_extras([k_new.len(), v_new.len()], tables.lens())?;
    shape.check_buffers(&[
        ("k_cache", k_cache.len()),
        ("v_cache", v_cache.len()),
        ("k_new", k_new.len()),
        ("v_new", v_new.len()),
        ("rotary_cos", tables.cos.len()),
        ("rotary_sin", tables.sin.len()),
    ])?;
    let row = p.heads_kv * p.head_dim;
    for b in 0..p.batch {
        let len = p.cache_seqlens[b] as usize;
        for t in 0..p.seqlen_new {
            let at = p.key_offset(b, len - p.start(b) + t);
            let from = (b * p.seqlen_new + t) * row;
            k_cache[at..at + row].copy_from_slice(&k_new[from..from + row]);
            if let Some(r) = &p.rotary {
                rotary::rotate_new_row(r, p.head_dim, &mut k_cache[at..at + row], tables, len + t);
            }
            v_cache[at..at + row].copy_from_slice(&v_new[from..from + row]);
        }
    }
    Ok(())
}
