//! The binding's exception types and the mapping of the library's typed error onto them:
//! [`FlashAttnError`] for every refused call, and its subclass `FlashAttnUnsupportedError`
//! (also a `NotImplementedError`) for what flashattn does not implement.

use flashattn::AttnError;
use pyo3::exceptions::{PyNotImplementedError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

pyo3::create_exception!(
    _native,
    FlashAttnError,
    PyValueError,
    "An invalid call: the message says what is wrong and what to do."
);

/// The docstring of `FlashAttnUnsupportedError`.
const UNSUPPORTED_DOC: &str = "A FlashAttention-2 feature that flashattn does not implement \
(dropout_p > 0, rotary embeddings, a GPU without the resources for a head_dim, ...), refused \
at the call that asks for it. A FlashAttnError (so a ValueError) and a NotImplementedError.";

static UNSUPPORTED: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// `FlashAttnUnsupportedError`: a subclass of both [`FlashAttnError`] and
/// `NotImplementedError`, built once with `type(name, bases, dict)` (a Rust-declared exception
/// has one base only).
pub(crate) fn unsupported_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    let ty = UNSUPPORTED.get_or_try_init(py, || -> PyResult<Py<PyType>> {
        let bases = PyTuple::new(
            py,
            [
                py.get_type::<FlashAttnError>(),
                py.get_type::<PyNotImplementedError>(),
            ],
        )?;
        let dict = PyDict::new(py);
        dict.set_item("__doc__", UNSUPPORTED_DOC)?;
        dict.set_item("__module__", "flashattn")?;
        let made = py
            .get_type::<PyType>()
            .call1(("FlashAttnUnsupportedError", bases, dict))?;
        Ok(made.cast_into::<PyType>()?.unbind())
    })?;
    Ok(ty.bind(py))
}

/// A `FlashAttnUnsupportedError` carrying `msg`.
pub(crate) fn unsupported(msg: String) -> PyErr {
    Python::attach(|py| match unsupported_type(py) {
        Ok(ty) => PyErr::from_type(ty.clone(), msg),
        Err(e) => e,
    })
}

/// The library's typed error as the Python exception, its message unchanged: what the
/// library does not implement (a head_dim, a feature) as `FlashAttnUnsupportedError`,
/// everything else as [`FlashAttnError`].
pub(crate) fn err(e: AttnError) -> PyErr {
    match e {
        AttnError::UnsupportedHeadDim { .. } | AttnError::UnsupportedFeature { .. } => {
            unsupported(e.to_string())
        }
        _ => FlashAttnError::new_err(e.to_string()),
    }
}
