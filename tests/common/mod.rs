//! Builders and CPU checks shared by the integration tests (the library's, and tools/tests,
//! which includes this file by path).

#![allow(dead_code)] // each test crate uses a subset

use flashattn::compare::{Tolerance, dense_o, diff_reference};
use flashattn::{AttnProblem, AttnShape, Element, Mask, cpu, reference};

/// A shape from its six sizes, in the order of [`AttnShape`]'s fields.
pub fn shape(b: usize, sq: usize, sk: usize, hq: usize, hkv: usize, d: usize) -> AttnShape {
    AttnShape::from_sizes([b, sq, sk, hq, hkv, d])
}

/// A validated problem with default scale and dense strides.
pub fn problem(
    b: usize,
    sq: usize,
    sk: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    mask: Mask,
) -> AttnProblem {
    AttnProblem::new(shape(b, sq, sk, hq, hkv, d))
        .unwrap()
        .with_mask(mask)
}

/// Runs the CPU backend on poisoned outputs and returns (o as written, lse).
pub fn run_cpu<T: Element>(p: &AttnProblem, q: &[T], k: &[T], v: &[T]) -> (Vec<T>, Vec<f32>) {
    let s = p.shape;
    let olen = p
        .o_strides
        .required_len("o", s.batch, s.seqlen_q, s.heads_q, s.head_dim)
        .unwrap();
    let mut o = vec![T::from_f32(f32::NAN); olen];
    let mut lse = vec![f32::NAN; s.lse_len()];
    cpu::forward(p, q, k, v, &mut o, &mut lse).unwrap();
    (o, lse)
}

/// CPU vs oracle on these inputs, within the dtype's tolerance.
pub fn cmp<T: Element>(
    p: &AttnProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    what: &str,
) -> flashattn::Result<()> {
    let r = reference::attention(p, q, k, v)?;
    let (o, lse) = run_cpu(p, q, k, v);
    let (od, ld) = diff_reference(p, dense_o(p, &o)?, lse.iter().map(|&x| x as f64), &r);
    Tolerance::for_dtype(T::DTYPE).check(&format!("{what} {}", T::DTYPE), &od, &ld)
}
