//! What P reports after a posted WRITE ended without `Success`: the pre-fix glue (`old`,
//! the negative control) and the F7 rule (`new`) as the producer driver states it: the
//! status goes through the glue's [`write_status`] and moves
//! the edge of a [`PushPlan`], which says whether a `PUSH_FAIL` is owed.
//!
//! | how the write ended for P | `old` | `new` (the edge in `PushPlan`) |
//! | --- | --- | --- |
//! | `get_xfer_status` → `NotFound` (e.g. after P's own invalidation) | `PUSH_FAIL` | nothing: `Unknown`, D's deadline decides |
//! | `get_xfer_status` → a backend error | `PUSH_FAIL` | `PUSH_FAIL`: `Failed { posted: true }` |
//! | `get_xfer_status` → another error (`InvalidParam`, …) | `PUSH_FAIL` | nothing: `Unknown` |
//! | handle dropped before a terminal status | `PUSH_FAIL` | nothing: `Unknown` |
//! | `Success` | nothing (the completion rides on the write) | nothing: `Landed` |

use kvdrain::producer::{PushPlan, Topology};
use kvdrain_driver::transport::WriteStatus;
use kvdrain_nixl::transport::write_status;
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

    /// What the producer driver makes of it: the glue's status mapping for a status
    /// error; a handle let go of says nothing about the write (unknown).
    pub fn status(self) -> WriteStatus {
        match self {
            WriteEnd::Success => WriteStatus::Success,
            WriteEnd::NotFound => write_status(Err(NixlError::NotFound)),
            WriteEnd::BackendError => write_status(Err(NixlError::BackendError)),
            WriteEnd::OtherError => write_status(Err(NixlError::InvalidParam)),
            WriteEnd::Dropped => WriteStatus::Unknown,
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

/// The F7 rule for a **posted** write, run on the producer driver's own state: one posted
/// edge of a [`PushPlan`] moved as the driver moves it for `end`'s status (`Unknown` →
/// [`status_unknown`](PushPlan::status_unknown), a backend error →
/// [`backend_error`](PushPlan::backend_error), `Success` →
/// [`landed_after_unknown`](PushPlan::landed_after_unknown)); a `PUSH_FAIL` is owed exactly
/// when the plan lists the edge in [`owed_notices`](PushPlan::owed_notices).
pub fn posted_write_owes_push_fail(end: WriteEnd) -> bool {
    let topology = Topology {
        p_tp: 1,
        p_pp: 1,
        d_tp: 1,
        mla: false,
    };
    let Ok(mut plan) = PushPlan::new(&topology, 0, 0) else {
        return false;
    };
    if plan.posted(0).is_err() {
        return false;
    }
    let _ = match end.status() {
        WriteStatus::InProgress => Ok(()),
        WriteStatus::Unknown => plan.status_unknown(0),
        WriteStatus::BackendError => plan.backend_error(0),
        WriteStatus::Success => plan.landed_after_unknown(0),
    };
    plan.owed_notices().next().is_some()
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
