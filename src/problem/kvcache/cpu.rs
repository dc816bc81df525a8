//! The exact oracle of a decoding call and the CPU backend, with split-KV and its exact
//! combine ([`crate::merge`]), and the split-count heuristic the GPU shares.

use super::rotary::{RotaryTables, rotated_q};
use super::{KvCacheProblem, append};
use crate::dtype::Element;
use crate::error::{AttnError, Result};
use crate::reference::Reference;
use rayon::prelude::*;

/// Keys per block of the split unit (a split holds whole blocks).
pub const SPLIT_BLOCK: usize = 64;
/// Most splits [`num_splits`] returns.
pub const MAX_SPLITS: usize = 128;

/// The exact result in f64 of a call on caches that already hold the appended rows (see
/// [`append`]): q rotated at its positions where the call has a rotary embedding (in the
/// element type, as the kernels rotate it: [`super::rotary`]), then `o` `[batch, seqlen_q,
/// heads_q, head_dim]`, `lse` `[batch, heads_q, seqlen_q]`.
///
/// # Errors
/// Validation and buffer-length errors.
pub fn reference<T: Element>(
    p: &KvCacheProblem,
    q: &[T],
    k_cache: &[T],
    v_cache: &[T],
    rotary: RotaryTables<'_, T>,
) -> Result<Reference> {
    p.validate()?;
    let shape = p.shape();
    shape.check_extras([0, 0], rotary.lens())?;
    shape.check_buffers(&[
        ("q", q.len()),
        ("k_cache", k_cache.len()),
        ("v_cache", v_cache.len()),
        ("rotary_cos", rotary.cos.len()),
        ("rotary_sin", rotary.sin.len()),
    ])?;
    let q = rotated_q(&shape, &p.cache_seqlens, q, rotary);
    let (vp, k, v) = p.gathered(k_cache, v_cache)?;
    let r = crate::problem::varlen::reference(&vp, &q, &k, &v)?;
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

/// The CPU backend: appends `k_new`/`v_new` to the caches in place (the new keys rotated when
/// the call has a rotary embedding; pass empty slices when `seqlen_new` is 0), rotates q,
/// then attends in f32 with the keys of each sequence cut into `splits` (see
/// [`split_range`]) and the partial results combined by [`crate::merge::merge_row`] (a
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
    rotary: RotaryTables<'_, T>,
    splits: usize,
) -> Result<KvCacheOutput<T>> {
    p.validate()?;
    p.check_call(
        q.len(),
        [k_cache.len(), v_cache.len()],
        [k_new.len(), v_new.len()],
        rotary.lens(),
    )?;
    if splits == 0 || splits > MAX_SPLITS {
        return Err(AttnError::InvalidInput {
            what: format!("splits = {splits}: use 1..={MAX_SPLITS}"),
        });
    }
    append(p, k_cache, v_cache, k_new, v_new, rotary)?;
    let q = &rotated_q(&p.shape(), &p.cache_seqlens, q, rotary)[..];
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
