//! The status every fallible call returns, its message, and the panic boundary.

use core::ffi::c_char;

/// What a call did. `KVDRAIN_OK` is 0; every other value is an error and the call changed
/// nothing, unless its documentation says otherwise. `kvdrain_status_str` gives a message.
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum kvdrain_status {
    /// Success.
    KVDRAIN_OK = 0,
    /// A required pointer is NULL (or a span's pointer is NULL with a non-zero length).
    KVDRAIN_ERR_NULL = 1,
    /// An argument is out of range: a capacity, a request id that is not UTF-8, a
    /// registration with both a count and agents, a topology.
    KVDRAIN_ERR_INVALID = 2,
    /// kvdrain panicked inside this call (a bug): the handle is poisoned and every later
    /// call on it returns this status; free it.
    KVDRAIN_ERR_PANIC = 3,
    /// The handle was freed (`*_free`), or it is a half whose ledger was freed.
    KVDRAIN_ERR_FREED = 4,
    /// Another call is inside this handle right now (two threads on one half or one push
    /// plan: nothing was done, the other call is unaffected); or `kvdrain_ledger_split`
    /// was called a second time.
    KVDRAIN_ERR_BUSY = 5,
    /// The ledger could not be built: no memory for its tables (13.8 MiB) or its key
    /// table, or no thread (with a stack for its construction) could start. Nothing was
    /// allocated.
    KVDRAIN_ERR_ALLOC = 6,
    /// Register: the table holds `capacity` requests; nothing changed, nothing evicted.
    KVDRAIN_ERR_FULL = 7,
    /// Register: a request with this id is tracked already.
    KVDRAIN_ERR_DUPLICATE_ID = 8,
    /// Register: counting mode needs a count in `1..=64`.
    KVDRAIN_ERR_BAD_COUNT = 9,
    /// Register: the agent list is empty, longer than `KVDRAIN_MAX_EDGES`, or names an
    /// agent twice.
    KVDRAIN_ERR_BAD_EDGES = 10,
    /// No such request (abort), or no such edge (push plan).
    KVDRAIN_ERR_UNKNOWN = 11,
    /// Abort: the request was decided first (its decision comes, or came, from poll).
    KVDRAIN_ERR_LATE = 12,
    /// Abort: the key's ticket was used up already — the request was aborted before, or
    /// it was decided and the engine has taken its decision from the core (it comes, or
    /// came, out of `kvdrain_engine_poll`), or a made-up key below the last one issued.
    /// Rust rejects a reused ticket at compile time: tickets are consumed by value.
    KVDRAIN_ERR_STALE = 13,
    /// Advance: the time is earlier than the ledger's clock; nothing changed.
    KVDRAIN_ERR_CLOCK_BACKWARDS = 14,
    /// Encode: the output buffer is too short; nothing was written.
    KVDRAIN_ERR_BUFFER_TOO_SMALL = 15,
    /// Push plan: the edge is not in a state that allows this step.
    KVDRAIN_ERR_WRONG_STATE = 16,
    /// Push plan: the request was retired on this producer; nothing more may be posted.
    KVDRAIN_ERR_RETIRED = 17,
}

use kvdrain_status::*;

impl kvdrain_status {
    /// The message of [`kvdrain_status_str`], NUL-terminated.
    pub(crate) fn message(self) -> &'static str {
        match self {
            KVDRAIN_OK => "ok\0",
            KVDRAIN_ERR_NULL => "a required pointer is NULL\0",
            KVDRAIN_ERR_INVALID => "an argument is out of range\0",
            KVDRAIN_ERR_PANIC => "kvdrain panicked; the handle is poisoned\0",
            KVDRAIN_ERR_FREED => "the handle or its ledger was freed\0",
            KVDRAIN_ERR_BUSY => {
                "another call is inside this handle (or the ledger was split already)\0"
            }
            KVDRAIN_ERR_ALLOC => "no memory (or no thread) to build the ledger\0",
            KVDRAIN_ERR_FULL => "table full; nothing changed\0",
            KVDRAIN_ERR_DUPLICATE_ID => "request id already tracked\0",
            KVDRAIN_ERR_BAD_COUNT => "expected count outside 1..=64\0",
            KVDRAIN_ERR_BAD_EDGES => "edge list empty, too long, or naming an agent twice\0",
            KVDRAIN_ERR_UNKNOWN => "no such request or edge\0",
            KVDRAIN_ERR_LATE => "the request was decided first\0",
            KVDRAIN_ERR_STALE => "the ticket of this key was used up already\0",
            KVDRAIN_ERR_CLOCK_BACKWARDS => "the clock went backwards; nothing changed\0",
            KVDRAIN_ERR_BUFFER_TOO_SMALL => "output buffer too short; nothing written\0",
            KVDRAIN_ERR_WRONG_STATE => "the edge is not in a state that allows this step\0",
            KVDRAIN_ERR_RETIRED => "the request was retired on this producer\0",
        }
    }

    /// Every status, in numeric order (for tests and the message table).
    /// cbindgen:ignore
    pub(crate) const ALL: [kvdrain_status; 18] = [
        KVDRAIN_OK,
        KVDRAIN_ERR_NULL,
        KVDRAIN_ERR_INVALID,
        KVDRAIN_ERR_PANIC,
        KVDRAIN_ERR_FREED,
        KVDRAIN_ERR_BUSY,
        KVDRAIN_ERR_ALLOC,
        KVDRAIN_ERR_FULL,
        KVDRAIN_ERR_DUPLICATE_ID,
        KVDRAIN_ERR_BAD_COUNT,
        KVDRAIN_ERR_BAD_EDGES,
        KVDRAIN_ERR_UNKNOWN,
        KVDRAIN_ERR_LATE,
        KVDRAIN_ERR_STALE,
        KVDRAIN_ERR_CLOCK_BACKWARDS,
        KVDRAIN_ERR_BUFFER_TOO_SMALL,
        KVDRAIN_ERR_WRONG_STATE,
        KVDRAIN_ERR_RETIRED,
    ];
}

/// A static, NUL-terminated English message for `status` (any value: unknown ones get
/// "unknown status"). Never NULL, never freed. Any thread.
#[unsafe(no_mangle)]
pub extern "C" fn kvdrain_status_str(status: u32) -> *const c_char {
    let text = std::panic::catch_unwind(|| {
        kvdrain_status::ALL
            .get(status as usize)
            .map_or("unknown status\0", |s| s.message())
    })
    .unwrap_or("unknown status\0");
    text.as_ptr().cast()
}

/// Runs `body` so that a panic becomes [`KVDRAIN_ERR_PANIC`] instead of unwinding into C.
pub(crate) fn boundary(body: impl FnOnce() -> kvdrain_status) -> kvdrain_status {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or(KVDRAIN_ERR_PANIC)
}

/// A borrowed `(pointer, length)` span from C as a slice: NULL is allowed with length 0.
///
/// # Safety
/// Unless NULL, `ptr` must point to `len` readable, initialised `T`s that stay valid and
/// unmodified for `'a`.
pub(crate) unsafe fn span<'a, T>(ptr: *const T, len: usize) -> Result<&'a [T], kvdrain_status> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(KVDRAIN_ERR_NULL);
    }
    if len > isize::MAX as usize / size_of::<T>().max(1) {
        return Err(KVDRAIN_ERR_INVALID);
    }
    // SAFETY: non-NULL, and the caller guarantees `len` valid `T`s for `'a`; the length
    // was checked against `isize::MAX` bytes.
    Ok(unsafe { core::slice::from_raw_parts(ptr, len) })
}

/// Writes `value` through an out-pointer that may be NULL (then nothing is written).
///
/// # Safety
/// Unless NULL, `out` must be valid for a write of `T`.
pub(crate) unsafe fn write_opt<T>(out: *mut T, value: T) {
    if !out.is_null() {
        // SAFETY: non-NULL and valid for writes per the caller.
        unsafe { out.write(value) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_has_its_number_and_a_nul_terminated_message() {
        for (i, s) in kvdrain_status::ALL.iter().enumerate() {
            assert_eq!(*s as usize, i);
            let m = s.message();
            assert!(m.ends_with('\0') && m.len() > 1 && !m[..m.len() - 1].contains('\0'));
            assert_eq!(kvdrain_status_str(i as u32).cast::<u8>(), m.as_ptr());
        }
        // SAFETY: the returned pointer is a static NUL-terminated string.
        let unknown = unsafe { core::ffi::CStr::from_ptr(kvdrain_status_str(9999)) };
        assert_eq!(unknown.to_str(), Ok("unknown status"));
    }
}
