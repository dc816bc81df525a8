//! Sliding window, softcap and ALiBi (FlashAttention-2's semantics, `flashattn::scores`): the
//! oracle against a brute-force reading of the definitions, the CPU backend against the oracle
//! over the cases the issue lists, the gradients against finite differences, and the GPU path
//! refusing what its kernels lack.

use flashattn::compare::{
    Tolerance, dense_o, diff, diff_reference, random_inputs, random_seed, random_vec, widen,
};
use flashattn::cuda::{KernelKind, attention::check_gpu_problem};
use flashattn::reference_grad::{backward_f64, forward_f64};
use flashattn::scores::{Alibi, ScoreMods, Window};
use flashattn::{AttnError, AttnProblem, BackendChoice, Element, Mask, cpu, reference};
use half::{bf16, f16};

mod common;
use common::problem;

fn mods(left: i64, right: i64, softcap: Option<f32>, alibi: Option<Alibi>) -> ScoreMods {
    ScoreMods {
        window: Window::from_fa(left, right).unwrap(),
        softcap,
        alibi,
        sink: None,
    }
}

/// Every (i, j) pair straight from the definitions, in f64, on dense inputs.
fn brute(p: &AttnProblem, q: &[f64], k: &[f64], v: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let s = p.shape;
    let (d, sq, sk, hq, hkv) = (s.head_dim, s.seqlen_q, s.seqlen_k, s.heads_q, s.heads_kv);
    let mut o = vec![0.0; s.batch * sq * hq * d];
    let mut lse = vec![f64::NEG_INFINITY; s.batch * hq * sq];
    let (l, r) = (p.scores.window.left, p.scores.window.right);
    for b in 0..s.batch {
        for h in 0..hq {
            let kvh = h / (hq / hkv);
            let slope = p
                .scores
                .alibi
                .as_ref()
                .map_or(0.0, |a| f64::from(a.slope(b, h, hq)));
            for i in 0..sq {
                let c = i as i64 + sk as i64 - sq as i64;
                let mut w = Vec::new();
                for j in 0..sk {
                    let jj = j as i64;
                    let seen = (p.mask != Mask::Causal || jj <= c)
                        && l.is_none_or(|l| jj >= c - l as i64)
                        && r.is_none_or(|r| jj <= c + r as i64);
                    if !seen {
                        continue;
                    }
                    let qa = ((b * sq + i) * hq + h) * d;
                    let ka = ((b * sk + j) * hkv + kvh) * d;
                    let mut x: f64 = (0..d).map(|t| q[qa + t] * k[ka + t]).sum::<f64>()
                        * f64::from(p.softmax_scale);
                    if let Some(cap) = p.scores.softcap {
                        x = f64::from(cap) * (x / f64::from(cap)).tanh();
                    }
                    x -= slope * (c - jj).abs() as f64;
                    w.push((ka, x));
                }
                if w.is_empty() {
                    continue;
                }
                let m = w.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = w.iter().map(|x| (x.1 - m).exp()).sum();
                lse[(b * hq + h) * sq + i] = m + sum.ln();
                let oa = ((b * sq + i) * hq + h) * d;
                for (ka, x) in w {
                    for t in 0..d {
                        o[oa + t] += (x - m).exp() / sum * v[ka + t];
                    }
                }
            }
        }
    }
    (o, lse)
}

/// The listed cases: window 0, windows that end inside a tile (the CPU's is 128 keys) or on
/// its edge, sq != sk; softcap 30 and 50 with logits up to +-1e4; ALiBi with causal sq != sk
/// and with a window; GQA; odd lengths.
fn cases() -> Vec<(String, AttnProblem)> {
    let mut out = Vec::new();
    let logits_1e4 = |p: AttnProblem| p.with_scale(40.0).unwrap();
    for (b, sq, sk, hq, hkv, d) in [
        (1, 7, 7, 2, 2, 16),
        (2, 131, 300, 4, 2, 40),
        (1, 300, 131, 8, 1, 24),
        (1, 257, 257, 2, 1, 8),
    ] {
        for mask in [Mask::None, Mask::Causal] {
            let base = problem(b, sq, sk, hq, hkv, d, mask);
            let w = |l, r| base.clone().with_scores(mods(l, r, None, None)).unwrap();
            out.push((format!("{} {mask:?} window 0,0", base.shape), w(0, 0)));
            out.push((
                format!("{} {mask:?} window 100,-1 (inside a tile)", base.shape),
                w(100, -1),
            ));
            out.push((
                format!("{} {mask:?} window 127,0 (tile edge)", base.shape),
                w(127, 0),
            ));
            out.push((format!("{} {mask:?} window 5,37", base.shape), w(5, 37)));
            for cap in [30.0, 50.0] {
                let p = logits_1e4(base.clone())
                    .with_scores(mods(-1, -1, Some(cap), None))
                    .unwrap();
                out.push((
                    format!("{} {mask:?} softcap {cap}, logits ~1e4", base.shape),
                    p,
                ));
            }
            let slopes = Alibi::geometric(hq);
            let p = base
                .clone()
                .with_scores(mods(-1, -1, None, Some(slopes.clone())))
                .unwrap();
            out.push((format!("{} {mask:?} alibi", base.shape), p));
            let per_batch = Alibi {
                slopes: (0..b * hq).map(|x| 0.05 * (x + 1) as f32).collect(),
                per_batch: true,
            };
            let p = base
                .clone()
                .with_scores(mods(33, 4, Some(30.0), Some(per_batch)))
                .unwrap();
            out.push((
                format!(
                    "{} {mask:?} window 33,4 + softcap + per-batch alibi",
                    base.shape
                ),
                p,
            ));
        }
    }
    out
}

#[test]
fn the_oracle_is_the_definition() {
    for (label, p) in cases() {
        let s = p.shape;
        let q = random_vec::<f32>(s.batch * s.seqlen_q * s.heads_q * s.head_dim, 1);
        let k = random_vec::<f32>(s.batch * s.seqlen_k * s.heads_kv * s.head_dim, 2);
        let v = random_vec::<f32>(s.batch * s.seqlen_k * s.heads_kv * s.head_dim, 3);
        let w = |x: &[f32]| x.iter().map(|&e| f64::from(e)).collect::<Vec<_>>();
        let (o, lse) = brute(&p, &w(&q), &w(&k), &w(&v));
        let r = reference::attention(&p, &q, &k, &v).unwrap();
        for (a, b) in o.iter().zip(&r.o) {
            assert!(
                (a - b).abs() <= 1e-9 * a.abs().max(1.0),
                "{label}: o {a} vs {b}"
            );
        }
        for (a, b) in lse.iter().zip(&r.lse) {
            assert!(
                a == b || (a - b).abs() <= 1e-9 * a.abs().max(1.0),
                "{label}: lse {a} vs {b}"
            );
        }
        // The f64 forward the gradients differentiate agrees too.
        let (o2, _) = forward_f64(&p, &w(&q), &w(&k), &w(&v));
        assert!(
            o2.iter()
                .zip(&r.o)
                .all(|(a, b)| (a - b).abs() <= 1e-9 * a.abs().max(1.0)),
            "{label}"
        );
    }
}

fn cpu_vs_oracle<T: Element>(p: &AttnProblem, label: &str) {
    let seed = random_seed();
    let (q, k, v) = random_inputs::<T>(p, seed);
    let s = p.shape;
    let mut o = vec![T::from_f32(f32::NAN); q.len()];
    let mut lse = vec![f32::NAN; s.lse_len()];
    cpu::forward(p, &q, &k, &v, &mut o, &mut lse).unwrap();
    let r = reference::attention(p, &q, &k, &v).unwrap();
    let (od, ld) = diff_reference(p, dense_o(p, &o).unwrap(), widen(&lse), &r);
    Tolerance::for_dtype(T::DTYPE)
        .check(&format!("{label} {} seed={seed}", T::DTYPE), &od, &ld)
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn cpu_matches_the_oracle() {
    for (label, p) in cases() {
        cpu_vs_oracle::<f16>(&p, &label);
        cpu_vs_oracle::<bf16>(&p, &label);
        cpu_vs_oracle::<f32>(&p, &label);
    }
}

/// Gradients through the window, softcap (1 - tanh^2) and ALiBi: central differences.
#[test]
fn gradients_match_finite_differences() {
    let h = 1e-6;
    for (l, r, cap, mask) in [
        (1, 0, None, Mask::None),
        (-1, 1, Some(2.0), Mask::Causal),
        (2, 2, Some(1.5), Mask::None),
    ] {
        let p = problem(1, 5, 4, 2, 1, 3, mask)
            .with_scale(0.9)
            .unwrap()
            .with_scores(mods(l, r, cap, Some(Alibi::geometric(2))))
            .unwrap();
        let n = |x: usize, seed| {
            random_vec::<f32>(x, seed)
                .iter()
                .map(|&e| f64::from(e) * 2.0)
                .collect::<Vec<f64>>()
        };
        let (q, k, v, d_o) = (n(5 * 2 * 3, 1), n(4 * 3, 2), n(4 * 3, 3), n(5 * 2 * 3, 4));
        let g = backward_f64(&p, &q, &k, &v, &d_o);
        let loss = |q: &[f64], k: &[f64], v: &[f64]| -> f64 {
            forward_f64(&p, q, k, v)
                .0
                .iter()
                .zip(&d_o)
                .map(|(a, b)| a * b)
                .sum()
        };
        for (which, grad) in [(0, &g.dq), (1, &g.dk), (2, &g.dv)] {
            for e in 0..grad.len() {
                let bumped = |delta: f64| {
                    let (mut q2, mut k2, mut v2) = (q.clone(), k.clone(), v.clone());
                    [&mut q2, &mut k2, &mut v2][which][e] += delta;
                    loss(&q2, &k2, &v2)
                };
                let fd = (bumped(h) - bumped(-h)) / (2.0 * h);
                assert!(
                    (fd - grad[e]).abs() < 1e-7 * grad[e].abs().max(1.0),
                    "({l},{r}) {cap:?} {which} {e}: {} vs {fd}",
                    grad[e]
                );
            }
        }
        // The CPU backward follows.
        let p16 = p.clone();
        let (qh, kh, vh) = (
            random_vec::<f32>(30, 5),
            random_vec::<f32>(12, 6),
            random_vec::<f32>(12, 7),
        );
        let mut o = vec![0.0f32; 30];
        let mut lse = vec![0.0f32; 10];
        cpu::forward(&p16, &qh, &kh, &vh, &mut o, &mut lse).unwrap();
        let doh = random_vec::<f32>(30, 8);
        let (mut dq, mut dk, mut dv) = (vec![0.0f32; 30], vec![0.0f32; 12], vec![0.0f32; 12]);
        flashattn::cpu_backward::backward(
            &p16, &qh, &kh, &vh, &o, &lse, &doh, &mut dq, &mut dk, &mut dv,
        )
        .unwrap();
        let exact = flashattn::reference_grad::backward(&p16, &qh, &kh, &vh, &doh).unwrap();
        for (got, want) in [(&dq, &exact.dq), (&dk, &exact.dk), (&dv, &exact.dv)] {
            let dd = diff(widen(got), want);
            assert!(dd.is_clean() && dd.rel_l2 < 1e-5, "({l},{r}) {cap:?}: {dd}");
        }
    }
}

#[test]
fn invalid_modifiers_and_the_gpu_path() {
    let p = problem(2, 8, 8, 4, 2, 16, Mask::None);
    let alibi =
        |slopes: Vec<f32>, per_batch: bool| mods(-1, -1, None, Some(Alibi { slopes, per_batch }));
    for bad in [
        mods(-1, -1, Some(0.0), None),
        mods(-1, -1, Some(f32::NAN), None),
        alibi(vec![0.5; 3], false),
        alibi(vec![f32::INFINITY; 4], false),
        alibi(vec![0.5; 4], true),
    ] {
        assert!(matches!(
            p.clone().with_scores(bad),
            Err(AttnError::InvalidInput { .. })
        ));
    }
    assert!(Window::from_fa(-2, 0).is_err() && Window::from_fa(0, -3).is_err());
    // FLOPs count the pairs a window lets through (new-user trial: it counted the causal ones).
    let sq = problem(1, 77, 77, 1, 1, 8, Mask::Causal);
    let diag = sq.clone().with_scores(mods(0, 0, None, None)).unwrap();
    assert_eq!(diag.flops(), 4.0 * 8.0 * 77.0);
    assert_eq!(sq.flops(), 4.0 * 8.0 * (77.0 * 78.0 / 2.0));
    // mma and wgmma take every modifier; naive and simt refuse them with a typed error that
    // names the kernels that have them. Without a GPU, Auto runs the CPU and says why.
    let w = p.clone().with_scores(mods(4, 0, Some(30.0), None)).unwrap();
    for kernel in [KernelKind::Mma, KernelKind::Wgmma] {
        assert!(check_gpu_problem(&w, kernel).is_ok());
    }
    for kernel in [KernelKind::Naive, KernelKind::Simt] {
        let e = check_gpu_problem(&w, kernel).unwrap_err();
        assert!(matches!(e, AttnError::UnsupportedFeature { .. }), "{e}");
        assert!(e.to_string().contains("mma"), "{e}");
        assert!(check_gpu_problem(&p, kernel).is_ok());
    }
    let (q, k, v) = random_inputs::<f16>(&w, 3);
    let f = flashattn::forward(BackendChoice::Auto, &w, &q, &k, &v).unwrap();
    if flashattn::cuda::shared_gpu().is_err() {
        assert!(
            matches!(f.backend, flashattn::Backend::Cpu { .. }),
            "{}",
            f.reason
        );
    }
}
