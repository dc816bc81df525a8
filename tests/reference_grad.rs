//! The oracle of the oracle: the exact f64 gradients (`reference_grad`) against central finite
//! differences of the f64 forward, on tiny shapes; and that forward against the forward oracle.

use flashattn::compare::random_vec;
use flashattn::reference_grad::{backward, backward_f64, forward_f64};
use flashattn::{AttnError, AttnProblem, Mask, reference};

mod common;
use common::problem;

/// `L = sum(do * o)`: its gradient with respect to the inputs is what backward returns.
fn loss(p: &AttnProblem, q: &[f64], k: &[f64], v: &[f64], d_o: &[f64]) -> f64 {
    let (o, _) = forward_f64(p, q, k, v);
    o.iter().zip(d_o).map(|(a, b)| a * b).sum()
}

fn values(n: usize, seed: u64) -> Vec<f64> {
    random_vec::<f32>(n, seed)
        .iter()
        .map(|&x| f64::from(x))
        .collect()
}

/// Every element of every input, perturbed by +-h: the analytic gradient must match the
/// central difference to ~1e-7 relative (the difference's own error is O(h^2) + rounding).
#[test]
fn gradients_match_central_finite_differences() {
    // (batch, sq, sk, hq, hkv, d): sq > sk (rows that see nothing when causal), sq < sk, GQA
    // 2:1 and MQA, head_dim 1 and odd.
    let shapes = [
        (1, 3, 4, 2, 1, 3),
        (2, 5, 3, 2, 2, 2),
        (1, 2, 5, 3, 1, 1),
        (1, 4, 4, 4, 2, 5),
    ];
    let h = 1e-6;
    for (n, &(b, sq, sk, hq, hkv, d)) in shapes.iter().enumerate() {
        for mask in [Mask::None, Mask::Causal] {
            let p = problem(b, sq, sk, hq, hkv, d, mask)
                .with_scale(0.7)
                .unwrap();
            let seed = 100 + n as u64;
            let (nq, nk) = (b * sq * hq * d, b * sk * hkv * d);
            let q = values(nq, seed);
            let k = values(nk, seed + 1);
            let v = values(nk, seed + 2);
            let d_o = values(nq, seed + 3);
            let g = backward_f64(&p, &q, &k, &v, &d_o);
            let mut worst = 0.0f64;
            for (which, grad) in [(0, &g.dq), (1, &g.dk), (2, &g.dv)] {
                for e in 0..grad.len() {
                    let bumped = |delta: f64| {
                        let (mut q2, mut k2, mut v2) = (q.clone(), k.clone(), v.clone());
                        [&mut q2, &mut k2, &mut v2][which][e] += delta;
                        loss(&p, &q2, &k2, &v2, &d_o)
                    };
                    let fd = (bumped(h) - bumped(-h)) / (2.0 * h);
                    let err = (fd - grad[e]).abs() / grad[e].abs().max(1.0);
                    worst = worst.max(err);
                    assert!(
                        err < 1e-7,
                        "shape {n} {mask:?}: d{} element {e}: analytic {} vs finite difference {fd}",
                        ["q", "k", "v"][which],
                        grad[e]
                    );
                }
            }
            assert!(worst > 0.0, "the comparison ran");
        }
    }
}

/// The differentiated forward is the forward oracle: same o and lse on the same inputs.
#[test]
fn f64_forward_is_the_forward_oracle() {
    for mask in [Mask::None, Mask::Causal] {
        let p = problem(2, 7, 5, 4, 2, 8, mask);
        let q32 = random_vec::<f32>(2 * 7 * 4 * 8, 1);
        let k32 = random_vec::<f32>(2 * 5 * 2 * 8, 2);
        let v32 = random_vec::<f32>(2 * 5 * 2 * 8, 3);
        let wide = |x: &[f32]| x.iter().map(|&e| f64::from(e)).collect::<Vec<_>>();
        let (o, lse) = forward_f64(&p, &wide(&q32), &wide(&k32), &wide(&v32));
        let r = reference::attention(&p, &q32, &k32, &v32).unwrap();
        for (a, b) in o.iter().zip(&r.o) {
            assert!((a - b).abs() < 1e-12, "{a} {b}");
        }
        for (a, b) in lse.iter().zip(&r.lse) {
            assert!(a == b || (a - b).abs() < 1e-12, "{a} {b}");
        }
    }
}

/// Rows that see no key (causal, sq > sk) have o = 0 whatever q is: their dq is 0, and they
/// add nothing to dk and dv. The typed-element entry point reads strides and checks lengths.
#[test]
fn masked_rows_and_entry_point() {
    let p = problem(1, 5, 2, 1, 1, 4, Mask::Causal);
    let q = random_vec::<f32>(5 * 4, 7);
    let k = random_vec::<f32>(2 * 4, 8);
    let v = random_vec::<f32>(2 * 4, 9);
    let d_o = random_vec::<f32>(5 * 4, 10);
    let g = backward(&p, &q, &k, &v, &d_o).unwrap();
    assert!(
        g.dq[..3 * 4].iter().all(|&x| x == 0.0),
        "rows 0..3 see no key"
    );
    assert!(g.dq[3 * 4..].iter().any(|&x| x != 0.0));
    // Only rows 3 and 4 contribute: the same dk/dv as a problem of those two rows.
    let tail = problem(1, 2, 2, 1, 1, 4, Mask::Causal);
    let g2 = backward(&tail, &q[3 * 4..], &k, &v, &d_o[3 * 4..]).unwrap();
    assert_eq!((g.dk.clone(), g.dv.clone()), (g2.dk, g2.dv));
    let e = backward(&p, &q, &k, &v, &d_o[..19]).unwrap_err();
    assert!(
        matches!(e, AttnError::BufferTooShort { tensor: "do", .. }),
        "{e}"
    );
}
