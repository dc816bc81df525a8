//! Where a packed variable-length batch runs ([`crate::problem::varlen`] describes it): one
//! GPU launch when the packed kernel takes it, else sequence by sequence through
//! [`super::forward`].

use super::{BackendChoice, forward as dense_forward};
use crate::dtype::Element;
use crate::error::Result;
use crate::problem::varlen::{VarlenOutput, VarlenProblem, per_sequence};

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
