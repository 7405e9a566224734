//! The package's exceptions. Each carries `code` (a snake-case reason), `retryable` (whether
//! the same request can succeed if sent again unchanged), `retry_after` (seconds to wait first)
//! and `detail` (the readable account).

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::type_object::PyTypeInfo;

use orbitkv_protocol::ErrorCode;

create_exception!(
    orbitkv,
    OrbitKVError,
    PyException,
    "Base of every error the orbitkv package raises.\n\nAttributes: code (str), retryable (bool), retry_after (float, seconds), detail (str)."
);
create_exception!(
    orbitkv,
    RefusedError,
    OrbitKVError,
    "The daemon refused the request; `code` is its typed reason (`seal_refused`, `retry_later`, ...)."
);
create_exception!(
    orbitkv,
    ConnectionLost,
    OrbitKVError,
    "The connection to the daemon failed or closed; open a new one."
);
create_exception!(
    orbitkv,
    DaemonNotFound,
    OrbitKVError,
    "No daemon answered at any socket tried; `tried` lists each path with its error."
);
create_exception!(
    orbitkv,
    ProtocolViolation,
    OrbitKVError,
    "The daemon sent bytes that are not a valid message, or a reply the request does not take."
);
create_exception!(
    orbitkv,
    InvalidInput,
    OrbitKVError,
    "An argument cannot describe what it should (a layout, a pool, an identity setting, a hash input)."
);
create_exception!(
    orbitkv,
    TimedOut,
    OrbitKVError,
    "A wait for a reply ended at its timeout; the request is still outstanding."
);

/// An exception of type `E` with the package's attributes set.
pub(crate) fn error<E: PyTypeInfo>(
    py: Python<'_>,
    code: &str,
    retryable: bool,
    retry_after: f64,
    detail: impl Into<String>,
) -> PyErr {
    let detail = detail.into();
    let err = PyErr::new::<E, _>(detail.clone());
    let value = err.value(py);
    // Setting attributes on a fresh exception instance cannot fail short of memory exhaustion;
    // the exception is raised either way.
    let _ = value.setattr("code", code);
    let _ = value.setattr("retryable", retryable);
    let _ = value.setattr("retry_after", retry_after);
    let _ = value.setattr("detail", detail);
    err
}

/// A refusal by the daemon.
pub(crate) fn refused(py: Python<'_>, code: ErrorCode, retry_after_ms: u32, detail: &str) -> PyErr {
    error::<RefusedError>(
        py,
        code.name(),
        code.retryable(),
        f64::from(retry_after_ms) / 1000.0,
        format!("refused ({}): {detail}", code.name()),
    )
}

/// An argument that cannot be used.
pub(crate) fn invalid(py: Python<'_>, detail: impl Into<String>) -> PyErr {
    error::<InvalidInput>(py, "invalid_input", false, 0.0, detail)
}

/// The connection failed.
pub(crate) fn lost(py: Python<'_>, detail: impl Into<String>) -> PyErr {
    error::<ConnectionLost>(py, "connection_lost", false, 0.0, detail)
}

/// The daemon broke the protocol.
pub(crate) fn violation(py: Python<'_>, detail: impl Into<String>) -> PyErr {
    error::<ProtocolViolation>(py, "protocol_violation", false, 0.0, detail)
}

/// Registers the exception types in the module.
pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("OrbitKVError", py.get_type::<OrbitKVError>())?;
    m.add("RefusedError", py.get_type::<RefusedError>())?;
    m.add("ConnectionLost", py.get_type::<ConnectionLost>())?;
    m.add("DaemonNotFound", py.get_type::<DaemonNotFound>())?;
    m.add("ProtocolViolation", py.get_type::<ProtocolViolation>())?;
    m.add("InvalidInput", py.get_type::<InvalidInput>())?;
    m.add("TimedOut", py.get_type::<TimedOut>())?;
    Ok(())
}
