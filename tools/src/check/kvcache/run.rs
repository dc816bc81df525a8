//! One case of the KV-cache sweep on the GPU: random inputs, the CPU's append and the f64
//! oracle, then every split count of the case on the device-index path (and the heuristic's
//! on the host-index path), each judged against the oracle, the appended caches and the
//! guards.

use super::KvCase;
use crate::check::outcome::{CaseResult, Poisoned, synced, to_bits};
use cudarc::driver::{CudaSlice, DevicePtr};
use flashattn::compare::{Tolerance, diff_rows, random_vec};
use flashattn::cuda::decode::{DecodeLaunch, DecodeTensors, DeviceIndex, forward_device};
use flashattn::cuda::device::cuda_err;
use flashattn::cuda::{Gpu, GpuElement, KernelKind};
use flashattn::dtype::{DType, Element};
use flashattn::error::Result;
use flashattn::kvcache::{HostIndex, KvCacheProblem, RotaryTables, append, place, reference};
use flashattn::reference::Reference;
use half::{bf16, f16};

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

/// Random logical caches, q, new rows and rotary tables of a call.
pub(super) struct Data<T> {
    pub k_cache: Vec<T>,
    pub v_cache: Vec<T>,
    pub q: Vec<T>,
    pub k_new: Vec<T>,
    pub v_new: Vec<T>,
    pub cos: Vec<T>,
    pub sin: Vec<T>,
}

/// The data of a call: the keys of each cache sequence drawn from one seed of that sequence
/// (so that batch entries sharing a cache sequence see the same keys, the shorter a prefix of
/// the longer); the rotary tables the cosines and sines of random angles.
pub(super) fn data<T: Element>(p: &KvCacheProblem, seed: u64) -> Data<T> {
    let row = p.heads_kv * p.head_dim;
    let logical = |s: u64| -> Vec<Vec<T>> {
        (0..p.batch)
            .map(|b| {
                let keys = p.cache_seqlens[b] as usize - p.start(b);
                let at = p.start(b) * row; // the cache sequence's keys from its row 0
                let c = p.cache_sequence(b) as u64;
                random_vec::<T>(at + keys * row, s ^ (c * 77))[at..].to_vec()
            })
            .collect()
    };
    let nn = p.batch * p.seqlen_new * row;
    let table = p.rotary.map_or(0, |r| r.seqlen_ro * r.dim / 2);
    let angles: Vec<f32> = random_vec(table, seed ^ 16);
    Data {
        k_cache: place(p, &logical(seed ^ 11)),
        v_cache: place(p, &logical(seed ^ 12)),
        q: random_vec(p.batch * p.seqlen_q * p.heads_q * p.head_dim, seed ^ 13),
        k_new: random_vec(nn, seed ^ 14),
        v_new: random_vec(nn, seed ^ 15),
        cos: angles
            .iter()
            .map(|a| T::from_f32((3.0 * a).cos()))
            .collect(),
        sin: angles
            .iter()
            .map(|a| T::from_f32((3.0 * a).sin()))
            .collect(),
    }
}

impl<T> Data<T> {
    pub(super) fn tables(&self) -> RotaryTables<'_, T> {
        RotaryTables {
            cos: &self.cos,
            sin: &self.sin,
        }
    }
}

/// Whether two buffers hold the same bytes, element by element (over the shorter one; NaNs
/// compare by their bits).
pub(super) fn same_bits<T: GpuElement>(a: &[T], b: &[T]) -> bool {
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

/// The path a run takes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Path {
    /// Index arrays on the device ([`DecodeLaunch`]), with these values.
    Device,
    /// Index arrays on the host ([`forward_device`]).
    Host,
}

/// Copies `x` to the device (one element at least, so that an unused buffer can be viewed).
fn up<T: cudarc::driver::DeviceRepr + Copy + Default>(gpu: &Gpu, x: &[T]) -> Result<CudaSlice<T>> {
    let one = [T::default()];
    gpu.stream()
        .clone_htod(if x.is_empty() { &one[..] } else { x })
        .map_err(cuda_err("copying inputs"))
}

fn run_once<T: GpuElement>(
    gpu: &Gpu,
    p: &KvCacheProblem,
    index: &HostIndex,
    x: &Data<T>,
    (path, splits): (Path, Option<usize>),
) -> Result<Result<Produced<T>>> {
    let stream = gpu.stream();
    let dq = up(gpu, &x.q)?;
    let (mut dkc, mut dvc) = (up(gpu, &x.k_cache)?, up(gpu, &x.v_cache)?);
    let (dkn, dvn) = (up(gpu, &x.k_new)?, up(gpu, &x.v_new)?);
    let (dcos, dsin) = (up(gpu, &x.cos)?, up(gpu, &x.sin)?);
    let n_o = x.q.len();
    let n_lse = p.batch * p.heads_q * p.seqlen_q;
    let mut outs = Poisoned::<T>::new(gpu, n_o, n_lse)?;
    let (mut o, mut lse) = (outs.o.slice_mut(0..n_o), outs.lse.slice_mut(0..n_lse));
    fn pair<'a, T>(
        on: bool,
        a: &'a CudaSlice<T>,
        b: &'a CudaSlice<T>,
    ) -> Option<(&'a dyn DevicePtr<T>, &'a dyn DevicePtr<T>)> {
        on.then_some((a as &dyn DevicePtr<T>, b as &dyn DevicePtr<T>))
    }
    let tensors = DecodeTensors {
        q: &dq,
        k_cache: &mut dkc,
        v_cache: &mut dvc,
        new: pair(p.seqlen_new > 0, &dkn, &dvn),
        rotary: pair(p.rotary.is_some(), &dcos, &dsin),
        o: &mut o,
        lse: &mut lse,
    };
    let launched = match path {
        Path::Host => forward_device(gpu, p, tensors, splits),
        Path::Device => {
            let mut shape = p.shape();
            // ALiBi slopes and sink logits on the device too, the shape's host values made
            // wrong (zeros): the result is right only if the device values are the ones read.
            let dslopes = shape
                .scores
                .alibi
                .as_ref()
                .map(|a| up(gpu, &a.slopes))
                .transpose()?;
            let dsink = shape.scores.sink.as_ref().map(|s| up(gpu, s)).transpose()?;
            if let Some(a) = shape.scores.alibi.as_mut() {
                a.slopes.fill(0.0);
            }
            if let Some(s) = shape.scores.sink.as_mut() {
                s.fill(0.0);
            }
            let arrays = [
                Some(&index.cache_seqlens),
                shape.is_paged().then_some(&index.block_table),
                index.cache_batch_idx.as_ref(),
                index.cache_leftpad.as_ref(),
            ];
            let mut dev: Vec<Option<CudaSlice<i32>>> = Vec::new();
            for a in arrays {
                dev.push(a.map(|v| up(gpu, v)).transpose()?);
            }
            let view = |i: usize| dev[i].as_ref().map(|s| s as &dyn DevicePtr<i32>);
            let seqlens = dev[0].as_ref().expect("cache_seqlens");
            let ix = DeviceIndex {
                block_table: view(1),
                cache_batch_idx: view(2),
                cache_leftpad: view(3),
                alibi_slopes: dslopes.as_ref().map(|s| s as &dyn DevicePtr<f32>),
                sink: dsink.as_ref().map(|s| s as &dyn DevicePtr<f32>),
                ..DeviceIndex::new(seqlens)
            };
            match DecodeLaunch::new(gpu, &shape, T::DTYPE, splits) {
                Err(e) => Err(e),
                Ok(launch) => {
                    // Poisoned: every partial the combine reads must have been written.
                    let mut ws = up(gpu, &vec![f32::NAN; launch.workspace_len()])?;
                    let ws = (launch.workspace_len() > 0)
                        .then_some(&mut ws as &mut dyn cudarc::driver::DevicePtrMut<f32>);
                    launch.run(gpu, &ix, tensors, ws)
                }
            }
        }
    };
    if let Err(e) = synced(gpu, launched, "kvcache decode launch") {
        return Ok(Err(e));
    }
    let (o, lse, guard_written) = outs.read(gpu)?;
    let back = |d: &CudaSlice<T>| {
        stream
            .clone_dtoh(d)
            .map_err(cuda_err("copying a cache back"))
    };
    let (mut k_cache, mut v_cache) = (back(&dkc)?, back(&dvc)?);
    k_cache.truncate(x.k_cache.len());
    v_cache.truncate(x.v_cache.len());
    Ok(Ok(Produced {
        o,
        lse,
        guard_written,
        k_cache,
        v_cache,
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
    append(p, &mut kc, &mut vc, &x.k_new, &x.v_new, x.tables())?;
    let mut exact: Reference = reference(p, &x.q, &kc, &vc, x.tables())?;
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
    let index = case.raw.clone().unwrap_or_else(|| p.index());
    let mut runs: Vec<(Path, Option<usize>)> =
        case.splits.iter().map(|&s| (Path::Device, s)).collect();
    if case.raw.is_none() {
        runs.push((Path::Host, None));
    }
    let mut guard = 0;
    for &(path, splits) in &runs {
        let name = format!(
            "{} splits {}",
            if path == Path::Host {
                "host index,"
            } else {
                "device index,"
            },
            splits.map_or("heuristic".to_string(), |s| s.to_string())
        );
        let got = match run_once(gpu, p, &index, &x, (path, splits))? {
            Ok(g) => g,
            Err(e) => {
                problems.push(format!("{name}: {e}"));
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
                "{name}: {dropped} rows that read a NaN came out finite (the NaN was dropped)"
            ));
        }
        let (od, ld) = diff_rows(go, gl, &exact, d, row_of);
        worst_l2 = worst_l2.max(od.rel_l2);
        worst_abs = worst_abs.max(od.max_abs);
        worst_lse = worst_lse.max(ld.max_abs);
        if let Err(e) = tol.check(&name, &od, &ld) {
            problems.push(e.to_string());
        }
        if !same_bits(&got.k_cache, &kc) || !same_bits(&got.v_cache, &vc) {
            problems.push(format!(
                "{name}: the caches after the call differ from the CPU's append"
            ));
        }
        if splits.is_none() {
            // Same bytes run to run.
            if let Ok(again) = run_once(gpu, p, &index, &x, (path, splits))?
                && (again.o.len() != got.o.len()
                    || !same_bits(&again.o, &got.o)
                    || again
                        .lse
                        .iter()
                        .map(|v| v.to_bits())
                        .ne(got.lse.iter().map(|v| v.to_bits())))
            {
                problems.push(format!("{name}: a second run gave other bytes"));
            }
        }
    }
    result.o_rel_l2 = worst_l2;
    result.o_max_abs = worst_abs;
    result.lse_max_abs = worst_lse;
    result.guard_overwritten = guard;
    let notes = vec![format!("{} runs", runs.len())];
    result.conclude(problems, notes);
    Ok(result)
}
