//! The CPU backward against the exact f64 gradients, every dtype, masks, GQA/MQA, sq != sk,
//! odd sizes and strided inputs; the same bytes for any thread count.

use flashattn::compare::{Tolerance, diff, random_inputs, random_seed, widen};
use flashattn::cpu_backward::backward;
use flashattn::{AttnError, AttnProblem, Element, Mask, Strides, cpu, reference_grad};
use half::{bf16, f16};

mod common;
use common::problem;

struct Run<T> {
    dq: Vec<T>,
    dk: Vec<T>,
    dv: Vec<T>,
}

fn run<T: Element>(p: &AttnProblem, seed: u64) -> (Run<T>, reference_grad::Gradients, Tolerance) {
    let s = p.shape;
    let (q, k, v) = random_inputs::<T>(p, seed);
    let olen = p
        .o_strides
        .required_len("o", s.batch, s.seqlen_q, s.heads_q, s.head_dim)
        .unwrap();
    let mut o = vec![T::default(); olen];
    let mut lse = vec![0.0f32; s.lse_len()];
    cpu::forward(p, &q, &k, &v, &mut o, &mut lse).unwrap();
    let d_o: Vec<T> = flashattn::compare::random_vec(olen, seed ^ 0xd0);
    let (nq, nk) = (
        s.batch * s.seqlen_q * s.heads_q * s.head_dim,
        s.batch * s.seqlen_k * s.heads_kv * s.head_dim,
    );
    let mut r = Run {
        dq: vec![T::default(); nq],
        dk: vec![T::default(); nk],
        dv: vec![T::default(); nk],
    };
    backward(
        p, &q, &k, &v, &o, &lse, &d_o, &mut r.dq, &mut r.dk, &mut r.dv,
    )
    .unwrap();
    // The oracle takes do dense; gather it through o's strides.
    let mut dense_do = Vec::with_capacity(nq);
    for b in 0..s.batch {
        for i in 0..s.seqlen_q {
            for h in 0..s.heads_q {
                let at = p.o_strides.offset(b, i, h);
                dense_do.extend_from_slice(&d_o[at..at + s.head_dim]);
            }
        }
    }
    let exact = reference_grad::backward(p, &q, &k, &v, &dense_do).unwrap();
    (r, exact, Tolerance::for_dtype(T::DTYPE))
}

fn check<T: Element>(p: &AttnProblem, label: &str) {
    let seed = random_seed();
    let (r, exact, tol) = run::<T>(p, seed);
    for (name, got, want) in [
        ("dq", &r.dq, &exact.dq),
        ("dk", &r.dk, &exact.dk),
        ("dv", &r.dv, &exact.dv),
    ] {
        let d = diff(widen(got), want);
        assert!(
            d.is_clean() && d.rel_l2 <= tol.o_rel_l2,
            "{label} {} {name} seed={seed}: {d} (bound {:e})",
            T::DTYPE,
            tol.o_rel_l2
        );
    }
}

#[test]
fn matches_the_exact_gradients() {
    // (batch, sq, sk, hq, hkv, d)
    let shapes = [
        (1, 17, 17, 2, 2, 64),
        (2, 33, 65, 4, 1, 40),
        (1, 65, 20, 4, 2, 8),
        (1, 1, 129, 8, 1, 128),
        (1, 7, 9, 3, 3, 6),
    ];
    for &(b, sq, sk, hq, hkv, d) in &shapes {
        for mask in [Mask::None, Mask::Causal] {
            let p = problem(b, sq, sk, hq, hkv, d, mask);
            let label = format!("{} {mask:?}", p.shape);
            check::<f16>(&p, &label);
            check::<bf16>(&p, &label);
            check::<f32>(&p, &label);
        }
    }
}

#[test]
fn strided_inputs_and_output() {
    // Memory [b, h, s, d] seen as bshd for q, k, v and o (do shares o's layout).
    let (b, s, h, d) = (2, 19, 3, 16);
    let st = Strides {
        batch: h * s * d,
        seq: d,
        head: s * d,
    };
    for mask in [Mask::None, Mask::Causal] {
        let p = problem(b, s, s, h, h, d, mask)
            .with_strides(st, st, st, st)
            .unwrap();
        check::<f16>(&p, "bhsd view");
    }
}

#[test]
fn same_bytes_for_any_thread_count() {
    let p = problem(2, 40, 50, 4, 2, 24, Mask::Causal);
    let at = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| run::<bf16>(&p, 5).0)
    };
    let (a, b) = (at(1), at(3));
    assert!(a.dq == b.dq && a.dk == b.dk && a.dv == b.dv);
}

#[test]
fn short_buffers_are_typed_errors() {
    let p = problem(1, 4, 4, 1, 1, 8, Mask::None);
    let x = vec![f16::ONE; 32];
    let lse = vec![0.0f32; 4];
    // One element short: do (read) or dk (written).
    let call = |do_len: usize, dk_len: usize| {
        let (mut dq, mut dk, mut dv) = (
            vec![f16::ZERO; 32],
            vec![f16::ZERO; dk_len],
            vec![f16::ZERO; 32],
        );
        let e = backward(
            &p,
            &x,
            &x,
            &x,
            &x,
            &lse,
            &x[..do_len],
            &mut dq,
            &mut dk,
            &mut dv,
        );
        assert!(
            dq.iter().all(|&z| z == f16::ZERO),
            "nothing is written on error"
        );
        e.unwrap_err()
    };
    let e = call(31, 32);
    assert!(
        matches!(e, AttnError::BufferTooShort { tensor: "do", .. }),
        "{e}"
    );
    let e = call(32, 31);
    assert!(
        matches!(e, AttnError::BufferTooShort { tensor: "dk", .. }),
        "{e}"
    );
}
