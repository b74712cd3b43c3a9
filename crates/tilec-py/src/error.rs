//! Python exceptions carrying tilec's messages, and the last-resort guard against panics.

use pyo3::exceptions::PyException;
use pyo3::prelude::*;

pyo3::create_exception!(
    _tilec,
    TilecError,
    PyException,
    "A model that tilec cannot import, compile or run; the message says why."
);
pyo3::create_exception!(
    _tilec,
    InvalidInputError,
    TilecError,
    "Inputs that do not fit the model: a wrong name, count, dtype, rank or size."
);

/// A [`TilecError`] from any message.
pub fn tilec_err(e: impl std::fmt::Display) -> PyErr {
    TilecError::new_err(e.to_string())
}

/// An [`InvalidInputError`].
pub fn invalid(msg: String) -> PyErr {
    InvalidInputError::new_err(msg)
}

/// Runs `f`, turning a panic (a tilec bug) into a [`TilecError`] instead of aborting or raising
/// PyO3's `PanicException`, which is not an `Exception`.
pub fn guard<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".into());
            Err(TilecError::new_err(format!("internal error in tilec (please report it): {msg}")))
        }
    }
}
