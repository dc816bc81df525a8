//! CUDA tensors: the library's device entry points on the caller's stream, with the tensors'
//! memory used in place ([`flashattn::cuda::ForeignSlice`]). Nothing here synchronises the
//! device or copies a tensor: a call only enqueues work on the stream the caller named (its
//! framework's current stream), so it can be captured in a CUDA graph.

use crate::dlpack::Borrowed;
use crate::error::{FlashAttnError, err};
use crate::rules::{CacheIndex, Seqlens};
use flashattn::cuda::DevicePtr;
use flashattn::cuda::DevicePtrMut;
use flashattn::cuda::LaunchInfo;
use flashattn::cuda::backward::{BackwardOptions, BwdTile, backward_device, run_head_dim};
use flashattn::cuda::decode::{DecodeLaunch, DecodeTensors, DeviceIndex};
use flashattn::cuda::{ContextGuard, ForeignSlice, Gpu, GpuElement, stream_capturing};
use flashattn::kvcache::KvCacheShape;
use flashattn::{AttnProblem, Result};
use pyo3::prelude::*;
use std::collections::HashMap;
use std::sync::Mutex;

/// One [`Gpu`] per device for the life of the process (its compiled modules and tile
/// counters are shared by every stream), opened on first use, which must not be inside a
/// CUDA graph capture on `stream` (opening synchronises the device once).
fn device(id: i32, stream: usize) -> PyResult<&'static Gpu> {
    static GPUS: Mutex<Option<HashMap<i32, &'static Gpu>>> = Mutex::new(None);
    let mut g = GPUS.lock().unwrap_or_else(|p| p.into_inner());
    let map = g.get_or_insert_with(HashMap::new);
    if let Some(gpu) = map.get(&id) {
        return Ok(gpu);
    }
    // SAFETY: the caller's framework keeps its current stream alive.
    if unsafe { stream_capturing(stream) } {
        return Err(FlashAttnError::new_err(format!(
            "the first flashattn call on cuda:{id} is inside a CUDA graph capture, and opening the device (and compiling its kernels) cannot be captured: make the same call once before the capture (a warm-up)"
        )));
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
    Ok(unsafe { device(id, stream)?.on_raw_stream(stream) })
}

/// Refuses a call that copies host data (index arrays) to the device inside a graph capture.
fn not_capturing(gpu: &Gpu, what: &str) -> PyResult<()> {
    if gpu.capturing() {
        return Err(FlashAttnError::new_err(format!(
            "{what} copies its index arrays from the host, which a CUDA graph capture cannot record: call it outside the capture"
        )));
    }
    Ok(())
}

/// Runs `call` on device `id` seen through `stream`; our context is bound for the call and
/// the caller's current context (its framework's current device) is restored after it.
/// Returns where it ran, as the natives do: the device, its name, the kernel `call` names,
/// and why that kernel (when the library says).
///
/// # Safety
/// As [`on_stream`].
pub unsafe fn on_device(
    id: i32,
    stream: usize,
    call: impl FnOnce(&Gpu) -> PyResult<(String, String)>,
) -> PyResult<String> {
    let _restore = ContextGuard::save();
    // SAFETY: forwarded to the caller.
    let gpu = unsafe { on_stream(id, stream)? };
    let (kernel, why) = call(&gpu)?;
    let name = &gpu.info().name;
    Ok(if why.is_empty() {
        format!("cuda:{id} {name} {kernel}")
    } else {
        format!("cuda:{id} {name} {kernel} ({why})")
    })
}

/// The tensor's memory as a device slice of `T` covering every element it addresses.
///
/// # Safety
/// The tensor is a CUDA tensor of `T` on `gpu`'s device; it stays alive for the call.
pub(crate) unsafe fn foreign<T>(t: &Borrowed, gpu: &Gpu) -> PyResult<ForeignSlice<T>> {
    let (start, _) = t.span()?;
    // SAFETY: DLPack: the producer's memory covers `extent` elements from `start`.
    Ok(unsafe { ForeignSlice::new(start as u64, t.extent()?, gpu.stream().clone()) })
}

/// Four tensors of `T` (q, k, v, o; or q and the caches, o) and lse (f32) of a call as
/// device slices.
///
/// # Safety
/// As [`foreign`].
#[allow(clippy::type_complexity)]
unsafe fn qkvo_lse<T>(
    gpu: &Gpu,
    [q, k, v, o, lse]: [&Borrowed; 5],
) -> PyResult<([ForeignSlice<T>; 4], ForeignSlice<f32>)> {
    // SAFETY: forwarded to the caller.
    unsafe {
        let qkvo = [q, k, v, o].map(|t| foreign(t, gpu));
        let [fq, fk, fv, fo] = qkvo;
        Ok(([fq?, fk?, fv?, fo?], foreign(lse, gpu)?))
    }
}

/// q, k, v of a forward call as device slices.
pub type Qkv<T> = [ForeignSlice<T>; 3];

/// A backward's CUDA tensors as device slices: `ins` q, k, v, o, do (`T`), `lse` (f32), `grads`
/// dq, dk, dv (`T`) and, when given, `d_sink` (f32).
struct BwdSlices<T> {
    ins: [ForeignSlice<T>; 5],
    lse: ForeignSlice<f32>,
    grads: [ForeignSlice<T>; 3],
    d_sink: Option<ForeignSlice<f32>>,
}

/// Takes a backward's tensors (checked by the caller: on `gpu`'s device, `T`, lse and d_sink
/// float32) as [`BwdSlices`].
///
/// # Safety
/// As [`foreign`].
unsafe fn bwd_slices<T>(
    gpu: &Gpu,
    [q, k, v, o, lse, d_o]: [&Borrowed; 6],
    [dq, dk, dv]: [&Borrowed; 3],
    d_sink: Option<&Borrowed>,
) -> PyResult<BwdSlices<T>> {
    // SAFETY: forwarded to the caller.
    unsafe {
        let ([fq, fk, fv, fo], fl) = qkvo_lse::<T>(gpu, [q, k, v, o, lse])?;
        let [fdo, fdq, fdk, fdv] = [d_o, dq, dk, dv].map(|t| foreign::<T>(t, gpu));
        Ok(BwdSlices {
            ins: [fq, fk, fv, fo, fdo?],
            lse: fl,
            grads: [fdq?, fdk?, fdv?],
            d_sink: d_sink.map(|t| foreign::<f32>(t, gpu)).transpose()?,
        })
    }
}

/// A forward call on CUDA tensors q, k, v, out, lse (checked by the caller: on `gpu`'s
/// device, dtype `T`, the layouts of its problem): `launch` runs the library's dense or packed
/// forward on their device slices. `from_host`: the Python function, when the call copies
/// index arrays from the host (which a CUDA graph capture cannot record). Returns the kernel
/// and why.
///
/// # Safety
/// As [`foreign`].
pub unsafe fn forward<T: GpuElement>(
    gpu: &Gpu,
    t: [&Borrowed; 5],
    from_host: Option<&str>,
    launch: impl FnOnce(&Qkv<T>, &mut ForeignSlice<T>, &mut ForeignSlice<f32>) -> Result<LaunchInfo>,
) -> PyResult<(String, String)> {
    if let Some(what) = from_host {
        not_capturing(gpu, what)?;
    }
    // SAFETY: forwarded to the caller.
    let ([fq, fk, fv, mut fo], mut fl) = unsafe { qkvo_lse::<T>(gpu, t)? };
    let info = launch(&[fq, fk, fv], &mut fo, &mut fl).map_err(err)?;
    Ok((format!("attn_{}", info.kernel), info.why))
}

/// Backward on CUDA tensors (checked by the caller as for [`forward`]; `d_o` with `o`'s
/// strides; `dq`, `dk`, `dv` dense; `d_sink`, when given, float32 `[heads_q]`: the learnable
/// sink's gradient).
///
/// # Safety
/// As [`foreign`].
pub unsafe fn backward<T: GpuElement>(
    gpu: &Gpu,
    p: &AttnProblem,
    deterministic: bool,
    ins: [&Borrowed; 6],
    grads: [&Borrowed; 3],
    d_sink: Option<&Borrowed>,
) -> PyResult<(String, String)> {
    // SAFETY: forwarded to the caller.
    let BwdSlices {
        ins: [fq, fk, fv, fo, fdo],
        lse: fl,
        grads: [mut fdq, mut fdk, mut fdv],
        mut d_sink,
    } = unsafe { bwd_slices::<T>(gpu, ins, grads, d_sink)? };
    let opts = BackwardOptions {
        deterministic,
        ..Default::default()
    };
    let info = backward_device(
        gpu,
        p,
        opts,
        &fq,
        &fk,
        &fv,
        &fo,
        &fl,
        &fdo,
        &mut fdq,
        &mut fdk,
        &mut fdv,
        d_sink.as_mut().map(|x| x as &mut dyn DevicePtrMut<f32>),
    )
    .map_err(err)?;
    Ok((info.kernel.to_string(), info.why_not_wgmma))
}

/// A packed batch as [`varlen_backward`] takes it: its offsets on the host (copied to the
/// device per call, so not inside a CUDA graph capture), or int32 tensors `[batch + 1]` on
/// `gpu`'s device (read by the kernels only: the call can be captured).
pub enum PackedCall<'a> {
    Host(&'a flashattn::varlen::VarlenProblem),
    Device(
        &'a flashattn::varlen::DeviceVarlenProblem,
        &'a [Borrowed; 2],
    ),
}

/// The backward of a packed variable-length batch on CUDA tensors (checked by the caller:
/// on `gpu`'s device, dtype `T`, every tensor compact and packed as
/// [`flashattn::cuda::bwd::varlen::backward_device`] takes them). One launch per kernel over
/// every sequence (`attn_bwd`), or with host offsets for few long sequences one
/// `attn_bwd_wgmma` backward per sequence (the library's choice). `d_sink` (float32 `[heads_q]` on the device, the problem with a
/// sink) receives the learnable sink's gradient.
///
/// # Safety
/// As [`foreign`].
pub unsafe fn varlen_backward<T: GpuElement>(
    gpu: &Gpu,
    call: PackedCall<'_>,
    deterministic: bool,
    ins: [&Borrowed; 6],
    (grads, d_sink): ([&Borrowed; 3], Option<&Borrowed>),
) -> PyResult<(String, String)> {
    if let PackedCall::Host(_) = call {
        not_capturing(gpu, "the backward of flash_attn_varlen_func")?;
    }
    // SAFETY: forwarded to the caller.
    let BwdSlices {
        ins: [fq, fk, fv, fo, fdo],
        lse: fl,
        grads: [mut fdq, mut fdk, mut fdv],
        mut d_sink,
    } = unsafe { bwd_slices::<T>(gpu, ins, grads, d_sink)? };
    let fds = d_sink.as_mut().map(|x| x as &mut dyn DevicePtrMut<f32>);
    let opts = BackwardOptions {
        deterministic,
        ..Default::default()
    };
    let info = match call {
        PackedCall::Host(p) => flashattn::cuda::bwd::varlen::backward_device(
            gpu, p, opts, &fq, &fk, &fv, &fo, &fl, &fdo, &mut fdq, &mut fdk, &mut fdv, fds,
        ),
        PackedCall::Device(p, [cq, ck]) => {
            // SAFETY: int32 tensors on this device (checked by the caller).
            let (fcq, fck) = unsafe { (foreign::<i32>(cq, gpu)?, foreign::<i32>(ck, gpu)?) };
            flashattn::cuda::bwd::varlen::backward_device_offsets(
                gpu,
                p,
                opts,
                [&fcq, &fck],
                &fq,
                &fk,
                &fv,
                &fo,
                &fl,
                &fdo,
                &mut fdq,
                &mut fdk,
                &mut fdv,
                fds,
            )
        }
    }
    .map_err(err)?;
    Ok((info.kernel.to_string(), info.why_not_wgmma))
}

/// Refuses, at the forward call of a problem whose gradients are wanted, what the GPU
/// backward ([`backward`]) would refuse for it on `gpu`'s device: a head_dim above its limit,
/// or one whose `attn_bwd` tile does not fit the device's shared memory per block (head dims
/// above 128 need about 155 KB: sm_80 and sm_90). The tile is chosen as the backward chooses
/// it, at the head_dim the kernels run (padded where the call's is not theirs).
pub fn backward_check<T: GpuElement>(gpu: &Gpu, p: &AttnProblem) -> PyResult<()> {
    if let Some(e) = flashattn::cuda::backward::unsupported(p) {
        return Err(err(e));
    }
    // The tile depends on the head_dim and the softcap only.
    let mut run = p.clone();
    run.shape.head_dim = run_head_dim(p.shape.head_dim);
    let info = gpu.info();
    let smem = usize::try_from(info.smem_per_block_optin).unwrap_or(0);
    BwdTile::for_call(&run, T::DTYPE, info.compute_capability, smem).map_err(err)?;
    Ok(())
}

/// A KV-cache call on CUDA tensors, checked by the caller ([`crate::rules::kvcache_shape`]: on
/// the Gpu's device, dtype `T`, the layouts of its shape, index tensors int32 on the device).
pub struct KvCall<'a, 'py> {
    /// The call's shape.
    pub shape: &'a KvCacheShape,
    /// Its index tensors.
    pub index: &'a CacheIndex,
    /// q, k_cache, v_cache, out, lse.
    pub t: [&'a Borrowed; 5],
    /// The new rows k, v.
    pub new: Option<&'a (Borrowed, Borrowed)>,
    /// rotary_cos, rotary_sin.
    pub rotary: Option<&'a (Borrowed, Borrowed)>,
    /// `None` for the library's heuristic.
    pub splits: Option<usize>,
    /// Python's allocator of the split-KV workspace: `workspace(n)` returns a float32 tensor
    /// of `n` elements on the device.
    pub workspace: Option<&'a Bound<'py, PyAny>>,
    /// DLPack's stream handshake for the workspace tensor.
    pub handshake: Option<i64>,
    /// ALiBi slopes and sink logits on the device (float32, checked by the caller), read in
    /// place of the shape's values (zeros that state the modifiers).
    pub values: (Option<&'a Borrowed>, Option<&'a Borrowed>),
}

/// Decoding against a KV cache on CUDA tensors ([`flashattn::cuda::decode::DecodeLaunch`]):
/// the index arrays are read on the device and never copied, the split-KV workspace comes
/// from the caller's framework (allocated on its current stream, so that a CUDA graph capture
/// keeps it in the graph's pool), and nothing synchronises: the call can be captured in a
/// CUDA graph (its kernels compiled by an earlier call: a warm-up) and replayed with new
/// values in the index tensors (and in the slopes and sink logits, when they are given on the
/// device; host ones are copied per call, which a capture refuses).
///
/// # Safety
/// As [`foreign`].
pub unsafe fn kvcache<T: GpuElement>(gpu: &Gpu, c: &KvCall<'_, '_>) -> PyResult<(String, String)> {
    let launch = DecodeLaunch::new(gpu, c.shape, T::DTYPE, c.splits).map_err(err)?;
    let [q, kc, vc, o, lse] = c.t;
    // SAFETY: forwarded to the caller.
    let (([fq, mut fkc, mut fvc, mut fo], mut fl), fnew, frot) = unsafe {
        let two = |x: Option<&(Borrowed, Borrowed)>| -> PyResult<_> {
            Ok(match x {
                Some((a, b)) => Some((foreign::<T>(a, gpu)?, foreign::<T>(b, gpu)?)),
                None => None,
            })
        };
        (
            qkvo_lse::<T>(gpu, [q, kc, vc, o, lse])?,
            two(c.new)?,
            two(c.rotary)?,
        )
    };
    // SAFETY: int32 tensors on the device (checked by the caller).
    let int = |t: &Borrowed| unsafe { foreign::<i32>(t, gpu) };
    let lens = match &c.index.cache_seqlens {
        Seqlens::Each(t) => int(t)?,
        _ => {
            return Err(FlashAttnError::new_err(
                "cache_seqlens: a CUDA call takes an int32 tensor [batch] on the device (flashattn's Python functions make one from an int)",
            ));
        }
    };
    let opt = |t: &Option<Borrowed>| t.as_ref().map(int).transpose();
    let (table, batch_idx, leftpad) = (
        opt(&c.index.block_table)?,
        opt(&c.index.cache_batch_idx)?,
        opt(&c.index.cache_leftpad)?,
    );
    fn dynp<U>(x: &Option<ForeignSlice<U>>) -> Option<&dyn DevicePtr<U>> {
        x.as_ref().map(|s| s as &dyn DevicePtr<U>)
    }
    // SAFETY: float32 tensors on the device (checked by the caller).
    let float = |t: Option<&Borrowed>| t.map(|t| unsafe { foreign::<f32>(t, gpu) }).transpose();
    let (slopes, sink) = (float(c.values.0)?, float(c.values.1)?);
    let index = DeviceIndex {
        block_table: dynp(&table),
        cache_batch_idx: dynp(&batch_idx),
        cache_leftpad: dynp(&leftpad),
        alibi_slopes: dynp(&slopes),
        sink: dynp(&sink),
        ..DeviceIndex::new(&lens)
    };
    // The workspace, from the caller's framework.
    let n = launch.workspace_len();
    let mut ws = None;
    let _ws_tensor = if n > 0 {
        let make = c.workspace.ok_or_else(|| {
            FlashAttnError::new_err(
                "this call needs a split-KV workspace: pass workspace, a callable that allocates n float32 elements on the device",
            )
        })?;
        let obj = make.call1((n,))?;
        let t = Borrowed::take_on(&obj, "workspace", c.handshake)?;
        if t.dtype()? != "float32" || t.place()? != q.place()? || t.extent()? < n {
            return Err(FlashAttnError::new_err(format!(
                "workspace({n}) returned a {} tensor of shape {:?}: expected {n} float32 elements on q's device",
                t.type_name(),
                t.shape()
            )));
        }
        // SAFETY: a float32 tensor on the device, alive to the end of this function.
        ws = Some(unsafe { foreign::<f32>(&t, gpu)? });
        Some(t)
    } else {
        None
    };
    type Pair<'b, U> = Option<(&'b dyn DevicePtr<U>, &'b dyn DevicePtr<U>)>;
    fn pair<U>(x: &Option<(ForeignSlice<U>, ForeignSlice<U>)>) -> Pair<'_, U> {
        x.as_ref()
            .map(|(a, b)| (a as &dyn DevicePtr<U>, b as &dyn DevicePtr<U>))
    }
    let info = launch
        .run(
            gpu,
            &index,
            DecodeTensors {
                q: &fq,
                k_cache: &mut fkc,
                v_cache: &mut fvc,
                new: pair(&fnew),
                rotary: pair(&frot),
                o: &mut fo,
                lse: &mut fl,
            },
            ws.as_mut().map(|w| w as &mut dyn DevicePtrMut<f32>),
        )
        .map_err(err)?;
    // attn_decode reports itself in the launch's configuration, not its kind.
    let kernel = info.config.as_deref().unwrap_or("attn_decode").to_string();
    Ok((kernel, info.why))
}
