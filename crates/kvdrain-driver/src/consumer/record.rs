//! The record every decision carries ([`DecisionRecord`]): the core's
//! [`Record`] of the request, read when the decision is handed out, with each named edge's
//! producer agent by name and, where the driver itself resolved an edge (a `gone` or a
//! `fence` it reported), how and when.
//!
//! ```text
//!  core Record (edges: landed | failed | outstanding, request-level times)
//!        +  what the driver reported: gone / fence of agent A at t, edges it resolved
//!        =  DecisionRecord (edges: landed | failure_notice | gone | fenced | failed | outstanding)
//! ```
//!
//! The core keeps no cause and no time per edge (that would be one more store on every
//! notice). The driver knows which edges its own reports resolved: before a `gone` or a
//! `fence` it reads which of the agent's edges are outstanding, after it which of those
//! failed, and it checks the count against the edges the core says the report resolved.
//! Every other failed edge was failed by a failure notice, the one other way an edge
//! fails. On two threads a failure notice can race the report for the same edge; when
//! the counts then disagree, the edges involved say [`EdgeResolution::Failed`]: failed,
//! cause not told apart. What is not known is left out rather than guessed: a landed
//! edge has no time (the core's `decided_at` is when the last one landed), and a
//! failure notice's time is given only when one edge of the request failed by notice
//! (the request's `failure_notice_at` is the last one's).

use std::sync::Arc;

use kvdrain::{
    AgentId, EdgeOutcome, Ended, FailureCause, Instant, Record, RecordedEdges, RequestKey,
};

use crate::PerRequest;
use crate::directory::AgentDirectory;

/// How a named edge resolved, as far as the ledger and the driver know.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EdgeResolution {
    /// Nothing resolved it (yet, or ever: an expiry or a forced release).
    Outstanding,
    /// Its completion notice came.
    Landed,
    /// Its producer's `PUSH_FAIL:` failed it.
    FailureNotice,
    /// The driver reported its producer gone ([`ConsumerEngine::gone`](super::ConsumerEngine::gone)).
    Gone,
    /// The driver fenced its producer ([`ConsumerEngine::fence`](super::ConsumerEngine::fence)).
    Fenced,
    /// Failed, by a failure notice or by the driver's report on its producer, which
    /// raced on two threads and cannot be told apart.
    Failed,
}

impl EdgeResolution {
    /// The lower-case word the logs and the bindings use.
    pub fn as_str(self) -> &'static str {
        match self {
            EdgeResolution::Outstanding => "outstanding",
            EdgeResolution::Landed => "landed",
            EdgeResolution::FailureNotice => "failure_notice",
            EdgeResolution::Gone => "gone",
            EdgeResolution::Fenced => "fenced",
            EdgeResolution::Failed => "failed",
        }
    }
}

/// One named edge of a [`DecisionRecord`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EdgeRecord {
    /// The producer agent, by the name its engine was added with (shared with the
    /// driver's directory: no copy per decision).
    pub agent: Arc<str>,
    /// How it resolved.
    pub resolution: EdgeResolution,
    /// When, where known: a `gone` or `fence` at the driver's report; a failure notice
    /// when it is the request's only edge failed by notice; otherwise `None`.
    pub at: Option<Instant>,
}

/// The edges of a [`DecisionRecord`].
// Inline, not boxed: a box would be one more allocation per decision
// (`tests/allocations.rs`); the records travel in the event queue, reserved once.
#[expect(
    clippy::large_enum_variant,
    reason = "a boxed edge list would allocate once per decision"
)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordEdges {
    /// Counting mode (vLLM's count): notices from any of the request's producers.
    Count {
        /// Notices expected.
        expected: u8,
        /// Notices still owed.
        outstanding: u8,
        /// Whether one of those that came was a failure notice.
        failed: bool,
    },
    /// Named edges, in the order of the request's producers.
    Named(PerRequest<EdgeRecord>),
}

impl RecordEdges {
    /// The named edges (none in counting mode).
    pub fn named(&self) -> &[EdgeRecord] {
        match self {
            RecordEdges::Count { .. } => &[],
            RecordEdges::Named(edges) => edges,
        }
    }
}

/// What happened to a request, as its decision is handed out: every event carries one
/// ([`ConsumerEvent::record`](super::ConsumerEvent::record)). The request's id and
/// producers are the event's [`TrackedRequest`](super::TrackedRequest); times are on the
/// driver's clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecisionRecord {
    /// The core's key.
    pub key: RequestKey,
    /// When it was registered.
    pub registered_at: Instant,
    /// When it expires (or expired) with edges outstanding.
    pub deadline: Instant,
    /// Its edges and how each stands.
    pub edges: RecordEdges,
    /// The last failure notice that resolved one of its edges.
    pub failure_notice_at: Option<Instant>,
    /// The last `gone` that resolved one of its edges.
    pub gone_at: Option<Instant>,
    /// The last `fence` that resolved one of its edges.
    pub fenced_at: Option<Instant>,
    /// Aborted or expired, and when.
    pub ended: Option<(Ended, Instant)>,
    /// When `completed` or `failed` was decided.
    pub decided_at: Option<Instant>,
    /// Until when its blocks settled after a failure, if they had to.
    pub settle_end: Option<Instant>,
    /// When its blocks came back, and whether the quarantine forced them back with
    /// writes outstanding (`None` until then: a `failed` or `expired` decision).
    pub released: Option<(Instant, bool)>,
    /// The earliest failure: a failure notice, a `gone`, a `fence`, the abort or the
    /// expiry, with its time (`None` when it did not fail).
    pub first_failure: Option<FailureCause>,
}

impl DecisionRecord {
    /// Whether the blocks came back forced by the quarantine.
    pub fn forced(&self) -> bool {
        matches!(self.released, Some((_, true)))
    }

    /// The record of a decision whose core record could not be read: cannot happen (a
    /// record is read as its decision is handed out, before the slot can be reused);
    /// it says only what the driver remembers, the key and registration time.
    pub(super) fn unread(key: RequestKey, registered_at: Instant) -> Self {
        DecisionRecord {
            key,
            registered_at,
            deadline: registered_at,
            edges: RecordEdges::Count {
                expected: 0,
                outstanding: 0,
                failed: false,
            },
            failure_notice_at: None,
            gone_at: None,
            fenced_at: None,
            ended: None,
            decided_at: None,
            settle_end: None,
            released: None,
            first_failure: None,
        }
    }
}

/// An edge the driver's own report resolved: its index among the request's named edges,
/// how ([`EdgeResolution::Gone`], [`EdgeResolution::Fenced`], or
/// [`EdgeResolution::Failed`] when a notice raced it) and when.
pub(super) type DriverResolved = (u8, EdgeResolution, Instant);

/// The driver's record of a request from the core's and what the driver resolved itself.
pub(super) fn assemble<const E: usize>(
    record: &Record<E>,
    by_driver: &[DriverResolved],
    directory: &AgentDirectory,
) -> DecisionRecord {
    let edges = match record.edges {
        RecordedEdges::Count {
            expected,
            outstanding,
            failed,
        } => RecordEdges::Count {
            expected,
            outstanding,
            failed,
        },
        RecordedEdges::Named { .. } => {
            RecordEdges::Named(named_edges(record, by_driver, directory))
        }
    };
    DecisionRecord {
        key: record.key,
        registered_at: record.registered_at,
        deadline: record.deadline,
        edges,
        failure_notice_at: record.failure_notice_at,
        gone_at: record.gone_at,
        fenced_at: record.fenced_at,
        ended: record.ended,
        decided_at: record.decided_at,
        settle_end: record.settle_end,
        released: record.released,
        first_failure: record.first_failure(),
    }
}

fn named_edges<const E: usize>(
    record: &Record<E>,
    by_driver: &[DriverResolved],
    directory: &AgentDirectory,
) -> PerRequest<EdgeRecord> {
    let mut edges: PerRequest<EdgeRecord> = record
        .edges
        .named()
        .iter()
        .enumerate()
        .map(|(i, &(agent, outcome))| {
            let (resolution, at) = match outcome {
                EdgeOutcome::Outstanding => (EdgeResolution::Outstanding, None),
                EdgeOutcome::Landed => (EdgeResolution::Landed, None),
                EdgeOutcome::Failed => by_driver
                    .iter()
                    .find(|&&(edge, _, _)| usize::from(edge) == i)
                    .map_or((EdgeResolution::FailureNotice, None), |&(_, how, at)| {
                        (how, (how != EdgeResolution::Failed).then_some(at))
                    }),
            };
            EdgeRecord {
                agent: agent_name(directory, agent),
                resolution,
                at,
            }
        })
        .collect();
    // The request's failure-notice time is the last notice's: an edge's own only when
    // no other edge can have failed by notice.
    let raced = edges.iter().any(|e| e.resolution == EdgeResolution::Failed);
    let mut by_notice = edges
        .iter_mut()
        .filter(|e| e.resolution == EdgeResolution::FailureNotice);
    if let (Some(only), None, false) = (by_notice.next(), by_notice.next(), raced) {
        only.at = record.failure_notice_at;
    }
    edges
}

/// The directory's name of `agent` (every named edge's agent was interned when its
/// engine was added; a stranger cannot be a named edge).
fn agent_name(directory: &AgentDirectory, agent: AgentId) -> Arc<str> {
    directory
        .shared_name(agent)
        .unwrap_or_else(|| Arc::from(format!("agent#{}", agent.0)))
}
