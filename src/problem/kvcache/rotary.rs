//! Rotary position embedding (RoPE) as FlashAttention-2's `flash_attn_with_kvcache` applies
//! it, stated once for the host (the oracle and the CPU backend); kernels/decode/rotary.cuh
//! is the same rule on the GPU, operation for operation, so that both round alike.
//!
//! With tables `cos`, `sin` `[seqlen_ro, dim / 2]` and a position `pos`, the channel pairs
//! `(x0, x1)` = `(2k, 2k + 1)` (interleaved) or `(k, k + dim / 2)` (not), `k < dim / 2`,
//! become, in f32 from the element type and rounded back to it,
//! `x0' = x0 cos - x1 sin` and `x1' = x1 cos + x0 sin` (`c = cos[pos][k]`, `s = sin[pos][k]`),
//! each computed as one fused multiply-add of `x c` and the rounded product of the other
//! term. Channels from `dim` on are left as they are.
//!
//! Positions: new key `t` of sequence `b` at `cache_seqlens[b] + t` (the cache row it is
//! written to); query row `i` at `cache_seqlens[b] + i` when
//! [`super::KvCacheShape::rotary_per_row`] (causal or a local window), else every query row at
//! `cache_seqlens[b]`. With `cache_leftpad` the positions stay these cache rows, as in FA2.

use super::shape::{KvCacheShape, Rotary};
use crate::dtype::Element;

/// A call's rotary tables: `rotary_cos`, `rotary_sin` `[seqlen_ro, rotary_dim / 2]`,
/// row-major (empty for a call without rotary embedding).
#[derive(Debug, Clone, Copy)]
pub struct RotaryTables<'a, T> {
    /// Cosines.
    pub cos: &'a [T],
    /// Sines.
    pub sin: &'a [T],
}

impl<T> RotaryTables<'_, T> {
    /// No tables (a call without rotary embedding).
    pub fn none() -> Self {
        RotaryTables { cos: &[], sin: &[] }
    }

    /// Elements of the two tables.
    pub fn lens(&self) -> [usize; 2] {
        [self.cos.len(), self.sin.len()]
    }
}

/// One pair rotated by `(c, s)`: `(x0 c - x1 s, x1 c + x0 s)`, each a fused multiply-add of
/// `x c` and the rounded product of the other term (the GPU's operations, in the same order).
pub fn rotate_pair(x0: f32, x1: f32, c: f32, s: f32) -> (f32, f32) {
    (x0.mul_add(c, -(x1 * s)), x1.mul_add(c, x0 * s))
}

/// The channels of pair `k`: `(2k, 2k + 1)` interleaved, else `(k, k + dim / 2)`.
pub fn pair_channels(r: &Rotary, k: usize) -> (usize, usize) {
    if r.interleaved {
        (2 * k, 2 * k + 1)
    } else {
        (k, k + r.dim / 2)
    }
}

/// Rotates one head's channels `x` (`head_dim` of them) in place at table row `pos`.
pub fn rotate_head<T: Element>(x: &mut [T], r: &Rotary, t: RotaryTables<'_, T>, pos: usize) {
    let half = r.dim / 2;
    let (cos, sin) = (&t.cos[pos * half..][..half], &t.sin[pos * half..][..half]);
    for k in 0..half {
        let (i0, i1) = pair_channels(r, k);
        let (y0, y1) = rotate_pair(
            x[i0].to_f32(),
            x[i1].to_f32(),
            cos[k].to_f32(),
            sin[k].to_f32(),
        );
        x[i0] = T::from_f32(y0);
        x[i1] = T::from_f32(y1);
    }
}

/// The rotary position of query row `i` of a sequence whose cache held `len` keys before the
/// call, at most the tables' last row (the GPU's clamp; the host validation refuses calls
/// that would need more).
pub fn q_position(shape: &KvCacheShape, r: &Rotary, len: usize, i: usize) -> usize {
    let pos = len + if shape.rotary_per_row() { i } else { 0 };
    pos.min(r.seqlen_ro.saturating_sub(1))
}

/// `q` `[batch, seqlen_q, heads_q, head_dim]` with every head rotated at its row's position
/// (`lens[b]`: each sequence's cache length before the call); a copy of q without rotary.
pub fn rotated_q<T: Element>(
    shape: &KvCacheShape,
    lens: &[i32],
    q: &[T],
    t: RotaryTables<'_, T>,
) -> Vec<T> {
    let mut out = q.to_vec();
    let Some(r) = &shape.rotary else {
        return out;
    };
    let d = shape.head_dim;
    let (sq, hq) = (shape.seqlen_q, shape.heads_q);
    for (n, head) in out.chunks_exact_mut(d).enumerate() {
        let (b, i) = (n / (sq * hq), (n / hq) % sq);
        let pos = q_position(shape, r, lens[b].max(0) as usize, i);
        rotate_head(head, r, t, pos);
    }
    out
}

/// New key row `t` of sequence `b` (`row`: its `heads_kv x head_dim` channels) rotated at
/// position `len + t`, `len` being the sequence's cache length before the call.
pub fn rotate_new_row<T: Element>(
    r: &Rotary,
    head_dim: usize,
    row: &mut [T],
    t: RotaryTables<'_, T>,
    pos: usize,
) {
    for head in row.chunks_exact_mut(head_dim) {
        rotate_head(head, r, t, pos);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_turns_by_its_angle_and_keeps_its_length() {
        let a = 0.7f32;
        let (y0, y1) = rotate_pair(1.0, 0.0, a.cos(), a.sin());
        assert!((y0 - a.cos()).abs() < 1e-6 && (y1 - a.sin()).abs() < 1e-6);
        let (y0, y1) = rotate_pair(0.3, -1.2, a.cos(), a.sin());
        assert!(((y0 * y0 + y1 * y1) - (0.09 + 1.44)).abs() < 1e-5);
    }

    #[test]
    fn interleaved_and_half_pairs_name_the_right_channels() {
        let r = |interleaved| Rotary {
            dim: 8,
            seqlen_ro: 4,
            interleaved,
        };
        assert_eq!(pair_channels(&r(true), 3), (6, 7));
        assert_eq!(pair_channels(&r(false), 3), (3, 7));
        // Channels past dim are untouched; position 0 of a table of cos 1, sin 0 is the
        // identity.
        let cos = [1.0f32; 16];
        let sin = [0.0f32; 16];
        let mut x: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let t = RotaryTables {
            cos: &cos,
            sin: &sin,
        };
        rotate_head(&mut x, &r(false), t, 2);
        assert_eq!(x, (0..10).map(|i| i as f32).collect::<Vec<_>>());
    }
}
