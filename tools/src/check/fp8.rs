//! The FP8 (e4m3) forward on the GPU (attn_wgmma_fp8) against the f64 oracle of the dequantised
//! inputs, judged by the FP8 tolerance of `flashattn::fp8::reference` (every `o` element within
//! its worst-case e4m3 bound, the error at most twice the rounding noise, lse within its bound);
//! and its refusals. Labels start with `fp8`, so `--filter fp8` selects them all.

use super::outcome::{CaseResult, Poisoned};
use flashattn::cuda::device::cuda_err;
use flashattn::cuda::fwd::wgmma_fp8::forward_device;
use flashattn::cuda::{Gpu, KernelKind};
use flashattn::error::{AttnError, Result};
use flashattn::fp8::{self, Descale, E4m3, Fp8Descales};
use flashattn::{AttnProblem, AttnShape, Mask};

/// One FP8 case: the problem and whether its descales are per (batch, kv head).
pub struct Fp8Case {
    /// `fp8 b=.. sq=.. sk=.. hq=.. hkv=.. d=.. mask [descales per head]`.
    pub label: String,
    /// The problem.
    pub problem: AttnProblem,
    /// Descales per (batch, kv head) rather than per tensor.
    pub per_head: bool,
}

/// The sweep: d64 and d128, no mask and causal, lengths off the tile sizes, GQA, sq != sk,
/// batches, and descales per (batch, kv head).
pub fn cases() -> Vec<Fp8Case> {
    let mut out = Vec::new();
    let shapes: [([usize; 6], bool); 7] = [
        ([1, 128, 128, 2, 2, 0], false),
        ([2, 257, 257, 4, 4, 0], false),
        ([1, 1000, 1000, 4, 2, 0], true),
        ([2, 77, 300, 6, 2, 0], false),
        ([1, 300, 77, 2, 1, 0], true),
        ([1, 1, 513, 4, 4, 0], false),
        ([1, 2048, 2048, 2, 2, 0], false),
    ];
    for d in [64, 128] {
        for causal in [false, true] {
            for (sizes, per_head) in shapes {
                let mut sz = sizes;
                sz[5] = d;
                let p = AttnProblem::new(AttnShape::from_sizes(sz))
                    .expect("valid")
                    .with_mask(if causal { Mask::Causal } else { Mask::None });
                out.push(Fp8Case {
                    label: format!(
                        "fp8 e4m3 {} {}{}",
                        p.shape,
                        p.mask.name(),
                        if per_head { " descales per head" } else { "" }
                    ),
                    problem: p,
                    per_head,
                });
            }
        }
    }
    out
}

/// Descales of a case: per tensor 0.05, 0.1, 0.02 (inputs drawn so that the dequantised values
/// are about N(0, 1)), or varying by (batch, kv head) around them.
fn descales(c: &Fp8Case) -> Fp8Descales {
    let s = c.problem.shape;
    if !c.per_head {
        return Fp8Descales::per_tensor(0.05, 0.1, 0.02);
    }
    let n = s.batch * s.heads_kv;
    let f = |base: f32| {
        Descale::PerBatchHeadKv(
            (0..n)
                .map(|i| base * (1.0 + 0.25 * (i % 5) as f32))
                .collect(),
        )
    };
    Fp8Descales {
        q: f(0.05),
        k: f(0.1),
        v: f(0.02),
    }
}

/// Runs one case: fresh inputs, poisoned outputs, the launch, the FP8 judge.
///
/// # Errors
/// Oracle and copy failures (a failed launch is a failed result).
pub fn run_case(gpu: &Gpu, c: &Fp8Case, seed: u64) -> Result<CaseResult> {
    let p = &c.problem;
    let s = p.shape;
    let d = descales(c);
    let n = |seqlen: usize, heads: usize| s.batch * seqlen * heads * s.head_dim;
    let q = fp8::random_e4m3(n(s.seqlen_q, s.heads_q), seed, 0.05);
    let k = fp8::random_e4m3(n(s.seqlen_k, s.heads_kv), seed ^ 0x4b, 0.1);
    let v = fp8::random_e4m3(n(s.seqlen_k, s.heads_kv), seed ^ 0x56, 0.02);
    let oracle = fp8::reference::attention(p, &q, &k, &v, &d)?;
    let stream = gpu.stream();
    let up = |x: &[E4m3]| stream.clone_htod(x).map_err(cuda_err("copying fp8 inputs"));
    let (dq, dk, dv) = (up(&q)?, up(&k)?, up(&v)?);
    let (o_len, lse_len) = (n(s.seqlen_q, s.heads_q), s.lse_len());
    let mut result = CaseResult::new(&c.label, KernelKind::Wgmma);
    result.kernel = "fp8".into();
    let mut outs = Poisoned::<half::bf16>::new(gpu, o_len, lse_len)?;
    let mut o_view = outs.o.slice_mut(0..o_len);
    let mut lse_view = outs.lse.slice_mut(0..lse_len);
    let what = flashattn::cuda::launch::launch_context("attn_wgmma_fp8", p);
    let launched = forward_device(gpu, p, &dq, &dk, &dv, &d, &mut o_view, &mut lse_view);
    let Some((o, lse)) = outs.collect(gpu, &mut result, KernelKind::Wgmma, launched, what)? else {
        return Ok(result);
    };
    let of: Vec<f64> = o.iter().map(|x| f64::from(x.to_f32())).collect();
    let v = fp8::judge(&oracle, &of, &lse);
    result.o_rel_l2 = v.o_rel_l2;
    result.o_max_abs = v.o_allow_used;
    result.lse_max_abs = v.lse_max_abs;
    result.conclude(
        v.problems.clone(),
        vec![format!(
            "noise ratio {:.2} (<= {}), o bound used {:.2}, lse bound used {:.2}",
            v.noise_ratio,
            fp8::reference::NOISE_RATIO_MAX,
            v.o_allow_used,
            v.lse_allow_used
        )],
    );
    // A clean ran-note: the kernel is the FP8 one, not a hand-on.
    result.ran.clear();
    Ok(result)
}

/// The calls the FP8 kernel must refuse, each with the error kind it must be: (label, passed,
/// message).
pub fn refusals(gpu: &Gpu) -> Vec<(String, bool, String)> {
    let stream = gpu.stream();
    let mut out = Vec::new();
    let mut one = |label: &str, p: AttnProblem, d: Fp8Descales, ok: fn(&AttnError) -> bool| {
        let s = p.shape;
        let n = |seqlen: usize, heads: usize| s.batch * seqlen * heads * s.head_dim;
        let r = (|| -> Result<()> {
            let alloc = |len: usize| {
                stream
                    .alloc_zeros::<E4m3>(len)
                    .map_err(cuda_err("allocating"))
            };
            let (q, k, v) = (
                alloc(n(s.seqlen_q, s.heads_q))?,
                alloc(n(s.seqlen_k, s.heads_kv))?,
                alloc(n(s.seqlen_k, s.heads_kv))?,
            );
            let mut o = stream
                .alloc_zeros::<half::bf16>(n(s.seqlen_q, s.heads_q))
                .map_err(cuda_err("allocating"))?;
            let mut lse = stream
                .alloc_zeros::<f32>(s.lse_len())
                .map_err(cuda_err("allocating"))?;
            forward_device(gpu, &p, &q, &k, &v, &d, &mut o, &mut lse).map(|_| ())
        })();
        let (passed, message) = match r {
            Err(e) if ok(&e) => (true, format!("refused: {e}")),
            Err(e) => (false, format!("wrong error: {e}")),
            Ok(()) => (false, "ran, but must be refused".into()),
        };
        out.push((format!("fp8 refuses {label}"), passed, message));
    };
    let base = AttnProblem::new(AttnShape::new(2, 64, 2, 128)).expect("valid");
    let per_tensor = Fp8Descales::per_tensor(1.0, 1.0, 1.0);
    one(
        "head_dim 96",
        AttnProblem::new(AttnShape::new(1, 64, 2, 96)).expect("valid"),
        per_tensor.clone(),
        |e| matches!(e, AttnError::UnsupportedHeadDim { .. }),
    );
    one(
        "a sliding window",
        base.clone()
            .with_scores(flashattn::scores::ScoreMods {
                window: flashattn::scores::Window::from_fa(16, 0).expect("valid"),
                ..Default::default()
            })
            .expect("valid"),
        per_tensor.clone(),
        |e| matches!(e, AttnError::UnsupportedFeature { .. }),
    );
    one(
        "v_descale of shape [3]",
        base.clone(),
        Fp8Descales {
            v: Descale::PerBatchHeadKv(vec![1.0; 3]),
            ..per_tensor.clone()
        },
        |e| {
            matches!(
                e,
                AttnError::InvalidDescale {
                    tensor: "v_descale",
                    ..
                }
            )
        },
    );
    one(
        "q_descale 0",
        base,
        Fp8Descales::per_tensor(0.0, 1.0, 1.0),
        |e| {
            matches!(
                e,
                AttnError::InvalidDescale {
                    tensor: "q_descale",
                    ..
                }
            )
        },
    );
    out
}
