//! What a host-memory call asks for ([`BackendChoice`]) and what it got ([`Backend`],
//! [`Forward`]): the dispatch layer's types, apart from its functions so that the GPU side
//! (`gpu.rs`) names them without importing the layer that calls it.

use serde::Serialize;

/// Which backend a call should use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub enum BackendChoice {
    /// The GPU when one is usable, else the CPU.
    #[default]
    Auto,
    /// The CPU backend ([`crate::cpu`]).
    Cpu,
    /// The CUDA backend ([`crate::cuda`]); an error when no GPU is usable.
    Cuda,
}

/// The backend that actually ran, and why it was chosen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Backend {
    /// The CPU backend with this many rayon threads.
    Cpu {
        /// rayon threads.
        threads: usize,
    },
    /// The CUDA backend on this device with this kernel.
    Cuda {
        /// Device name.
        device: String,
        /// Kernel name.
        kernel: String,
    },
}

/// The result of [`super::forward`]: o in q's layout (dense), lse, which backend ran, and why.
#[derive(Debug, Clone)]
pub struct Forward<T> {
    /// `[batch, seqlen_q, heads_q, head_dim]`, dense.
    pub o: Vec<T>,
    /// `[batch, heads_q, seqlen_q]`, natural log.
    pub lse: Vec<f32>,
    /// The backend that ran.
    pub backend: Backend,
    /// Why that backend (e.g. why `auto` fell back to the CPU).
    pub reason: String,
    /// Wall time of the attention itself in seconds (no compile, no transfers).
    pub seconds: f64,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backend::Cpu { threads } => write!(f, "cpu ({threads} threads)"),
            Backend::Cuda { device, kernel } => write!(f, "cuda {kernel} on {device}"),
        }
    }
}
