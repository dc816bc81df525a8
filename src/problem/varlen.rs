//! Variable-length batches (FlashAttention-2's `flash_attn_varlen_func`): sequences of
//! different lengths packed one after another, described by cumulative offsets.
//!
//! - q packed as `[total_q, heads_q, head_dim]`, k and v as `[total_k, heads_kv, head_dim]`;
//! - `cu_seqlens_q`, `cu_seqlens_k` (`batch + 1` entries, starting at 0, non-decreasing):
//!   sequence `b` holds queries `cu_seqlens_q[b]..cu_seqlens_q[b+1]` and keys
//!   `cu_seqlens_k[b]..cu_seqlens_k[b+1]`;
//! - sequences are independent: the mask (causal bottom-right), window and ALiBi distances
//!   are those of each sequence's own lengths; zero-length sequences are legal (a query that
//!   sees no key gives `o = 0`, `lse = -inf`, or the sink's logit with a learnable sink);
//! - `o` packed like q; `lse` `[heads_q, total_q]` (natural log);
//! - the backward ([`crate::dispatch::varlen::backward`]) takes `do` packed like q and gives
//!   `dq` packed like q, `dk` and `dv` like k.
//!
//! On the GPU the whole batch is one `attn_mma` launch ([`crate::cuda::varlen`]), its
//! backward one `attn_bwd` launch ([`crate::cuda::bwd::varlen`]); the CPU backend, and the
//! GPU forward for head dims that are not a multiple of 8, run each sequence as a batch-1
//! [`AttnProblem`].

use crate::dtype::Element;
use crate::error::{AttnError, Result};
use crate::mask::Mask;
use crate::problem::varlen_device::DeviceVarlenProblem;
use crate::reference::{self, RowPrecision};
use crate::scores::{Alibi, ScoreMods};
use crate::shape::{AttnProblem, AttnShape, check_scale};

/// A packed variable-length batch (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct VarlenProblem {
    /// Query offsets, `batch + 1` entries.
    pub cu_seqlens_q: Vec<i32>,
    /// Key offsets, `batch + 1` entries.
    pub cu_seqlens_k: Vec<i32>,
    /// Query heads.
    pub heads_q: usize,
    /// Key/value heads (divides `heads_q`).
    pub heads_kv: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// Causal or not, per sequence.
    pub mask: Mask,
    /// Multiplies `q k^T`; default `1/sqrt(head_dim)`.
    pub softmax_scale: f32,
    /// Window, softcap, ALiBi (per-batch slopes: one row per sequence).
    pub scores: ScoreMods,
}

/// The result of a varlen call: `o` packed `[total_q, heads_q, head_dim]`, `lse`
/// `[heads_q, total_q]`, and where it ran.
#[derive(Debug, Clone, PartialEq)]
pub struct VarlenOutput<T> {
    /// Output, packed like q.
    pub o: Vec<T>,
    /// Log-sum-exp per (head, packed query).
    pub lse: Vec<f32>,
    /// The backend and kernel that ran, and why (empty where not recorded).
    pub ran: String,
}

/// The gradients of a varlen backward call ([`crate::dispatch::varlen::backward`]): `dq`
/// packed like q `[total_q, heads_q, head_dim]`, `dk` and `dv` like k `[total_k, heads_kv,
/// head_dim]` (summed over the query heads of each kv head), the learnable sink's gradient
/// when the problem has one, and where it ran.
#[derive(Debug, Clone, PartialEq)]
pub struct VarlenGrads<T> {
    /// Gradient of q, packed like q.
    pub dq: Vec<T>,
    /// Gradient of k, packed like k.
    pub dk: Vec<T>,
    /// Gradient of v, packed like v.
    pub dv: Vec<T>,
    /// Gradient of the learnable sink, `[heads_q]` f32 (summed over every packed row), when
    /// the problem has one ([`crate::cpu_backward::sink_grad`] states it).
    pub d_sink: Option<Vec<f32>>,
    /// The backend and kernel that ran, and why.
    pub ran: String,
}

option_builders!(VarlenProblem, |p| p.batch());

impl VarlenProblem {
    /// Checks the offsets and sizes.
    ///
    /// # Errors
    /// [`AttnError::InvalidInput`] naming what is wrong: offsets of different counts, empty,
    /// not starting at 0, decreasing or negative; [`AttnError::ZeroDim`] and
    /// [`AttnError::HeadsNotMultiple`] as for dense problems.
    pub fn new(
        cu_seqlens_q: Vec<i32>,
        cu_seqlens_k: Vec<i32>,
        heads_q: usize,
        heads_kv: usize,
        head_dim: usize,
    ) -> Result<Self> {
        let p = VarlenProblem {
            cu_seqlens_q,
            cu_seqlens_k,
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

    /// Sequences in the batch.
    pub fn batch(&self) -> usize {
        self.cu_seqlens_q.len().saturating_sub(1)
    }

    /// Packed queries.
    pub fn total_q(&self) -> usize {
        self.cu_seqlens_q.last().map_or(0, |&x| x as usize)
    }

    /// Packed keys.
    pub fn total_k(&self) -> usize {
        self.cu_seqlens_k.last().map_or(0, |&x| x as usize)
    }

    /// The longest query sequence (`max_seqlen_q`).
    pub fn max_seqlen_q(&self) -> usize {
        lengths(&self.cu_seqlens_q).max().unwrap_or(0)
    }

    /// The longest key sequence (`max_seqlen_k`).
    pub fn max_seqlen_k(&self) -> usize {
        lengths(&self.cu_seqlens_k).max().unwrap_or(0)
    }

    /// Validates offsets, sizes, scale and modifiers.
    ///
    /// # Errors
    /// See [`Self::new`], [`Self::with_scale`], [`Self::with_scores`].
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(AttnError::InvalidInput { what });
        for (name, cu) in [
            ("cu_seqlens_q", &self.cu_seqlens_q),
            ("cu_seqlens_k", &self.cu_seqlens_k),
        ] {
            if cu.len() < 2 {
                return bad(format!(
                    "{name} has {} entries: it needs batch + 1 >= 2 (offsets starting at 0)",
                    cu.len()
                ));
            }
            if cu[0] != 0 {
                return bad(format!("{name}[0] = {}: the offsets start at 0", cu[0]));
            }
            if let Some(w) = cu.windows(2).position(|w| w[1] < w[0]) {
                return bad(format!(
                    "{name} decreases at entry {}: {} then {} (offsets are cumulative lengths)",
                    w + 1,
                    cu[w],
                    cu[w + 1]
                ));
            }
        }
        if self.cu_seqlens_q.len() != self.cu_seqlens_k.len() {
            return bad(format!(
                "cu_seqlens_q has {} entries and cu_seqlens_k {}: both are batch + 1",
                self.cu_seqlens_q.len(),
                self.cu_seqlens_k.len()
            ));
        }
        // Sizes, heads and head_dim by the dense rules (lengths of 1 stand for any).
        AttnShape {
            batch: 1,
            seqlen_q: 1,
            seqlen_k: 1,
            heads_q: self.heads_q,
            heads_kv: self.heads_kv,
            head_dim: self.head_dim,
        }
        .validate()?;
        check_scale(self.softmax_scale)?;
        self.scores.validate(self.batch(), self.heads_q)
    }

    /// The `lse` of a row of head `h` that sees no key: `-inf`, or the learnable sink's logit
    /// ([`crate::scores`]).
    pub fn empty_lse(&self, h: usize) -> f32 {
        self.scores
            .sink
            .as_ref()
            .map_or(f32::NEG_INFINITY, |s| s[h])
    }

    /// `lse` `[heads_q, total_q]` as every row that sees no key has it ([`Self::empty_lse`]):
    /// what the sequence-by-sequence paths start from.
    pub(crate) fn empty_lse_rows(&self) -> Vec<f32> {
        let total = self.total_q();
        (0..self.heads_q * total)
            .map(|n| self.empty_lse(n / total.max(1)))
            .collect()
    }

    /// Sequence `b` as a dense batch-1 problem, with its offsets `(q0, k0)`; `None` when it
    /// has no query or no key (handled without a backend).
    pub(crate) fn sequence(&self, b: usize) -> Result<Option<(AttnProblem, usize, usize)>> {
        let (q0, q1) = (
            self.cu_seqlens_q[b] as usize,
            self.cu_seqlens_q[b + 1] as usize,
        );
        let (k0, k1) = (
            self.cu_seqlens_k[b] as usize,
            self.cu_seqlens_k[b + 1] as usize,
        );
        if q1 == q0 || k1 == k0 {
            return Ok(None);
        }
        let shape = AttnShape {
            batch: 1,
            seqlen_q: q1 - q0,
            seqlen_k: k1 - k0,
            heads_q: self.heads_q,
            heads_kv: self.heads_kv,
            head_dim: self.head_dim,
        };
        let alibi = self.scores.alibi.as_ref().map(|a| Alibi {
            slopes: (0..self.heads_q)
                .map(|h| a.slope(b, h, self.heads_q))
                .collect(),
            per_batch: false,
        });
        let scores = ScoreMods {
            alibi,
            ..self.scores.clone()
        };
        let p = AttnProblem::new(shape)?
            .with_mask(self.mask)
            .with_scale(self.softmax_scale)?
            .with_scores(scores)?;
        Ok(Some((p, q0, k0)))
    }

    /// Checks that q, k and v hold the packed batch (`total * heads * head_dim` elements).
    ///
    /// # Errors
    /// [`AttnError::BufferTooShort`] or [`AttnError::Overflow`].
    pub(crate) fn check_lengths(&self, q: usize, k: usize, v: usize) -> Result<()> {
        let (nq, nk) = self.packed_lens()?;
        for (tensor, len, required) in [("q", q, nq), ("k", k, nk), ("v", v, nk)] {
            crate::error::check_len(tensor, len, required)?;
        }
        Ok(())
    }
}

impl VarlenProblem {
    /// Elements of a packed q (also o, do, dq: `total_q * heads_q * head_dim`) and of a
    /// packed k (also v, dk, dv: `total_k * heads_kv * head_dim`).
    ///
    /// # Errors
    /// [`AttnError::Overflow`] when a count does not fit in an i64.
    pub fn packed_lens(&self) -> Result<(usize, usize)> {
        DeviceVarlenProblem::from(self).packed_lens()
    }

    /// The length checks of a varlen backward (CPU and GPU): `[q, k, v, o, lse, do]` and
    /// `[dq, dk, dv]` against the packed sizes (q, o, do, dq `total_q * heads_q * head_dim`;
    /// k, v, dk, dv `total_k * heads_kv * head_dim`; lse `heads_q * total_q`).
    ///
    /// # Errors
    /// [`AttnError::BufferTooShort`] naming the first buffer that is too short;
    /// [`AttnError::Overflow`].
    pub(crate) fn check_backward_lengths(
        &self,
        inputs: [usize; 6],
        grads: [usize; 3],
    ) -> Result<()> {
        // The offsets are the host's own (batch + 1 each): only the buffers are judged.
        let offsets = [self.cu_seqlens_q.len(), self.cu_seqlens_k.len()];
        DeviceVarlenProblem::from(self).check_backward_lengths(offsets, inputs, grads)
    }
}

impl From<&VarlenProblem> for DeviceVarlenProblem {
    /// The sizes of a batch whose offsets the host holds: exact (the longest as read).
    fn from(p: &VarlenProblem) -> Self {
        DeviceVarlenProblem {
            batch: p.batch(),
            total_q: p.total_q(),
            total_k: p.total_k(),
            max_seqlen_q: p.max_seqlen_q(),
            max_seqlen_k: p.max_seqlen_k(),
            heads_q: p.heads_q,
            heads_kv: p.heads_kv,
            head_dim: p.head_dim,
            mask: p.mask,
            softmax_scale: p.softmax_scale,
            scores: p.scores.clone(),
        }
    }
}

/// One sequence of a packed backward, as a dense batch-1 call ([`backward_per_sequence`]):
/// its problem, its slices of q, k, v, o and do, its lse gathered dense `[1, heads_q, sq]`.
pub(crate) struct SeqBackward<'a, T> {
    /// The sequence's dense problem.
    pub p: AttnProblem,
    /// q, k, v, o, do of the sequence (dense layouts of `p`).
    pub inputs: [&'a [T]; 5],
    /// Its lse, dense `[1, heads_q, seqlen_q]`.
    pub lse: Vec<f32>,
}

/// Runs `f` on every sequence that has queries and keys, with its [`SeqBackward`] and its
/// slices of the packed dq, dk and dv (dense `[1, seqlen, heads, head_dim]` layouts, which `f`
/// writes in full); the gradients of the other sequences are set to zero (no key: dq = 0; no
/// query: dk = dv = 0). The caller validated `p` and the lengths
/// ([`VarlenProblem::check_backward_lengths`]).
///
/// # Errors
/// Those of `f`.
pub(crate) fn backward_per_sequence<T: Element>(
    p: &VarlenProblem,
    [q, k, v, o, d_o]: [&[T]; 5],
    lse: &[f32],
    [dq, dk, dv]: [&mut [T]; 3],
    mut f: impl FnMut(&SeqBackward<T>, &mut [T], &mut [T], &mut [T]) -> Result<()>,
) -> Result<()> {
    let (row_q, row_k) = (p.heads_q * p.head_dim, p.heads_kv * p.head_dim);
    let total = p.total_q();
    let zero = T::from_f32(0.0);
    for b in 0..p.batch() {
        let (q0, q1) = (p.cu_seqlens_q[b] as usize, p.cu_seqlens_q[b + 1] as usize);
        let (k0, k1) = (p.cu_seqlens_k[b] as usize, p.cu_seqlens_k[b + 1] as usize);
        let (rq, rk) = (q0 * row_q..q1 * row_q, k0 * row_k..k1 * row_k);
        let Some((sp, _, _)) = p.sequence(b)? else {
            dq[rq].fill(zero);
            dk[rk.clone()].fill(zero);
            dv[rk].fill(zero);
            continue;
        };
        let sq = q1 - q0;
        let seq = SeqBackward {
            p: sp,
            inputs: [
                &q[rq.clone()],
                &k[rk.clone()],
                &v[rk.clone()],
                &o[rq.clone()],
                &d_o[rq.clone()],
            ],
            lse: (0..p.heads_q)
                .flat_map(|h| lse[h * total + q0..h * total + q1].iter().copied())
                .collect(),
        };
        debug_assert_eq!(seq.lse.len(), p.heads_q * sq);
        f(&seq, &mut dq[rq], &mut dk[rk.clone()], &mut dv[rk])?;
    }
    Ok(())
}

/// The exact gradients of a packed batch in f64 ([`crate::reference_grad`] per sequence):
/// `dq` packed like q, `dk` and `dv` like k (zero for keys no query sees, and for the rows of
/// sequences without keys), and a learnable sink's gradient summed over the sequences (rows
/// that see no key add nothing: their o is 0). `d_o` is packed like q.
///
/// # Errors
/// Validation errors of `p`; [`AttnError::BufferTooShort`] for q, k, v or do shorter than
/// the packed sizes.
pub fn reference_backward<T: Element>(
    p: &VarlenProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    d_o: &[T],
) -> Result<crate::reference_grad::Gradients> {
    p.validate()?;
    let (nq, nk) = p.packed_lens()?;
    for (tensor, len, required) in [
        ("q", q.len(), nq),
        ("k", k.len(), nk),
        ("v", v.len(), nk),
        ("do", d_o.len(), nq),
    ] {
        crate::error::check_len(tensor, len, required)?;
    }
    let (row_q, row_k) = (p.heads_q * p.head_dim, p.heads_kv * p.head_dim);
    let mut out = crate::reference_grad::Gradients {
        dq: vec![0.0; nq],
        dk: vec![0.0; nk],
        dv: vec![0.0; nk],
        d_sink: p.scores.sink.as_ref().map(|_| vec![0.0; p.heads_q]),
    };
    for b in 0..p.batch() {
        let Some((sp, q0, k0)) = p.sequence(b)? else {
            continue;
        };
        let (sq, sk) = (sp.shape.seqlen_q, sp.shape.seqlen_k);
        let (rq, rk) = (q0 * row_q..(q0 + sq) * row_q, k0 * row_k..(k0 + sk) * row_k);
        let g = crate::reference_grad::backward(
            &sp,
            &q[rq.clone()],
            &k[rk.clone()],
            &v[rk.clone()],
            &d_o[rq.clone()],
        )?;
        out.dq[rq].copy_from_slice(&g.dq);
        out.dk[rk.clone()].copy_from_slice(&g.dk);
        out.dv[rk].copy_from_slice(&g.dv);
        if let (Some(total), Some(part)) = (&mut out.d_sink, &g.d_sink) {
            total.iter_mut().zip(part).for_each(|(t, x)| *t += x);
        }
    }
    Ok(out)
}

/// Offsets `[0, l0, l0 + l1, ...]` (`batch + 1` entries) of sequences of the given lengths,
/// for [`VarlenProblem::new`]. The lengths must sum below 2^31 (the offsets are i32).
pub fn offsets(lengths: &[usize]) -> Vec<i32> {
    std::iter::once(0)
        .chain(lengths.iter().scan(0i32, |acc, &l| {
            *acc += l as i32;
            Some(*acc)
        }))
        .collect()
}

fn lengths(cu: &[i32]) -> impl Iterator<Item = usize> + '_ {
    cu.windows(2).map(|w| (w[1] - w[0]) as usize)
}

/// Where one sequence's dense result goes in the packed output.
pub(crate) struct Placed {
    q0: usize,
    sq: usize,
}

impl Placed {
    /// Copies a dense `[1, sq, heads, d]` o into the packed o (rows of `row` elements).
    pub(crate) fn o<X: Copy>(&self, packed: &mut [X], dense: &[X], row: usize) {
        packed[self.q0 * row..(self.q0 + self.sq) * row].copy_from_slice(dense);
    }

    /// Scatters a dense `[1, heads, sq]` per-row value into the packed `[heads, total]`.
    pub(crate) fn rows<X: Copy>(&self, packed: &mut [X], dense: &[X], heads: usize, total: usize) {
        for h in 0..heads {
            let at = h * total + self.q0;
            packed[at..at + self.sq].copy_from_slice(&dense[h * self.sq..(h + 1) * self.sq]);
        }
    }
}

/// Runs `f` on every sequence that has queries and keys, with its dense batch-1 problem and
/// its q, k, v slices; `place` stores each result. The caller validated `p` and the buffers.
pub(crate) fn per_sequence<T: Element, R>(
    p: &VarlenProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    f: impl Fn(&AttnProblem, &[T], &[T], &[T]) -> Result<R>,
    mut place: impl FnMut(&Placed, R),
) -> Result<()> {
    let (row_q, row_k) = (p.heads_q * p.head_dim, p.heads_kv * p.head_dim);
    for b in 0..p.batch() {
        // No query, or no key: the caller's initial o = 0, lse = empty_lse stand.
        let Some((sp, q0, k0)) = p.sequence(b)? else {
            continue;
        };
        let (sq, sk) = (sp.shape.seqlen_q, sp.shape.seqlen_k);
        let r = f(
            &sp,
            &q[q0 * row_q..(q0 + sq) * row_q],
            &k[k0 * row_k..(k0 + sk) * row_k],
            &v[k0 * row_k..(k0 + sk) * row_k],
        )?;
        place(&Placed { q0, sq }, r);
    }
    Ok(())
}

/// The exact result of a packed batch in f64: `o` packed, `lse` `[heads_q, total_q]`, and
/// each row's precision in `lse`'s layout (see [`reference::Reference`]).
///
/// # Errors
/// As [`crate::dispatch::varlen::forward`] (before any work).
pub fn reference<T: Element>(
    p: &VarlenProblem,
    q: &[T],
    k: &[T],
    v: &[T],
) -> Result<reference::Reference> {
    p.validate()?;
    p.check_lengths(q.len(), k.len(), v.len())?;
    let (hq, total, row) = (p.heads_q, p.total_q(), p.heads_q * p.head_dim);
    let mut out = reference::Reference {
        o: vec![0.0; total * row],
        lse: p.empty_lse_rows().into_iter().map(f64::from).collect(),
        precision: vec![RowPrecision::default(); hq * total],
    };
    per_sequence(p, q, k, v, reference::attention, |at, r| {
        at.o(&mut out.o, &r.o, row);
        at.rows(&mut out.lse, &r.lse, hq, total);
        at.rows(&mut out.precision, &r.precision, hq, total);
    })?;
    Ok(out)
}

/// [`crate::compare::diff_reference`] for packed results: `o` against the oracle's packed
/// `o`, `lse` against its `[heads_q, total_q]` lse, each row forgiven what its precision
/// explains, `o`'s max-abs judged per row.
pub fn diff_reference<T: Element>(
    p: &VarlenProblem,
    out: &VarlenOutput<T>,
    r: &reference::Reference,
) -> (crate::compare::Diff, crate::compare::Diff) {
    let (hq, d, total) = (p.heads_q, p.head_dim.max(1), p.total_q());
    // o element n is packed query n / d / hq, head (n / d) % hq; its lse index h * total + i.
    crate::compare::diff_rows(
        out.o.iter().map(|x| x.to_f64()),
        out.lse.iter().map(|&x| f64::from(x)),
        r,
        d,
        |n| ((n / d) % hq) * total + n / d / hq,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_sizes_come_from_host_offsets() {
        let host = VarlenProblem::new(vec![0, 3, 3, 10], vec![0, 5, 6, 6], 4, 2, 64).unwrap();
        let d = DeviceVarlenProblem::from(&host);
        assert_eq!(
            (
                d.batch,
                d.total_q,
                d.total_k,
                d.max_seqlen_q,
                d.max_seqlen_k
            ),
            (3, 10, 6, 7, 5)
        );
        d.validate().unwrap();
        assert_eq!(host.packed_lens().unwrap(), (10 * 4 * 64, 6 * 2 * 64));
    }
}
