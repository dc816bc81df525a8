//! Decoding on host buffers: copies in, [`super::forward_device`], copies back.

use super::{DecodeTensors, forward_device};
use crate::cuda::runtime::device::{Gpu, cuda_err};
use crate::cuda::runtime::launch::{GpuElement, LaunchInfo};
use crate::error::Result;
use crate::problem::kvcache::{KvCacheOutput, KvCacheProblem, RotaryTables};
use cudarc::driver::{CudaSlice, DevicePtr};

/// Host-memory convenience of [`forward_device`]: copies q, the caches, the new rows and the
/// rotary tables in, runs, and copies o, lse and the caches (with the appended rows) back;
/// like [`crate::problem::kvcache::forward_cpu`], the caches are updated in place. Pass empty
/// `k_new` / `v_new` when `seqlen_new` is 0, and empty tables without rotary embedding.
///
/// # Errors
/// As [`forward_device`], plus validation, allocation and copy failures.
#[allow(clippy::too_many_arguments)]
pub fn forward_host<T: GpuElement>(
    gpu: &Gpu,
    p: &KvCacheProblem,
    q: &[T],
    k_cache: &mut [T],
    v_cache: &mut [T],
    k_new: &[T],
    v_new: &[T],
    rotary: RotaryTables<'_, T>,
    splits: Option<usize>,
) -> Result<(KvCacheOutput<T>, LaunchInfo)> {
    p.validate()?;
    super::check_gpu(&p.shape())?;
    p.check_call(
        q.len(),
        [k_cache.len(), v_cache.len()],
        [k_new.len(), v_new.len()],
        rotary.lens(),
    )?;
    let stream = gpu.stream();
    // One element at least, so that a call without new rows or tables still has buffers.
    let up = |x: &[T], what: &str| -> Result<CudaSlice<T>> {
        let one = [T::from_f32(0.0)];
        stream
            .clone_htod(if x.is_empty() { &one[..] } else { x })
            .map_err(cuda_err(format!("copying {what} to the device")))
    };
    let exact = |x: &[T], what: &str| -> Result<CudaSlice<T>> {
        stream
            .clone_htod(x)
            .map_err(cuda_err(format!("copying {what} to the device")))
    };
    let dq = exact(q, "q")?;
    let (mut dkc, mut dvc) = (exact(k_cache, "k_cache")?, exact(v_cache, "v_cache")?);
    let (dkn, dvn) = (up(k_new, "k")?, up(v_new, "v")?);
    let (dcos, dsin) = (up(rotary.cos, "rotary_cos")?, up(rotary.sin, "rotary_sin")?);
    let n_lse = p.batch * p.heads_q * p.seqlen_q;
    let mut d_o: CudaSlice<T> = stream
        .alloc_zeros(q.len().max(1))
        .map_err(cuda_err("allocating o"))?;
    let mut d_lse: CudaSlice<f32> = stream
        .alloc_zeros(n_lse.max(1))
        .map_err(cuda_err("allocating lse"))?;
    fn pair<'a, T>(
        on: bool,
        a: &'a CudaSlice<T>,
        b: &'a CudaSlice<T>,
    ) -> Option<(&'a dyn DevicePtr<T>, &'a dyn DevicePtr<T>)> {
        on.then_some((a as &dyn DevicePtr<T>, b as &dyn DevicePtr<T>))
    }
    let info = forward_device(
        gpu,
        p,
        DecodeTensors {
            q: &dq,
            k_cache: &mut dkc,
            v_cache: &mut dvc,
            new: pair(p.seqlen_new > 0, &dkn, &dvn),
            rotary: pair(p.rotary.is_some(), &dcos, &dsin),
            o: &mut d_o,
            lse: &mut d_lse,
        },
        splits,
    )?;
    let back = |d: &CudaSlice<T>, what: &str| {
        stream
            .clone_dtoh(d)
            .map_err(cuda_err(format!("decode: copying {what} back")))
    };
    let mut o = back(&d_o, "o")?;
    o.truncate(q.len());
    let mut lse = stream
        .clone_dtoh(&d_lse)
        .map_err(cuda_err("decode: copying lse back"))?;
    lse.truncate(n_lse);
    k_cache.copy_from_slice(&back(&dkc, "k_cache")?);
    v_cache.copy_from_slice(&back(&dvc, "v_cache")?);
    Ok((KvCacheOutput { o, lse }, info))
}
