//! `flashattn._native`: the Python binding of the `flashattn` library. Tensors come in through
//! DLPack (`__dlpack__`), so NumPy, PyTorch, JAX and CuPy arrays all work without a copy; the
//! Python package (`flashattn/__init__.py`) gives FlashAttention-2's function names and
//! allocates outputs in the caller's framework.
//!
//! CPU tensors run on the library's CPU backend; CUDA tensors (forward and backward) on its
//! GPU kernels, on the stream the caller names (its framework's current stream), through the
//! DLPack stream handshake, without a copy or a device synchronisation (`gpu.rs`); the
//! variable-length and KV-cache calls plan from host copies of their index arrays, which the
//! Python layer makes.
//!
//! - `dlpack.rs`: tensor intake (the DLPack capsule or a PyTorch tensor's attributes: device,
//!   element type, shape, strides, memory span).
//! - `rules.rs`: the argument rules, each once; what the library checks is left to it, and its
//!   `AttnError` becomes a `FlashAttnError` (`error.rs`).
//! - `error.rs`: [`FlashAttnError`], the one exception type of every refused call, its
//!   subclass `FlashAttnUnsupportedError` for what is not implemented, and `err`, which maps
//!   the library's [`flashattn::AttnError`] onto them.
//! - `api.rs`: the `#[pyfunction]`s, which wire intake, rules and the library, on the CPU or
//!   through `gpu.rs` on a CUDA device.
//! - `fp8.rs`: the FP8 (e4m3) forward, `fp8_forward` (q, k, v as bytes, FlashAttention-3's
//!   descales, bf16 out).

mod api;
mod dlpack;
mod error;
mod fp8;
mod gpu;
mod rules;

use error::FlashAttnError;
use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(api::forward, m)?)?;
    m.add_function(wrap_pyfunction!(api::backward, m)?)?;
    m.add_function(wrap_pyfunction!(api::nvrtc_version, m)?)?;
    m.add_function(wrap_pyfunction!(api::reference, m)?)?;
    m.add_function(wrap_pyfunction!(api::varlen_forward, m)?)?;
    m.add_function(wrap_pyfunction!(api::varlen_backward, m)?)?;
    m.add_function(wrap_pyfunction!(api::kvcache_forward, m)?)?;
    m.add_function(wrap_pyfunction!(fp8::fp8_forward, m)?)?;
    m.add("FlashAttnError", m.py().get_type::<FlashAttnError>())?;
    m.add(
        "FlashAttnUnsupportedError",
        error::unsupported_type(m.py())?,
    )?;
    Ok(())
}
