//! Arguments from Python checked into the core's types before anything changes: ints in
//! range, names that are valid UTF-8, request ids that can complete. Each refusal is a
//! `KvdrainError` subclass whose message names the parameter and the value.

use kvdrain::wire::{EncodeError, check_request_id};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyString};

use crate::errors::InvalidRequestIdError;

/// An unsigned integer type an argument converts to.
pub(crate) trait Unsigned: TryFrom<u64> {
    /// Its largest value, for the message.
    const MAX: u64;
}

impl Unsigned for u16 {
    const MAX: u64 = u16::MAX as u64;
}

impl Unsigned for u64 {
    const MAX: u64 = u64::MAX;
}

impl Unsigned for usize {
    const MAX: u64 = usize::MAX as u64;
}

/// `value` as a `T`, or `error` with a message naming `name`: a bool, a negative or too
/// large int, and anything that is not an int are refused.
pub(crate) fn unsigned<T: Unsigned>(
    value: &Bound<'_, PyAny>,
    name: &str,
    error: fn(String) -> PyErr,
) -> PyResult<T> {
    if !value.is_instance_of::<PyBool>()
        && let Ok(n) = value.extract::<u64>()
        && let Ok(t) = T::try_from(n)
    {
        return Ok(t);
    }
    let why = if value.is_instance_of::<PyBool>() {
        format!("{name}={value}: give an int, not a bool")
    } else if value.is_instance_of::<PyInt>() {
        format!("{name}={value}: must be in 0..={}", T::MAX)
    } else {
        let kind = value.get_type().name().map(|n| n.to_string());
        format!(
            "{name} must be an int, not {}",
            kind.as_deref().unwrap_or("?")
        )
    };
    Err(error(why))
}

/// [`unsigned`] for an optional argument (`None` stays `None`).
pub(crate) fn unsigned_opt<T: Unsigned>(
    value: Option<&Bound<'_, PyAny>>,
    name: &str,
    error: fn(String) -> PyErr,
) -> PyResult<Option<T>> {
    match value {
        Some(v) if !v.is_none() => unsigned(v, name, error).map(Some),
        _ => Ok(None),
    }
}

/// The repr of a `str` for a message (ASCII, so a lone surrogate prints as `\ud800`).
pub(crate) fn repr(s: &Bound<'_, PyString>) -> String {
    s.repr().map_or_else(|_| "<str>".into(), |r| r.to_string())
}

/// `s` as UTF-8, or `error` with a message saying which `what` is not.
pub(crate) fn utf8<'a>(
    s: &'a Bound<'_, PyString>,
    what: &str,
    error: impl FnOnce(String) -> PyErr,
) -> PyResult<&'a str> {
    s.to_str().map_err(|_| {
        error(format!(
            "{what} {} is not valid UTF-8 (it holds a lone surrogate)",
            repr(s)
        ))
    })
}

/// A request id as UTF-8, for a request that could be tracked (abort).
pub(crate) fn request_id_utf8<'a>(id: &'a Bound<'_, PyString>) -> PyResult<&'a str> {
    utf8(id, "request id", |why| {
        InvalidRequestIdError::new_err((why, id.clone().unbind()))
    })
}

/// A request id as UTF-8, refused unless its completions can exist on the wire (see
/// [`check_request_id`]): registering it would only ever end in an expiry.
pub(crate) fn registrable_request_id<'a>(id: &'a Bound<'_, PyString>) -> PyResult<&'a str> {
    let text = request_id_utf8(id)?;
    check_request_id(text).map_err(|e| cannot_complete(id, e))?;
    Ok(text)
}

/// The `InvalidRequestIdError` for an id [`check_request_id`] refused with `e`.
pub(crate) fn cannot_complete(id: &Bound<'_, PyString>, e: EncodeError) -> PyErr {
    let why = match e {
        EncodeError::EmptyRequestId => "an empty request id can never complete".into(),
        _ => format!(
            "request id {} can never complete: its completion would read as another \
             message (HB:, PUSH_FAIL:, PUSH_REG:)",
            repr(id)
        ),
    };
    InvalidRequestIdError::new_err((why, id.clone().unbind()))
}
