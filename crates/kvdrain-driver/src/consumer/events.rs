//! What the driver hands the engine: the decisions to act on, the request each one names,
//! what one poll did, and the rank's counters.

use kvdrain::{BlockHandle, Instant, Outstanding, RequestKey};

use super::DecisionRecord;
use crate::PerRequest;

/// What the driver remembers of a registered request, from its registration to its
/// release; carried by every event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrackedRequest {
    /// The core's key.
    pub key: RequestKey,
    /// D's request id.
    pub id: String,
    /// The producer engine.
    pub producer_engine: String,
    /// P's request id (named in heartbeats).
    pub remote_request_id: String,
    /// The producer agents this rank waits for, in edge order.
    pub producers: PerRequest<String>,
    /// When it was registered (the driver's clock).
    pub registered_at: Instant,
}

impl TrackedRequest {
    /// The producers still owing a write in `outstanding` (named-edge mode; none when
    /// counting).
    pub fn owing(&self, outstanding: Outstanding) -> impl Iterator<Item = &str> + '_ {
        let bits = match outstanding {
            Outstanding::Edges(bits) => bits,
            Outstanding::Count(_) => 0,
        };
        self.producers
            .iter()
            .enumerate()
            .filter(move |&(i, _)| i < 64 && bits & (1 << i) != 0)
            .map(|(_, p)| p.as_str())
    }
}

/// A decision for the engine, each with the request's [`DecisionRecord`] as it stood
/// when the decision was handed out.
#[derive(Debug, PartialEq, Eq)]
pub enum ConsumerEvent {
    /// `completed`: every write landed; the blocks now belong to the running request.
    Decode {
        /// The request.
        request: TrackedRequest,
        /// Its blocks.
        blocks: BlockHandle,
        /// What happened to it.
        record: DecisionRecord,
    },
    /// `failed`: apply the KV load failure policy now; `Release` follows.
    Failed {
        /// The request.
        request: TrackedRequest,
        /// What happened to it.
        record: DecisionRecord,
    },
    /// `expired`: the deadline passed with `outstanding` writes owed; the blocks come back
    /// later through `Release`.
    Expired {
        /// The request.
        request: TrackedRequest,
        /// What was still owed.
        outstanding: Outstanding,
        /// What happened to it.
        record: DecisionRecord,
    },
    /// The blocks of a request that did not complete are safe to reuse. `forced`: the
    /// quarantine ran out with writes outstanding.
    Release {
        /// The request.
        request: TrackedRequest,
        /// Its blocks.
        blocks: BlockHandle,
        /// Released by the quarantine.
        forced: bool,
        /// What happened to it.
        record: DecisionRecord,
    },
}

impl ConsumerEvent {
    /// The request the decision is for.
    pub fn request(&self) -> &TrackedRequest {
        match self {
            ConsumerEvent::Decode { request, .. }
            | ConsumerEvent::Failed { request, .. }
            | ConsumerEvent::Expired { request, .. }
            | ConsumerEvent::Release { request, .. } => request,
        }
    }

    /// What happened to the request, read as the decision was handed out.
    pub fn record(&self) -> &DecisionRecord {
        match self {
            ConsumerEvent::Decode { record, .. }
            | ConsumerEvent::Failed { record, .. }
            | ConsumerEvent::Expired { record, .. }
            | ConsumerEvent::Release { record, .. } => record,
        }
    }
}

/// What one [`ConsumerDriver::poll`](super::ConsumerDriver::poll) did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollReport {
    /// Notifications drained.
    pub notifications: usize,
    /// Decisions queued.
    pub decisions: usize,
}

/// Counters of a consumer rank (the core keeps its own).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConsumerCounters {
    /// Notifications drained.
    pub notifications: u64,
    /// Notifications from agents never introduced.
    pub from_strangers: u64,
    /// `PUSH_REG` sent.
    pub registrations_sent: u64,
    /// `PUSH_REG` sends that failed (F6).
    pub registrations_failed: u64,
    /// `HB:` sent.
    pub heartbeats_sent: u64,
    /// `HB:` sends that failed.
    pub heartbeats_failed: u64,
    /// Producers found disconnected (a failed send, the transport's report), each
    /// reported gone to the core.
    pub disconnects: u64,
    /// Producers reported gone to the core (disconnects and
    /// [`ConsumerEngine::gone`](super::ConsumerEngine::gone)).
    pub gones: u64,
    /// Named edges those reports resolved (they settle).
    pub gone_edges: u64,
    /// Producers fenced ([`ConsumerEngine::fence`](super::ConsumerEngine::fence): nothing
    /// more can land).
    pub fences: u64,
    /// Named edges those fences resolved.
    pub fenced_edges: u64,
}
