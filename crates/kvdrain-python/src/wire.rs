//! `kvdrain.encode_cancel` and `kvdrain.parse_cancel`: the consumer's `PUSH_CANCEL:` (it
//! gave up a request it registered), byte for byte as the core's [`kvdrain::wire`] writes
//! and reads it.

use kvdrain::wire::{self, Message};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::InvalidRequestIdError;

/// `PUSH_CANCEL:{request_id}`, the bytes a consumer sends each producer it registered
/// `request_id` with once it gives the request up. Raises `InvalidRequestIdError` for an
/// empty id.
#[pyfunction]
pub(crate) fn encode_cancel<'py>(
    py: Python<'py>,
    request_id: &str,
) -> PyResult<Bound<'py, PyBytes>> {
    let mut buf = vec![0u8; wire::PUSH_CANCEL_PREFIX.len() + request_id.len()];
    let n = wire::encode_cancel(request_id, &mut buf).map_err(|e| {
        InvalidRequestIdError::new_err((format!("{e}: {request_id:?}"), request_id.to_owned()))
    })?;
    Ok(PyBytes::new(py, &buf[..n]))
}

/// The consumer's request id a `PUSH_CANCEL:` message names, or `None` for any other
/// message (another kind, malformed, or not `bytes`). Never raises.
#[pyfunction]
pub(crate) fn parse_cancel(message: &Bound<'_, PyAny>) -> Option<String> {
    let bytes = message.cast::<PyBytes>().ok()?;
    match wire::parse(bytes.as_bytes()) {
        Ok(Message::Cancel(id)) => Some(id.to_owned()),
        _ => None,
    }
}
