//! The binding's one exception type and the mapping of the library's typed error onto it.

use flashattn::AttnError;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

pyo3::create_exception!(
    _native,
    FlashAttnError,
    PyValueError,
    "An invalid call: the message says what is wrong and what to do."
);

/// The library's typed error as the Python exception, its message unchanged.
pub(crate) fn err(e: AttnError) -> PyErr {
    FlashAttnError::new_err(e.to_string())
}
