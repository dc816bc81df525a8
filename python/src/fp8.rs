//! The FP8 (e4m3) forward, FlashAttention-3 style: `fp8_forward` takes q, k, v as bytes
//! (float8_e4m3fn tensors viewed as uint8 by the Python layer, which checked their dtype),
//! their dequantisation factors (`q_descale`, `k_descale`, `v_descale`, copied to the host by
//! the Python layer), and writes `out` bf16 and `lse` f32: on the library's FP8 CPU backend
//! ([`flashattn::fp8::cpu::forward`]) for CPU tensors, on `attn_wgmma_fp8`
//! ([`flashattn::cuda::fwd::wgmma_fp8::forward_device`], sm_90 only) for CUDA tensors, on the
//! caller's stream.

use crate::api::cpu_threads;
use crate::dlpack::{handshake, placement, take_all};
use crate::error::{FlashAttnError, err};
use crate::gpu::{foreign, on_device};
use crate::rules::{Scores, bshd_problem, check_disjoint};
use flashattn::AttnProblem;
use flashattn::cuda::ForeignSlice;
use flashattn::cuda::fwd::wgmma_fp8;
use flashattn::fp8::{Descale, E4m3, Fp8Descales};
use half::bf16;
use pyo3::prelude::*;

/// One descale as the Python layer hands it over: its shape (`[]`, `[1]` or `[batch,
/// heads_kv]`) and its values, row-major.
type HostDescale = (Vec<usize>, Vec<f32>);

/// The three descales of a call (`None`: 1), judged against the problem's shape by the
/// library ([`Descale::from_tensor`]: shape, count, finite and above 0).
fn descales(p: &AttnProblem, [q, k, v]: [Option<HostDescale>; 3]) -> PyResult<Fp8Descales> {
    let one = |name: &'static str, d: Option<HostDescale>| match d {
        None => Ok(Descale::Tensor(1.0)),
        Some((dims, values)) => {
            Descale::from_tensor(name, "float32", &dims, &values, &p.shape).map_err(err)
        }
    };
    Ok(Fp8Descales {
        q: one("q_descale", q)?,
        k: one("k_descale", k)?,
        v: one("v_descale", v)?,
    })
}

/// FP8 attention: `q` `[batch, seqlen_q, heads_q, head_dim]`, `k`/`v` `[batch, seqlen_k,
/// heads_kv, head_dim]`, e4m3 read as uint8 (any strides with head_dim contiguous; on CUDA q
/// and k need byte strides and addresses that are multiples of 16), written into `out`
/// (bfloat16, q's shape) and `lse` (f32 `[batch, heads_q, seqlen_q]`, contiguous). Each
/// descale: `None` (1), or `(shape, values)` with shape `[]`/`[1]` (one factor) or `[batch,
/// heads_kv]` (one per sequence and kv head, FlashAttention-3's). The score arguments as
/// [`crate::api::forward`]'s; the CPU backend takes them all, the GPU kernel none but
/// `causal` (the library's typed refusal otherwise, as for a head_dim other than 64 and 128
/// or a GPU other than sm_90). CUDA tensors run on `stream` (`current` as there); per-(batch,
/// kv head) descales are copied to the device by the library, which a CUDA graph capture
/// cannot record (refused inside one). Returns where it ran.
#[pyfunction]
#[pyo3(signature = (q, k, v, out, lse, q_descale, k_descale, v_descale, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, stream=None, current=false))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn fp8_forward<'py>(
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    out: &Bound<'py, PyAny>,
    lse: &Bound<'py, PyAny>,
    q_descale: Option<HostDescale>,
    k_descale: Option<HostDescale>,
    v_descale: Option<HostDescale>,
    softmax_scale: Option<f32>,
    causal: bool,
    window_left: i64,
    window_right: i64,
    softcap: f32,
    alibi_slopes: Option<Bound<'py, PyAny>>,
    stream: Option<usize>,
    current: bool,
) -> PyResult<String> {
    let named = [(q, "q"), (k, "k"), (v, "v"), (out, "out"), (lse, "lse")];
    let [tq, tk, tv, to, tl] = take_all(named, handshake(stream, current), false)?;
    let t = [&tq, &tk, &tv, &to, &tl];
    let place = placement(&t)?;
    for x in [&tq, &tk, &tv] {
        x.check_bytes("float8_e4m3fn")?;
    }
    if to.dtype()? != "bfloat16" {
        return Err(FlashAttnError::new_err(
            "out must be bfloat16 (the FP8 forward writes bf16)",
        ));
    }
    if tl.dtype()? != "float32" {
        return Err(FlashAttnError::new_err("lse must be float32"));
    }
    check_disjoint(&[&to, &tl], &[&tq, &tk, &tv])?;
    let window = (window_left, window_right);
    let scores = Scores::new(softmax_scale, causal, window, softcap, alibi_slopes);
    let p = bshd_problem(t, &scores)?;
    let d = descales(&p, [q_descale, k_descale, v_descale])?;
    match place {
        None => {
            // SAFETY: q, k, v are one-byte tensors (checked above; E4m3 is a transparent u8),
            // out bf16 and lse f32 (checked), all on the CPU; the problem checked their
            // layouts, so the slices cover what the strides address; out and lse are
            // writable and share no memory with the inputs (check_disjoint).
            unsafe {
                let (q, k, v) = (
                    tq.slice::<E4m3>()?,
                    tk.slice::<E4m3>()?,
                    tv.slice::<E4m3>()?,
                );
                let (o, l) = (to.slice_mut::<bf16>()?, tl.slice_mut::<f32>()?);
                flashattn::fp8::cpu::forward(&p, q, k, v, &d, o, l).map_err(err)?;
            }
            Ok(cpu_threads())
        }
        Some(id) => {
            // SAFETY: as above, on CUDA device `id`; `stream` is the tensors' framework's
            // current stream (or the legacy default stream), which it keeps alive.
            unsafe {
                on_device(id, stream.unwrap_or(0), |g| {
                    let [fq, fk, fv]: [ForeignSlice<E4m3>; 3] =
                        [foreign(&tq, g)?, foreign(&tk, g)?, foreign(&tv, g)?];
                    let mut fo: ForeignSlice<bf16> = foreign(&to, g)?;
                    let mut fl: ForeignSlice<f32> = foreign(&tl, g)?;
                    let info =
                        wgmma_fp8::forward_device(g, &p, &fq, &fk, &fv, &d, &mut fo, &mut fl)
                            .map_err(err)?;
                    Ok(("attn_wgmma_fp8".to_string(), info.why))
                })
            }
        }
    }
}
