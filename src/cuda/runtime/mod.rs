//! What every CUDA launcher stands on: the argument checks ([`args`]), the device and its
//! module cache ([`device`]), NVRTC ([`nvrtc`]), TMA descriptors ([`tma`]), kernel parameters
//! and defines ([`launch`]), memory owned by another framework ([`foreign`]), and the padded
//! copies that run a head_dim the kernels lack ([`pad`]).

pub mod args;
pub mod device;
pub mod foreign;
pub mod launch;
pub mod nvrtc;
pub mod pad;
pub mod tma;
