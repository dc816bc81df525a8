//! A decoding loop on one [`flashattn::cuda::decode::DecodePlan`] (the host-index path of a
//! loop that keeps its shapes): steps of one new token per sequence, the plan handed each
//! step's lengths with `update`.

use super::run::same_bits;
use crate::check::outcome::{CaseResult, Poisoned};
use flashattn::compare::{Tolerance, diff_rows, random_vec};
use flashattn::cuda::decode::DecodeTensors;
use flashattn::cuda::device::cuda_err;
use flashattn::cuda::{Gpu, GpuElement, KernelKind};
use flashattn::dtype::DType;
use flashattn::error::Result;
use flashattn::kvcache::{
    CacheLayout, KvCacheProblem, RotaryTables, append, place, reference, shuffled_pages,
};
use half::{bf16, f16};

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
                DecodeTensors {
                    q: &dq,
                    k_cache: &mut dkc,
                    v_cache: &mut dvc,
                    new: Some((&dkn, &dvn)),
                    rotary: None,
                    o: &mut outs.o.slice_mut(0..q.len()),
                    lse: &mut outs.lse.slice_mut(0..3 * hq),
                },
            )?;
            stream.synchronize().map_err(cuda_err("decoding loop step"))
        });
        if let Err(e) = ran {
            problems.push(format!("step {step}: {e}"));
            break;
        }
        append(&p, &mut kc, &mut vc, &kn, &vn, RotaryTables::none())?;
        let exact = reference(&p, &q, &kc, &vc, RotaryTables::none())?;
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
