//! Decisions as plain C structs, and the caller's array they are pulled into.
//!
//! Decisions wait in the core's own fixed queue (`advance` and `fence` queue theirs; a
//! drained request is decided at the pull) until `kvdrain_engine_poll` pulls them one at a
//! time, only as many as the caller's array has room for. Nothing is copied twice,
//! dropped or allocated per call.

use core::mem::MaybeUninit;

use kvdrain::{Decision, Outstanding, QuarantineCause, Quarantined};

/// Which decision.
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum kvdrain_decision_kind {
    /// Every edge delivered its completion: `blocks` hold the whole KV; decode may start.
    /// No `RELEASED` follows: the blocks now belong to the running request.
    KVDRAIN_COMPLETED = 0,
    /// Every edge is resolved, at least one failed: fail the request now. Its blocks come
    /// back in the `RELEASED` that follows; do not read them.
    KVDRAIN_FAILED = 1,
    /// The deadline passed with edges outstanding (`outstanding`): fail the request now.
    /// The blocks stay fenced until a `RELEASED`.
    KVDRAIN_EXPIRED = 2,
    /// The blocks (`blocks`) of a request that did not complete are free for reuse;
    /// `forced` is 1 when the quarantine ran out with edges still outstanding.
    KVDRAIN_RELEASED = 3,
}

/// One decision about the request registered under `key`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct kvdrain_decision {
    /// The key `kvdrain_engine_register` returned for the request.
    pub key: u64,
    /// `COMPLETED`: the blocks for decode; `RELEASED`: the blocks to free; else 0.
    pub blocks: u64,
    /// `EXPIRED`: what was still owed — a count in counting mode, or (when `named` is 1)
    /// a bit mask: bit `i` set if the `i`-th agent of the registration still owes.
    pub outstanding: u64,
    /// Which decision.
    pub kind: kvdrain_decision_kind,
    /// `RELEASED`: 1 when released because the quarantine ran out, else 0.
    pub forced: u8,
    /// `EXPIRED`: 1 when `outstanding` is a bit mask of agents (named-edge mode).
    pub named: u8,
}

// The layouts C sees: fixed sizes, no surprise padding (192 B per unit of capacity in
// the README counts on the first).
const _: () = assert!(size_of::<kvdrain_decision>() == 32);
const _: () = assert!(size_of::<kvdrain_quarantined>() == 24);

/// Why a request was quarantined.
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum kvdrain_quarantine_cause {
    /// `kvdrain_engine_abort`.
    KVDRAIN_ABORTED = 0,
    /// The deadline passed.
    KVDRAIN_DEADLINE = 1,
}

/// An aborted request: over for the client; its blocks come back in a later `RELEASED`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct kvdrain_quarantined {
    /// The request's key.
    pub key: u64,
    /// What was still owed at that moment (see `kvdrain_decision.outstanding`).
    pub outstanding: u64,
    /// Abort or deadline.
    pub cause: kvdrain_quarantine_cause,
    /// 1 when `outstanding` is a bit mask of agents (named-edge mode).
    pub named: u8,
}

fn outstanding(o: Outstanding) -> (u64, u8) {
    match o {
        Outstanding::Count(n) => (u64::from(n), 0),
        Outstanding::Edges(mask) => (mask, 1),
    }
}

impl From<&Quarantined> for kvdrain_quarantined {
    fn from(q: &Quarantined) -> Self {
        let (outstanding, named) = outstanding(q.outstanding());
        kvdrain_quarantined {
            key: q.key().get(),
            outstanding,
            cause: match q.cause() {
                QuarantineCause::Aborted => kvdrain_quarantine_cause::KVDRAIN_ABORTED,
                QuarantineCause::Expired => kvdrain_quarantine_cause::KVDRAIN_DEADLINE,
            },
            named,
        }
    }
}

impl kvdrain_decision {
    /// The C form of `d`.
    #[inline]
    pub(crate) fn from_core(d: Decision) -> Self {
        let key = d.key().get();
        let (kind, blocks, outstanding_, forced, named) = match d {
            Decision::Completed(done) => (
                kvdrain_decision_kind::KVDRAIN_COMPLETED,
                done.into_decode().0,
                0,
                0,
                0,
            ),
            Decision::Failed(_) => (kvdrain_decision_kind::KVDRAIN_FAILED, 0, 0, 0, 0),
            Decision::Expired(q) => {
                let (o, named) = outstanding(q.outstanding());
                (kvdrain_decision_kind::KVDRAIN_EXPIRED, 0, o, 0, named)
            }
            Decision::Released(r) => {
                let forced = u8::from(r.forced());
                (
                    kvdrain_decision_kind::KVDRAIN_RELEASED,
                    r.into_free().0,
                    0,
                    forced,
                    0,
                )
            }
        };
        kvdrain_decision {
            key,
            blocks,
            outstanding: outstanding_,
            kind,
            forced,
            named,
        }
    }

    /// Whether the request's ticket is used up by this decision: every decision but
    /// `RELEASED` ends the counting request.
    #[inline]
    pub(crate) fn ends_ticket(&self) -> bool {
        self.kind != kvdrain_decision_kind::KVDRAIN_RELEASED
    }
}

/// The caller's output array (possibly uninitialised), filled from the front.
#[derive(Debug)]
pub(crate) struct Out<'a> {
    slots: &'a mut [MaybeUninit<kvdrain_decision>],
    len: usize,
}

impl<'a> Out<'a> {
    pub(crate) fn new(slots: &'a mut [MaybeUninit<kvdrain_decision>]) -> Self {
        Out { slots, len: 0 }
    }

    pub(crate) fn is_full(&self) -> bool {
        self.len == self.slots.len()
    }

    /// Writes `d` into the next slot; the caller checks [`is_full`](Self::is_full).
    pub(crate) fn push(&mut self, d: kvdrain_decision) {
        self.slots[self.len].write(d);
        self.len += 1;
    }

    /// Decisions written.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}
