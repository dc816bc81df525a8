//! Decoding against a KV cache (FlashAttention-2's `flash_attn_with_kvcache`): the problem
//! description, its validation, appending new keys and values in place, the exact oracle and
//! the CPU backend with split-KV and its exact combine.
//!
//! - `k_cache`/`v_cache`: contiguous `[batch, seqlen_cache, heads_kv, head_dim]`, or paged
//!   `[num_blocks, page_size, heads_kv, head_dim]` with `block_table` `[batch, max_blocks]`
//!   (i32): key `j` of sequence `b` sits in page `block_table[b][j / page_size]`, row
//!   `j % page_size`;
//! - `cache_seqlens` `[batch]` (i32): each sequence's length before this call;
//! - optional new `k`/`v` `[batch, seqlen_new, heads_kv, head_dim]`, written into the cache at
//!   `cache_seqlens[b]..cache_seqlens[b] + seqlen_new` before attending (in place, as FA2);
//! - `q` `[batch, seqlen_q, heads_q, head_dim]`; sequence `b` attends to its
//!   `cache_seqlens[b] + seqlen_new` keys; causal aligns its queries to that length (bottom
//!   right), and the window, softcap and ALiBi are [`crate::scores`]'s;
//! - `o` like q; `lse` `[batch, heads_q, seqlen_q]`.
//!
//! Split-KV: the keys of each sequence are cut into `splits` runs of whole 64-key blocks, each
//! run gives a partial `(o, lse)`, and [`crate::merge`] combines them exactly; a split with no
//! keys contributes nothing. [`num_splits`] picks the count from the SM count and the lengths.
//! The GPU path ([`crate::cuda::decode`], reached through [`crate::dispatch::kvcache::forward`]) cuts splits the same way
//! in whole tiles of its own key block (64 or 128 keys).

use crate::dtype::Element;
use crate::error::{AttnError, Result};
use crate::mask::Mask;
use crate::problem::varlen::VarlenProblem;
use crate::reference::Reference;
use crate::scores::ScoreMods;
use crate::shape::check_scale;
use rayon::prelude::*;

/// Keys per block of the split unit (a split holds whole blocks).
pub const SPLIT_BLOCK: usize = 64;
/// Page sizes must be a multiple of this (the GPU kernels' key tile).
pub const PAGE_MULTIPLE: usize = 16;
/// Most splits [`num_splits`] returns.
pub const MAX_SPLITS: usize = 128;

/// Where the cache lives.
#[derive(Debug, Clone, PartialEq)]
pub enum CacheLayout {
    /// `[batch, seqlen_cache, heads_kv, head_dim]`.
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

/// A decoding call against a KV cache (see the module docs).
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
    /// Keys in each sequence's cache before this call, `[batch]`.
    pub cache_seqlens: Vec<i32>,
    /// New key/value rows appended per sequence before attending (0: none).
    pub seqlen_new: usize,
    /// Causal (bottom-right per sequence) or not.
    pub mask: Mask,
    /// Multiplies `q k^T`; default `1/sqrt(head_dim)`.
    pub softmax_scale: f32,
    /// Window, softcap, ALiBi.
    pub scores: ScoreMods,
}

option_builders!(KvCacheProblem, |p| p.batch);

impl KvCacheProblem {
    /// A problem with the default scale, no mask and no modifiers.
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
        };
        p.validate()?;
        Ok(p)
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

    /// Keys sequence `b` attends to (its cache plus the appended rows).
    pub fn seqlen_k(&self, b: usize) -> usize {
        self.cache_seqlens[b].max(0) as usize + self.seqlen_new
    }

    /// Checks every size, offset and page index, so that nothing reads or writes outside the
    /// buffers.
    ///
    /// # Errors
    /// [`AttnError::ZeroDim`], [`AttnError::HeadsNotMultiple`]; [`AttnError::InvalidInput`]
    /// naming the entry: `cache_seqlens` of the wrong length or negative, a sequence whose
    /// cache plus the appended rows exceed its capacity, a page size that is 0 or not a
    /// multiple of [`PAGE_MULTIPLE`], a block table of the wrong size, a page index outside
    /// `0..num_blocks` among the pages a sequence uses, or a page that two sequences both
    /// append to; [`AttnError::Overflow`] for sizes whose offsets overflow.
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
        if let CacheLayout::Paged { page_size, .. } = &self.layout
            && (*page_size == 0 || !page_size.is_multiple_of(PAGE_MULTIPLE))
        {
            return bad(format!(
                "page_size {page_size} is not a positive multiple of {PAGE_MULTIPLE} (the kernels' key tile)"
            ));
        }
        if self.cache_seqlens.len() != self.batch {
            return bad(format!(
                "cache_seqlens has {} entries; expected one per sequence ({})",
                self.cache_seqlens.len(),
                self.batch
            ));
        }
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
        let rows = match &self.layout {
            CacheLayout::Contiguous { seqlen_cache } => self.batch.checked_mul(*seqlen_cache),
            CacheLayout::Paged {
                num_blocks,
                page_size,
                ..
            } => num_blocks.checked_mul(*page_size),
        };
        rows.and_then(|r| r.checked_mul(self.heads_kv))
            .and_then(|r| r.checked_mul(self.head_dim))
            .filter(|&n| n <= i64::MAX as usize)
            .ok_or_else(|| AttnError::Overflow {
                what: "the element count of the cache".into(),
            })?;
        check_scale(self.softmax_scale)?;
        self.scores.validate(self.batch, self.heads_q)
    }

    /// Elements of `k_cache` (and `v_cache`).
    pub fn cache_len(&self) -> usize {
        let rows = match &self.layout {
            CacheLayout::Contiguous { seqlen_cache } => self.batch * seqlen_cache,
            CacheLayout::Paged {
                num_blocks,
                page_size,
                ..
            } => num_blocks * page_size,
        };
        rows * self.heads_kv * self.head_dim
    }

    /// Element offset of key `j` (kv head 0) of sequence `b` in the cache.
    pub fn key_offset(&self, b: usize, j: usize) -> usize {
        let row = match &self.layout {
            CacheLayout::Contiguous { seqlen_cache } => b * seqlen_cache + j,
            CacheLayout::Paged {
                page_size,
                block_table,
                max_blocks,
                ..
            } => block_table[b * max_blocks + j / page_size] as usize * page_size + j % page_size,
        };
        row * self.heads_kv * self.head_dim
    }

    /// Checks buffer lengths: `q` (and `o`) `[batch, seqlen_q, heads_q, head_dim]`, `lse`
    /// `[batch, heads_q, seqlen_q]`, `k_cache` and `v_cache`, and the new rows `k_new`, `v_new`
    /// `[batch, seqlen_new, heads_kv, head_dim]`.
    ///
    /// # Errors
    /// [`AttnError::BufferTooShort`] naming the first buffer that is too short.
    pub fn check_buffers(&self, lens: &[(&'static str, usize)]) -> Result<()> {
        for &(tensor, len) in lens {
            let required = match tensor {
                "q" | "o" => self.batch * self.seqlen_q * self.heads_q * self.head_dim,
                "lse" => self.batch * self.heads_q * self.seqlen_q,
                "k_new" | "v_new" => self.batch * self.seqlen_new * self.heads_kv * self.head_dim,
                _ => self.cache_len(),
            };
            crate::error::check_len(tensor, len, required)?;
        }
        Ok(())
    }

    /// [`Self::check_buffers`] for a whole call: q, the two caches and the two new-row tensors
    /// (which must be empty when `seqlen_new` is 0).
    ///
    /// # Errors
    /// [`AttnError::BufferTooShort`]; [`AttnError::InvalidInput`] for new rows with
    /// `seqlen_new` 0.
    pub fn check_call(&self, q: usize, caches: [usize; 2], new: [usize; 2]) -> Result<()> {
        self.check_new_rows(new)?;
        self.check_buffers(&[
            ("q", q),
            ("k_cache", caches[0]),
            ("v_cache", caches[1]),
            ("k_new", new[0]),
            ("v_new", new[1]),
        ])
    }

    /// New rows may only be given with `seqlen_new` > 0 (they would be dropped otherwise).
    fn check_new_rows(&self, new: [usize; 2]) -> Result<()> {
        if self.seqlen_new == 0 && new.iter().any(|&n| n > 0) {
            return Err(AttnError::InvalidInput {
                what: "new k/v rows were given but seqlen_new is 0: set seqlen_new to their row count (or pass empty slices)".into(),
            });
        }
        Ok(())
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
/// Validation errors (a page size that is not a multiple of [`PAGE_MULTIPLE`]).
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
        ..p.clone()
    };
    paged.validate()?;
    Ok(paged)
}

/// A cache under `p`'s layout holding the logical keys `logical[b]` (rows of
/// `heads_kv x head_dim`, `logical[b].len() / row` keys of sequence `b`); every other element
/// is NaN, a value no call may read.
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
/// caches at `cache_seqlens[b]..`, as a call with them does before attending.
///
/// # Errors
/// Those of [`KvCacheProblem::validate`] and [`AttnError::BufferTooShort`].
pub fn append<T: Element>(
    p: &KvCacheProblem,
    k_cache: &mut [T],
    v_cache: &mut [T],
    k_new: &[T],
    v_new: &[T],
) -> Result<()> {
    p.validate()?;
    p.check_new_rows([k_new.len(), v_new.len()])?;
    p.check_buffers(&[
        ("k_cache", k_cache.len()),
        ("v_cache", v_cache.len()),
        ("k_new", k_new.len()),
        ("v_new", v_new.len()),
    ])?;
    let row = p.heads_kv * p.head_dim;
    for b in 0..p.batch {
        for r in 0..p.seqlen_new {
            let at = p.key_offset(b, p.cache_seqlens[b] as usize + r);
            let from = (b * p.seqlen_new + r) * row;
            k_cache[at..at + row].copy_from_slice(&k_new[from..from + row]);
            v_cache[at..at + row].copy_from_slice(&v_new[from..from + row]);
        }
    }
    Ok(())
}

/// The exact result in f64 of a call on caches that already hold the appended rows (see
/// [`append`]): `o` `[batch, seqlen_q, heads_q, head_dim]`, `lse` `[batch, heads_q, seqlen_q]`.
///
/// # Errors
/// Validation and buffer-length errors.
pub fn reference<T: Element>(
    p: &KvCacheProblem,
    q: &[T],
    k_cache: &[T],
    v_cache: &[T],
) -> Result<Reference> {
    p.validate()?;
    p.check_buffers(&[
        ("q", q.len()),
        ("k_cache", k_cache.len()),
        ("v_cache", v_cache.len()),
    ])?;
    let (vp, k, v) = p.gathered(k_cache, v_cache)?;
    let r = crate::problem::varlen::reference(&vp, q, &k, &v)?;
    // lse and precision from [heads_q, total_q] to [batch, heads_q, seqlen_q].
    let (hq, sq, total) = (p.heads_q, p.seqlen_q, p.batch * p.seqlen_q);
    let at = |n: usize| {
        let (b, rest) = (n / (hq * sq), n % (hq * sq));
        (rest / sq) * total + b * sq + rest % sq
    };
    Ok(Reference {
        o: r.o,
        lse: (0..hq * total).map(|n| r.lse[at(n)]).collect(),
        precision: (0..hq * total).map(|n| r.precision[at(n)]).collect(),
    })
}

/// Splits for a decoding call: one when `batch x heads x query blocks` fill the GPU (at least
/// 80 % of `sm_count` blocks), else the count whose waves fill the SMs best, preferring fewer
/// splits within 95 % of the best efficiency (the combine costs a pass over the partials, and
/// fewer concurrent streams read the cache faster), at most [`MAX_SPLITS`] and at most one
/// per 64-key block. (FlashAttention-2 picks its split count the same way, within 85 %; on the
/// H200, batch 1 ran 8 % faster at the count that fills 97 % of the SMs than at 85 %: run 47.)
pub fn num_splits(blocks: usize, sm_count: usize, max_seqlen_k: usize) -> usize {
    let key_blocks = max_seqlen_k.div_ceil(SPLIT_BLOCK).max(1);
    if blocks == 0 || sm_count == 0 || blocks * 5 >= sm_count * 4 {
        return 1;
    }
    let limit = MAX_SPLITS.min(sm_count).min(key_blocks);
    let efficiency = |s: usize| {
        let waves = (blocks * s) as f64 / sm_count as f64;
        waves / waves.ceil()
    };
    // A count that gives the same blocks per split as a smaller one only adds combine work.
    let useful = |s: usize| s == 1 || key_blocks.div_ceil(s) != key_blocks.div_ceil(s - 1);
    let best = (1..=limit)
        .filter(|&s| useful(s))
        .map(efficiency)
        .fold(0.0, f64::max);
    (1..=limit)
        .filter(|&s| useful(s))
        .find(|&s| efficiency(s) >= 0.95 * best)
        .unwrap_or(1)
}

/// The keys of split `s` of `splits` for a sequence of `seqlen_k` keys: whole 64-key blocks,
/// `ceil(blocks / splits)` per split (later splits may be empty).
pub fn split_range(seqlen_k: usize, splits: usize, s: usize) -> std::ops::Range<usize> {
    let per = seqlen_k.div_ceil(SPLIT_BLOCK).div_ceil(splits.max(1)) * SPLIT_BLOCK;
    (s * per).min(seqlen_k)..((s + 1) * per).min(seqlen_k)
}

/// What [`forward_cpu`] returns.
#[derive(Debug, Clone, PartialEq)]
pub struct KvCacheOutput<T> {
    /// `[batch, seqlen_q, heads_q, head_dim]`.
    pub o: Vec<T>,
    /// `[batch, heads_q, seqlen_q]`, natural log.
    pub lse: Vec<f32>,
}

/// The CPU backend: appends `k_new`/`v_new` to the caches in place (pass empty slices when
/// `seqlen_new` is 0), then attends in f32 with the keys of each sequence cut into `splits`
/// (see [`split_range`]) and the partial results combined by [`crate::merge::merge_row`] (a
/// learnable sink joins them as one more part, its logit with `o = 0`). The result is the same
/// bytes run to run for a given `splits`.
///
/// # Errors
/// Validation and buffer-length errors (before anything is written); `splits` of 0.
#[allow(clippy::too_many_arguments)]
pub fn forward_cpu<T: Element>(
    p: &KvCacheProblem,
    q: &[T],
    k_cache: &mut [T],
    v_cache: &mut [T],
    k_new: &[T],
    v_new: &[T],
    splits: usize,
) -> Result<KvCacheOutput<T>> {
    p.validate()?;
    p.check_call(
        q.len(),
        [k_cache.len(), v_cache.len()],
        [k_new.len(), v_new.len()],
    )?;
    if splits == 0 || splits > MAX_SPLITS {
        return Err(AttnError::InvalidInput {
            what: format!("splits = {splits}: use 1..={MAX_SPLITS}"),
        });
    }
    append(p, k_cache, v_cache, k_new, v_new)?;
    let (k_cache, v_cache) = (&*k_cache, &*v_cache);
    let (d, hq, sq) = (p.head_dim, p.heads_q, p.seqlen_q);
    let group = hq / p.heads_kv;
    let rows = p.batch * sq * hq;
    let mut o = vec![0.0f32; rows * d];
    let mut lse = vec![f32::NEG_INFINITY; rows];
    o.par_chunks_mut(d)
        .zip(lse.par_iter_mut())
        .enumerate()
        .for_each(|(r, (out, l))| {
            // r walks o's layout: (b, i, h).
            let (b, i, h) = (r / (sq * hq), (r / hq) % sq, r % hq);
            let sk = p.seqlen_k(b);
            let qrow: Vec<f32> = q[r * d..(r + 1) * d].iter().map(|x| x.to_f32()).collect();
            let keys = p.scores.key_range(p.mask, i, sq, sk);
            let slope = p
                .scores
                .alibi
                .as_ref()
                .map_or(0.0, |a| f64::from(a.slope(b, h, hq)));
            let kvh = h / group;
            let mut parts: Vec<(Vec<f32>, f32)> = (0..splits)
                .map(|s| {
                    let range = split_range(sk, splits, s);
                    let (lo, hi) = (range.start.max(keys.start), range.end.min(keys.end));
                    partial(p, &qrow, k_cache, v_cache, (b, kvh, i, sk), lo..hi, slope)
                })
                .collect();
            // A learnable sink is one more part: a logit with no value row (o = 0).
            if let Some(sink) = &p.scores.sink {
                parts.push((vec![0.0; d], sink[h]));
            }
            *l = crate::merge::merge_row(parts.iter().map(|(o, l)| (&o[..], *l)), out);
        });
    // lse from o's row order (b, i, h) to [batch, heads_q, seqlen_q].
    let lse = (0..rows)
        .map(|n| {
            let (b, h, i) = (n / (hq * sq), (n / sq) % hq, n % sq);
            lse[(b * sq + i) * hq + h]
        })
        .collect();
    Ok(KvCacheOutput {
        o: o.into_iter().map(T::from_f32).collect(),
        lse,
    })
}

/// One split's partial result for one query row, in f32: `(o, lse)` over keys `keys` of
/// sequence `b` (`-inf` and zeros when empty).
fn partial<T: Element>(
    p: &KvCacheProblem,
    qrow: &[f32],
    k_cache: &[T],
    v_cache: &[T],
    (b, kvh, i, sk): (usize, usize, usize, usize),
    keys: std::ops::Range<usize>,
    slope: f64,
) -> (Vec<f32>, f32) {
    let d = p.head_dim;
    let mut o = vec![0.0f32; d];
    if keys.is_empty() {
        return (o, f32::NEG_INFINITY);
    }
    let scores: Vec<f32> = keys
        .clone()
        .map(|j| {
            let at = p.key_offset(b, j) + kvh * d;
            let dot: f32 = qrow
                .iter()
                .zip(&k_cache[at..at + d])
                .map(|(x, y)| x * y.to_f32())
                .sum();
            let s = f64::from(dot * p.softmax_scale);
            p.scores.score(s, slope, i, j, p.seqlen_q, sk) as f32
        })
        .collect();
    if scores.iter().any(|s| s.is_nan()) {
        return (vec![f32::NAN; d], f32::NAN); // a NaN input propagates to the row
    }
    let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        return (o, f32::NEG_INFINITY);
    }
    let mut l = 0.0f32;
    for (s, j) in scores.iter().zip(keys) {
        let w = (s - m).exp();
        l += w;
        let at = p.key_offset(b, j) + kvh * d;
        for (x, y) in o.iter_mut().zip(&v_cache[at..at + d]) {
            *x += w * y.to_f32();
        }
    }
    for x in &mut o {
        *x /= l;
    }
    (o, m + l.ln())
}
