//! Decoding against a KV cache (issue 13) on the CPU: contiguous and paged caches (page sizes
//! 16, 64, 256, shuffled block tables) give the same bytes; appended rows land where they
//! should, across a page boundary; cache lengths 0 and at capacity; lengths that differ,
//! including a sequence with fewer keys than splits; seqlen_q 1, 2, 4, 16 with GQA 1, 4, 8 and
//! MQA; every split count from 1 to the heuristic's maximum against the same f64 reference;
//! window, softcap and ALiBi; invalid calls refused before anything is written.

use flashattn::compare::{Tolerance, diff_rows, random_seed, random_vec};
use flashattn::kvcache::{
    CacheLayout, KvCacheProblem, MAX_SPLITS, RotaryTables, append, forward_cpu, num_splits, place,
    reference, shuffled_pages, split_range,
};
use flashattn::scores::{Alibi, ScoreMods, Window};
use flashattn::{AttnError, Element, Mask};
use half::{bf16, f16};

/// No rotary tables.
fn none<'a, T>() -> RotaryTables<'a, T> {
    RotaryTables::none()
}

/// Shapes of one test call.
struct Call {
    batch: usize,
    seqlen_q: usize,
    heads_q: usize,
    heads_kv: usize,
    d: usize,
    cache_seqlens: Vec<i32>,
    seqlen_new: usize,
    capacity: usize,
}

/// The same call on a contiguous cache and on a paged one (pages shuffled), with the same
/// logical contents.
fn layouts(c: &Call, page_size: usize, seed: u64) -> (KvCacheProblem, KvCacheProblem) {
    let contiguous = KvCacheProblem::new(
        c.batch,
        c.seqlen_q,
        c.heads_q,
        c.heads_kv,
        c.d,
        CacheLayout::Contiguous {
            seqlen_cache: c.capacity,
        },
        c.cache_seqlens.clone(),
        c.seqlen_new,
    )
    .unwrap();
    let paged = shuffled_pages(&contiguous, page_size, seed).unwrap();
    (contiguous, paged)
}

/// Runs `p` with `splits` on fresh caches holding `logical` plus the new rows; returns o and
/// lse, checked against the f64 reference on the appended caches.
fn run<T: Element>(
    p: &KvCacheProblem,
    logical: &(Vec<Vec<T>>, Vec<Vec<T>>),
    q: &[T],
    new: &(Vec<T>, Vec<T>),
    splits: usize,
    label: &str,
) -> (Vec<T>, Vec<f32>) {
    let (mut kc, mut vc) = (place(p, &logical.0), place(p, &logical.1));
    let out = forward_cpu(p, q, &mut kc, &mut vc, &new.0, &new.1, none(), splits).unwrap();
    let r = reference(p, q, &kc, &vc, none()).unwrap();
    let (hq, sq, d) = (p.heads_q, p.seqlen_q, p.head_dim);
    let (od, ld) = diff_rows(
        out.o.iter().map(|x| x.to_f64()),
        out.lse.iter().map(|&x| f64::from(x)),
        &r,
        d,
        |n| {
            let row = n / d; // (b, i, h)
            let (b, i, h) = (row / (sq * hq), (row / hq) % sq, row % hq);
            (b * hq + h) * sq + i
        },
    );
    Tolerance::for_dtype(T::DTYPE)
        .check(&format!("{label} splits={splits}"), &od, &ld)
        .unwrap_or_else(|e| panic!("{e}"));
    (out.o, out.lse)
}

/// Random logical caches (each sequence's `cache_seqlens[b]` keys), q and new rows.
type Data<T> = ((Vec<Vec<T>>, Vec<Vec<T>>), Vec<T>, (Vec<T>, Vec<T>));
fn data<T: Element>(c: &Call, seed: u64) -> Data<T> {
    let row = c.heads_kv * c.d;
    let keys = |s: u64| -> Vec<Vec<T>> {
        c.cache_seqlens
            .iter()
            .enumerate()
            .map(|(b, &l)| random_vec(l as usize * row, s ^ (b as u64 * 77)))
            .collect()
    };
    let nn = c.batch * c.seqlen_new * row;
    (
        (keys(seed ^ 11), keys(seed ^ 12)),
        random_vec(c.batch * c.seqlen_q * c.heads_q * c.d, seed ^ 13),
        (random_vec(nn, seed ^ 14), random_vec(nn, seed ^ 15)),
    )
}

/// Contiguous and paged give the same bytes; both match the reference; every split count.
fn check_call<T: Element>(c: &Call, mask: Mask, mods: &ScoreMods, label: &str) {
    let seed = random_seed();
    let (logical, q, new) = data::<T>(c, seed);
    let label = format!("{label} {} seed={seed}", T::DTYPE);
    for page in [16, 64, 256] {
        let (cp, pp) = layouts(c, page, seed);
        let (cp, pp) = (
            cp.with_mask(mask).with_scores(mods.clone()).unwrap(),
            pp.with_mask(mask).with_scores(mods.clone()).unwrap(),
        );
        let max_sk = (0..c.batch).map(|b| cp.seqlen_k(b)).max().unwrap();
        let most = num_splits(1, 132, max_sk).clamp(4, MAX_SPLITS);
        for splits in 1..=most {
            let a = run(
                &cp,
                &logical,
                &q,
                &new,
                splits,
                &format!("{label} contiguous"),
            );
            let b = run(
                &pp,
                &logical,
                &q,
                &new,
                splits,
                &format!("{label} paged{page}"),
            );
            assert!(
                a == b,
                "{label}: paged {page} differs from contiguous at splits {splits}"
            );
            // Same bytes run to run.
            assert!(a == run(&cp, &logical, &q, &new, splits, &label), "{label}");
        }
    }
}

#[test]
fn decode_shapes_against_the_oracle() {
    // seqlen_q 1, 2, 4, 16 with GQA 1, 4, 8 and MQA; lengths that differ (one shorter than the
    // split count, one at 0), appended rows crossing page boundaries.
    for (sq, hq, hkv) in [(1, 4, 4), (2, 8, 2), (4, 8, 1), (16, 4, 1), (1, 16, 2)] {
        let c = Call {
            batch: 3,
            seqlen_q: sq,
            heads_q: hq,
            heads_kv: hkv,
            d: 16,
            cache_seqlens: vec![300, 0, 14],
            seqlen_new: 3,
            capacity: 320,
        };
        for mask in [Mask::None, Mask::Causal] {
            check_call::<f16>(
                &c,
                mask,
                &ScoreMods::default(),
                &format!("sq{sq} hq{hq}:{hkv} {}", mask.name()),
            );
        }
    }
}

#[test]
fn cache_empty_and_full() {
    // Lengths 0 (no keys: o = 0, lse = -inf unless rows are appended) and at capacity.
    for (lens, new) in [
        (vec![0, 0], 0),
        (vec![0, 256], 0),
        (vec![250, 200], 6),
        (vec![0, 3], 1),
    ] {
        let c = Call {
            batch: 2,
            seqlen_q: 2,
            heads_q: 2,
            heads_kv: 1,
            d: 8,
            cache_seqlens: lens.clone(),
            seqlen_new: new,
            capacity: 256,
        };
        check_call::<bf16>(
            &c,
            Mask::Causal,
            &ScoreMods::default(),
            &format!("lens {lens:?} new {new}"),
        );
    }
    // No keys at all: o = 0 and lse = -inf exactly.
    let p = KvCacheProblem::new(
        1,
        2,
        2,
        2,
        8,
        CacheLayout::Contiguous { seqlen_cache: 16 },
        vec![0],
        0,
    )
    .unwrap();
    let q: Vec<f16> = random_vec(2 * 2 * 8, 1);
    let (mut kc, mut vc) = (
        vec![f16::ZERO; p.cache_len()],
        vec![f16::ZERO; p.cache_len()],
    );
    let out = forward_cpu(&p, &q, &mut kc, &mut vc, &[], &[], none(), 3).unwrap();
    assert!(out.o.iter().all(|x| x.to_f32() == 0.0));
    assert!(out.lse.iter().all(|&l| l == f32::NEG_INFINITY));
}

#[test]
fn modifiers_with_a_cache() {
    let c = Call {
        batch: 2,
        seqlen_q: 4,
        heads_q: 4,
        heads_kv: 2,
        d: 16,
        cache_seqlens: vec![200, 37],
        seqlen_new: 2,
        capacity: 256,
    };
    let mods = ScoreMods {
        window: Window::from_fa(50, 0).unwrap(),
        softcap: Some(30.0),
        alibi: Some(Alibi {
            slopes: (0..8).map(|i| 0.5f32.powi(i + 1)).collect(),
            per_batch: true,
        }),
        sink: None,
    };
    check_call::<f16>(&c, Mask::Causal, &mods, "window+softcap+alibi");
    // A learnable sink joins the splits' merge as one more part (o = 0, lse = sink_h).
    let with_sink = ScoreMods {
        sink: Some(vec![1.0, -2.0, 0.5, 6.0]),
        ..mods
    };
    check_call::<f16>(&c, Mask::Causal, &with_sink, "window+softcap+alibi+sink");
    check_call::<bf16>(&c, Mask::None, &with_sink, "window+softcap+alibi+sink");
}

#[test]
fn appended_rows_land_across_a_page_boundary() {
    let c = Call {
        batch: 2,
        seqlen_q: 1,
        heads_q: 2,
        heads_kv: 1,
        d: 8,
        cache_seqlens: vec![14, 30],
        seqlen_new: 5,
        capacity: 64,
    };
    let (cp, pp) = layouts(&c, 16, 7);
    let ((lk, lv), _, (nk, nv)) = data::<f16>(&c, 7);
    for p in [&cp, &pp] {
        let (mut kc, mut vc) = (place(p, &lk), place(p, &lv));
        append(p, &mut kc, &mut vc, &nk, &nv, none()).unwrap();
        let row = 8;
        for (b, old) in lk.iter().enumerate() {
            for r in 0..5 {
                let at = p.key_offset(b, c.cache_seqlens[b] as usize + r);
                let from = (b * 5 + r) * row;
                assert_eq!(&kc[at..at + row], &nk[from..from + row]);
                assert_eq!(&vc[at..at + row], &nv[from..from + row]);
            }
            // The old keys are untouched.
            let at = p.key_offset(b, 0);
            assert_eq!(&kc[at..at + row], &old[..row]);
        }
    }
}

#[test]
fn split_ranges_and_the_heuristic() {
    // Splits cover the keys exactly once, in whole 64-key blocks; later ones may be empty.
    for sk in [0, 1, 63, 64, 65, 1000, 4096] {
        for splits in 1..=20 {
            let mut next = 0;
            for s in 0..splits {
                let r = split_range(sk, splits, s);
                assert_eq!(r.start, next.min(sk), "sk {sk} splits {splits}");
                assert!(r.start.is_multiple_of(64) || r.start == sk);
                next = r.end;
            }
            assert_eq!(next, sk);
        }
    }
    // Enough blocks: one split. Batch 1 with a long cache: many, within the limits.
    assert_eq!(num_splits(132, 132, 32768), 1);
    let s = num_splits(8, 132, 32768);
    assert!(s > 1 && s <= MAX_SPLITS && s <= 32768 / 64, "{s}");
    assert_eq!(num_splits(8, 132, 64), 1, "one key block cannot be split");
    assert!(num_splits(1, 132, 1 << 17) <= MAX_SPLITS);
}

#[test]
fn invalid_calls_are_refused() {
    let contiguous = |lens: Vec<i32>, new| {
        KvCacheProblem::new(
            2,
            1,
            2,
            1,
            8,
            CacheLayout::Contiguous { seqlen_cache: 32 },
            lens,
            new,
        )
    };
    let paged = |table: Vec<i32>, page, lens: Vec<i32>, new| {
        KvCacheProblem::new(
            2,
            1,
            2,
            1,
            8,
            CacheLayout::Paged {
                num_blocks: 4,
                page_size: page,
                block_table: table,
                max_blocks: 2,
            },
            lens,
            new,
        )
    };
    let invalid = |r: flashattn::Result<KvCacheProblem>, want: &str| match r {
        Err(AttnError::InvalidInput { what }) => assert!(what.contains(want), "{what}"),
        other => panic!("{want}: {other:?}"),
    };
    invalid(contiguous(vec![33, 0], 0), "capacity");
    invalid(contiguous(vec![30, 0], 3), "capacity");
    invalid(contiguous(vec![-1, 0], 0), "negative");
    invalid(contiguous(vec![1], 0), "cache_seqlens has 1");
    invalid(
        paged(vec![0, 1, 2, 7], 16, vec![5, 20], 0),
        "outside the pool",
    );
    invalid(
        paged(vec![0, 1, 2, -1], 16, vec![5, 20], 0),
        "outside the pool",
    );
    invalid(
        paged(vec![0, 1, 2, 3], 24, vec![5, 20], 0),
        "multiple of 16",
    );
    invalid(
        paged(vec![0, 1, 2], 16, vec![5, 20], 0),
        "block_table has 3",
    );
    invalid(
        paged(vec![0, 1, 0, 3], 16, vec![5, 5], 1),
        "page 0 receives appended rows",
    );
    // A bad page size is named as such, before any capacity rule.
    invalid(
        paged(vec![0, 1, 2, 3], 10, vec![5, 20], 0),
        "multiple of 16",
    );
    // Unused table entries are not read: anything goes there.
    assert!(paged(vec![0, 99, 2, 3], 16, vec![5, 20], 0).is_ok());
    // Buffers too short, and a bad split count, before anything is written.
    let p = contiguous(vec![3, 4], 1).unwrap();
    let q: Vec<f16> = random_vec(2 * 2 * 8, 3);
    let mut kc = vec![f16::ONE; p.cache_len()];
    let mut vc = vec![f16::ONE; p.cache_len()];
    let new: Vec<f16> = random_vec(2 * 8, 4);
    let short = forward_cpu(&p, &q, &mut kc, &mut vc, &new[..15], &new, none(), 1);
    assert!(matches!(
        short,
        Err(AttnError::BufferTooShort {
            tensor: "k_new",
            ..
        })
    ));
    let zero = forward_cpu(&p, &q, &mut kc, &mut vc, &new, &new, none(), 0);
    assert!(matches!(zero, Err(AttnError::InvalidInput { .. })));
    // New rows given to a call without seqlen_new would be dropped: refused, on every path.
    let plain = contiguous(vec![3, 4], 0).unwrap();
    let dropped = forward_cpu(&plain, &q, &mut kc, &mut vc, &new, &new, none(), 1);
    assert!(
        matches!(dropped, Err(AttnError::InvalidInput { what }) if what.contains("seqlen_new is 0"))
    );
    let auto = flashattn::kvcache::forward(
        flashattn::BackendChoice::Auto,
        &plain,
        &q,
        &mut kc,
        &mut vc,
        &new,
        &new,
        none(),
        None,
    );
    assert!(matches!(auto, Err(AttnError::InvalidInput { .. })));
    assert!(append(&plain, &mut kc, &mut vc, &new, &new, none()).is_err());
    assert!(
        kc.iter().all(|x| *x == f16::ONE),
        "nothing written by a refused call"
    );
}

/// A NaN read by a row makes that row NaN (o and lse) at every split count, and leaves every
/// other row finite: the rule of every backend, which the GPU check applies too.
#[test]
fn nan_inputs_propagate_to_the_rows_that_read_them() {
    let p = KvCacheProblem::new(
        2,
        2,
        4,
        2,
        16,
        CacheLayout::Contiguous { seqlen_cache: 256 },
        vec![200, 40],
        0,
    )
    .unwrap()
    .with_mask(Mask::Causal);
    let mut q: Vec<f32> = random_vec(2 * 2 * 4 * 16, 1);
    q[0] = f32::NAN; // row (b 0, i 0, h 0)
    let mut kc: Vec<f32> = random_vec(p.cache_len(), 2);
    let at = p.key_offset(1, 10) + 16; // sequence 1, key 10, kv head 1: query heads 2 and 3
    kc[at + 3] = f32::NAN;
    let mut vc: Vec<f32> = random_vec(p.cache_len(), 3);
    for splits in 1..=5 {
        let out = forward_cpu(&p, &q, &mut kc, &mut vc, &[], &[], none(), splits).unwrap();
        for b in 0..2 {
            for i in 0..2 {
                for h in 0..4 {
                    let reads_nan = (b == 0 && i == 0 && h == 0) || (b == 1 && h >= 2);
                    let lse = out.lse[(b * 4 + h) * 2 + i];
                    let o = &out.o[((b * 2 + i) * 4 + h) * 16..][..16];
                    assert_eq!(
                        lse.is_nan(),
                        reads_nan,
                        "b{b} i{i} h{h} splits {splits}: lse {lse}"
                    );
                    assert_eq!(o.iter().any(|x| x.is_nan()), reads_nan, "b{b} i{i} h{h}");
                }
            }
        }
    }
}
