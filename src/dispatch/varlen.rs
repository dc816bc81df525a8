//! Where a packed variable-length batch runs ([`crate::problem::varlen`] describes it): one
//! GPU launch when the packed kernel takes it, else sequence by sequence through
//! [`super::forward`]; its backward ([`backward`]) one launch per GPU kernel, else sequence by
//! sequence on the CPU.

use super::{BackendChoice, forward as dense_forward};
use crate::cuda::bwd::backward::BackwardOptions;
use crate::dtype::Element;
use crate::error::Result;
use crate::problem::varlen::{
    VarlenGrads, VarlenOutput, VarlenProblem, backward_per_sequence, per_sequence,
};

/// Runs a packed batch on `choice`'s backend: on the GPU in one launch when the packed kernel
/// takes it, otherwise sequence by sequence (`Auto` falling back to the CPU as
/// [`crate::forward`] does).
///
/// # Errors
/// Validation errors before any work ([`VarlenProblem::validate`],
/// [`crate::AttnError::BufferTooShort`], [`crate::AttnError::Overflow`]); a kernel or launch failure; then
/// those of [`crate::forward`] for a sequence.
pub fn forward<T: Element>(
    choice: BackendChoice,
    p: &VarlenProblem,
    q: &[T],
    k: &[T],
    v: &[T],
) -> Result<VarlenOutput<T>> {
    p.validate()?;
    p.check_lengths(q.len(), k.len(), v.len())?;
    let mut why = "asked for".to_string();
    if choice != BackendChoice::Cpu {
        match super::gpu::try_host_varlen(p, q, k, v) {
            Ok((o, lse, backend, why)) => {
                return Ok(VarlenOutput {
                    o,
                    lse,
                    ran: format!("{backend}: {why}"),
                });
            }
            // What the packed kernel cannot take goes sequence by sequence below (padded
            // head dims on the GPU; Auto's CPU fallback; Cuda's own error without a GPU).
            Err(e) if e.is_unsupported() => {
                why = format!("the packed GPU path cannot run this: {e}")
            }
            Err(e) => return Err(e),
        }
    }
    let (hq, total, row) = (p.heads_q, p.total_q(), p.heads_q * p.head_dim);
    let mut out = VarlenOutput {
        o: vec![T::from_f32(0.0); total * row],
        lse: p.empty_lse_rows(),
        ran: format!("sequence by sequence, backend choice {choice:?} ({why})"),
    };
    per_sequence(
        p,
        q,
        k,
        v,
        |sp, q, k, v| dense_forward(choice, sp, q, k, v),
        |at, f| {
            at.o(&mut out.o, &f.o, row);
            at.rows(&mut out.lse, &f.lse, hq, total);
        },
    )?;
    Ok(out)
}

/// The gradients of a packed batch: `q`, `o` and `d_o` packed `[total_q, heads_q, head_dim]`,
/// `k` and `v` `[total_k, heads_kv, head_dim]`, `lse` the forward's `[heads_q, total_q]`
/// ([`forward`] returns both `o` and `lse` so). `dq` comes back packed like q, `dk` and `dv`
/// like k (summed over the query heads of each kv head); rows that see no key get dq = 0,
/// keys that no query sees dk = dv = 0. On the GPU ([`crate::cuda::bwd::varlen`]) one launch
/// per kernel over every sequence; on the CPU ([`crate::cpu_backward`]) sequence by sequence
/// (`Auto` falls back to it where the GPU cannot take the call, and says why in `ran`).
/// `opts.deterministic`: dq the same bytes run to run (the CPU always is); `opts.kernel` picks
/// the GPU kernel (attn_bwd_wgmma does not take packed batches: asking for it by name is an
/// error). With a learnable sink, `d_sink` holds its gradient (both backends: the same sum
/// over every packed row as the dense backward's).
///
/// # Errors
/// Validation errors before any work ([`VarlenProblem::validate`]: offsets not starting at 0,
/// decreasing, of different counts, ...); [`crate::AttnError::BufferTooShort`] naming the first
/// buffer shorter than its packed size (`lse` shorter than `heads_q * total_q` included);
/// [`crate::AttnError::Overflow`]; then those of the backend
/// ([`crate::cuda::bwd::varlen::backward_host`], [`crate::cpu_backward::backward`]).
#[allow(clippy::too_many_arguments)]
pub fn backward<T: Element>(
    choice: BackendChoice,
    p: &VarlenProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    o: &[T],
    lse: &[f32],
    d_o: &[T],
    opts: BackwardOptions,
) -> Result<VarlenGrads<T>> {
    p.validate()?;
    let (nq, nk) = p.packed_lens()?;
    p.check_backward_lengths(
        [q.len(), k.len(), v.len(), o.len(), lse.len(), d_o.len()],
        [nq, nk, nk],
    )?;
    let mut why = "asked for".to_string();
    if choice != BackendChoice::Cpu {
        match super::gpu::try_host_varlen_backward(p, opts, q, k, v, o, lse, d_o) {
            Ok((mut g, backend)) => {
                g.ran = format!("{backend}: {}", g.ran);
                return Ok(g);
            }
            // Auto's CPU fallback (no GPU, f32, a tile the device lacks); Cuda's own error.
            Err(e) if e.is_unsupported() && choice == BackendChoice::Auto => {
                why = format!("the GPU cannot run this: {e}")
            }
            Err(e) => return Err(e),
        }
    }
    let zero = T::from_f32(0.0);
    let mut g = VarlenGrads {
        dq: vec![zero; nq],
        dk: vec![zero; nk],
        dv: vec![zero; nk],
        d_sink: None,
        ran: format!(
            "cpu ({} threads), sequence by sequence ({why})",
            rayon::current_num_threads()
        ),
    };
    backward_per_sequence(
        p,
        [q, k, v, o, d_o],
        lse,
        [&mut g.dq, &mut g.dk, &mut g.dv],
        |s, dq, dk, dv| {
            let [q, k, v, o, d_o] = s.inputs;
            crate::cpu_backward::backward(&s.p, q, k, v, o, &s.lse, d_o, dq, dk, dv)
        },
    )?;
    g.d_sink = cpu_sink_grad(p, o, lse, d_o)?;
    Ok(g)
}

/// The learnable sink's gradient of a packed batch on the CPU (`None` without a sink):
/// [`crate::cpu_backward::sink_grad`] on the packed rows seen as one dense batch entry of
/// `total_q` rows (o and do `[1, total_q, heads_q, head_dim]`, lse `[1, heads_q, total_q]`:
/// the packed layouts). Every row counts, each sequence's alike; rows that see no key have
/// o = 0 and add nothing. The caller checked the lengths.
fn cpu_sink_grad<T: Element>(
    p: &VarlenProblem,
    o: &[T],
    lse: &[f32],
    d_o: &[T],
) -> Result<Option<Vec<f32>>> {
    let Some(sink) = &p.scores.sink else {
        return Ok(None);
    };
    let mut d_sink = vec![0.0f32; p.heads_q];
    if p.total_q() == 0 {
        return Ok(Some(d_sink));
    }
    let rows = crate::shape::AttnProblem::new(crate::shape::AttnShape {
        batch: 1,
        seqlen_q: p.total_q(),
        seqlen_k: 1,
        heads_q: p.heads_q,
        heads_kv: p.heads_kv,
        head_dim: p.head_dim,
    })?
    .with_scores(crate::scores::ScoreMods {
        sink: Some(sink.clone()),
        ..Default::default()
    })?;
    crate::cpu_backward::sink_grad(&rows, o, lse, d_o, &mut d_sink)?;
    Ok(Some(d_sink))
}
