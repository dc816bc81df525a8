//! CUDA tensors: the library's device entry points on the caller's stream, with the tensors'
//! memory used in place ([`flashattn::cuda::ForeignSlice`]). Nothing here synchronises the
//! device or copies a tensor: a call only enqueues work on the stream the caller named (its
//! framework's current stream), so it can be captured in a CUDA graph.

use crate::{Borrowed, FlashAttnError, err};
use flashattn::AttnProblem;
use flashattn::cuda::backward::{BackwardOptions, backward_device};
use flashattn::cuda::{ForeignSlice, Gpu, GpuElement, KernelKind, forward_device};
use pyo3::prelude::*;
use std::collections::HashMap;
use std::sync::Mutex;

/// One [`Gpu`] per device for the life of the process (its compiled modules and tile
/// counters are shared by every stream), opened on first use.
fn device(id: i32) -> PyResult<&'static Gpu> {
    static GPUS: Mutex<Option<HashMap<i32, &'static Gpu>>> = Mutex::new(None);
    let mut g = GPUS.lock().unwrap_or_else(|p| p.into_inner());
    let map = g.get_or_insert_with(HashMap::new);
    if let Some(gpu) = map.get(&id) {
        return Ok(gpu);
    }
    let ordinal = usize::try_from(id)
        .map_err(|_| FlashAttnError::new_err(format!("CUDA device id {id} is negative")))?;
    let gpu: &'static Gpu = Box::leak(Box::new(Gpu::new(ordinal).map_err(err)?));
    map.insert(id, gpu);
    Ok(gpu)
}

/// Device `id` seen through the caller's stream (a raw `CUstream` handle; 0 the legacy
/// default stream).
///
/// # Safety
/// `stream` is a live stream of device `id`'s primary context (the caller's framework owns
/// it and keeps it alive).
unsafe fn on_stream(id: i32, stream: usize) -> PyResult<Gpu> {
    // SAFETY: forwarded to the caller.
    Ok(unsafe { device(id)?.on_raw_stream(stream) })
}

/// The tensor's memory as a device slice of `T` covering every element it addresses.
///
/// # Safety
/// The tensor is a CUDA tensor of `T` on `gpu`'s device; it stays alive for the call.
unsafe fn foreign<T>(t: &Borrowed, gpu: &Gpu) -> PyResult<ForeignSlice<T>> {
    let (start, _) = t.span()?;
    // SAFETY: DLPack: the producer's memory covers `extent` elements from `start`.
    Ok(unsafe { ForeignSlice::new(start as u64, t.extent()?, gpu.stream().clone()) })
}

/// Forward on CUDA tensors (checked by the caller: one device, dtype `T`, shapes of `p`).
///
/// # Safety
/// As [`on_stream`] and [`foreign`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn forward<T: GpuElement>(
    id: i32,
    stream: usize,
    p: &AttnProblem,
    q: &Borrowed,
    k: &Borrowed,
    v: &Borrowed,
    o: &Borrowed,
    lse: &Borrowed,
) -> PyResult<String> {
    // SAFETY: forwarded to the caller.
    unsafe {
        let gpu = on_stream(id, stream)?;
        let (fq, fk, fv) = (foreign::<T>(q, &gpu)?, foreign(k, &gpu)?, foreign(v, &gpu)?);
        let (mut fo, mut fl) = (foreign::<T>(o, &gpu)?, foreign::<f32>(lse, &gpu)?);
        let info = forward_device(
            &gpu,
            KernelKind::Wgmma,
            None,
            p,
            &fq,
            &fk,
            &fv,
            &mut fo,
            &mut fl,
        )
        .map_err(err)?;
        Ok(format!(
            "cuda:{id} {} attn_{} ({})",
            gpu.info().name,
            info.kernel,
            info.why
        ))
    }
}

/// Backward on CUDA tensors (checked by the caller as for [`forward`]; `d_o` with `o`'s
/// strides; `dq`, `dk`, `dv` dense).
///
/// # Safety
/// As [`on_stream`] and [`foreign`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn backward<T: GpuElement>(
    id: i32,
    stream: usize,
    p: &AttnProblem,
    deterministic: bool,
    [q, k, v, o, lse, d_o]: [&Borrowed; 6],
    [dq, dk, dv]: [&Borrowed; 3],
) -> PyResult<String> {
    // SAFETY: forwarded to the caller.
    unsafe {
        let gpu = on_stream(id, stream)?;
        let (fq, fk, fv) = (foreign::<T>(q, &gpu)?, foreign(k, &gpu)?, foreign(v, &gpu)?);
        let (fo, fl, fdo) = (
            foreign::<T>(o, &gpu)?,
            foreign::<f32>(lse, &gpu)?,
            foreign::<T>(d_o, &gpu)?,
        );
        let (mut fdq, mut fdk, mut fdv) = (
            foreign::<T>(dq, &gpu)?,
            foreign::<T>(dk, &gpu)?,
            foreign::<T>(dv, &gpu)?,
        );
        let opts = BackwardOptions {
            deterministic,
            ..Default::default()
        };
        let info = backward_device(
            &gpu, p, opts, &fq, &fk, &fv, &fo, &fl, &fdo, &mut fdq, &mut fdk, &mut fdv,
        )
        .map_err(err)?;
        Ok(format!("cuda:{id} {} {}", gpu.info().name, info.kernel))
    }
}
