//! The CUDA backend: NVRTC compilation to CUBIN, a module cache, and kernel launches.
//!
//! Everything is loaded at run time (`cudarc` with `dynamic-loading`): building the crate needs
//! no CUDA toolkit, and a machine without a driver or NVRTC gets
//! [`crate::AttnError::BackendUnavailable`], never a panic.

pub mod device;
pub mod nvrtc;
pub mod sources;

/// cudarc's device-slice traits, which every `*_device` entry point takes (re-exported so that
/// callers need not depend on the same cudarc version themselves).
pub use cudarc::driver::{DevicePtr, DevicePtrMut};
pub use device::{COUNTER_SLOTS, ContextGuard, DeviceInfo, Gpu, LoadedKernel, stream_capturing};
pub use foreign::ForeignSlice;
pub use nvrtc::{Cubin, PtxasStats, compile_cubin};
pub use sources::KernelSource;

/// Supported architectures that CI compiles every kernel for.
pub const CI_ARCHS: [&str; 5] = ["sm_80", "sm_86", "sm_89", "sm_90", "sm_120"];

pub mod attention;
pub mod backward;
pub mod backward_wgmma;
pub mod decode;
pub mod foreign;
pub mod launch;
pub mod mma;
pub mod naive;
pub mod pad;
pub mod simt;
pub mod tma;
pub mod varlen;
pub mod wgmma;
pub mod wgmma_trace;

pub use attention::{HostRun, forward_device, forward_host};
pub use launch::{GpuElement, KernelKind, LaunchInfo, score_defines};
pub use mma::MmaTile;
pub use wgmma::WgmmaTile;
pub mod host;
pub use host::{shared_gpu, try_host_forward, try_host_kvcache, try_host_varlen};
