//! The attention problem: sizes, element strides, mask and scale, with validation.
//!
//! Layout is `[batch, seqlen, heads, head_dim]` ("bshd", as FlashAttention and candle), with
//! head_dim contiguous and explicit element strides for the other three axes. `lse` is always
//! contiguous f32 `[batch, heads_q, seqlen_q]`.

use crate::error::{AttnError, Result};
use crate::mask::Mask;
use crate::scores::ScoreMods;
use serde::Serialize;

/// Largest head_dim any backend accepts.
pub const MAX_HEAD_DIM: usize = 256;

/// Sizes of one attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct AttnShape {
    /// Independent sequences.
    pub batch: usize,
    /// Query rows per sequence.
    pub seqlen_q: usize,
    /// Key/value rows per sequence.
    pub seqlen_k: usize,
    /// Query (and output) heads.
    pub heads_q: usize,
    /// Key/value heads; `heads_q` must be a multiple (GQA; 1 is MQA).
    pub heads_kv: usize,
    /// Channels per head, shared by q, k, v and o.
    pub head_dim: usize,
}

impl AttnShape {
    /// Self-attention shape: `seqlen_q = seqlen_k`, `heads_q = heads_kv`.
    pub fn new(batch: usize, seqlen: usize, heads: usize, head_dim: usize) -> Self {
        Self {
            batch,
            seqlen_q: seqlen,
            seqlen_k: seqlen,
            heads_q: heads,
            heads_kv: heads,
            head_dim,
        }
    }

    /// A shape from its six sizes in field order, `[batch, seqlen_q, seqlen_k, heads_q,
    /// heads_kv, head_dim]` (cross-attention, GQA/MQA). Not validated here: see
    /// [`Self::validate`] (which [`AttnProblem::new`] runs).
    pub fn from_sizes(
        [batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim]: [usize; 6],
    ) -> Self {
        Self {
            batch,
            seqlen_q,
            seqlen_k,
            heads_q,
            heads_kv,
            head_dim,
        }
    }

    /// Checks every rule that does not depend on a backend: no zero dims, GQA divisibility,
    /// `head_dim <= 256`, and element counts that fit in `i64` (kernels use 64-bit offsets).
    ///
    /// # Errors
    /// [`AttnError::ZeroDim`], [`AttnError::HeadsNotMultiple`], [`AttnError::UnsupportedHeadDim`],
    /// [`AttnError::Overflow`].
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("batch", self.batch),
            ("seqlen_q", self.seqlen_q),
            ("seqlen_k", self.seqlen_k),
            ("heads_q", self.heads_q),
            ("heads_kv", self.heads_kv),
            ("head_dim", self.head_dim),
        ] {
            if v == 0 {
                return Err(AttnError::ZeroDim { name });
            }
        }
        if !self.heads_q.is_multiple_of(self.heads_kv) {
            return Err(AttnError::HeadsNotMultiple {
                heads_q: self.heads_q,
                heads_kv: self.heads_kv,
            });
        }
        if self.head_dim > MAX_HEAD_DIM {
            return Err(AttnError::UnsupportedHeadDim {
                head_dim: self.head_dim,
                backend: "flashattn".into(),
                supported: format!("1..={MAX_HEAD_DIM}"),
            });
        }
        checked_product(
            "batch*seqlen_q*heads_q*head_dim",
            &[self.batch, self.seqlen_q, self.heads_q, self.head_dim],
        )?;
        checked_product(
            "batch*seqlen_k*heads_kv*head_dim",
            &[self.batch, self.seqlen_k, self.heads_kv, self.head_dim],
        )?;
        Ok(())
    }

    /// Query heads per kv head (the GQA group size).
    pub fn group_size(&self) -> usize {
        self.heads_q / self.heads_kv.max(1)
    }

    /// Elements of `lse`: `batch * heads_q * seqlen_q`.
    /// Saturates at `usize::MAX` for sizes that [`Self::validate`] rejects.
    pub fn lse_len(&self) -> usize {
        self.batch
            .saturating_mul(self.heads_q)
            .saturating_mul(self.seqlen_q)
    }
}

impl std::fmt::Display for AttnShape {
    /// `b=1 sq=77 sk=77 hq=12 hkv=12 d=32`: the form every table and message uses.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "b={} sq={} sk={} hq={} hkv={} d={}",
            self.batch, self.seqlen_q, self.seqlen_k, self.heads_q, self.heads_kv, self.head_dim
        )
    }
}

/// Element strides of a `[batch, seqlen, heads, head_dim]` tensor; head_dim has stride 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Strides {
    /// Elements between consecutive batch entries.
    pub batch: usize,
    /// Elements between consecutive sequence positions.
    pub seq: usize,
    /// Elements between consecutive heads.
    pub head: usize,
}

impl Strides {
    /// Row-major strides of a dense `[batch, seqlen, heads, head_dim]` tensor.
    pub fn contiguous(seqlen: usize, heads: usize, head_dim: usize) -> Self {
        Self {
            batch: seqlen * heads * head_dim,
            seq: heads * head_dim,
            head: head_dim,
        }
    }

    /// Element offset of `(b, s, h, 0)`.
    #[inline]
    pub fn offset(&self, b: usize, s: usize, h: usize) -> usize {
        b * self.batch + s * self.seq + h * self.head
    }

    /// Smallest buffer length (elements) that holds every addressed element, checked.
    ///
    /// # Errors
    /// [`AttnError::Overflow`] when the largest offset does not fit in `i64`.
    pub fn required_len(
        &self,
        tensor: &'static str,
        batch: usize,
        seqlen: usize,
        heads: usize,
        head_dim: usize,
    ) -> Result<usize> {
        let of = || AttnError::Overflow {
            what: format!("largest element offset of {tensor}"),
        };
        if batch == 0 || seqlen == 0 || heads == 0 || head_dim == 0 {
            return Ok(0); // nothing is addressed
        }
        let last = (batch - 1)
            .checked_mul(self.batch)
            .and_then(|a| {
                (seqlen - 1)
                    .checked_mul(self.seq)
                    .and_then(|b| a.checked_add(b))
            })
            .and_then(|a| {
                (heads - 1)
                    .checked_mul(self.head)
                    .and_then(|b| a.checked_add(b))
            })
            .and_then(|a| a.checked_add(head_dim))
            .ok_or_else(of)?;
        if last > i64::MAX as usize {
            return Err(of());
        }
        Ok(last)
    }

    /// `true` when the strides describe a dense row-major tensor of these sizes.
    pub fn is_contiguous(&self, seqlen: usize, heads: usize, head_dim: usize) -> bool {
        *self == Self::contiguous(seqlen, heads, head_dim)
    }
}

/// The rule every softmax_scale passes, wherever it comes from (the library, `--scale`, a
/// file's `scale` metadata): a finite number above 0. FlashAttention takes any float, but a
/// zero, negative or NaN scale is almost always a bug upstream (a parsed "-0.25" meant as
/// 0.25, a 1/sqrt of 0), so it is refused rather than run.
///
/// # Errors
/// [`AttnError::InvalidScale`] for NaN, infinite, zero or negative values.
pub fn check_scale(softmax_scale: f32) -> Result<f32> {
    if !softmax_scale.is_finite() || softmax_scale <= 0.0 {
        return Err(AttnError::InvalidScale {
            value: softmax_scale,
        });
    }
    Ok(softmax_scale)
}

/// The default `softmax_scale`, `1/sqrt(head_dim)` (FlashAttention's), for every problem type
/// (dense, varlen, kvcache). A head_dim of 0 (refused by validation) is taken as 1 so that
/// the default stays finite until the validation says what is wrong.
pub fn default_scale(head_dim: usize) -> f32 {
    1.0 / (head_dim.max(1) as f32).sqrt()
}

/// One attention call, fully described: sizes, strides of each tensor, mask and scale.
///
/// Built with [`AttnProblem::new`] (dense tensors, default scale, no mask) and refined with
/// the `with_*` methods, each of which validates what it sets.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttnProblem {
    /// Sizes.
    pub shape: AttnShape,
    /// Which (query, key) pairs take part.
    pub mask: Mask,
    /// Multiplies `q k^T` before the softmax; default `1/sqrt(head_dim)`.
    pub softmax_scale: f32,
    /// Strides of q (`[batch, seqlen_q, heads_q, head_dim]`).
    pub q_strides: Strides,
    /// Strides of k (`[batch, seqlen_k, heads_kv, head_dim]`).
    pub k_strides: Strides,
    /// Strides of v (`[batch, seqlen_k, heads_kv, head_dim]`).
    pub v_strides: Strides,
    /// Strides of o (`[batch, seqlen_q, heads_q, head_dim]`).
    pub o_strides: Strides,
    /// Sliding window, softcap, ALiBi ([`ScoreMods`]; all off by default).
    pub scores: ScoreMods,
}

impl AttnProblem {
    /// Dense tensors, no mask, `softmax_scale = 1/sqrt(head_dim)`.
    ///
    /// # Errors
    /// Any error of [`AttnShape::validate`].
    pub fn new(shape: AttnShape) -> Result<Self> {
        shape.validate()?;
        let q = Strides::contiguous(shape.seqlen_q, shape.heads_q, shape.head_dim);
        let k = Strides::contiguous(shape.seqlen_k, shape.heads_kv, shape.head_dim);
        Ok(Self {
            shape,
            mask: Mask::None,
            softmax_scale: default_scale(shape.head_dim),
            q_strides: q,
            k_strides: k,
            v_strides: k,
            o_strides: q,
            scores: ScoreMods::default(),
        })
    }

    /// Sets the score modifiers (window, softcap, ALiBi).
    ///
    /// # Errors
    /// Those of [`ScoreMods::validate`].
    pub fn with_scores(mut self, scores: ScoreMods) -> Result<Self> {
        scores.validate(self.shape.batch, self.shape.heads_q)?;
        self.scores = scores;
        Ok(self)
    }

    /// The keys query row `i` sees under the mask and the window (see [`crate::scores`]).
    pub fn key_range(&self, i: usize) -> std::ops::Range<usize> {
        self.scores
            .key_range(self.mask, i, self.shape.seqlen_q, self.shape.seqlen_k)
    }

    /// Sets the mask.
    pub fn with_mask(mut self, mask: Mask) -> Self {
        self.mask = mask;
        self
    }

    /// Sets `softmax_scale`.
    ///
    /// # Errors
    /// [`AttnError::InvalidScale`] for NaN, infinite, zero or negative values.
    pub fn with_scale(mut self, softmax_scale: f32) -> Result<Self> {
        self.softmax_scale = check_scale(softmax_scale)?;
        Ok(self)
    }

    /// Sets the strides of q, k, v and o.
    ///
    /// q, k and v may overlap themselves (a zero stride from a broadcast, e.g. k/v heads or a
    /// shared prefix expanded over the batch): they are only read. head_dim is always
    /// contiguous (stride 1).
    ///
    /// # Errors
    /// [`AttnError::InvalidStrides`] when two positions of `o` would share memory (a zero
    /// stride on an axis longer than 1, or heads overlapping head_dim), and
    /// [`AttnError::Overflow`] when offsets overflow.
    pub fn with_strides(mut self, q: Strides, k: Strides, v: Strides, o: Strides) -> Result<Self> {
        self.q_strides = q;
        self.k_strides = k;
        self.v_strides = v;
        self.o_strides = o;
        self.validate()?;
        Ok(self)
    }

    /// Validates sizes, scale and strides (buffers are checked by [`Self::check_lengths`]).
    ///
    /// # Errors
    /// See [`AttnShape::validate`], [`Self::with_scale`] and [`Self::with_strides`].
    pub fn validate(&self) -> Result<()> {
        let s = &self.shape;
        s.validate()?;
        check_scale(self.softmax_scale)?;
        self.scores.validate(s.batch, s.heads_q)?;
        for (name, st, seqlen, heads) in self.tensors() {
            // Inputs are only read, so broadcast views (PyTorch's `expand`: a zero stride, or
            // heads that share memory) are legal, as in FlashAttention; o must not overlap
            // itself (two results written to one place).
            if name == "o" {
                check_no_overlap(name, st, s.batch, seqlen, heads, s.head_dim)?;
            }
            st.required_len(name, s.batch, seqlen, heads, s.head_dim)?;
        }
        Ok(())
    }

    /// Checks buffer lengths (in elements) of q, k, v, o and lse against shape and strides.
    ///
    /// # Errors
    /// [`AttnError::BufferTooShort`] naming the first buffer that is too short.
    pub fn check_lengths(&self, q: usize, k: usize, v: usize, o: usize, lse: usize) -> Result<()> {
        let s = &self.shape;
        for ((name, st, seqlen, heads), len) in self.tensors().into_iter().zip([q, k, v, o]) {
            let required = st.required_len(name, s.batch, seqlen, heads, s.head_dim)?;
            crate::error::check_len(name, len, required)?;
        }
        crate::error::check_len("lse", lse, s.lse_len())?;
        Ok(())
    }

    /// (name, strides, seqlen, heads) of q, k, v, o in that order.
    pub fn tensors(&self) -> [(&'static str, Strides, usize, usize); 4] {
        let s = &self.shape;
        [
            ("q", self.q_strides, s.seqlen_q, s.heads_q),
            ("k", self.k_strides, s.seqlen_k, s.heads_kv),
            ("v", self.v_strides, s.seqlen_k, s.heads_kv),
            ("o", self.o_strides, s.seqlen_q, s.heads_q),
        ]
    }

    /// Floating-point operations of the forward pass: `4 * head_dim` per visible (query, key)
    /// pair (2 for `q k^T`, 2 for `p v`), over every batch and query head. For a causal square
    /// problem this is about half of `4 * b * h * s^2 * d`; a sliding window counts only the
    /// pairs it lets through (one pass over the query rows).
    pub fn flops(&self) -> f64 {
        let s = &self.shape;
        let pairs = if self.scores.window.is_unbounded() {
            self.mask.visible_pairs(s.seqlen_q, s.seqlen_k) as f64
        } else {
            (0..s.seqlen_q)
                .map(|i| self.key_range(i).len() as f64)
                .sum()
        };
        4.0 * s.batch as f64 * s.heads_q as f64 * s.head_dim as f64 * pairs
    }
}

fn checked_product(what: &str, xs: &[usize]) -> Result<usize> {
    let p = xs
        .iter()
        .try_fold(1usize, |a, &x| a.checked_mul(x))
        .filter(|&p| p <= i64::MAX as usize);
    p.ok_or_else(|| AttnError::Overflow {
        what: format!("{what} = {xs:?}"),
    })
}

/// Rejects strides under which two distinct (b, s, h, d) positions could share an element:
/// each axis longer than 1 must step past everything the inner axes span. Axes are ordered by
/// stride, so transposed views (e.g. `[b, h, s, d]` memory seen as bshd) are accepted.
fn check_no_overlap(
    name: &'static str,
    st: Strides,
    batch: usize,
    seqlen: usize,
    heads: usize,
    head_dim: usize,
) -> Result<()> {
    let mut axes: Vec<(usize, usize, &str)> = vec![
        (st.batch, batch, "batch"),
        (st.seq, seqlen, "seq"),
        (st.head, heads, "head"),
    ];
    axes.retain(|a| a.1 > 1);
    axes.sort_by_key(|a| a.0);
    let mut span = head_dim; // elements covered by the axes inside this one
    let mut inner: Option<(usize, &str)> = None; // the previous (stride, axis)
    for (stride, len, axis) in axes {
        if stride < span {
            let reason = match inner {
                // Equal strides: the sort order between the two says nothing; name both.
                Some((s, other)) if s == stride => format!(
                    "{other} and {axis} strides are both {stride}, so positions overlap; use strides of a dense layout (head_dim contiguous)"
                ),
                _ => format!(
                    "{axis} stride {stride} is smaller than the {span} elements the inner axes span, so positions overlap; use strides of a dense layout (head_dim contiguous)"
                ),
            };
            return Err(AttnError::InvalidStrides {
                tensor: name,
                reason,
            });
        }
        span = stride.saturating_mul(len - 1).saturating_add(span);
        inner = Some((stride, axis));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposed_view_is_accepted() {
        // Memory laid out [b, h, s, d], viewed as bshd.
        let (b, s, h, d) = (2, 5, 3, 8);
        let st = Strides {
            batch: h * s * d,
            seq: d,
            head: s * d,
        };
        let p = AttnProblem::new(AttnShape::new(b, s, h, d)).unwrap();
        assert!(p.clone().with_strides(st, st, st, st).is_ok());
    }

    #[test]
    fn overlapping_output_is_rejected_overlapping_inputs_are_not() {
        let p = AttnProblem::new(AttnShape::new(2, 4, 2, 8)).unwrap();
        let overlap = Strides {
            batch: 64,
            seq: 4,
            head: 8,
        };
        assert!(matches!(
            p.clone()
                .with_strides(p.q_strides, p.k_strides, p.v_strides, overlap),
            Err(AttnError::InvalidStrides { tensor: "o", .. })
        ));
        let zero_batch = Strides {
            batch: 0,
            ..p.o_strides
        };
        assert!(matches!(
            p.clone()
                .with_strides(p.q_strides, p.k_strides, p.v_strides, zero_batch),
            Err(AttnError::InvalidStrides { tensor: "o", .. })
        ));
        // Field report (turn 2, 7): broadcast inputs (PyTorch expand) are legal.
        let bcast = Strides {
            batch: 0,
            seq: 8,
            head: 0,
        };
        let ok = p
            .clone()
            .with_strides(overlap, bcast, bcast, p.o_strides)
            .unwrap();
        assert_eq!(ok.k_strides.required_len("k", 2, 4, 2, 8).unwrap(), 32);
    }
}
