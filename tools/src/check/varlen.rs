//! Packed variable-length batches ([`flashattn::varlen`]) on the GPU against the f64 oracle: one
//! launch over every sequence ([`flashattn::cuda::varlen`]), with the cases the variable-length
//! issue names: zero-length query and/or key sequences inside a batch, seqlen_q = 1 with GQA
//! 8:1, one sequence much longer than the rest, seqlen_q != seqlen_k per sequence, causal,
//! window, softcap and per-(batch, head) ALiBi, odd lengths, head dims 40 to 256, both dtypes.
//! Outputs are poisoned (with a guard past the end) as in the dense sweep: every row must be
//! written (o = 0, lse = -inf for rows that see no key) and nothing past the end.

use super::outcome::{CaseResult, Poisoned};
use flashattn::compare::{Tolerance, random_vec};
use flashattn::cuda::device::cuda_err;
use flashattn::cuda::{Gpu, GpuElement, KernelKind};
use flashattn::dtype::DType;
use flashattn::error::Result;
use flashattn::mask::Mask;
use flashattn::scores::{Alibi, ScoreMods, Window};
use flashattn::varlen::{self, DeviceVarlenProblem, VarlenOutput, VarlenProblem, offsets};
use half::{bf16, f16};

/// One packed batch of the sweep.
#[derive(Debug, Clone)]
pub struct VarlenCase {
    /// Description: dtype, lengths, heads, head_dim, mask, modifiers.
    pub label: String,
    /// Element type.
    pub dtype: DType,
    /// The batch.
    pub problem: VarlenProblem,
}

/// The packed batches of the sweep (the same in quick mode: they are small).
pub fn cases() -> Vec<VarlenCase> {
    let window = |l, r| ScoreMods {
        window: Window::from_fa(l, r).expect("valid window"),
        ..ScoreMods::default()
    };
    // (q lengths, k lengths, heads_q, heads_kv, head_dim, mask, modifiers)
    type Spec = (Vec<usize>, Vec<usize>, usize, usize, usize, Mask, ScoreMods);
    let plain = ScoreMods::default;
    let specs: Vec<Spec> = vec![
        // Zero-length query and/or key sequences inside the batch.
        (
            vec![5, 0, 17, 9, 0, 3],
            vec![7, 3, 0, 9, 0, 130],
            4,
            2,
            64,
            Mask::Causal,
            plain(),
        ),
        (
            vec![5, 0, 17, 9, 0, 3],
            vec![7, 3, 0, 9, 0, 130],
            4,
            2,
            128,
            Mask::None,
            plain(),
        ),
        // Decoding: one query per sequence, GQA 8:1, keys of different lengths.
        (
            vec![1, 1, 1, 1],
            vec![100, 1000, 37, 513],
            8,
            1,
            128,
            Mask::Causal,
            plain(),
        ),
        // Long enough sequences to run one attn_wgmma launch each (per_sequence_pays),
        // among them one without queries and one with fewer keys than queries.
        (
            vec![2048, 2300, 0, 4000],
            vec![2048, 2000, 5, 4000],
            2,
            1,
            64,
            Mask::Causal,
            plain(),
        ),
        // One sequence much longer than the rest.
        (
            vec![3000, 17, 64, 1],
            vec![3000, 17, 64, 1],
            4,
            4,
            64,
            Mask::Causal,
            plain(),
        ),
        (
            vec![1500, 33, 129],
            vec![1500, 33, 129],
            2,
            1,
            256,
            Mask::None,
            plain(),
        ),
        // seqlen_q != seqlen_k per sequence, both ways; odd lengths; d40 and d96.
        (
            vec![65, 200, 7],
            vec![200, 65, 300],
            3,
            1,
            40,
            Mask::Causal,
            plain(),
        ),
        (
            vec![65, 200, 7],
            vec![200, 65, 300],
            2,
            2,
            96,
            Mask::None,
            plain(),
        ),
        // Score modifiers per sequence: window, softcap, ALiBi per (batch, head).
        (
            vec![300, 1, 129],
            vec![300, 77, 200],
            4,
            2,
            64,
            Mask::Causal,
            window(63, -1),
        ),
        (
            vec![257, 31],
            vec![257, 400],
            2,
            1,
            128,
            Mask::None,
            ScoreMods {
                window: Window::from_fa(100, 20).expect("valid window"),
                softcap: Some(30.0),
                alibi: Some(Alibi {
                    slopes: vec![0.5, 0.25, 0.125, 0.0625],
                    per_batch: true,
                }),
                sink: None,
            },
        ),
        // A learnable sink: a sequence without keys (its rows' lse is the sink), causal
        // sequences with more queries than keys.
        (
            vec![65, 40, 200],
            vec![300, 0, 70],
            4,
            2,
            64,
            Mask::Causal,
            ScoreMods {
                sink: Some(super::cases::sink_logits(4, "mild")),
                ..ScoreMods::default()
            },
        ),
    ];
    let mut out = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        for (lq, lk, hq, hkv, d, mask, mods) in &specs {
            let p = VarlenProblem::new(offsets(lq), offsets(lk), *hq, *hkv, *d)
                .expect("valid sweep batch")
                .with_mask(*mask)
                .with_scores(mods.clone())
                .expect("valid sweep modifiers");
            let label = format!(
                "{dtype} varlen q{lq:?} k{lk:?} hq={hq} hkv={hkv} d={d} {}{}",
                mask.name(),
                super::cases::describe_scores(mods)
            );
            out.push(VarlenCase {
                label,
                dtype,
                problem: p,
            });
        }
    }
    out
}

/// Runs one case on each kernel (wgmma hands packed batches to mma, and the result says so).
///
/// # Errors
/// Oracle errors and copy failures; kernel failures are recorded as failed results.
pub fn run_case(
    gpu: &Gpu,
    case: &VarlenCase,
    kernels: &[KernelKind],
    seed: u64,
) -> Result<Vec<CaseResult>> {
    match case.dtype {
        DType::BF16 => run_typed::<bf16>(gpu, case, kernels, seed),
        _ => run_typed::<f16>(gpu, case, kernels, seed),
    }
}

fn run_typed<T: GpuElement>(
    gpu: &Gpu,
    case: &VarlenCase,
    kernels: &[KernelKind],
    seed: u64,
) -> Result<Vec<CaseResult>> {
    let p = &case.problem;
    let (nq, nk) = (
        p.total_q() * p.heads_q * p.head_dim,
        p.total_k() * p.heads_kv * p.head_dim,
    );
    let q: Vec<T> = random_vec(nq, seed);
    let k: Vec<T> = random_vec(nk, seed ^ 0x5555);
    let v: Vec<T> = random_vec(nk, seed ^ 0xAAAA);
    let exact = varlen::reference(p, &q, &k, &v)?;
    let tol = Tolerance::for_dtype(case.dtype);
    let stream = gpu.stream();
    let up = |x: &[T]| stream.clone_htod(x).map_err(cuda_err("copying inputs"));
    let (dq, dk, dv) = (up(&q)?, up(&k)?, up(&v)?);
    let n_lse = p.heads_q * p.total_q();
    let mut out = Vec::new();
    for &kernel in kernels.iter().filter(|k| k.has_score_mods()) {
        let mut result = CaseResult::new(&case.label, kernel);
        let mut outs = Poisoned::<T>::new(gpu, nq, n_lse)?;
        let launched = flashattn::cuda::varlen::forward_device(
            gpu,
            kernel,
            p,
            &dq,
            &dk,
            &dv,
            &mut outs.o.slice_mut(0..nq),
            &mut outs.lse.slice_mut(0..n_lse),
        );
        let what = format!("varlen {kernel} launch");
        let Some((o, lse)) = outs.collect(gpu, &mut result, kernel, launched, what)? else {
            out.push(result);
            continue;
        };
        let got = VarlenOutput {
            o,
            lse,
            ran: String::new(),
        };
        let (od, ld) = varlen::diff_reference(p, &got, &exact);
        result.o_rel_l2 = od.rel_l2;
        result.o_max_abs = od.max_abs;
        result.lse_max_abs = ld.max_abs;
        let problems = tol
            .check(&case.label, &od, &ld)
            .err()
            .map(|e| e.to_string());
        result.conclude(problems.into_iter().collect(), Vec::new());
        out.push(result);
    }
    if p.head_dim.is_multiple_of(8) && kernels.contains(&KernelKind::Mma) {
        out.push(device_offsets::<T>(gpu, case, [&dq, &dk, &dv], &exact)?);
    }
    Ok(out)
}

/// The case with its offsets copied to the device first and the call made with them there
/// ([`flashattn::cuda::varlen::forward_device_offsets`], as a CUDA graph would replay it):
/// labelled `offsets-on-device`, checked against the same oracle.
fn device_offsets<T: GpuElement>(
    gpu: &Gpu,
    case: &VarlenCase,
    [dq, dk, dv]: [&cudarc::driver::CudaSlice<T>; 3],
    exact: &flashattn::reference::Reference,
) -> Result<CaseResult> {
    let p = &case.problem;
    let stream = gpu.stream();
    let (nq, n_lse) = (
        p.total_q() * p.heads_q * p.head_dim,
        p.heads_q * p.total_q(),
    );
    let up = |x: &[i32]| {
        stream
            .clone_htod(x)
            .map_err(cuda_err("copying the offsets"))
    };
    let (cq, ck) = (up(&p.cu_seqlens_q)?, up(&p.cu_seqlens_k)?);
    let kernel = KernelKind::Mma;
    let mut result = CaseResult::new(&format!("{} offsets-on-device", case.label), kernel);
    let mut outs = Poisoned::<T>::new(gpu, nq, n_lse)?;
    let launched = flashattn::cuda::varlen::forward_device_offsets(
        gpu,
        &DeviceVarlenProblem::from(p),
        &cq,
        &ck,
        dq,
        dk,
        dv,
        &mut outs.o.slice_mut(0..nq),
        &mut outs.lse.slice_mut(0..n_lse),
    );
    let what = "varlen launch, offsets on the device".to_string();
    let Some((o, lse)) = outs.collect(gpu, &mut result, kernel, launched, what)? else {
        return Ok(result);
    };
    let got = VarlenOutput {
        o,
        lse,
        ran: String::new(),
    };
    let (od, ld) = varlen::diff_reference(p, &got, exact);
    result.o_rel_l2 = od.rel_l2;
    result.o_max_abs = od.max_abs;
    result.lse_max_abs = ld.max_abs;
    let problems = Tolerance::for_dtype(case.dtype)
        .check(&case.label, &od, &ld)
        .err()
        .map(|e| e.to_string());
    result.conclude(problems.into_iter().collect(), Vec::new());
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_varlen_sweep_has_the_issue_cases() {
        let cs = cases();
        assert!(cs.iter().all(|c| c.problem.validate().is_ok()));
        let has = |f: &dyn Fn(&VarlenProblem) -> bool| cs.iter().any(|c| f(&c.problem));
        let lens = |cu: &[i32]| cu.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>();
        // zero-length q and k inside a batch, decoding with GQA 8:1, a long sequence
        assert!(has(
            &|p| lens(&p.cu_seqlens_q)[1..].contains(&0) && lens(&p.cu_seqlens_k)[1..].contains(&0)
        ));
        assert!(has(
            &|p| lens(&p.cu_seqlens_q).iter().all(|&l| l == 1) && p.heads_q == 8 * p.heads_kv
        ));
        assert!(has(&|p| p.max_seqlen_q() >= 3000));
        // both ways of the sm_90 forward: one launch per sequence, and packed
        assert!(has(&flashattn::cuda::varlen::per_sequence_pays));
        assert!(has(&|p| !flashattn::cuda::varlen::per_sequence_pays(p)));
        assert!(has(&|p| p
            .scores
            .alibi
            .as_ref()
            .is_some_and(|a| a.per_batch)));
    }
}
