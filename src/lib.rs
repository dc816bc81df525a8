//! # flashattn
//!
//! Exact attention (the FlashAttention forward pass) for NVIDIA GPUs, with hand-written
//! Tensor Core kernels compiled at run time by NVRTC, an f64 reference, and a CPU backend.
//!
//! Layout `[batch, seqlen, heads, head_dim]`, `lse` f32 `[batch, heads_q, seqlen_q]` in
//! natural log. See [`AttnProblem`] for the problem description and [`forward`] for the
//! host-memory entry point that picks a backend.
//!
//! The command line, the GPU checks, benchmarks and layout probes live in the
//! `flashattn-tools` crate (`tools/`), so that this crate builds none of their dependencies.

pub mod backward_tiles;
pub mod compare;
pub mod cpu;
pub mod cpu_backward;
pub mod cuda;
pub mod dispatch;
pub mod dist;
pub mod dtype;
pub mod error;
pub mod fp8;
pub mod io;
pub mod kvcache;
pub mod mask;
pub mod merge;
pub mod problem;
pub mod reference;
pub mod reference_grad;
pub mod scores;
pub mod shape;
pub mod varlen;

pub use dispatch::fp8::forward as forward_fp8;
pub use dispatch::{Backend, BackendChoice, Forward, forward};
pub use dtype::{DType, Element};
pub use error::{AttnError, Result};
pub use mask::Mask;
pub use shape::{AttnProblem, AttnShape, Strides};

/// The README's examples, compiled and run as doc tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
