//! The ring schedule, simulated on the CPU: `N` ranks in one process, the key/value shards
//! rotated one rank onwards per step, each rank's running `(o, lse)` merged with every partial
//! result in f32 ([`crate::merge::merge_row`]), as the GPU ranks will do.

use super::shard::Sharding;
use crate::dtype::Element;
use crate::error::{AttnError, Result};
use crate::merge::merge_row;
use crate::shape::{AttnProblem, Strides};
use rayon::prelude::*;

/// The ring's result, assembled from every rank's shard: `o` dense
/// `[batch, seqlen, heads_q, head_dim]`, `lse` `[batch, heads_q, seqlen]`.
#[derive(Debug, Clone, PartialEq)]
pub struct RingOutput<T> {
    /// Output.
    pub o: Vec<T>,
    /// Natural-log logsumexp per row.
    pub lse: Vec<f32>,
}

/// Partial attention, in f32, of the query rows at global positions `q_pos` (local `q`
/// `[batch, q_pos.len(), heads_q, head_dim]`) to the key rows at global positions `k_pos`
/// (local `k`, `v` `[batch, k_pos.len(), heads_kv, head_dim]`), under the global problem's
/// mask, window, softcap and ALiBi (positions decide what is visible). Returns `o`
/// `[batch, nq, heads_q, head_dim]` and `lse` `[batch, nq, heads_q]` (one per row of `o`, in
/// its order); a row that sees none of these keys gets `o = 0`, `lse = -inf` (a NaN input gives
/// NaN).
pub fn partial_cpu<T: Element>(
    p: &AttnProblem,
    q_pos: &[usize],
    q: &[T],
    k_pos: &[usize],
    k: &[T],
    v: &[T],
) -> (Vec<f32>, Vec<f32>) {
    let s = p.shape;
    let (d, hq, hkv) = (s.head_dim, s.heads_q, s.heads_kv);
    let (nq, nk, group) = (q_pos.len(), k_pos.len(), s.group_size());
    let mut o = vec![0.0f32; s.batch * nq * hq * d];
    let mut lse = vec![f32::NEG_INFINITY; s.batch * nq * hq];
    o.par_chunks_mut(d.max(1))
        .zip(lse.par_iter_mut())
        .enumerate()
        .for_each(|(r, (out, lse))| {
            let (b, i, h) = (r / (nq * hq), (r / hq) % nq, r % hq);
            let qi = q_pos[i];
            let qrow = &q[r * d..(r + 1) * d];
            let visible = p.key_range(qi);
            let slope = p
                .scores
                .alibi
                .as_ref()
                .map_or(0.0, |a| f64::from(a.slope(b, h, hq)));
            let kv_at = |j: usize| ((b * nk + j) * hkv + h / group) * d;
            let scores: Vec<(usize, f32)> = (0..nk)
                .filter(|&j| visible.contains(&k_pos[j]))
                .map(|j| {
                    let dot: f32 = qrow
                        .iter()
                        .zip(&k[kv_at(j)..kv_at(j) + d])
                        .map(|(x, y)| x.to_f32() * y.to_f32())
                        .sum();
                    let sc = f64::from(dot * p.softmax_scale);
                    let sc = p
                        .scores
                        .score(sc, slope, qi, k_pos[j], s.seqlen_q, s.seqlen_k);
                    (j, sc as f32)
                })
                .collect();
            if scores.iter().any(|(_, x)| x.is_nan()) {
                out.fill(f32::NAN);
                *lse = f32::NAN;
                return;
            }
            let m = scores
                .iter()
                .map(|&(_, x)| x)
                .fold(f32::NEG_INFINITY, f32::max);
            if m == f32::NEG_INFINITY {
                return;
            }
            let mut l = 0.0f32;
            for &(j, x) in &scores {
                let w = (x - m).exp();
                l += w;
                for (acc, y) in out.iter_mut().zip(&v[kv_at(j)..kv_at(j) + d]) {
                    *acc += w * y.to_f32();
                }
            }
            for acc in out.iter_mut() {
                *acc /= l;
            }
            *lse = m + l.ln();
        });
    (o, lse)
}

/// A key/value shard in a rank's hands: the rank it came from, its k and v.
type InHand<T> = (usize, (Vec<T>, Vec<T>));

/// Rows at `pos` of a dense `[batch, len, heads, d]` tensor, as a dense
/// `[batch, pos.len(), heads, d]` shard.
fn gather<T: Copy>(x: &[T], batch: usize, len: usize, row: usize, pos: &[usize]) -> Vec<T> {
    let mut out = Vec::with_capacity(batch * pos.len() * row);
    for b in 0..batch {
        for &i in pos {
            let at = (b * len + i) * row;
            out.extend_from_slice(&x[at..at + row]);
        }
    }
    out
}

/// Ring attention over `ranks` simulated ranks on the CPU (self-attention: `seqlen_q ==
/// seqlen_k`; q, k, v dense). Rank `r` holds the rows of [`Sharding::zigzag`] (causal) or
/// [`Sharding::contiguous`] (otherwise); at step `t` it attends its queries to the key/value
/// shard of rank `(r - t) mod ranks` and merges the partial result into its running one; a
/// learnable sink is merged in once at the end (the partial results of [`partial_cpu`] have
/// none).
///
/// # Errors
/// The problem's validation errors; [`AttnError::InvalidInput`] for `seqlen_q != seqlen_k`
/// or 0 ranks; [`AttnError::InvalidStrides`] for strided views (shard them first);
/// [`AttnError::BufferTooShort`].
pub fn ring_forward_cpu<T: Element>(
    p: &AttnProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    ranks: usize,
) -> Result<RingOutput<T>> {
    p.validate()?;
    p.check_lengths(q.len(), k.len(), v.len(), usize::MAX, usize::MAX)?;
    let s = p.shape;
    if s.seqlen_q != s.seqlen_k {
        return Err(AttnError::InvalidInput {
            what: format!(
                "ring attention shards one sequence for queries and keys alike: seqlen_q {} != seqlen_k {}",
                s.seqlen_q, s.seqlen_k
            ),
        });
    }
    let dense_q = Strides::contiguous(s.seqlen_q, s.heads_q, s.head_dim);
    let dense_k = Strides::contiguous(s.seqlen_k, s.heads_kv, s.head_dim);
    for (name, st, want) in [
        ("q", p.q_strides, dense_q),
        ("k", p.k_strides, dense_k),
        ("v", p.v_strides, dense_k),
    ] {
        if st != want {
            return Err(AttnError::InvalidStrides {
                tensor: name,
                reason: "the ring shards dense [batch, seqlen, heads, head_dim] tensors: copy the view to a dense layout first".into(),
            });
        }
    }
    let len = s.seqlen_q;
    let plan = if p.mask.is_causal() {
        Sharding::zigzag(len, ranks)?
    } else {
        Sharding::contiguous(len, ranks)?
    };
    let (rq, rk) = (s.heads_q * s.head_dim, s.heads_kv * s.head_dim);
    let shard = |r: usize| {
        let pos = &plan.positions[r];
        (
            gather(k, s.batch, len, rk, pos),
            gather(v, s.batch, len, rk, pos),
        )
    };
    // The key/value shard each rank holds, rotated one rank onwards after every step.
    let mut in_hand: Vec<InHand<T>> = (0..ranks).map(|r| (r, shard(r))).collect();
    let qs: Vec<Vec<T>> = (0..ranks)
        .map(|r| gather(q, s.batch, len, rq, &plan.positions[r]))
        .collect();
    // Running (o, lse) of every rank, in partial_cpu's layout.
    let mut run: Vec<(Vec<f32>, Vec<f32>)> = (0..ranks)
        .map(|r| {
            let nq = plan.positions[r].len();
            (
                vec![0.0; s.batch * nq * rq],
                vec![f32::NEG_INFINITY; s.batch * nq * s.heads_q],
            )
        })
        .collect();
    for _step in 0..ranks {
        for r in 0..ranks {
            let (from, (ks, vs)) = &in_hand[r];
            let (po, pl) = partial_cpu(
                p,
                &plan.positions[r],
                &qs[r],
                &plan.positions[*from],
                ks,
                vs,
            );
            merge_into(&mut run[r], (&po, &pl), s.head_dim);
        }
        // Send to the next rank: rank r + 1 now holds what rank r held.
        in_hand.rotate_right(1);
    }
    // A learnable sink joins each row's denominator once, after every shard's keys: one more
    // merged part with the sink's logit and o = 0 ([`crate::merge`]).
    if let Some(sink) = &p.scores.sink {
        let (d, hq) = (s.head_dim, s.heads_q);
        for (ro, rl) in run.iter_mut() {
            ro.par_chunks_mut(d.max(1))
                .zip(rl.par_iter_mut())
                .enumerate()
                .for_each(|(r, (o, l))| {
                    let old = o.to_vec();
                    let zero = vec![0.0f32; d];
                    *l = merge_row([(&old[..], *l), (&zero[..], sink[r % hq])].into_iter(), o);
                });
        }
    }
    // Every rank's rows back to their global places.
    let mut o = vec![T::from_f32(0.0); s.batch * len * rq];
    let mut lse = vec![f32::NEG_INFINITY; s.batch * s.heads_q * len];
    for (r, (ro, rl)) in run.iter().enumerate() {
        let pos = &plan.positions[r];
        let nq = pos.len();
        for b in 0..s.batch {
            for (i, &g) in pos.iter().enumerate() {
                let (from, to) = ((b * nq + i) * rq, (b * len + g) * rq);
                for (x, y) in o[to..to + rq].iter_mut().zip(&ro[from..from + rq]) {
                    *x = T::from_f32(*y);
                }
                for h in 0..s.heads_q {
                    lse[(b * s.heads_q + h) * len + g] = rl[(b * nq + i) * s.heads_q + h];
                }
            }
        }
    }
    Ok(RingOutput { o, lse })
}

/// Merges a partial `(o, lse)` into a running one of the same shard, row by row (layouts as
/// [`partial_cpu`]'s: one lse per row of `d` values).
fn merge_into(run: &mut (Vec<f32>, Vec<f32>), part: (&[f32], &[f32]), d: usize) {
    let (ro, rl) = run;
    ro.par_chunks_mut(d.max(1))
        .zip(rl.par_iter_mut())
        .zip(part.0.par_chunks(d.max(1)).zip(part.1.par_iter()))
        .for_each(|((o, l), (po, &pl))| {
            let old = o.to_vec();
            *l = merge_row([(&old[..], *l), (po, pl)].into_iter(), o);
        });
}
