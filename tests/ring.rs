//! Ring attention simulated on the CPU (issue 17): 2, 3 and 4 ranks, causal and not, GQA and
//! MQA, lengths that do not divide evenly, with a window, softcap, ALiBi and a sink too, against the
//! single-device CPU backend and the f64 oracle; the zigzag sharding balances causal work.

use flashattn::compare::{Tolerance, diff_reference, random_seed, random_vec};
use flashattn::dist::{Sharding, ring_forward_cpu};
use flashattn::scores::{Alibi, ScoreMods, Window};
use flashattn::{AttnError, AttnProblem, AttnShape, BackendChoice, Element, Mask, reference};
use half::{bf16, f16};

fn check<T: Element>(p: &AttnProblem, ranks: usize, label: &str) {
    let seed = random_seed();
    let s = p.shape;
    let q: Vec<T> = random_vec(s.batch * s.seqlen_q * s.heads_q * s.head_dim, seed);
    let k: Vec<T> = random_vec(s.batch * s.seqlen_k * s.heads_kv * s.head_dim, seed ^ 1);
    let v: Vec<T> = random_vec(s.batch * s.seqlen_k * s.heads_kv * s.head_dim, seed ^ 2);
    let ring = ring_forward_cpu(p, &q, &k, &v, ranks).unwrap();
    let label = format!("{label} ranks={ranks} {} seed={seed}", T::DTYPE);
    let tol = Tolerance::for_dtype(T::DTYPE);
    // Against the oracle.
    let r = reference::attention(p, &q, &k, &v).unwrap();
    let (od, ld) = diff_reference(
        p,
        ring.o.iter().map(|x| x.to_f64()),
        ring.lse.iter().map(|&x| f64::from(x)),
        &r,
    );
    tol.check(&format!("{label} vs oracle"), &od, &ld)
        .unwrap_or_else(|e| panic!("{e}"));
    // Against the single-device CPU backend: both within the tolerance of each other's
    // rounding (o is rounded to T by both).
    let single = flashattn::forward(BackendChoice::Cpu, p, &q, &k, &v).unwrap();
    let worst_lse = ring
        .lse
        .iter()
        .zip(&single.lse)
        .map(|(a, b)| if a == b { 0.0 } else { (a - b).abs() })
        .fold(0.0f32, f32::max);
    assert!(
        worst_lse < 1e-3,
        "{label}: lse differs from one device by {worst_lse}"
    );
}

fn problem(batch: usize, len: usize, hq: usize, hkv: usize, d: usize, mask: Mask) -> AttnProblem {
    AttnProblem::new(AttnShape {
        batch,
        seqlen_q: len,
        seqlen_k: len,
        heads_q: hq,
        heads_kv: hkv,
        head_dim: d,
    })
    .unwrap()
    .with_mask(mask)
}

#[test]
fn rings_match_one_device() {
    for ranks in [2, 3, 4] {
        for mask in [Mask::None, Mask::Causal] {
            // Uneven lengths (37 and 101 over 4 or 6 chunks), GQA 2:1 and MQA, batch 2.
            for (len, hq, hkv) in [(37, 4, 2), (101, 4, 1), (64, 2, 2)] {
                let p = problem(2, len, hq, hkv, 16, mask);
                check::<f16>(
                    &p,
                    ranks,
                    &format!("len {len} hq {hq}:{hkv} {}", mask.name()),
                );
            }
        }
    }
    // One rank is the plain computation; more ranks than rows leaves some ranks empty.
    check::<bf16>(&problem(1, 50, 2, 1, 8, Mask::Causal), 1, "one rank");
    check::<f16>(
        &problem(1, 5, 2, 1, 8, Mask::Causal),
        4,
        "5 rows on 8 chunks",
    );
}

#[test]
fn rings_with_score_modifiers() {
    let mods = ScoreMods {
        window: Window::from_fa(20, 0).unwrap(),
        softcap: Some(30.0),
        alibi: Some(Alibi::geometric(4)),
        sink: None,
    };
    for ranks in [2, 3] {
        let p = problem(1, 77, 4, 2, 16, Mask::Causal)
            .with_scores(mods.clone())
            .unwrap();
        check::<f16>(&p, ranks, "window+softcap+alibi");
        let p = problem(1, 77, 4, 2, 16, Mask::None)
            .with_scores(ScoreMods {
                window: Window::from_fa(10, 10).unwrap(),
                ..ScoreMods::default()
            })
            .unwrap();
        check::<bf16>(&p, ranks, "window (10, 10)");
        // A learnable sink is merged once, after every shard (rows that see few keys lean on it).
        let p = problem(1, 77, 4, 2, 16, Mask::Causal)
            .with_scores(ScoreMods {
                sink: Some(vec![0.5, -3.0, 2.0, 5.0]),
                ..mods.clone()
            })
            .unwrap();
        check::<f16>(&p, ranks, "window+softcap+alibi+sink");
    }
}

#[test]
fn zigzag_balances_causal_work() {
    for ranks in [2, 3, 4, 8] {
        let len = 2 * ranks * 16;
        let z = Sharding::zigzag(len, ranks).unwrap();
        // Every position exactly once.
        let mut all: Vec<usize> = z.positions.concat();
        all.sort_unstable();
        assert_eq!(all, (0..len).collect::<Vec<_>>());
        // Causal pairs per rank: row i sees i + 1 keys.
        let pairs: Vec<usize> = z
            .positions
            .iter()
            .map(|pos| pos.iter().map(|&i| i + 1).sum())
            .collect();
        assert!(
            pairs.iter().all(|&x| x == pairs[0]),
            "{ranks} ranks: {pairs:?}"
        );
        // Contiguous shards would not be: the last rank does the most.
        let c = Sharding::contiguous(len, ranks).unwrap();
        let first: usize = c.positions[0].iter().map(|&i| i + 1).sum();
        let last: usize = c.positions[ranks - 1].iter().map(|&i| i + 1).sum();
        assert!(last > 2 * first);
    }
}

#[test]
fn invalid_rings_are_refused() {
    let p = problem(1, 16, 2, 2, 8, Mask::None);
    let x: Vec<f16> = random_vec(16 * 2 * 8, 1);
    assert!(matches!(
        ring_forward_cpu(&p, &x, &x, &x, 0),
        Err(AttnError::InvalidInput { .. })
    ));
    let cross = AttnProblem::new(AttnShape {
        batch: 1,
        seqlen_q: 8,
        seqlen_k: 16,
        heads_q: 2,
        heads_kv: 2,
        head_dim: 8,
    })
    .unwrap();
    assert!(matches!(
        ring_forward_cpu(&cross, &x, &x, &x, 2),
        Err(AttnError::InvalidInput { .. })
    ));
    assert!(matches!(
        ring_forward_cpu(&p, &x[..10], &x, &x, 2),
        Err(AttnError::BufferTooShort { .. })
    ));
}
