//! The record every decision carries ([`DecisionRecord`]): the core's [`Record`] of the
//! request, handed out with the decision ([`Engine::poll_recorded`](kvdrain::Engine::poll_recorded)),
//! with each named edge's producer agent by name.
//!
//! ```text
//!  core Record (each edge: outstanding | landed | failure_notice | gone | fenced,
//!               request-level times)
//!        +  the directory's names of the edges' agents
//!        =  DecisionRecord
//! ```
//!
//! The core writes each edge's cause as it resolves it, whichever thread did, so the
//! driver derives nothing: what the record says is what the core says. A landed edge has
//! no time (the core's `decided_at` is when the last one landed); the failure times are
//! the request's (the last failure notice, `gone` and `fence` that resolved one of its
//! edges).

use std::sync::Arc;

use kvdrain::{
    AgentId, EdgeOutcome, Ended, FailureCause, Instant, Record, RecordedEdges, RequestKey,
};

use crate::PerRequest;
use crate::directory::AgentDirectory;

/// One named edge of a [`DecisionRecord`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EdgeRecord {
    /// The producer agent, by the name its engine was added with (shared with the
    /// driver's directory: no copy per decision).
    pub agent: Arc<str>,
    /// How it stands, as the core recorded it.
    pub outcome: EdgeOutcome,
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
/// ([`ConsumerEvent::record`](super::ConsumerEvent::record)). The core's [`Record`], field
/// for field, with the agents of its named edges by name. The request's id and producers
/// are the event's [`TrackedRequest`](super::TrackedRequest); times are on the driver's
/// clock.
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

    /// The core's record of a request, with its edges' agents by the directory's names.
    pub(super) fn new<const E: usize>(record: &Record<E>, directory: &AgentDirectory) -> Self {
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
            RecordedEdges::Named { .. } => RecordEdges::Named(
                record
                    .edges
                    .named()
                    .iter()
                    .map(|&(agent, outcome)| EdgeRecord {
                        agent: agent_name(directory, agent),
                        outcome,
                    })
                    .collect(),
            ),
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
}

/// The directory's name of `agent` (every named edge's agent was interned when its
/// engine was added; a stranger cannot be a named edge).
fn agent_name(directory: &AgentDirectory, agent: AgentId) -> Arc<str> {
    directory
        .shared_name(agent)
        .unwrap_or_else(|| Arc::from(format!("agent#{}", agent.0)))
}
