//! Masking rules shared by the reference, the CPU backend and the GPU kernels.
//!
//! Causal masks with `seqlen_q != seqlen_k` align bottom-right, as FlashAttention 2.1+ and
//! PyTorch's `causal_lower_right`: query `i` sees key `j` iff `j <= i + seqlen_k - seqlen_q`.
//! The last query row therefore always sees every key; when `seqlen_q > seqlen_k` the first
//! `seqlen_q - seqlen_k` rows see none and produce `o = 0`, `lse = -inf`.

use serde::Serialize;

/// Which (query, key) pairs take part in the softmax.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
pub enum Mask {
    /// Every query sees every key.
    #[default]
    None,
    /// Bottom-right aligned causal mask (see the module docs).
    Causal,
}

impl Mask {
    /// Number of keys query row `i` sees: keys `0..visible_keys(i)` take part, the rest do not.
    ///
    /// Returns a value in `0..=seqlen_k`. Exact for any sizes up to `usize::MAX`.
    pub fn visible_keys(self, i: usize, seqlen_q: usize, seqlen_k: usize) -> usize {
        match self {
            Mask::None => seqlen_k,
            Mask::Causal => {
                // j <= i + seqlen_k - seqlen_q  <=>  j < i + 1 + seqlen_k - seqlen_q
                let end = (i as u128 + 1 + seqlen_k as u128).saturating_sub(seqlen_q as u128);
                end.min(seqlen_k as u128) as usize
            }
        }
    }

    /// Number of (query, key) pairs that take part, over one (batch, head).
    pub fn visible_pairs(self, seqlen_q: usize, seqlen_k: usize) -> u128 {
        match self {
            Mask::None => seqlen_q as u128 * seqlen_k as u128,
            Mask::Causal => {
                // Rows i >= seqlen_q - seqlen_k (when positive) see min(i + 1 + sk - sq, sk) keys.
                let (sq, sk) = (seqlen_q as u128, seqlen_k as u128);
                let first = sq.saturating_sub(sk); // rows before this see nothing
                let rows = sq - first;
                // For rows r = 0..rows (i = first + r): visible = r + 1 + (sk - sq + first) capped at sk.
                let offset = sk + first - sq; // = max(sk - sq, 0)
                // visible(r) = min(r + 1 + offset, sk); r + 1 + offset <= sk whenever r < rows
                // because rows + offset = sq - first + sk + first - sq = sk.
                rows * (offset + 1) + rows * (rows - 1) / 2
            }
        }
    }

    /// `true` for [`Mask::Causal`].
    pub fn is_causal(self) -> bool {
        matches!(self, Mask::Causal)
    }

    /// The name used in tables and kernel specialisations: `none` or `causal`.
    pub fn name(self) -> &'static str {
        match self {
            Mask::None => "none",
            Mask::Causal => "causal",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bottom_right_alignment() {
        // seqlen_q = 5, seqlen_k = 2: first three rows see nothing.
        let v: Vec<_> = (0..5).map(|i| Mask::Causal.visible_keys(i, 5, 2)).collect();
        assert_eq!(v, [0, 0, 0, 1, 2]);
        // seqlen_q = 2, seqlen_k = 5: rows see keys 0..=3 and 0..=4.
        let v: Vec<_> = (0..2).map(|i| Mask::Causal.visible_keys(i, 2, 5)).collect();
        assert_eq!(v, [4, 5]);
        // Decoding: one query sees all keys.
        assert_eq!(Mask::Causal.visible_keys(0, 1, 8), 8);
    }

    #[test]
    fn pair_count_matches_row_sum() {
        for sq in 1..40 {
            for sk in 1..40 {
                for m in [Mask::None, Mask::Causal] {
                    let sum: u128 = (0..sq).map(|i| m.visible_keys(i, sq, sk) as u128).sum();
                    assert_eq!(sum, m.visible_pairs(sq, sk), "{m:?} sq={sq} sk={sk}");
                }
            }
        }
    }
}
