//! One GPU: context, stream, device facts, a cache of compiled modules, and the wgmma tile
//! scheduler's counters (one per stream).

use crate::cuda::runtime::nvrtc::{PtxasStats, compile_cubin, nvrtc_present, nvrtc_version};
use crate::cuda::sources::KernelSource;
use crate::error::{AttnError, Result};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, sys,
};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Facts about the device, read from the driver.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeviceInfo {
    /// Marketing name, e.g. "NVIDIA H200".
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// The arch we compile for, e.g. `sm_90`.
    pub arch: String,
    /// Streaming multiprocessors.
    pub sm_count: i32,
    /// Shared memory a block may opt in to (bytes).
    pub smem_per_block_optin: i32,
    /// Shared memory per SM (bytes).
    pub smem_per_sm: i32,
    /// Global memory (bytes).
    pub total_mem: usize,
    /// Driver's CUDA version, e.g. 13000.
    pub driver_version: i32,
    /// NVRTC version (major, minor).
    pub nvrtc_version: (i32, i32),
}

/// A compiled, loaded kernel function and what ptxas said about it.
#[derive(Debug, Clone)]
pub struct LoadedKernel {
    /// The function, ready to launch.
    pub function: CudaFunction,
    /// Registers, spills, static shared memory.
    pub stats: PtxasStats,
}

/// ptxas's statistics of a loaded function, completed by the driver's own attributes where the
/// log lacks them.
///
/// On the H200, bench JSON reported 0 registers (no usable ptxas entry for the function) in
/// every process after the first one on a machine; the cause was not isolated. Then the
/// register count comes from the driver (`CU_FUNC_ATTRIBUTE_NUM_REGS`, what the launch uses),
/// and, without an entry at all, the stack frame and both spill fields from the local memory
/// per thread (`CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES`): an upper bound on spills, 0 exactly when
/// the kernel neither spills nor keeps arrays in local memory (true of all our kernels).
fn with_driver_stats(f: &CudaFunction, from_log: Option<&PtxasStats>) -> PtxasStats {
    if let Some(s) = from_log.filter(|s| s.registers > 0) {
        return s.clone();
    }
    let attr = |a| f.get_attribute(a).ok().and_then(|v| u32::try_from(v).ok());
    let mut stats = from_log.cloned().unwrap_or_default();
    stats.registers = attr(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS).unwrap_or(0);
    if from_log.is_none() {
        let local = attr(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES);
        stats.stack_frame = local.unwrap_or(0);
        stats.spill_stores = local.unwrap_or(0);
        stats.spill_loads = local.unwrap_or(0);
        stats.shared =
            attr(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES).unwrap_or(0);
    }
    stats
}

/// Key of the module cache: (source, arch, specialisation defines).
type CacheKey = (KernelSource, String, Vec<(String, String)>);
/// A loaded module and ptxas's statistics of its functions.
type CachedModule = (Arc<CudaModule>, Vec<PtxasStats>);

/// The wgmma tile scheduler's counters: [`COUNTER_SLOTS`] pairs of u32 (tiles drawn, blocks
/// done), each zero between launches (attn_wgmma zeroes its pair on exit), one pair per
/// stream: launches on one stream run in order and may share a pair, launches on two streams
/// may overlap and must not.
struct TileCounters {
    buf: CudaSlice<u32>,
    /// The stream handle (as an integer) that owns each slot taken so far.
    owners: Vec<usize>,
}

/// Whether libcuda can be loaded, asked once per process: `sys::is_culib_present` builds its
/// candidate names and dlopens them on every call, too much for every launch.
fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen candidate names; no symbol is called.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// Restores the context current before [`Gpu::restore_current_context`] when dropped.
#[must_use = "the previous context is restored when the guard drops"]
pub struct ContextGuard(Option<sys::CUcontext>);

impl ContextGuard {
    /// Saves this thread's current context (none when the driver cannot be loaded).
    pub fn save() -> Self {
        if !driver_present() {
            return ContextGuard(None);
        }
        let mut prev: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: an out-parameter.
        let ok = unsafe { sys::cuCtxGetCurrent(&mut prev) } == sys::CUresult::CUDA_SUCCESS;
        ContextGuard(ok.then_some(prev))
    }
}

/// Whether the stream with raw handle `raw` (0: the current context's legacy stream) is
/// capturing a CUDA graph; `true` too when the driver cannot say.
///
/// # Safety
/// `raw` is a live stream (or 0 with a current context).
pub unsafe fn stream_capturing(raw: usize) -> bool {
    if !driver_present() {
        return false;
    }
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: forwarded to the caller; an out-parameter.
    let r = unsafe { sys::cuStreamIsCapturing(raw as sys::CUstream, &mut status) };
    r != sys::CUresult::CUDA_SUCCESS
        || status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        if let Some(prev) = self.0 {
            // SAFETY: a context handle the driver returned (null unbinds, as it was).
            unsafe { sys::cuCtxSetCurrent(prev) };
        }
    }
}

/// Slots of [`TileCounters`]: streams past this many launch with the static schedule.
pub const COUNTER_SLOTS: usize = 64;

/// What every view of one device shares: facts, compiled modules, tile counters.
struct Shared {
    info: DeviceInfo,
    cache: Mutex<HashMap<CacheKey, CachedModule>>,
    counters: Mutex<TileCounters>,
}

/// A CUDA device seen through one stream: every launch and copy of this crate made with this
/// value goes to [`Gpu::stream`]. [`Gpu::on_stream`] gives a view of the same device (same
/// context, compiled modules and counters) on another stream. Cheap to share by reference.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("info", &self.shared.info)
            .field("stream", &self.stream.cu_stream())
            .finish()
    }
}

/// Maps a driver error into ours, naming what was being done. Errors that poison the
/// context (700-720: illegal address, misaligned address, launch failure, ...) say so: every
/// later CUDA call in this process fails, and the process must be restarted.
pub fn cuda_err(
    context: impl Into<String>,
) -> impl FnOnce(cudarc::driver::DriverError) -> AttnError {
    let context = context.into();
    move |e| {
        let code = e.0 as u32;
        let sticky = (700..=720).contains(&code);
        AttnError::Cuda {
            context,
            message: if sticky {
                format!(
                    "{e:?}: the CUDA context is now unusable (a sticky error); restart the process"
                )
            } else {
                format!("{e:?}; the context is still usable")
            },
        }
    }
}

impl Gpu {
    /// Opens device `ordinal`. Never panics when CUDA is missing.
    ///
    /// # Errors
    /// [`AttnError::BackendUnavailable`] when libcuda or NVRTC is absent or no device exists;
    /// [`AttnError::Cuda`] when the driver fails.
    pub fn new(ordinal: usize) -> Result<Self> {
        let unavailable = |reason: String| AttnError::BackendUnavailable {
            backend: "cuda",
            reason,
        };
        if !driver_present() {
            return Err(unavailable(
                "the CUDA driver library (libcuda.so) was not found: this machine has no NVIDIA driver".into(),
            ));
        }
        if !nvrtc_present() {
            return Err(unavailable(
                "the NVRTC library (libnvrtc.so.13) was not found: install it (pip install nvidia-cuda-nvrtc==13.0.*) and add its lib folder to LD_LIBRARY_PATH".into(),
            ));
        }
        let count = CudaContext::device_count()
            .map_err(|e| unavailable(format!("cuInit/cuDeviceGetCount failed: {e:?}")))?;
        if ordinal as i32 >= count {
            return Err(unavailable(format!(
                "device {ordinal} asked for, {count} found"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(cuda_err("creating the context"))?;
        let stream = ctx.default_stream();
        let attr = |a| {
            ctx.attribute(a)
                .map_err(cuda_err("reading device attributes"))
        };
        use sys::CUdevice_attribute as A;
        let cc = ctx
            .compute_capability()
            .map_err(cuda_err("reading compute capability"))?;
        let mut driver_version = 0;
        // SAFETY: out-parameter.
        unsafe { sys::cuDriverGetVersion(&mut driver_version) };
        let info = DeviceInfo {
            name: ctx.name().map_err(cuda_err("reading device name"))?,
            compute_capability: cc,
            arch: format!("sm_{}{}", cc.0, cc.1),
            sm_count: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            smem_per_block_optin: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
            smem_per_sm: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?,
            total_mem: ctx.total_mem().map_err(cuda_err("reading memory size"))?,
            driver_version,
            nvrtc_version: nvrtc_version()?,
        };
        if cc.0 < 8 {
            return Err(unavailable(format!(
                "{} is sm_{}{}; the kernels need sm_80 or newer (bf16 mma.sync, cp.async)",
                info.name, cc.0, cc.1
            )));
        }
        // Zeroed and complete before any stream can use it (the legacy stream does not order
        // non-blocking streams, so synchronise once here, outside any graph capture).
        let buf = stream
            .alloc_zeros::<u32>(2 * COUNTER_SLOTS)
            .map_err(cuda_err("allocating the tile counters"))?;
        stream
            .synchronize()
            .map_err(cuda_err("zeroing the tile counters"))?;
        Ok(Self {
            ctx,
            stream,
            shared: Arc::new(Shared {
                info,
                cache: Mutex::new(HashMap::new()),
                counters: Mutex::new(TileCounters {
                    buf,
                    owners: Vec::new(),
                }),
            }),
        })
    }

    /// The same device on `stream` (of this context): launches made through the returned
    /// value go to `stream`; modules compiled by either are shared.
    ///
    /// # Errors
    /// [`AttnError::ShapeMismatch`] when `stream` belongs to another context.
    pub fn on_stream(&self, stream: Arc<CudaStream>) -> Result<Gpu> {
        if stream.context().cu_ctx() != self.ctx.cu_ctx() {
            return Err(AttnError::ShapeMismatch {
                what:
                    "a stream of another CUDA context than this Gpu's: take it from gpu.context()"
                        .into(),
            });
        }
        Ok(Gpu {
            ctx: self.ctx.clone(),
            stream,
            shared: self.shared.clone(),
        })
    }

    /// The same device on a stream owned by another library (a PyTorch or CuPy stream),
    /// given as its raw `CUstream` handle as an integer (what `torch.cuda.Stream.cuda_stream`
    /// and `cupy.cuda.Stream.ptr` return; 0: the legacy default stream, 2: per-thread).
    ///
    /// # Safety
    /// `raw` must be a live stream of this device's primary context, and stay alive while
    /// the returned value (or work it enqueued) is in use.
    pub unsafe fn on_raw_stream(&self, raw: usize) -> Gpu {
        Gpu {
            ctx: self.ctx.clone(),
            // SAFETY: forwarded to the caller.
            stream: unsafe { self.ctx.wrap_borrowed_stream(raw as sys::CUstream) },
            shared: self.shared.clone(),
        }
    }

    /// Device facts.
    pub fn info(&self) -> &DeviceInfo {
        &self.shared.info
    }

    /// The context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every launch made through this value goes to (the context's legacy default
    /// stream for [`Gpu::new`]).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Compiles (once per process) and loads `function` from `source` specialised by `defines`.
    ///
    /// # Errors
    /// [`AttnError::Compile`] with the NVRTC log; [`AttnError::Cuda`] when loading fails.
    pub fn kernel(
        &self,
        source: KernelSource,
        function: &str,
        defines: &[(String, String)],
    ) -> Result<LoadedKernel> {
        let arch = source.target(&self.shared.info.arch);
        let key = (source, arch.clone(), defines.to_vec());
        let mut cache = self.shared.cache.lock().unwrap_or_else(|p| p.into_inner());
        if !cache.contains_key(&key) {
            if self.capturing() {
                return Err(AttnError::InvalidInput {
                    what: format!(
                        "{function} for this configuration is not compiled yet and the stream is capturing a CUDA graph (compiling and loading a module cannot be captured): make the same call once before the capture (a warm-up)"
                    ),
                });
            }
            let cubin = compile_cubin(&source.text(), source.name(), &arch, defines)?;
            let module = self
                .ctx
                .load_module(Ptx::from_binary(cubin.image))
                .map_err(cuda_err(format!("loading module {}", source.name())))?;
            cache.insert(key.clone(), (module, cubin.stats));
        }
        let (module, stats) = &cache[&key];
        let f = module
            .load_function(function)
            .map_err(cuda_err(format!("finding {function} in {}", source.name())))?;
        let stats = with_driver_stats(&f, stats.iter().find(|s| s.function == function));
        Ok(LoadedKernel { function: f, stats })
    }

    /// The device address of this stream's pair of wgmma tile counters (two u32, zero between
    /// launches: the kernel zeroes them on exit), or `None` (the caller then launches with
    /// the static schedule) when [`COUNTER_SLOTS`] other streams hold every pair, when the
    /// stream is the per-thread default stream (one handle, a stream per thread), or when the
    /// stream is capturing a CUDA graph: a graph may be replayed on any stream, alongside
    /// work on the stream it was captured on, so no pair could be its alone. A stream keeps
    /// its pair for the life of the device; a handle reused after its stream was destroyed
    /// takes over that stream's pair (safe once the old stream's work is done, as it is for
    /// streams that PyTorch pools and never destroys).
    pub fn tile_counter(&self) -> Option<u64> {
        if self.capturing() {
            return None;
        }
        // The legacy stream (handle 0, or CU_STREAM_LEGACY = 1) is one stream of the context;
        // the per-thread stream (2) is one handle for a different stream in each thread, so
        // it gets no pair (two threads' launches could overlap on it).
        let key = match self.stream.cu_stream() as usize {
            1 => 0,
            2 => return None,
            h => h,
        };
        let mut c = self
            .shared
            .counters
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let slot = match c.owners.iter().position(|&o| o == key) {
            Some(i) => i,
            None if c.owners.len() < COUNTER_SLOTS => {
                c.owners.push(key);
                c.owners.len() - 1
            }
            None => return None,
        };
        let (base, _guard) = c.buf.device_ptr(&self.stream);
        Some(base + (2 * slot * std::mem::size_of::<u32>()) as u64)
    }

    /// Whether this value's stream is capturing a CUDA graph (or the driver cannot say, which
    /// callers treat the same way: do only what a capture may record).
    pub fn capturing(&self) -> bool {
        // (The legacy stream is the current context's: bind ours.)
        if self.ctx.bind_to_thread().is_err() {
            return true;
        }
        // SAFETY: the stream is live (this value's invariant), and our context is bound.
        unsafe { stream_capturing(self.stream.cu_stream() as usize) }
    }

    /// Makes the context that was current in this thread before the guard current again when
    /// the guard drops: cudarc binds this device's context for every call, which would
    /// otherwise change the caller's current device (PyTorch's and CuPy's follow it).
    pub fn restore_current_context(&self) -> ContextGuard {
        ContextGuard::save()
    }

    /// Number of modules compiled so far (for tests of the cache).
    pub fn cached_modules(&self) -> usize {
        self.shared.cache.lock().map(|c| c.len()).unwrap_or(0)
    }
}

/// The process-wide GPU 0, opened on first use. The error text is kept so that every caller
/// can say why the GPU is not usable.
///
/// # Errors
/// [`crate::AttnError::BackendUnavailable`] (or the driver error) from [`Gpu::new`].
pub fn shared_gpu() -> Result<&'static Gpu> {
    static GPU: OnceLock<std::result::Result<Gpu, String>> = OnceLock::new();
    GPU.get_or_init(|| {
        Gpu::new(0).map_err(|e| match e {
            AttnError::BackendUnavailable { reason, .. } => reason,
            other => other.to_string(),
        })
    })
    .as_ref()
    .map_err(|reason| AttnError::BackendUnavailable {
        backend: "cuda",
        reason: reason.clone(),
    })
}
