//! A packed variable-length batch whose offsets stay on the device: FlashAttention-2 passes
//! `cu_seqlens_q`/`cu_seqlens_k` as CUDA tensors, and a server captures such calls in a CUDA
//! graph and replays them with new offsets, so the host never reads them. The kernels read them
//! where they are; the host works from what the caller states instead (the sequence count, the
//! packed rows from the tensors' shapes, FlashAttention-2's `max_seqlen_q`/`max_seqlen_k`).
//!
//! The offsets are not validated: the kernels clamp each sequence's rows into the packed
//! tensors and its lengths to the stated longest (attn_common.cuh `packed_range`), so valid
//! offsets give [`crate::problem::varlen`]'s results and bad ones wrong rows, never an access
//! outside the buffers. A sequence longer than the stated `max_seqlen_*` is cut to it (its
//! first rows and keys), as FlashAttention-2's grid is.

use crate::error::{AttnError, Result};
use crate::mask::Mask;
use crate::scores::ScoreMods;
use crate::shape::AttnShape;

/// A packed batch described by its sizes, its offsets on the device (see the module docs). q
/// packed `[total_q, heads_q, head_dim]`, k and v `[total_k, heads_kv, head_dim]`, o like q,
/// lse `[heads_q, total_q]` f32, as a `VarlenProblem` (the host-offset form, which converts
/// into this one with `From`).
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceVarlenProblem {
    /// Sequences (the offsets hold `batch + 1` entries).
    pub batch: usize,
    /// Packed query rows (q's first dimension).
    pub total_q: usize,
    /// Packed key rows (k's first dimension).
    pub total_k: usize,
    /// The longest query sequence, as the caller states it (rows past it are not computed).
    pub max_seqlen_q: usize,
    /// The longest key sequence, as the caller states it (keys past it are not seen).
    pub max_seqlen_k: usize,
    /// Query heads.
    pub heads_q: usize,
    /// Key/value heads (divides `heads_q`).
    pub heads_kv: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// Causal or not, per sequence (bottom-right aligned to each sequence's own lengths).
    pub mask: Mask,
    /// Multiplies `q k^T`; default `1/sqrt(head_dim)`.
    pub softmax_scale: f32,
    /// Window, softcap, ALiBi (per-batch slopes: one row per sequence), sink.
    pub scores: ScoreMods,
}

option_builders!(DeviceVarlenProblem, |p| p.batch);

impl DeviceVarlenProblem {
    /// A batch of `batch` sequences over `total_q` query and `total_k` key rows, the longest
    /// `max_seqlen_q` and `max_seqlen_k`; no mask, the default scale.
    ///
    /// # Errors
    /// As [`Self::validate`].
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        batch: usize,
        [total_q, total_k]: [usize; 2],
        [max_seqlen_q, max_seqlen_k]: [usize; 2],
        heads_q: usize,
        heads_kv: usize,
        head_dim: usize,
    ) -> Result<Self> {
        let p = DeviceVarlenProblem {
            batch,
            total_q,
            total_k,
            max_seqlen_q,
            max_seqlen_k,
            heads_q,
            heads_kv,
            head_dim,
            mask: Mask::None,
            softmax_scale: crate::shape::default_scale(head_dim),
            scores: ScoreMods::default(),
        };
        p.validate()?;
        Ok(p)
    }

    /// Checks the sizes, scale and modifiers (not the offsets: the host does not read them).
    ///
    /// # Errors
    /// [`AttnError::InvalidInput`] for a batch of 0 sequences; [`AttnError::TooLarge`] for
    /// more than 2^31 - 1 packed rows (the kernels' offsets are 32-bit); [`AttnError::ZeroDim`]
    /// and [`AttnError::HeadsNotMultiple`] as for dense problems; the scale's and modifiers'
    /// errors.
    pub fn validate(&self) -> Result<()> {
        if self.batch == 0 {
            return Err(AttnError::InvalidInput {
                what: "a packed batch of 0 sequences: cu_seqlens needs batch + 1 >= 2 entries"
                    .into(),
            });
        }
        if self.total_q > i32::MAX as usize || self.total_k > i32::MAX as usize {
            return Err(AttnError::TooLarge {
                kernel: "attn_mma/attn_bwd (packed)",
                reason: "more than 2^31-1 packed rows: split the batch".into(),
            });
        }
        AttnShape {
            batch: 1,
            seqlen_q: 1,
            seqlen_k: 1,
            heads_q: self.heads_q,
            heads_kv: self.heads_kv,
            head_dim: self.head_dim,
        }
        .validate()?;
        crate::shape::check_scale(self.softmax_scale)?;
        self.scores.validate(self.batch, self.heads_q)
    }

    /// The longest sequences the kernels cover: the stated ones, at most the packed rows (a
    /// sequence holds no more), at least 1 (the launch's envelope).
    pub fn covered(&self) -> (usize, usize) {
        (
            self.max_seqlen_q.min(self.total_q).max(1),
            self.max_seqlen_k.min(self.total_k).max(1),
        )
    }

    /// Elements of a packed q (also o, do, dq) and of a packed k (also v, dk, dv).
    ///
    /// # Errors
    /// [`AttnError::Overflow`] when a count does not fit in an i64.
    pub fn packed_lens(&self) -> Result<(usize, usize)> {
        let size = |tensor: &str, total: usize, heads: usize| {
            [total, heads, self.head_dim]
                .iter()
                .try_fold(1usize, |a, &x| a.checked_mul(x))
                .filter(|&n| n <= i64::MAX as usize)
                .ok_or_else(|| AttnError::Overflow {
                    what: format!(
                        "the element count of {tensor} ({total} x {heads} x {})",
                        self.head_dim
                    ),
                })
        };
        Ok((
            size("q", self.total_q, self.heads_q)?,
            size("k", self.total_k, self.heads_kv)?,
        ))
    }

    /// Checks a forward's buffers `[q, k, v, o, lse]` against the packed sizes (q and o
    /// `total_q * heads_q * head_dim`, k and v `total_k * heads_kv * head_dim`, lse `heads_q *
    /// total_q`), after the offsets' lengths `cu_seqlens` (q's then k's: `batch + 1` each).
    ///
    /// # Errors
    /// [`AttnError::BufferTooShort`] naming the first buffer that is too short;
    /// [`AttnError::Overflow`].
    pub fn check_lengths(&self, cu_seqlens: [usize; 2], buffers: [usize; 5]) -> Result<()> {
        let (nq, nk) = self.packed_lens()?;
        let nl = self.heads_q * self.total_q;
        let offsets = self.batch + 1;
        let [q, k, v, o, lse] = buffers;
        for (tensor, len, required) in [
            ("cu_seqlens_q", cu_seqlens[0], offsets),
            ("cu_seqlens_k", cu_seqlens[1], offsets),
            ("q", q, nq),
            ("k", k, nk),
            ("v", v, nk),
            ("o", o, nq),
            ("lse", lse, nl),
        ] {
            crate::error::check_len(tensor, len, required)?;
        }
        Ok(())
    }

    /// [`Self::check_lengths`] for a backward: `inputs` `[q, k, v, o, lse, do]`, then `grads`
    /// `[dq, dk, dv]` (do and dq like q, dk and dv like k).
    ///
    /// # Errors
    /// As [`Self::check_lengths`].
    pub fn check_backward_lengths(
        &self,
        cu_seqlens: [usize; 2],
        inputs: [usize; 6],
        grads: [usize; 3],
    ) -> Result<()> {
        let [q, k, v, o, lse, d_o] = inputs;
        self.check_lengths(cu_seqlens, [q, k, v, o, lse])?;
        let (nq, nk) = self.packed_lens()?;
        let [dq, dk, dv] = grads;
        for (tensor, len, required) in [
            ("do", d_o, nq),
            ("dq", dq, nq),
            ("dk", dk, nk),
            ("dv", dv, nk),
        ] {
            crate::error::check_len(tensor, len, required)?;
        }
        Ok(())
    }

    /// The `lse` of a row of head `h` that sees no key: `-inf`, or the learnable sink's logit.
    pub fn empty_lse(&self, h: usize) -> f32 {
        self.scores
            .sink
            .as_ref()
            .map_or(f32::NEG_INFINITY, |s| s[h])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_envelope_is_bounded() {
        // A stated longest past the packed rows is cut to them; 0 rows cover 1.
        let wide = DeviceVarlenProblem::new(2, [10, 0], [1 << 20, 0], 4, 2, 64).unwrap();
        assert_eq!(wide.covered(), (10, 1));
    }

    #[test]
    fn bad_sizes_are_refused_by_name() {
        let e = DeviceVarlenProblem::new(0, [1, 1], [1, 1], 4, 2, 64).unwrap_err();
        assert!(e.to_string().contains("0 sequences"), "{e}");
        let e = DeviceVarlenProblem::new(1, [1usize << 31, 1], [1, 1], 4, 2, 64).unwrap_err();
        assert!(e.to_string().contains("2^31-1"), "{e}");
        assert!(DeviceVarlenProblem::new(1, [1, 1], [1, 1], 4, 3, 64).is_err());
        let p = DeviceVarlenProblem::new(2, [4, 4], [2, 2], 4, 2, 64).unwrap();
        p.check_backward_lengths([3, 3], [1 << 20; 6], [1 << 20; 3])
            .unwrap();
        let e = p
            .check_backward_lengths([2, 3], [1 << 20; 6], [1 << 20; 3])
            .unwrap_err();
        assert!(e.to_string().contains("cu_seqlens_q"), "{e}");
        let e = p
            .check_lengths([3, 3], [4 * 4 * 64 - 1, 1 << 20, 1 << 20, 1 << 20, 16])
            .unwrap_err();
        assert!(e.to_string().starts_with("q buffer holds 1023"), "{e}");
        let e = p
            .check_backward_lengths([3, 3], [1 << 20; 6], [1 << 20, 1 << 20, 511])
            .unwrap_err();
        assert!(e.to_string().starts_with("dv buffer holds 511"), "{e}");
    }
}
