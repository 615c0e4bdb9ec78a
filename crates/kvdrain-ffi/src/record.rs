//! A request's record as a plain C struct (`kvdrain_record`), read by key with
//! `kvdrain_engine_record`.
//!
//! A call apart, not a field of `kvdrain_decision`: the decision stays 32 bytes (the
//! caller's poll array and the README's memory figure count on it), and a caller that
//! never asks pays nothing. The record is readable from the registration until the
//! request's slot takes the next registration, so every decision one
//! `kvdrain_engine_poll` returned has its record until the engine registers again.
//!
//! Times are the ledger's clock in ms; [`KVDRAIN_NO_TIME`] where unset. Each named edge
//! says how it stands as the core recorded it: outstanding, landed, or failed by a
//! failure notice, a `gone` or a `fence` (the core writes the cause as it resolves the
//! edge, whichever thread did). The times are the request's (the last failure notice,
//! `gone` and `fence` that resolved one of its edges, and `first_failure`).

use kvdrain::{EdgeOutcome, Ended, FailureCause, Instant, Record, RecordedEdges, RequestKey};

use crate::config::KVDRAIN_MAX_EDGES;
use crate::group::{kvdrain_engine, with_half};
use crate::status::kvdrain_status::{self, *};
use crate::status::write_opt;

/// `uint64_t` for "not set" in a `kvdrain_record`'s times.
pub const KVDRAIN_NO_TIME: u64 = u64::MAX;

/// How a named edge stands.
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum kvdrain_record_edge_outcome {
    /// Nothing resolved it.
    KVDRAIN_RECORD_EDGE_OUTSTANDING = 0,
    /// Its completion notice came.
    KVDRAIN_RECORD_EDGE_LANDED = 1,
    /// Its producer's failure notice (`PUSH_FAIL:`) failed it.
    KVDRAIN_RECORD_EDGE_FAILURE_NOTICE = 2,
    /// `kvdrain_engine_gone` of its agent failed it.
    KVDRAIN_RECORD_EDGE_GONE = 3,
    /// `kvdrain_engine_fence` of its agent failed it.
    KVDRAIN_RECORD_EDGE_FENCED = 4,
}

/// How a request ended before every edge resolved.
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum kvdrain_record_ended {
    /// It did not: its edges decided it, or it is still tracked.
    KVDRAIN_ENDED_NONE = 0,
    /// `kvdrain_engine_abort` or `_abort_id`.
    KVDRAIN_ENDED_ABORTED = 1,
    /// Its deadline passed.
    KVDRAIN_ENDED_EXPIRED = 2,
}

/// What a request's first failure was.
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum kvdrain_failure_cause {
    /// It did not fail.
    KVDRAIN_FAILURE_NONE = 0,
    /// A producer's `PUSH_FAIL:`.
    KVDRAIN_FAILURE_NOTICE = 1,
    /// `kvdrain_engine_gone` of one of its agents.
    KVDRAIN_FAILURE_GONE = 2,
    /// `kvdrain_engine_fence` of one of its agents.
    KVDRAIN_FAILURE_FENCED = 3,
    /// The abort.
    KVDRAIN_FAILURE_ABORTED = 4,
    /// The deadline.
    KVDRAIN_FAILURE_EXPIRED = 5,
}

/// One named edge of a `kvdrain_record`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct kvdrain_record_edge {
    /// How it stands.
    pub outcome: kvdrain_record_edge_outcome,
    /// The agent id given to `kvdrain_engine_register`.
    pub agent: u16,
}

/// What the ledger knows of one request (`kvdrain_engine_record`). Times in ms on the
/// ledger's clock, `KVDRAIN_NO_TIME` where unset.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct kvdrain_record {
    /// The request's key.
    pub key: u64,
    /// The clock at its registration.
    pub registered_ms: u64,
    /// When it expires (or expired) with edges outstanding.
    pub deadline_ms: u64,
    /// The last failure notice that resolved one of its edges.
    pub failure_notice_ms: u64,
    /// The last `gone` that resolved one of its edges.
    pub gone_ms: u64,
    /// The last `fence` that resolved one of its edges.
    pub fenced_ms: u64,
    /// When it was aborted or expired (`ended`).
    pub ended_ms: u64,
    /// When `COMPLETED` or `FAILED` was decided.
    pub decided_ms: u64,
    /// Until when its blocks settled after a failure, if they had to.
    pub settle_end_ms: u64,
    /// When its blocks came back (`COMPLETED` or `RELEASED`).
    pub released_ms: u64,
    /// When its first failure happened (`first_failure`).
    pub first_failure_ms: u64,
    /// Named-edge mode: the first `named_edges` entries, in registration order.
    pub edges: [kvdrain_record_edge; 8],
    /// Aborted, expired, or neither.
    pub ended: kvdrain_record_ended,
    /// The earliest of its failures, or `KVDRAIN_FAILURE_NONE`.
    pub first_failure: kvdrain_failure_cause,
    /// Named edges (`1..=KVDRAIN_MAX_EDGES`), or 0 in counting mode.
    pub named_edges: u8,
    /// Notices (counting) or named edges expected.
    pub expected: u8,
    /// Notices (counting) or named edges still owed.
    pub outstanding: u8,
    /// Counting mode: 1 when one of the notices that came was a failure notice.
    pub count_failed: u8,
    /// 1 when the quarantine forced the blocks back with writes outstanding.
    pub forced: u8,
}

// The layout C sees, and the edge array's length is the ledger's.
const _: () = assert!(size_of::<kvdrain_record>() == 168);
const _: () = assert!(KVDRAIN_MAX_EDGES as usize == 8);

fn ms(at: Option<Instant>) -> u64 {
    at.map_or(KVDRAIN_NO_TIME, Instant::millis)
}

impl From<&Record<8>> for kvdrain_record {
    fn from(r: &Record<8>) -> Self {
        let edge = |&(agent, outcome): &(kvdrain::AgentId, EdgeOutcome)| kvdrain_record_edge {
            outcome: match outcome {
                EdgeOutcome::Outstanding => {
                    kvdrain_record_edge_outcome::KVDRAIN_RECORD_EDGE_OUTSTANDING
                }
                EdgeOutcome::Landed => kvdrain_record_edge_outcome::KVDRAIN_RECORD_EDGE_LANDED,
                EdgeOutcome::FailureNotice => {
                    kvdrain_record_edge_outcome::KVDRAIN_RECORD_EDGE_FAILURE_NOTICE
                }
                EdgeOutcome::Gone => kvdrain_record_edge_outcome::KVDRAIN_RECORD_EDGE_GONE,
                EdgeOutcome::Fenced => kvdrain_record_edge_outcome::KVDRAIN_RECORD_EDGE_FENCED,
            },
            agent: agent.0,
        };
        let mut edges = [kvdrain_record_edge {
            outcome: kvdrain_record_edge_outcome::KVDRAIN_RECORD_EDGE_OUTSTANDING,
            agent: 0,
        }; 8];
        for (out, e) in edges.iter_mut().zip(r.edges.named()) {
            *out = edge(e);
        }
        let (named_edges, expected, outstanding, count_failed) = match &r.edges {
            RecordedEdges::Count {
                expected,
                outstanding,
                failed,
            } => (0, *expected, *outstanding, u8::from(*failed)),
            named @ RecordedEdges::Named { len, .. } => {
                let owed = named
                    .named()
                    .iter()
                    .filter(|&&(_, o)| o == EdgeOutcome::Outstanding)
                    .count() as u8;
                (*len, *len, owed, 0)
            }
        };
        let first = r.first_failure();
        kvdrain_record {
            key: r.key.get(),
            registered_ms: r.registered_at.millis(),
            deadline_ms: r.deadline.millis(),
            failure_notice_ms: ms(r.failure_notice_at),
            gone_ms: ms(r.gone_at),
            fenced_ms: ms(r.fenced_at),
            ended_ms: ms(r.ended.map(|(_, at)| at)),
            decided_ms: ms(r.decided_at),
            settle_end_ms: ms(r.settle_end),
            released_ms: ms(r.released.map(|(at, _)| at)),
            first_failure_ms: ms(first.map(FailureCause::at)),
            edges,
            ended: match r.ended {
                None => kvdrain_record_ended::KVDRAIN_ENDED_NONE,
                Some((Ended::Aborted, _)) => kvdrain_record_ended::KVDRAIN_ENDED_ABORTED,
                Some((Ended::Expired, _)) => kvdrain_record_ended::KVDRAIN_ENDED_EXPIRED,
            },
            first_failure: match first {
                None => kvdrain_failure_cause::KVDRAIN_FAILURE_NONE,
                Some(FailureCause::Notice(_)) => kvdrain_failure_cause::KVDRAIN_FAILURE_NOTICE,
                Some(FailureCause::Gone(_)) => kvdrain_failure_cause::KVDRAIN_FAILURE_GONE,
                Some(FailureCause::Fenced(_)) => kvdrain_failure_cause::KVDRAIN_FAILURE_FENCED,
                Some(FailureCause::Aborted(_)) => kvdrain_failure_cause::KVDRAIN_FAILURE_ABORTED,
                Some(FailureCause::Expired(_)) => kvdrain_failure_cause::KVDRAIN_FAILURE_EXPIRED,
            },
            named_edges,
            expected,
            outstanding,
            count_failed,
            forced: u8::from(r.forced()),
        }
    }
}

/// Writes into `*out` what the ledger knows of the request registered under `key`: its
/// edges and how each stands, its failure times and first failure, deadline, decision,
/// settle end and release. Readable from the registration until the request's slot takes
/// the next registration: read the records of the decisions a `kvdrain_engine_poll`
/// returned before registering again. Engine thread.
///
/// Errors (nothing written): `KVDRAIN_ERR_NULL` (`out`), `KVDRAIN_ERR_UNKNOWN` (a key
/// no registration returned, or whose slot holds a later request now).
///
/// # Safety
/// `engine` is NULL or a live engine handle; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_engine_record(
    engine: *mut kvdrain_engine,
    key: u64,
    out: *mut kvdrain_record,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe {
        with_half(engine, |side| {
            if out.is_null() {
                return KVDRAIN_ERR_NULL;
            }
            match side.engine.record(RequestKey::from_raw(key)) {
                Some(record) => {
                    write_opt(out, kvdrain_record::from(&record));
                    KVDRAIN_OK
                }
                None => KVDRAIN_ERR_UNKNOWN,
            }
        })
    }
}
