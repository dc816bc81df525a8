//! The FP8 CPU backend: the inputs dequantised to f32 (`x * descale`), the f32 CPU backend
//! ([`crate::cpu`]) on them, `o` rounded to bf16. It takes every problem the CPU backend takes
//! (masks, windows, softcap, ALiBi, strides), and P is not quantised: it is the accurate
//! answer the GPU's e4m3 P V approximates.

use super::e4m3::E4m3;
use super::{Fp8Descales, check_call, dequantise};
use crate::error::Result;
use crate::shape::AttnProblem;
use half::bf16;

/// FP8 attention on host buffers: `q`, `k`, `v` e4m3 read through the problem's strides,
/// `o` bf16 written through `o_strides` (elements no `(b, s, h, d)` addresses are left as they
/// are), `lse` dense `[batch, heads_q, seqlen_q]` f32.
///
/// # Errors
/// Those of [`check_call`] (problem, descales, buffer lengths); nothing is written then.
pub fn forward(
    p: &AttnProblem,
    q: &[E4m3],
    k: &[E4m3],
    v: &[E4m3],
    descales: &Fp8Descales,
    o: &mut [bf16],
    lse: &mut [f32],
) -> Result<()> {
    check_call(p, descales, [q.len(), k.len(), v.len(), o.len(), lse.len()])?;
    let s = p.shape;
    let [qs, ks, vs] = [&descales.q, &descales.k, &descales.v];
    let group = s.group_size();
    let qf = dequantise(
        q,
        p.q_strides,
        s.seqlen_q,
        s.heads_q,
        s.head_dim,
        s.batch,
        |b, h| qs.get(b, h / group, s.heads_kv),
    );
    let kf = dequantise(
        k,
        p.k_strides,
        s.seqlen_k,
        s.heads_kv,
        s.head_dim,
        s.batch,
        |b, h| ks.get(b, h, s.heads_kv),
    );
    let vf = dequantise(
        v,
        p.v_strides,
        s.seqlen_k,
        s.heads_kv,
        s.head_dim,
        s.batch,
        |b, h| vs.get(b, h, s.heads_kv),
    );
    let mut of = vec![0.0f32; o.len()];
    crate::cpu::forward(p, &qf, &kf, &vf, &mut of, lse)?;
    for b in 0..s.batch {
        for i in 0..s.seqlen_q {
            for h in 0..s.heads_q {
                let at = p.o_strides.offset(b, i, h);
                for (dst, src) in o[at..at + s.head_dim].iter_mut().zip(&of[at..]) {
                    *dst = bf16::from_f32(*src);
                }
            }
        }
    }
    Ok(())
}
