//! The forward pass on the GPU: the kernel choice and host/device entry points
//! ([`attention`]), one launcher per kernel ([`naive`], [`simt`], [`mma`], [`wgmma`], the
//! latter's timeline trace [`wgmma_trace`]) and packed variable-length batches ([`varlen`]).
//! Head dims the kernels lack run padded ([`crate::cuda::runtime::pad`]).

pub mod attention;
pub mod mma;
pub mod naive;
pub mod simt;
pub mod varlen;
pub mod wgmma;
pub mod wgmma_fp8;
pub mod wgmma_trace;
