//! Timing our kernels on the GPU: random input sets rotated past L2, CUDA events around each
//! launch, extra device memory, and a finite-output check.

use super::report::{LineResult, Source};
use super::rounds::Measured;
use super::stats::{self, Schedule};
use super::sweep::{Case, Line};
use cudarc::driver::{CudaSlice, sys};
use flashattn::cuda::backward::{BackwardOptions, BwdKernel, backward_device};
use flashattn::cuda::device::cuda_err;
use flashattn::cuda::{Gpu, GpuElement, KernelKind, forward_device};
use flashattn::error::{AttnError, Result};
use flashattn::{AttnProblem, DType, Element};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// L2 size assumed when the driver does not say (H200: 60 MB).
const FALLBACK_L2: usize = 64 << 20;

/// How `extra_mem_bytes` of our lines is measured.
pub const EXTRA_MEM_METHOD: &str = "measured: free device memory (cuMemGetInfo) before a warm launch minus the least seen right after the launch call returned and after synchronizing (2 MiB granularity); q, k, v, o, lse and the loaded module are outside it";

/// Rotating input sets of one dtype, with one o and one lse.
struct Inputs<T> {
    sets: Vec<[CudaSlice<T>; 3]>,
    o: CudaSlice<T>,
    lse: CudaSlice<f32>,
    len: usize,
    lse_len: usize,
}

/// Times lines of a sweep on one GPU; keeps input sets between cases of the same size.
pub struct GpuBench<'g> {
    gpu: &'g Gpu,
    l2: usize,
    f16: Option<Inputs<f16>>,
    bf16: Option<Inputs<bf16>>,
    seed: u64,
}

/// Normal(0, 1) values rounded to `T`, generated in parallel and reproducibly from `seed`.
pub fn normal_values<T: Element>(len: usize, seed: u64) -> Vec<T> {
    let mut v = vec![T::default(); len];
    v.par_chunks_mut(1 << 20)
        .enumerate()
        .for_each(|(i, chunk)| {
            let mut rng =
                StdRng::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            for pair in chunk.chunks_mut(2) {
                // Box-Muller: u1 in (0, 1] keeps ln finite.
                let u1: f64 = 1.0 - rng.r#gen::<f64>();
                let u2: f64 = rng.r#gen::<f64>();
                let r = (-2.0 * u1.ln()).sqrt();
                let a = std::f64::consts::TAU * u2;
                pair[0] = T::from_f32((r * a.cos()) as f32);
                if let Some(x) = pair.get_mut(1) {
                    *x = T::from_f32((r * a.sin()) as f32);
                }
            }
        });
    v
}

impl<'g> GpuBench<'g> {
    /// Reads the L2 size; allocates nothing yet.
    pub fn new(gpu: &'g Gpu) -> Self {
        let l2 = gpu
            .context()
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
            .ok()
            .filter(|&b| b > 0)
            .map_or(FALLBACK_L2, |b| b as usize);
        GpuBench {
            gpu,
            l2,
            f16: None,
            bf16: None,
            seed: 0x5EED_F1A5,
        }
    }

    /// L2 bytes the rotation is sized against.
    pub fn l2_bytes(&self) -> usize {
        self.l2
    }

    /// Input sets for `case`: together over 3x L2, within a quarter of free memory.
    pub fn sets_for(&self, case: &Case) -> usize {
        let held = self
            .f16
            .as_ref()
            .map_or(0, |i| i.sets.len() * 3 * i.len * 2)
            + self
                .bf16
                .as_ref()
                .map_or(0, |i| i.sets.len() * 3 * i.len * 2);
        let free = self
            .gpu
            .context()
            .mem_get_info()
            .map_or(usize::MAX / 8, |(f, _)| f)
            + held;
        stats::input_sets(case.input_bytes(), self.l2, free)
    }

    /// Frees every input set.
    pub fn release(&mut self) {
        self.f16 = None;
        self.bf16 = None;
        let _ = self.gpu.stream().synchronize();
    }

    /// Times every line on `case`, in the order given; a line that fails is recorded as
    /// skipped with the reason (and no launch times).
    pub fn run_case(
        &mut self,
        case: &Case,
        lines: &[Line],
        sets: usize,
        sched: Schedule,
        mut progress: impl FnMut(&str),
    ) -> Vec<Measured> {
        let prepared = (|| -> Result<(AttnProblem, DType)> {
            let p = case.problem()?;
            let dt = case.dtype()?;
            let (len, lse_len) = (case.tensor_len(), p.shape.lse_len());
            match dt {
                DType::F16 => {
                    self.bf16 = None;
                    ensure(self.gpu, &mut self.f16, sets, len, lse_len, self.seed)?;
                }
                _ => {
                    self.f16 = None;
                    ensure(self.gpu, &mut self.bf16, sets, len, lse_len, self.seed)?;
                }
            }
            Ok((p, dt))
        })();
        let (p, dt) = match prepared {
            Ok(x) => x,
            Err(e) => {
                let why = format!("preparing inputs: {e}");
                return lines
                    .iter()
                    .map(|l| Measured::skipped(&l.name, Source::Ours, why.clone()))
                    .collect();
            }
        };
        let mut out = Vec::new();
        for line in lines {
            progress(&line.name);
            let gpu = self.gpu;
            let r = catch_unwind(AssertUnwindSafe(|| match dt {
                _ if line.name == "fp8" && !case.backward => time_fp8(gpu, line, &p, sets, sched),
                DType::F16 if case.backward => {
                    time_backward(gpu, line, &p, self.f16.as_mut().expect("prepared"), sched)
                }
                DType::BF16 if case.backward => {
                    time_backward(gpu, line, &p, self.bf16.as_mut().expect("prepared"), sched)
                }
                DType::F16 => time_line(
                    gpu,
                    line,
                    &p,
                    self.f16.as_mut().expect("prepared"),
                    sets,
                    sched,
                ),
                _ => time_line(
                    gpu,
                    line,
                    &p,
                    self.bf16.as_mut().expect("prepared"),
                    sets,
                    sched,
                ),
            }));
            out.push(match r {
                Ok(Ok(m)) => m,
                Ok(Err(e)) => Measured::skipped(&line.name, Source::Ours, e.to_string()),
                Err(panic) => {
                    let msg = super::panic_message(&*panic);
                    Measured::skipped(&line.name, Source::Ours, format!("panicked: {msg}"))
                }
            });
        }
        out
    }
}

/// Makes `slot` hold at least `sets` input sets of `len` elements (reallocating when short).
fn ensure<T: GpuElement>(
    gpu: &Gpu,
    slot: &mut Option<Inputs<T>>,
    sets: usize,
    len: usize,
    lse_len: usize,
    seed: u64,
) -> Result<()> {
    if slot
        .as_ref()
        .is_some_and(|i| i.sets.len() >= sets && i.len >= len && i.lse_len >= lse_len)
    {
        return Ok(());
    }
    *slot = None;
    let stream = gpu.stream();
    stream
        .synchronize()
        .map_err(cuda_err("synchronizing before allocating bench inputs"))?;
    let mut all = Vec::with_capacity(sets);
    for s in 0..sets {
        let mut one = Vec::with_capacity(3);
        for t in 0..3u64 {
            let host: Vec<T> = normal_values(
                len,
                seed ^ ((s as u64) << 8 | t).wrapping_mul(0xA24B_AED4_963E_E407),
            );
            one.push(stream.clone_htod(&host).map_err(cuda_err(format!(
                "copying bench input set {s} ({} MB) to the device",
                (len * 2) >> 20
            )))?);
        }
        let [q, k, v]: [CudaSlice<T>; 3] =
            one.try_into().map_err(|_| AttnError::ShapeMismatch {
                what: "three inputs".into(),
            })?;
        all.push([q, k, v]);
    }
    let o = stream
        .alloc_zeros::<T>(len)
        .map_err(cuda_err("allocating bench output o"))?;
    let lse = stream
        .alloc_zeros::<f32>(lse_len)
        .map_err(cuda_err("allocating bench lse"))?;
    stream
        .synchronize()
        .map_err(cuda_err("uploading bench inputs"))?;
    *slot = Some(Inputs {
        sets: all,
        o,
        lse,
        len,
        lse_len,
    });
    Ok(())
}

/// Names the line, kernel and shape in an error.
fn line_context(line: &Line, kernel: &str, p: &AttnProblem) -> String {
    let launch = flashattn::cuda::launch::launch_context(kernel, p);
    format!("{} on {launch}", line.name)
}

/// Warm-up, one launch for memory, the timed launches, then an lse check.
fn time_line<T: GpuElement>(
    gpu: &Gpu,
    line: &Line,
    p: &AttnProblem,
    inputs: &mut Inputs<T>,
    sets: usize,
    sched: Schedule,
) -> Result<Measured> {
    let stream = gpu.stream();
    let what = line_context(line, line.kernel.name(), p);
    let Inputs {
        sets: bufs, o, lse, ..
    } = inputs;
    let n = sets.clamp(1, bufs.len());
    let timed = time_launches(gpu, &what, sched, |i| {
        let [q, k, v] = &bufs[i % n];
        forward_device(gpu, line.kernel, line.tile, p, q, k, v, o, lse)
    })?;
    let host = stream
        .clone_dtoh(&lse.slice(0..p.shape.lse_len()))
        .map_err(cuda_err(format!("{what}: copying lse back")))?;
    let finite = host.iter().all(|x| x.is_finite());
    line_result(line, &what, timed, p.flops(), finite)
}

/// The `fp8` line: attn_wgmma_fp8 (its V^T pre-pass included) on `sets` rotating sets of
/// e4m3 q, k, v (N(0, 1) values, descales 1) of the case's shape, o in bf16; timed as
/// [`time_launches`] times every line, the lse checked finite.
fn time_fp8(
    gpu: &Gpu,
    line: &Line,
    p: &AttnProblem,
    sets: usize,
    sched: Schedule,
) -> Result<Measured> {
    use flashattn::cuda::fwd::wgmma_fp8;
    use flashattn::fp8::{E4m3, Fp8Descales};
    let stream = gpu.stream();
    let what = line_context(line, "attn_wgmma_fp8", p);
    let s = &p.shape;
    let n_q = s.batch * s.seqlen_q * s.heads_q * s.head_dim;
    let n_kv = s.batch * s.seqlen_k * s.heads_kv * s.head_dim;
    let up = |n: usize, seed: u64| -> Result<CudaSlice<E4m3>> {
        stream
            .clone_htod(&flashattn::fp8::random_e4m3(n, seed, 1.0))
            .map_err(cuda_err(format!("{what}: copying e4m3 inputs")))
    };
    let n = sets.clamp(1, 8);
    let mut bufs = Vec::with_capacity(n);
    for i in 0..n as u64 {
        bufs.push([up(n_q, 3 * i)?, up(n_kv, 3 * i + 1)?, up(n_kv, 3 * i + 2)?]);
    }
    let mut o = stream
        .alloc_zeros::<bf16>(n_q)
        .map_err(cuda_err(format!("{what}: allocating o")))?;
    let mut lse = stream
        .alloc_zeros::<f32>(s.lse_len())
        .map_err(cuda_err(format!("{what}: allocating lse")))?;
    let d = Fp8Descales::per_tensor(1.0, 1.0, 1.0);
    wgmma_fp8::prepare(gpu, p)?;
    let timed = time_launches(gpu, &what, sched, |i| {
        let [q, k, v] = &bufs[i % n];
        wgmma_fp8::forward_device(gpu, p, q, k, v, &d, &mut o, &mut lse)
    })?;
    let host = stream
        .clone_dtoh(&lse)
        .map_err(cuda_err(format!("{what}: copying lse back")))?;
    let finite = host.iter().all(|x| x.is_finite());
    line_result(line, &what, timed, p.flops(), finite)
}

/// The result of a timed line: the timing over `flops`, what the memory launch reported, the
/// extra device memory, and whether the output came back finite.
fn line_result(
    line: &Line,
    what: &str,
    timed: Timed,
    flops: f64,
    finite: bool,
) -> Result<Measured> {
    let (times, info, (free0, free1, free2)) = (timed.times, timed.info, timed.free);
    let host_us = timed.host_us;
    let timing = stats::summarize(&times, flops).ok_or_else(|| AttnError::Cuda {
        context: what.to_string(),
        message: "no valid event times".into(),
    })?;
    let mut r = LineResult::timed(&line.name, Source::Ours, timing);
    r.tile = info.config.clone();
    if info.kernel != line.kernel {
        r.ran = Some(format!("{} ({})", info.kernel, info.why));
    }
    r.registers = Some(info.registers);
    r.spill_bytes = Some(info.spill_bytes);
    r.smem_bytes = Some(info.smem_bytes);
    r.extra_mem_bytes = Some((free0 - free1.min(free2)).max(0));
    r.extra_mem_method = Some(EXTRA_MEM_METHOD.into());
    r.output_finite = Some(finite);
    r.host_us = host_us.is_finite().then_some(host_us);
    Ok(Measured {
        line: r,
        times_ms: times,
        window_ms: Some(timed.window_ms),
    })
}

/// The backward line of a case: o and lse from one forward (attn_mma) on the first input set,
/// a random dO, then the line's backward (`bwd`: the default kernel, `bwd-mma`: attn_bwd,
/// `bwd-det`: the default kernel, deterministic, `bwd-persistent` / `bwd-grid`:
/// attn_bwd_wgmma's persistent variant / one block per tile where it serves the call, else
/// as `bwd`) timed as [`time_launches`] times every line (on that one set:
/// q, k, v, o and dO of the default sweep are 5 x 64 MB, well past L2), and dq checked finite.
fn time_backward<T: GpuElement>(
    gpu: &Gpu,
    line: &Line,
    p: &AttnProblem,
    inputs: &mut Inputs<T>,
    sched: Schedule,
) -> Result<Measured> {
    let stream = gpu.stream();
    let what = line_context(line, "attn_bwd", p);
    let len = p.shape.batch * p.shape.seqlen_q * p.shape.heads_q * p.shape.head_dim;
    let Inputs {
        sets: bufs, o, lse, ..
    } = inputs;
    let [q, k, v] = &bufs[0];
    forward_device(gpu, KernelKind::Mma, None, p, q, k, v, o, lse)?;
    let d_o = stream
        .clone_htod(&normal_values::<T>(len, 0xD0D0))
        .map_err(cuda_err(format!("{what}: copying dO")))?;
    let alloc = |what_: &str| -> Result<CudaSlice<T>> {
        stream
            .alloc_zeros::<T>(len)
            .map_err(cuda_err(format!("{what}: allocating {what_}")))
    };
    let (mut dq, mut dk, mut dv) = (alloc("dq")?, alloc("dk")?, alloc("dv")?);
    let timed = time_launches(gpu, &what, sched, |_| {
        let opts = BackwardOptions {
            deterministic: line.name == "bwd-det",
            kernel: if line.name == "bwd-mma" {
                BwdKernel::Mma
            } else {
                BwdKernel::Auto
            },
            // The other lines: the library's choice (backward::persistent_default).
            persistent: match line.name.as_str() {
                "bwd-persistent" => Some(true),
                "bwd-grid" => Some(false),
                _ => None,
            },
            persistent_blocks: None,
        };
        let info = backward_device(
            gpu, p, opts, q, k, v, &*o, &*lse, &d_o, &mut dq, &mut dk, &mut dv, None,
        )?;
        let config = match info.tile {
            Some(t) => format!(
                "{}: {} warps, {} keys x {} rows per step{}",
                info.kernel,
                t.nwarps,
                t.bc(),
                t.br,
                if info.deterministic {
                    ", deterministic"
                } else {
                    ""
                }
            ),
            None => format!(
                "{}: 128 keys x 64 rows per step, producer warp + 2 consumer warpgroups{}",
                info.kernel,
                if info.persistent {
                    format!(", persistent on {} blocks", info.blocks)
                } else {
                    String::new()
                }
            ),
        };
        Ok(flashattn::cuda::LaunchInfo {
            kernel: KernelKind::Mma,
            why: if info.why_not_wgmma.is_empty() {
                format!("the backward ({})", info.kernel)
            } else {
                format!("the backward ({}): {}", info.kernel, info.why_not_wgmma)
            },
            config: Some(config),
            registers: info.registers,
            spill_bytes: info.spill_bytes,
            smem_bytes: info.smem_bytes,
        })
    })?;
    let host = stream
        .clone_dtoh(&dq)
        .map_err(cuda_err(format!("{what}: copying dq back")))?;
    let finite = host.iter().all(|x| x.to_f32().is_finite());
    line_result(line, &what, timed, 2.5 * p.flops(), finite)
}

/// What [`time_launches`] measured.
pub(crate) struct Timed {
    /// Milliseconds of each timed launch (CUDA events).
    pub times: Vec<f64>,
    /// What the memory launch reported.
    pub info: flashattn::cuda::LaunchInfo,
    /// Free device memory before, right after and after the memory launch (bytes).
    pub free: (i64, i64, i64),
    /// Median host time of one `launch` call in the timed loop, microseconds: what the
    /// caller's thread spends per call (checks, tensor maps, the launch), not the GPU.
    pub host_us: f64,
    /// Wall milliseconds from the first timed launch to the end of the last.
    pub window_ms: f64,
}

/// The timing method of every line: `warmup` untimed launches, then launches in batches of 8
/// until `warmup_ms` have passed (steady clocks; peers.py does the same), one launch with the
/// free memory read around it, then the timed launches each between two CUDA events (one
/// untimed launch in flight first, so that the GPU is busy while the first timed one is
/// queued): `iters` of them, or as many as fill `window_ms` at the wall time per launch of
/// the warm-up batches (one batch timed for it when `warmup_ms` is 0; [`Schedule`]).
/// `launch(i)` runs call `i` (rotating input sets is the caller's business).
pub(crate) fn time_launches(
    gpu: &Gpu,
    what: &str,
    sched: Schedule,
    mut launch: impl FnMut(usize) -> Result<flashattn::cuda::LaunchInfo>,
) -> Result<Timed> {
    let stream = gpu.stream();
    let ctx = gpu.context();
    let warmup = sched.warmup.max(1);
    for i in 0..warmup {
        launch(i)?;
    }
    stream
        .synchronize()
        .map_err(cuda_err(format!("{what}: warm-up")))?;
    let mut batch = || -> Result<()> {
        for i in 0..8 {
            launch(i)?;
        }
        stream
            .synchronize()
            .map_err(cuda_err(format!("{what}: warm-up")))
    };
    let (mut calls, t0) = (0usize, std::time::Instant::now());
    while t0.elapsed() < std::time::Duration::from_millis(sched.warmup_ms) {
        batch()?;
        calls += 8;
    }
    let mut elapsed = t0.elapsed();
    if calls == 0 && sched.window_ms > 0 {
        let t = std::time::Instant::now();
        batch()?;
        (calls, elapsed) = (8, t.elapsed());
    }
    let per_call_ms = if calls > 0 {
        elapsed.as_secs_f64() * 1e3 / calls as f64
    } else {
        f64::NAN
    };
    let iters = sched.timed_iters(per_call_ms);
    let free = || {
        ctx.mem_get_info()
            .map(|(f, _)| f as i64)
            .map_err(cuda_err("cuMemGetInfo"))
    };
    let free0 = free()?;
    let info = launch(0)?;
    let free1 = free()?;
    stream
        .synchronize()
        .map_err(cuda_err(format!("{what}: memory launch")))?;
    let free2 = free()?;
    let flag = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut events = Vec::with_capacity(iters);
    for _ in 0..iters {
        events.push((
            ctx.new_event(flag).map_err(cuda_err("creating an event"))?,
            ctx.new_event(flag).map_err(cuda_err("creating an event"))?,
        ));
    }
    launch(1)?;
    let mut host = Vec::with_capacity(iters);
    let window = std::time::Instant::now();
    for (i, (start, end)) in events.iter().enumerate() {
        start
            .record(stream)
            .map_err(cuda_err("recording an event"))?;
        let t = std::time::Instant::now();
        launch(warmup + 1 + i)?;
        host.push(t.elapsed().as_secs_f64() * 1e6);
        end.record(stream).map_err(cuda_err("recording an event"))?;
    }
    host.sort_by(f64::total_cmp);
    stream
        .synchronize()
        .map_err(cuda_err(format!("{what}: timed launches")))?;
    let window_ms = window.elapsed().as_secs_f64() * 1e3;
    let mut times = Vec::with_capacity(iters);
    for (start, end) in &events {
        times.push(
            start
                .elapsed_ms(end)
                .map_err(cuda_err("reading event times"))? as f64,
        );
    }
    Ok(Timed {
        times,
        info,
        free: (free0, free1, free2),
        host_us: host.get(host.len() / 2).copied().unwrap_or(f64::NAN),
        window_ms,
    })
}
