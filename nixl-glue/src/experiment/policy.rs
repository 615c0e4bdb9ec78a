//! What P reports after a posted WRITE ended without `Success`: the pre-fix glue (`old`,
//! the negative control) and the F7 rule (`new`).
//!
//! | how the write ended for P | `old` | `new` |
//! | --- | --- | --- |
//! | `get_xfer_status` → `NotFound` (e.g. after P's own invalidation) | `PUSH_FAIL` | nothing (unknown: D's deadline decides) |
//! | `get_xfer_status` → another error (`BackendError`, …) | `PUSH_FAIL` | `PUSH_FAIL` |
//! | handle dropped before a terminal status | `PUSH_FAIL` | nothing (unknown) |
//! | `Success` | nothing (the completion rides on the write) | nothing |

use nixl_sys::NixlError;

/// How a posted WRITE ended, as far as its producer can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteEnd {
    /// `get_xfer_status` returned `Success`: every byte landed.
    Success,
    /// `get_xfer_status` returned `NotFound`.
    NotFound,
    /// `get_xfer_status` returned a backend error (peer disconnect, transport error, …).
    BackendError,
    /// `get_xfer_status` returned another error (`InvalidParam`, …).
    OtherError,
    /// The producer dropped (released) the handle before a terminal status.
    Dropped,
}

impl WriteEnd {
    /// Classifies a status error.
    pub fn of_error(e: &NixlError) -> Self {
        match e {
            NixlError::NotFound => WriteEnd::NotFound,
            NixlError::BackendError => WriteEnd::BackendError,
            _ => WriteEnd::OtherError,
        }
    }

    /// Name in the JSON output.
    pub fn name(self) -> &'static str {
        match self {
            WriteEnd::Success => "success",
            WriteEnd::NotFound => "not_found",
            WriteEnd::BackendError => "backend_error",
            WriteEnd::OtherError => "other_error",
            WriteEnd::Dropped => "dropped",
        }
    }
}

/// The producer's reporting policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// The pre-fix glue: `PUSH_FAIL` whenever a posted write ends without `Success`.
    Old,
    /// The F7 rule: `PUSH_FAIL` for a posted write only after a backend error.
    New,
}

impl Policy {
    /// Parses `old` / `new`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "old" => Some(Policy::Old),
            "new" => Some(Policy::New),
            _ => None,
        }
    }

    /// Name on the command line and in the JSON output.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Old => "old",
            Policy::New => "new",
        }
    }

    /// Whether the producer sends `PUSH_FAIL` for a posted write that ended as `end`.
    pub fn sends_push_fail(self, end: WriteEnd) -> bool {
        match self {
            Policy::Old => end != WriteEnd::Success,
            Policy::New => posted_write_owes_push_fail(end),
        }
    }
}

/// The F7 rule for a **posted** write: only a backend error proves the write is over (bounded
/// to a short drain), so only it earns a `PUSH_FAIL`. A `NotFound` the producer did not cause
/// proves nothing, and neither does a handle it let go of: send nothing, keep the source
/// blocks fenced and let the consumer's deadline decide.
// lead: replace with the producer driver's rule at merge
pub fn posted_write_owes_push_fail(end: WriteEnd) -> bool {
    end == WriteEnd::BackendError
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_new_rule_reports_only_backend_errors_and_the_old_one_everything() {
        use WriteEnd::*;
        for end in [Success, NotFound, BackendError, OtherError, Dropped] {
            assert_eq!(
                Policy::New.sends_push_fail(end),
                end == BackendError,
                "{end:?}"
            );
            assert_eq!(Policy::Old.sends_push_fail(end), end != Success, "{end:?}");
        }
        assert_eq!(WriteEnd::of_error(&NixlError::NotFound), NotFound);
        assert_eq!(WriteEnd::of_error(&NixlError::BackendError), BackendError);
        assert_eq!(WriteEnd::of_error(&NixlError::InvalidParam), OtherError);
    }
}
