//! What the ledger knows of one request, for an operator: read from the tables it already
//! keeps, with no allocation and nothing added to the notification path.
//!
//! ```text
//!  registered_at ──▶ edges resolve (landed | failed) ──▶ decided_at ──▶ settle_end? ──▶ released_at
//!        │                                                   ▲
//!        └── deadline (expiry) or abort ──── ended ──────────┘
//! ```
//!
//! [`Engine::record`](crate::Engine::record) builds a [`Record`] from a request's key, from
//! its registration until its slot holds the next request: for a tracked request (what is
//! it waiting for?), and for a decision just handed out (how did it end?). A caller that
//! wants the record of every decision reads it right after
//! [`poll_decision`](crate::Engine::poll_decision), before its next registration.
//!
//! The failure times are the ones the decisions use: the *last* failure notice that
//! resolved one of the request's edges (the stamp rule 8 settles from), the last `gone`
//! and the last `fence` of one of its agents. A named edge says whether it landed or
//! failed; which of a notice, a `gone` or a `fence` failed it, and when, is the
//! request's, not the edge's: the edge words hold two flag bits, and a per-edge time
//! would be one more store on every notice.

use crate::ticket::{AgentId, RequestKey};
use crate::time::Instant;

/// How a named edge stands.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum EdgeOutcome {
    /// Nothing resolved it yet.
    Outstanding,
    /// Its completion notice came.
    Landed,
    /// A failure notice, a `gone` or a `fence` of its agent resolved it as failed.
    Failed,
}

impl EdgeOutcome {
    /// Its lower-case name, as logs and bindings spell it: `outstanding`, `landed` or
    /// `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            EdgeOutcome::Outstanding => "outstanding",
            EdgeOutcome::Landed => "landed",
            EdgeOutcome::Failed => "failed",
        }
    }
}

/// The edges of a request, as registered and as they stand.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum RecordedEdges<const E: usize> {
    /// Counting mode: `expected` notices from anyone.
    Count {
        /// Notices the registration asked for.
        expected: u8,
        /// Notices still owed.
        outstanding: u8,
        /// Whether one of those that came was a failure notice.
        failed: bool,
    },
    /// Named-edge mode: one notice from each agent, in registration order.
    Named {
        /// The first `len` entries are the edges.
        edges: [(AgentId, EdgeOutcome); E],
        /// Named edges.
        len: u8,
    },
}

impl<const E: usize> RecordedEdges<E> {
    /// The named edges (none in counting mode).
    pub fn named(&self) -> &[(AgentId, EdgeOutcome)] {
        match self {
            RecordedEdges::Count { .. } => &[],
            RecordedEdges::Named { edges, len } => &edges[..usize::from(*len)],
        }
    }
}

/// How a request ended before every edge resolved.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Ended {
    /// The engine aborted it.
    Aborted,
    /// Its deadline passed.
    Expired,
}

/// What the request's first failure was, and when.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum FailureCause {
    /// A producer's `PUSH_FAIL:` (the last one that resolved an edge).
    Notice(Instant),
    /// A producer was reported gone.
    Gone(Instant),
    /// A producer was fenced.
    Fenced(Instant),
    /// The engine aborted the request.
    Aborted(Instant),
    /// The deadline passed.
    Expired(Instant),
}

impl FailureCause {
    /// Its lower-case name, as logs and bindings spell it: `failure_notice`, `gone`,
    /// `fenced`, `aborted` or `expired`.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureCause::Notice(_) => "failure_notice",
            FailureCause::Gone(_) => "gone",
            FailureCause::Fenced(_) => "fenced",
            FailureCause::Aborted(_) => "aborted",
            FailureCause::Expired(_) => "expired",
        }
    }

    /// When it happened.
    pub fn at(self) -> Instant {
        match self {
            FailureCause::Notice(t)
            | FailureCause::Gone(t)
            | FailureCause::Fenced(t)
            | FailureCause::Aborted(t)
            | FailureCause::Expired(t) => t,
        }
    }
}

/// What the ledger knows of one request ([`Engine::record`](crate::Engine::record)).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Record<const E: usize> {
    /// The request.
    pub key: RequestKey,
    /// The clock at its registration.
    pub registered_at: Instant,
    /// When it expires if its edges have not resolved.
    pub deadline: Instant,
    /// Its edges.
    pub edges: RecordedEdges<E>,
    /// The last failure notice that resolved one of its edges.
    pub failure_notice_at: Option<Instant>,
    /// The last `gone` that resolved one of its edges.
    pub gone_at: Option<Instant>,
    /// The last `fence` that resolved one of its edges.
    pub fenced_at: Option<Instant>,
    /// Aborted or expired, and when.
    pub ended: Option<(Ended, Instant)>,
    /// When `completed` or `failed` was decided (every edge resolved).
    pub decided_at: Option<Instant>,
    /// Until when its blocks settled after a failure (rule 8), if they had to.
    pub settle_end: Option<Instant>,
    /// When its blocks came back (`completed` or `released`), and whether the quarantine
    /// forced it (edges still outstanding).
    pub released: Option<(Instant, bool)>,
}

impl<const E: usize> Record<E> {
    /// The earliest of its failures: a failure notice, a `gone`, a `fence`, the abort or
    /// the expiry. `None` for a request that has not failed.
    pub fn first_failure(&self) -> Option<FailureCause> {
        let ended = self.ended.map(|(how, at)| match how {
            Ended::Aborted => FailureCause::Aborted(at),
            Ended::Expired => FailureCause::Expired(at),
        });
        [
            self.failure_notice_at.map(FailureCause::Notice),
            self.gone_at.map(FailureCause::Gone),
            self.fenced_at.map(FailureCause::Fenced),
            ended,
        ]
        .into_iter()
        .flatten()
        .min_by_key(|c| c.at())
    }

    /// Whether its blocks came back forced by the quarantine, with writes outstanding.
    pub fn forced(&self) -> bool {
        matches!(self.released, Some((_, true)))
    }
}
