//! `flashattn check`: every GPU kernel against the f64 oracle, over a sweep of dtypes, head
//! dims, masks, lengths, GQA, strides and `seqlen_q != seqlen_k`.
//!
//! Each case draws fresh random inputs (seeded; the seed is printed and `FLASHATTN_SEED`
//! replays it), poisons `o` and `lse` (NaN bit patterns) including a guard region past the last
//! element, launches, and then requires: every addressed element written and within
//! [`Tolerance`], and the guard region untouched (no write past the end). The oracle of a case is
//! computed once and shared by every kernel.

use crate::compare::{dense_o, diff_lse, diff_o, random_inputs, widen, Tolerance};
use crate::cuda::device::cuda_err;
use crate::cuda::{forward_device, GpuElement, Gpu, KernelKind, MmaTile};
use crate::dtype::DType;
use crate::error::Result;
use crate::mask::Mask;
use crate::reference;
use crate::shape::{AttnProblem, AttnShape, Strides};
use half::{bf16, f16};
use serde::Serialize;

/// Elements past the end of `o` and `lse` that must stay poisoned.
const GUARD: usize = 256;
/// NaN in both f16 and bf16 (all exponent and mantissa bits set).
const POISON16: u16 = 0xFFFF;

/// One problem of the sweep (run by every selected kernel).
#[derive(Debug, Clone, Serialize)]
pub struct Case {
    /// Short description: dtype, shape, mask, layout.
    pub label: String,
    /// Element type.
    pub dtype: DType,
    /// The problem.
    pub problem: AttnProblem,
}

/// The outcome of one (case, kernel).
#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    /// Case label.
    pub label: String,
    /// Kernel name.
    pub kernel: String,
    /// rel-L2 of o.
    pub o_rel_l2: f64,
    /// max-abs error of o.
    pub o_max_abs: f64,
    /// max-abs error of lse.
    pub lse_max_abs: f64,
    /// Poisoned guard elements past the end that were overwritten.
    pub guard_overwritten: usize,
    /// Passed every rule.
    pub passed: bool,
    /// Why it failed (or was skipped), empty when passed.
    pub message: String,
}

fn problem(shape: AttnShape, mask: Mask) -> AttnProblem {
    AttnProblem::new(shape).map(|p| p.with_mask(mask)).expect("sweep shapes are valid")
}

/// The sweep. `quick` keeps it small enough for compute-sanitizer.
pub fn cases(quick: bool) -> Vec<Case> {
    let mut out = Vec::new();
    let dtypes = [DType::F16, DType::BF16];
    let masks = [Mask::None, Mask::Causal];
    let (head_dims, lengths): (&[usize], &[usize]) = if quick {
        (&[64, 128], &[1, 17, 64, 65, 129])
    } else {
        (&[32, 40, 64, 80, 96, 128, 256], &[1, 17, 63, 64, 65, 127, 129, 200, 512, 1000, 4096])
    };
    let mut push = |dtype: DType, p: AttnProblem, what: &str| {
        let s = p.shape;
        out.push(Case {
            label: format!(
                "{dtype} b{} sq{} sk{} hq{} hkv{} d{} {}{}",
                s.batch,
                s.seqlen_q,
                s.seqlen_k,
                s.heads_q,
                s.heads_kv,
                s.head_dim,
                p.mask.name(),
                what
            ),
            dtype,
            problem: p,
        });
    };
    for dtype in dtypes {
        for &d in head_dims {
            for mask in masks {
                for &l in lengths {
                    // Long sequences only where the oracle stays cheap.
                    if l >= 4096 && !(d == 64 || d == 128) {
                        continue;
                    }
                    push(dtype, problem(AttnShape::new(1, l, 2, d), mask), "");
                }
            }
        }
        let pairs: &[(usize, usize)] = if quick {
            &[(5, 2), (2, 5), (1, 8), (65, 200)]
        } else {
            &[(5, 2), (2, 5), (1, 8), (1, 1000), (64, 200), (200, 64), (129, 1000), (1000, 129), (17, 4096)]
        };
        for &(sq, sk) in pairs {
            for mask in masks {
                let shape = AttnShape { seqlen_q: sq, seqlen_k: sk, ..AttnShape::new(1, 0, 2, 64) };
                push(dtype, problem(shape, mask), "");
            }
        }
        for mask in masks {
            // GQA 4:1 and 8:1 (issue 7: 64 query heads over 8 kv heads at d128), MQA, batch 3.
            let gqa = AttnShape { heads_kv: 2, ..AttnShape::new(2, 200, 8, 64) };
            push(dtype, problem(gqa, mask), " gqa");
            if !quick {
                let gqa8 = AttnShape { heads_kv: 8, ..AttnShape::new(1, 256, 64, 128) };
                push(dtype, problem(gqa8, mask), " gqa");
            }
            let mqa = AttnShape { heads_kv: 1, ..AttnShape::new(1, 129, 4, 128) };
            push(dtype, problem(mqa, mask), " mqa");
            push(dtype, problem(AttnShape::new(3, 100, 2, 64), mask), " batch");
            // Memory [b, h, s, d] seen as bshd (a transposed view), and a non-default scale.
            let sh = AttnShape::new(2, 77, 3, 64);
            let st = Strides { batch: 3 * 77 * 64, seq: 64, head: 77 * 64 };
            let p = problem(sh, mask)
                .with_strides(st, st, st, st)
                .and_then(|p| p.with_scale(0.3))
                .expect("valid strides");
            push(dtype, p, " bhsd-view scale0.3");
        }
    }
    out
}

/// Options of [`run`].
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Kernels to check.
    pub kernels: Vec<KernelKind>,
    /// Small sweep.
    pub quick: bool,
    /// Base seed (printed).
    pub seed: u64,
    /// Only cases whose label contains this.
    pub filter: Option<String>,
    /// Tile override for `mma`.
    pub tile: Option<MmaTile>,
}

/// Runs the sweep, printing one line per (case, kernel) with `print`. Returns every result.
///
/// # Errors
/// Only failures that stop the sweep (oracle errors on a valid case); kernel failures are
/// recorded as failed results.
pub fn run(gpu: &Gpu, opts: &CheckOptions, mut print: impl FnMut(&str)) -> Result<Vec<CaseResult>> {
    let mut results = Vec::new();
    let all = cases(opts.quick);
    let selected: Vec<&Case> = all
        .iter()
        .filter(|c| opts.filter.as_ref().is_none_or(|f| c.label.contains(f.as_str())))
        .collect();
    print(&format!(
        "checking {} cases x {} kernels on {} ({}), seed {} (replay with FLASHATTN_SEED={})",
        selected.len(),
        opts.kernels.len(),
        gpu.info().name,
        gpu.info().arch,
        opts.seed,
        opts.seed
    ));
    for (i, case) in selected.iter().enumerate() {
        let seed = opts.seed.wrapping_add(i as u64 * 0x9E37_79B9);
        let r = match case.dtype {
            DType::F16 => run_case::<f16>(gpu, case, opts, seed)?,
            DType::BF16 => run_case::<bf16>(gpu, case, opts, seed)?,
            DType::F32 => continue,
        };
        for x in r {
            print(&format!(
                "[{}] {:6} {:<48} o rel-L2 {:.2e} max-abs {:.2e} | lse max-abs {:.2e}{}",
                if x.passed { "PASS" } else { "FAIL" },
                x.kernel,
                x.label,
                x.o_rel_l2,
                x.o_max_abs,
                x.lse_max_abs,
                if x.message.is_empty() { String::new() } else { format!(" | {}", x.message) }
            ));
            results.push(x);
        }
    }
    let failed = results.iter().filter(|r| !r.passed).count();
    print(&format!("{} passed, {} failed", results.len() - failed, failed));
    Ok(results)
}

fn run_case<T: GpuElement>(gpu: &Gpu, case: &Case, opts: &CheckOptions, seed: u64) -> Result<Vec<CaseResult>> {
    let p = &case.problem;
    let s = p.shape;
    let (q, k, v) = random_inputs::<T>(p, seed);
    let oracle = reference::attention(p, &q, &k, &v)?;
    let tol = Tolerance::for_dtype(case.dtype);
    let stream = gpu.stream();
    let up = |x: &[T]| stream.clone_htod(x).map_err(cuda_err("copying inputs"));
    let (dq, dk, dv) = (up(&q)?, up(&k)?, up(&v)?);
    let o_len = p.o_strides.required_len("o", s.batch, s.seqlen_q, s.heads_q, s.head_dim)?;
    let lse_len = s.lse_len();
    // SAFETY: T is f16 or bf16; every 16-bit pattern is a valid value.
    let poison: T = unsafe { std::mem::transmute_copy::<u16, T>(&POISON16) };
    let poison_o: Vec<T> = vec![poison; o_len + GUARD];
    let poison_lse: Vec<f32> = vec![f32::NAN; lse_len + GUARD];
    let mut out = Vec::new();
    for &kernel in &opts.kernels {
        let mut result = CaseResult {
            label: case.label.clone(),
            kernel: kernel.name().into(),
            o_rel_l2: f64::NAN,
            o_max_abs: f64::NAN,
            lse_max_abs: f64::NAN,
            guard_overwritten: 0,
            passed: false,
            message: String::new(),
        };
        // Fresh poisoned outputs for every kernel; the kernel sees only the first o_len/lse_len.
        let mut d_o = stream.clone_htod(&poison_o).map_err(cuda_err("poisoning o"))?;
        let mut d_lse = stream.clone_htod(&poison_lse).map_err(cuda_err("poisoning lse"))?;
        let mut o_view = d_o.slice_mut(0..o_len);
        let mut lse_view = d_lse.slice_mut(0..lse_len);
        let launched = forward_device(gpu, kernel, opts.tile, p, &dq, &dk, &dv, &mut o_view, &mut lse_view)
            .and_then(|_| stream.synchronize().map_err(cuda_err(crate::cuda::attention::launch_context(kernel.name(), p))));
        if let Err(e) = launched {
            result.message = e.to_string();
            out.push(result);
            continue;
        }
        let o_host: Vec<T> = stream.clone_dtoh(&d_o).map_err(cuda_err("copying o back"))?;
        let lse_host: Vec<f32> = stream.clone_dtoh(&d_lse).map_err(cuda_err("copying lse back"))?;
        let guard_o = o_host[o_len..].iter().filter(|x| to_bits(**x) != POISON16).count();
        let guard_lse = lse_host[lse_len..].iter().filter(|x| !x.is_nan()).count();
        result.guard_overwritten = guard_o + guard_lse;
        let od = diff_o(dense_o(p, &o_host[..o_len])?, &oracle.o);
        let ld = diff_lse(widen(&lse_host[..lse_len]), &oracle.lse);
        result.o_rel_l2 = od.rel_l2;
        result.o_max_abs = od.max_abs;
        result.lse_max_abs = ld.max_abs;
        let mut problems = Vec::new();
        if let Err(e) = tol.check(&case.label, &od, &ld) {
            problems.push(e.to_string());
        }
        if result.guard_overwritten > 0 {
            problems.push(format!("{} elements past the end were written", result.guard_overwritten));
        }
        result.passed = problems.is_empty();
        result.message = problems.join("; ");
        out.push(result);
    }
    Ok(out)
}

fn to_bits<T: GpuElement>(x: T) -> u16 {
    // SAFETY: T is f16 or bf16, both 16-bit plain data.
    unsafe { std::mem::transmute_copy::<T, u16>(&x) }
}
