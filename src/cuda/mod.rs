//! The CUDA backend: NVRTC compilation to CUBIN, a module cache, and kernel launches.
//!
//! Everything is loaded at run time (`cudarc` with `dynamic-loading`): building the crate needs
//! no CUDA toolkit, and a machine without a driver or NVRTC gets
//! [`crate::AttnError::BackendUnavailable`], never a panic.
//!
//! One folder per job: [`runtime`] (argument checks, device, NVRTC, TMA maps, launch
//! parameters, foreign memory, padded head dims), [`fwd`] (the forward kernels' launchers,
//! packed varlen batches),
//! [`bwd`] (the backward), [`decode`] (decoding against a KV cache). The kernel sources are
//! [`sources`]. This module imports problem types only from the layers below it (shape, mask,
//! dtype, scores, [`crate::problem`]); the choice of backend is [`crate::dispatch`]'s.
//!
//! The `pub use` lines below keep the flat paths (`cuda::backward`, `cuda::wgmma`, ...) that
//! callers outside the library use.

pub mod bwd;
pub mod decode;
pub mod fwd;
pub mod runtime;
pub mod sources;

/// cudarc's device-slice traits, which every `*_device` entry point takes (re-exported so that
/// callers need not depend on the same cudarc version themselves).
pub use cudarc::driver::{DevicePtr, DevicePtrMut};

pub use bwd::{backward, backward_wgmma};
pub use fwd::{attention, mma, naive, simt, varlen, wgmma, wgmma_trace};
pub use runtime::{device, foreign, launch, nvrtc, pad, tma};

pub use fwd::attention::{HostRun, forward_device, forward_host};
pub use fwd::mma::MmaTile;
pub use fwd::wgmma::WgmmaTile;
pub use runtime::device::{
    COUNTER_SLOTS, ContextGuard, DeviceInfo, Gpu, LoadedKernel, shared_gpu, stream_capturing,
};
pub use runtime::foreign::ForeignSlice;
pub use runtime::launch::{GpuElement, KernelKind, LaunchInfo, score_defines, sink_defines};
pub use runtime::nvrtc::{Cubin, PtxasStats, compile_cubin};
pub use sources::KernelSource;

/// Supported architectures that CI compiles every kernel for.
pub const CI_ARCHS: [&str; 5] = ["sm_80", "sm_86", "sm_89", "sm_90", "sm_120"];
