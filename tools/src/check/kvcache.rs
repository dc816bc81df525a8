//! Decoding against a KV cache ([`flashattn::kvcache`]) on the GPU against the f64 oracle
//! ([`flashattn::cuda::decode`]), with the cases the decoding issue names: cache lengths 0 and at
//! capacity; page sizes 16, 64 and 256 (and 48, 144) with shuffled block tables; lengths that differ within
//! a batch, including a sequence with fewer key blocks than splits; appended rows crossing a
//! page boundary; seqlen_q 1, 2, 4, 16 with GQA 1, 4, 8 and MQA; every split count from 1 to
//! past the number of key blocks (and the heuristic's pick) against the same reference;
//! causal, window, softcap, ALiBi; head dims 40 to 256; both dtypes.
//!
//! Unused cache rows hold NaN (a read of one would reach o), outputs are poisoned with a guard
//! past the end, the caches after the call must equal the CPU's append byte for byte, and the
//! heuristic's split count must give the same bytes on a second run.

use super::outcome::{CaseResult, Poisoned, synced, to_bits};
use flashattn::compare::{Tolerance, diff_rows, random_vec};
use flashattn::cuda::decode::forward_device;
use flashattn::cuda::device::cuda_err;
use flashattn::cuda::{Gpu, GpuElement, KernelKind};
use flashattn::dtype::{DType, Element};
use flashattn::error::Result;
use flashattn::kvcache::{
    CacheLayout, KvCacheProblem, MAX_SPLITS, SPLIT_BLOCK, append, place, reference, shuffled_pages,
};
use flashattn::mask::Mask;
use flashattn::reference::Reference;
use flashattn::scores::{Alibi, ScoreMods, Window};
use half::{bf16, f16};

/// One decoding call of the sweep.
#[derive(Debug, Clone)]
pub struct KvCase {
    /// Description: dtype, layout, lengths, heads, head_dim, mask, modifiers.
    pub label: String,
    /// Element type.
    pub dtype: DType,
    /// The call (contiguous or paged).
    pub problem: KvCacheProblem,
    /// Split counts to run (`None`: the heuristic's).
    pub splits: Vec<Option<usize>>,
    /// Put a NaN in one query row and in one cached key: the rows that read them must come
    /// out non-finite (never silently dropped), every other row within tolerance.
    pub poison: bool,
}

/// The split counts of a call: 1 to two past the number of key blocks of its longest
/// sequence (so some splits are empty for every sequence), at most [`MAX_SPLITS`], and the
/// heuristic's.
fn split_counts(p: &KvCacheProblem) -> Vec<Option<usize>> {
    let blocks = p.max_seqlen_k().div_ceil(SPLIT_BLOCK).max(1);
    let mut out: Vec<Option<usize>> = (1..=(blocks + 2).min(MAX_SPLITS)).map(Some).collect();
    out.push(None);
    out
}

/// The sweep's calls.
pub fn cases() -> Vec<KvCase> {
    // (batch lengths, seqlen_new, capacity, seqlen_q, heads_q, heads_kv, head_dim, mask, mods)
    type Spec = (
        Vec<i32>,
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        Mask,
        ScoreMods,
    );
    let plain = ScoreMods::default;
    let mut specs: Vec<Spec> = Vec::new();
    // seqlen_q 1, 2, 4, 16 with GQA 1, 4, 8 and MQA; lengths that differ (one at 0, one with
    // fewer key blocks than splits); three appended rows, crossing a 16-key page boundary.
    for (sq, hq, hkv) in [(1, 4, 4), (2, 8, 2), (4, 8, 1), (16, 4, 1), (1, 32, 8)] {
        for mask in [Mask::None, Mask::Causal] {
            specs.push((vec![300, 0, 14], 3, 320, sq, hq, hkv, 128, mask, plain()));
        }
    }
    // Cache lengths 0 and at capacity; all empty.
    specs.push((vec![0, 256], 0, 256, 2, 4, 2, 64, Mask::Causal, plain()));
    specs.push((vec![0, 0], 0, 256, 1, 4, 2, 64, Mask::None, plain()));
    specs.push((vec![250, 200], 6, 256, 2, 4, 1, 64, Mask::Causal, plain()));
    // A long cache (many splits), head dims 40 and 256.
    specs.push((vec![3000, 700], 1, 3072, 1, 16, 2, 128, Mask::None, plain()));
    specs.push((vec![1000, 37], 2, 1024, 3, 6, 2, 40, Mask::Causal, plain()));
    specs.push((vec![1000, 37], 2, 1024, 4, 4, 2, 256, Mask::Causal, plain()));
    // Window, softcap and ALiBi per (batch, head).
    specs.push((
        vec![700, 37],
        2,
        768,
        4,
        8,
        2,
        128,
        Mask::Causal,
        ScoreMods {
            window: Window::from_fa(100, 0).expect("valid window"),
            softcap: Some(30.0),
            alibi: Some(Alibi {
                slopes: (0..16).map(|i| 0.5f32.powi(i % 8 + 1)).collect(),
                per_batch: true,
            }),
            sink: None,
        },
    ));
    // A learnable sink: one split (attn_decode folds it in) and many (attn_combine does);
    // a sequence with one key only, the new row (causal: its first query row sees none, and
    // its lse is the sink).
    for lens in [vec![200, 0], vec![3000, 700]] {
        specs.push((
            lens,
            1,
            3072,
            2,
            8,
            2,
            128,
            Mask::Causal,
            ScoreMods {
                sink: Some(super::cases::sink_logits(8, "mild")),
                ..ScoreMods::default()
            },
        ));
    }
    let mut out = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        for (n, (lens, new, cap, sq, hq, hkv, d, mask, mods)) in specs.iter().enumerate() {
            let contiguous = KvCacheProblem::new(
                lens.len(),
                *sq,
                *hq,
                *hkv,
                *d,
                CacheLayout::Contiguous { seqlen_cache: *cap },
                lens.clone(),
                *new,
            )
            .and_then(|p| p.with_mask(*mask).with_scores(mods.clone()))
            .expect("valid sweep call");
            // Contiguous, and paged with one of the three page sizes (rotating through the
            // specs), pages shuffled.
            let page = [16, 64, 256][n % 3];
            let paged = shuffled_pages(&contiguous, page, n as u64 + 1).expect("valid pages");
            for (layout, p) in [
                ("contiguous".to_string(), contiguous),
                (format!("paged{page}"), paged),
            ] {
                let label = format!(
                    "{dtype} kvcache {layout} lens{lens:?}+{new} sq={sq} hq={hq} hkv={hkv} d={d} {}{}",
                    mask.name(),
                    super::cases::describe_scores(mods)
                );
                out.push(KvCase {
                    label,
                    dtype,
                    splits: split_counts(&p),
                    problem: p,
                    poison: false,
                });
            }
        }
        // Pages that neither divide the 128-key tile nor are a multiple of it (48, 144): the
        // copy engine path refuses them (a box would straddle two pages), so these run the
        // cp.async path on every GPU.
        let odd = d128_call(1, 600, vec![577, 130, 0], 0);
        for page in [48, 144] {
            let p = shuffled_pages(&odd, page, 7 + page as u64).expect("valid pages");
            out.push(KvCase {
                label: format!(
                    "{dtype} kvcache paged{page} lens[577, 130, 0]+0 sq=1 hq=8 hkv=2 d=128 none"
                ),
                dtype,
                splits: split_counts(&p),
                problem: p,
                poison: false,
            });
        }
        // A cache with no rows at all (capacity 0): every row sees no key (o = 0, lse = -inf);
        // a tensor map cannot describe it, so the copy engine path refuses it.
        let none = d128_call(1, 0, vec![0, 0], 0);
        out.push(KvCase {
            label: format!(
                "{dtype} kvcache contiguous capacity 0 lens[0, 0]+0 sq=1 hq=8 hkv=2 d=128 none"
            ),
            dtype,
            splits: vec![Some(1), None],
            problem: none,
            poison: false,
        });
        // NaN inputs: a NaN in q row (0, 0, head 0) and in a cached key of sequence 1 (kv head
        // 1, read by query heads 4..7), contiguous and paged, several splits.
        let nan = d128_call(2, 512, vec![300, 50], 1).with_mask(Mask::Causal);
        let paged = shuffled_pages(&nan, 16, 99).expect("valid pages");
        for (layout, p) in [("contiguous", nan), ("paged16", paged)] {
            out.push(KvCase {
                label: format!(
                    "{dtype} kvcache {layout} lens[300, 50]+1 sq=2 hq=8 hkv=2 d=128 causal NaN in q and k"
                ),
                dtype,
                splits: vec![Some(1), Some(3), None],
                problem: p,
                poison: true,
            });
        }
    }
    out
}

/// A call of the sweep's extra cases: `seqlen_q` rows of 8 query heads on 2 kv heads, d128,
/// against a contiguous cache of `capacity` rows per sequence holding `lens`, `new` rows
/// appended.
fn d128_call(seqlen_q: usize, capacity: usize, lens: Vec<i32>, new: usize) -> KvCacheProblem {
    KvCacheProblem::new(
        lens.len(),
        seqlen_q,
        8,
        2,
        128,
        CacheLayout::Contiguous {
            seqlen_cache: capacity,
        },
        lens,
        new,
    )
    .expect("valid sweep call")
}

/// Runs one call at every split count of the case; one result (the worst split count's
/// errors, and every failing count named).
///
/// # Errors
/// Oracle errors and copy failures; kernel failures are recorded as failed results.
pub fn run_case(gpu: &Gpu, case: &KvCase, seed: u64) -> Result<CaseResult> {
    match case.dtype {
        DType::BF16 => run_typed::<bf16>(gpu, case, seed),
        _ => run_typed::<f16>(gpu, case, seed),
    }
}

/// Random logical caches, q and new rows of a call.
struct Data<T> {
    k_cache: Vec<T>,
    v_cache: Vec<T>,
    q: Vec<T>,
    k_new: Vec<T>,
    v_new: Vec<T>,
}

fn data<T: Element>(p: &KvCacheProblem, seed: u64) -> Data<T> {
    let row = p.heads_kv * p.head_dim;
    let logical = |s: u64| -> Vec<Vec<T>> {
        p.cache_seqlens
            .iter()
            .enumerate()
            .map(|(b, &l)| random_vec(l as usize * row, s ^ (b as u64 * 77)))
            .collect()
    };
    let nn = p.batch * p.seqlen_new * row;
    Data {
        k_cache: place(p, &logical(seed ^ 11)),
        v_cache: place(p, &logical(seed ^ 12)),
        q: random_vec(p.batch * p.seqlen_q * p.heads_q * p.head_dim, seed ^ 13),
        k_new: random_vec(nn, seed ^ 14),
        v_new: random_vec(nn, seed ^ 15),
    }
}

/// Whether two buffers hold the same bytes, element by element (over the shorter one; NaNs
/// compare by their bits).
fn same_bits<T: GpuElement>(a: &[T], b: &[T]) -> bool {
    a.iter().zip(b).all(|(x, y)| to_bits(*x) == to_bits(*y))
}

/// What one GPU call produced.
struct Produced<T> {
    o: Vec<T>,
    lse: Vec<f32>,
    guard_written: usize,
    k_cache: Vec<T>,
    v_cache: Vec<T>,
}

fn run_once<T: GpuElement>(
    gpu: &Gpu,
    p: &KvCacheProblem,
    x: &Data<T>,
    splits: Option<usize>,
) -> Result<Result<Produced<T>>> {
    let stream = gpu.stream();
    let up = |v: &[T]| stream.clone_htod(v).map_err(cuda_err("copying inputs"));
    let (dq, mut dkc, mut dvc) = (up(&x.q)?, up(&x.k_cache)?, up(&x.v_cache)?);
    // At least one element, so that a call without new rows still has buffers to view.
    let pad = |v: &[T]| {
        if v.is_empty() {
            vec![T::from_f32(0.0)]
        } else {
            v.to_vec()
        }
    };
    let (dkn, dvn) = (up(&pad(&x.k_new))?, up(&pad(&x.v_new))?);
    let n_o = x.q.len();
    let n_lse = p.batch * p.heads_q * p.seqlen_q;
    let mut outs = Poisoned::<T>::new(gpu, n_o, n_lse)?;
    let new = (p.seqlen_new > 0).then(|| (dkn.as_view(), dvn.as_view()));
    let launched = forward_device(
        gpu,
        p,
        &dq,
        &mut dkc,
        &mut dvc,
        new.as_ref().map(|(k, v)| {
            (
                k as &dyn cudarc::driver::DevicePtr<T>,
                v as &dyn cudarc::driver::DevicePtr<T>,
            )
        }),
        &mut outs.o.slice_mut(0..n_o),
        &mut outs.lse.slice_mut(0..n_lse),
        splits,
    );
    if let Err(e) = synced(gpu, launched, "kvcache decode launch") {
        return Ok(Err(e));
    }
    let (o, lse, guard_written) = outs.read(gpu)?;
    let back = |d: &cudarc::driver::CudaSlice<T>| {
        stream
            .clone_dtoh(d)
            .map_err(cuda_err("copying a cache back"))
    };
    Ok(Ok(Produced {
        o,
        lse,
        guard_written,
        k_cache: back(&dkc)?,
        v_cache: back(&dvc)?,
    }))
}

fn run_typed<T: GpuElement>(gpu: &Gpu, case: &KvCase, seed: u64) -> Result<CaseResult> {
    let p = &case.problem;
    let mut x = data::<T>(p, seed);
    if case.poison {
        // q row (b 0, i 0, h 0), and key 10 of sequence 1, kv head 1, channel 5.
        x.q[0] = T::from_f32(f32::NAN);
        let at = p.key_offset(1, 10) + p.head_dim + 5;
        x.k_cache[at] = T::from_f32(f32::NAN);
    }
    // The CPU's append gives the caches the call must leave, and the oracle's inputs.
    let (mut kc, mut vc) = (x.k_cache.clone(), x.v_cache.clone());
    append(p, &mut kc, &mut vc, &x.k_new, &x.v_new)?;
    let mut exact: Reference = reference(p, &x.q, &kc, &vc)?;
    // Rows whose exact result is not finite (they read the NaN): judged apart, by the rule of
    // every backend (src/check/inputs.rs): they must come out non-finite too.
    let bad: Vec<bool> = exact.lse.iter().map(|l| l.is_nan()).collect();
    let (hq, sq, d) = (p.heads_q, p.seqlen_q, p.head_dim);
    // o row (b, i, h) of lse row (b, h, i), and back.
    let o_row = |r: usize| {
        let (b, h, i) = (r / (hq * sq), (r / sq) % hq, r % sq);
        (b * sq + i) * hq + h
    };
    for r in (0..bad.len()).filter(|&r| bad[r]) {
        exact.lse[r] = 0.0;
        exact.o[o_row(r) * d..(o_row(r) + 1) * d].fill(0.0);
    }
    let tol = Tolerance::for_dtype(case.dtype);
    let mut result = CaseResult::new(&case.label, KernelKind::Mma);
    result.kernel = "decode".into();
    let (mut worst_l2, mut worst_abs, mut worst_lse) = (0.0f64, 0.0f64, 0.0f64);
    let mut problems = Vec::new();
    let row_of = |n: usize| {
        let row = n / d; // (b, i, h)
        let (b, i, h) = (row / (sq * hq), (row / hq) % sq, row % hq);
        (b * hq + h) * sq + i
    };
    let mut guard = 0;
    for &splits in &case.splits {
        let name = splits.map_or("heuristic".to_string(), |s| s.to_string());
        let got = match run_once(gpu, p, &x, splits)? {
            Ok(g) => g,
            Err(e) => {
                problems.push(format!("splits {name}: {e}"));
                continue;
            }
        };
        guard += got.guard_written;
        let (mut go, mut gl): (Vec<f64>, Vec<f64>) = (
            got.o.iter().map(|v| v.to_f64()).collect(),
            got.lse.iter().map(|&v| f64::from(v)).collect(),
        );
        let mut dropped = 0;
        for r in (0..bad.len()).filter(|&r| bad[r]) {
            let row = &mut go[o_row(r) * d..(o_row(r) + 1) * d];
            if row.iter().all(|v| v.is_finite()) && gl[r].is_finite() {
                dropped += 1;
            }
            row.fill(0.0);
            gl[r] = 0.0;
        }
        if dropped > 0 {
            problems.push(format!(
                "splits {name}: {dropped} rows that read a NaN came out finite (the NaN was dropped)"
            ));
        }
        let (od, ld) = diff_rows(go, gl, &exact, d, row_of);
        worst_l2 = worst_l2.max(od.rel_l2);
        worst_abs = worst_abs.max(od.max_abs);
        worst_lse = worst_lse.max(ld.max_abs);
        if let Err(e) = tol.check(&format!("splits {name}"), &od, &ld) {
            problems.push(e.to_string());
        }
        if !same_bits(&got.k_cache, &kc) || !same_bits(&got.v_cache, &vc) {
            problems.push(format!(
                "splits {name}: the caches after the call differ from the CPU's append"
            ));
        }
        if splits.is_none() {
            // Same bytes run to run.
            if let Ok(again) = run_once(gpu, p, &x, splits)?
                && (again.o.len() != got.o.len()
                    || !same_bits(&again.o, &got.o)
                    || again
                        .lse
                        .iter()
                        .map(|v| v.to_bits())
                        .ne(got.lse.iter().map(|v| v.to_bits())))
            {
                problems.push("a second run gave other bytes".into());
            }
        }
    }
    result.o_rel_l2 = worst_l2;
    result.o_max_abs = worst_abs;
    result.lse_max_abs = worst_lse;
    result.guard_overwritten = guard;
    let notes = vec![format!("{} split counts", case.splits.len())];
    result.conclude(problems, notes);
    Ok(result)
}

/// A decoding loop on one [`flashattn::cuda::decode::DecodePlan`]: four steps of one new token per
/// sequence on a paged cache (pages of 16, shuffled), the plan handed each step's lengths with
/// `update`; every step's o and lse against the oracle and the device caches against the CPU's
/// appends. One result per dtype.
///
/// # Errors
/// Oracle errors and copy failures; kernel failures are recorded in the result.
pub fn run_loop(gpu: &Gpu, dtype: DType, seed: u64) -> Result<CaseResult> {
    match dtype {
        DType::BF16 => run_loop_typed::<bf16>(gpu, seed),
        _ => run_loop_typed::<f16>(gpu, seed),
    }
}

/// The label of [`run_loop`]'s result.
pub fn loop_label(dtype: DType) -> String {
    format!(
        "{dtype} kvcache paged16 decoding loop: 4 steps on one plan, lens [30, 0, 47]+1 hq=8 hkv=2 d=128"
    )
}

fn run_loop_typed<T: GpuElement>(gpu: &Gpu, seed: u64) -> Result<CaseResult> {
    use flashattn::cuda::decode::DecodePlan;
    let start = vec![30, 0, 47];
    let base = KvCacheProblem::new(
        3,
        1,
        8,
        2,
        128,
        CacheLayout::Contiguous { seqlen_cache: 96 },
        start.clone(),
        1,
    )?;
    let p0 = shuffled_pages(&base, 16, seed | 1)?;
    let row = p0.heads_kv * p0.head_dim;
    let logical = |s: u64| -> Vec<Vec<T>> {
        start
            .iter()
            .enumerate()
            .map(|(b, &l)| random_vec(l as usize * row, s ^ (b as u64 * 31)))
            .collect()
    };
    let (mut kc, mut vc) = (
        place(&p0, &logical(seed ^ 1)),
        place(&p0, &logical(seed ^ 2)),
    );
    let stream = gpu.stream();
    let up = |v: &[T]| stream.clone_htod(v).map_err(cuda_err("copying inputs"));
    let (mut dkc, mut dvc) = (up(&kc)?, up(&vc)?);
    let mut result = CaseResult::new(&loop_label(T::DTYPE), KernelKind::Mma);
    result.kernel = "decode".into();
    let tol = Tolerance::for_dtype(T::DTYPE);
    let mut problems = Vec::new();
    let (mut worst_l2, mut worst_abs, mut worst_lse) = (0.0f64, 0.0f64, 0.0f64);
    let mut plan = match DecodePlan::new(gpu, &p0, T::DTYPE, None) {
        Ok(plan) => plan,
        Err(e) => {
            result.message = e.to_string();
            return Ok(result);
        }
    };
    let (hq, d) = (p0.heads_q, p0.head_dim);
    for step in 0..4i32 {
        let mut p = p0.clone();
        p.cache_seqlens = start.iter().map(|l| l + step).collect();
        let s = step as u64;
        let q: Vec<T> = random_vec(3 * hq * d, seed ^ (100 + s));
        let (kn, vn): (Vec<T>, Vec<T>) = (
            random_vec(3 * row, seed ^ (200 + s)),
            random_vec(3 * row, seed ^ (300 + s)),
        );
        let (dq, dkn, dvn) = (up(&q)?, up(&kn)?, up(&vn)?);
        let mut outs = Poisoned::<T>::new(gpu, q.len(), 3 * hq)?;
        let ran = plan.update(gpu, &p).and_then(|()| {
            plan.run(
                gpu,
                &dq,
                &mut dkc,
                &mut dvc,
                Some((&dkn.as_view(), &dvn.as_view())),
                &mut outs.o.slice_mut(0..q.len()),
                &mut outs.lse.slice_mut(0..3 * hq),
            )?;
            stream.synchronize().map_err(cuda_err("decoding loop step"))
        });
        if let Err(e) = ran {
            problems.push(format!("step {step}: {e}"));
            break;
        }
        append(&p, &mut kc, &mut vc, &kn, &vn)?;
        let exact = reference(&p, &q, &kc, &vc)?;
        let (o, lse, written) = outs.read(gpu)?;
        result.guard_overwritten += written;
        // seqlen_q 1: o row (b, h) and lse row (b, h) coincide.
        let (od, ld) = diff_rows(
            o.iter().map(|v| v.to_f64()),
            lse.iter().map(|&v| f64::from(v)),
            &exact,
            d,
            |n| n / d,
        );
        worst_l2 = worst_l2.max(od.rel_l2);
        worst_abs = worst_abs.max(od.max_abs);
        worst_lse = worst_lse.max(ld.max_abs);
        if let Err(e) = tol.check(&format!("step {step}"), &od, &ld) {
            problems.push(e.to_string());
        }
        let back = |x: &cudarc::driver::CudaSlice<T>| {
            stream
                .clone_dtoh(x)
                .map_err(cuda_err("copying a cache back"))
        };
        if !same_bits(&back(&dkc)?, &kc) || !same_bits(&back(&dvc)?, &vc) {
            problems.push(format!(
                "step {step}: the caches differ from the CPU's appends"
            ));
        }
    }
    result.o_rel_l2 = worst_l2;
    result.o_max_abs = worst_abs;
    result.lse_max_abs = worst_lse;
    result.conclude(problems, vec![format!("{} splits", plan.splits())]);
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kvcache_sweep_has_the_issue_cases() {
        let cs = cases();
        assert!(cs.iter().all(|c| c.problem.validate().is_ok()));
        let has = |f: &dyn Fn(&KvCacheProblem) -> bool| cs.iter().any(|c| f(&c.problem));
        let page = |p: &KvCacheProblem, n| matches!(p.layout, CacheLayout::Paged { page_size, .. } if page_size == n);
        for n in [16, 64, 256, 48, 144] {
            assert!(has(&|p| page(p, n)), "page size {n}");
        }
        assert!(has(&|p| p.cache_seqlens.contains(&0)));
        assert!(has(&|p| p
            .cache_seqlens
            .iter()
            .any(|&l| l as usize == p.capacity())));
        for sq in [1, 2, 4, 16] {
            assert!(has(&|p| p.seqlen_q == sq), "seqlen_q {sq}");
        }
        for g in [1, 4, 8] {
            assert!(has(&|p| p.heads_q / p.heads_kv == g), "group {g}");
        }
        assert!(has(&|p| p.heads_kv == 1), "MQA");
        // Appended rows crossing a 16-key page boundary.
        assert!(has(&|p| page(p, 16)
            && p.seqlen_new > 0
            && p.cache_seqlens
                .iter()
                .any(|&l| (l as usize % 16) + p.seqlen_new > 16)));
        // Every split count from 1 past the key blocks, and the heuristic's.
        assert!(cs.iter().any(|c| c.poison));
        for c in cs.iter().filter(|c| !c.poison) {
            let blocks = c.problem.max_seqlen_k().div_ceil(SPLIT_BLOCK).max(1);
            assert!(c.splits.contains(&Some(1)) && c.splits.contains(&None));
            assert!(c.splits.len() > blocks.min(MAX_SPLITS - 2));
        }
    }
}
