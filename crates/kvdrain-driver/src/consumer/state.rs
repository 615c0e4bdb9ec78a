//! What the driver keeps between calls: per request (the [`TrackedRequest`], whether it is
//! heartbeated, its ticket), per producer (engines, disconnected agents, failed sends), and
//! the decisions queued for the engine; and what the ingest half counts.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use kvdrain::{Decision, Instant, Pending, RequestKey};

use super::{
    ConsumerConfig, ConsumerCounters, ConsumerEvent, DecisionRecord, RemoteProducer, TrackedRequest,
};

/// One registered request, until it is released.
#[derive(Debug)]
pub(super) struct InFlight {
    pub(super) request: TrackedRequest,
    /// Until the decision (F9).
    pub(super) heartbeat: bool,
    /// Until decided or aborted.
    pub(super) ticket: Option<Pending>,
}

/// What the engine half keeps between calls.
#[derive(Debug)]
pub(super) struct EngineState {
    pub(super) config: ConsumerConfig,
    /// Shared with each registration that sends to the engine's agents (no copy of the
    /// names per request).
    pub(super) engines: HashMap<String, Arc<RemoteProducer>>,
    pub(super) inflight: HashMap<RequestKey, InFlight>,
    pub(super) by_id: HashMap<String, RequestKey>,
    /// Producers found gone (or fenced): nothing is sent to them until their engine is
    /// added again.
    pub(super) disconnected: HashSet<String>,
    /// Producers whose send failed with `PeerGone` since the last poll, reported gone to
    /// the core at the start of the next one: a send returns only once it has failed,
    /// later than the clock of the round that made it, and the core settles a gone from
    /// its clock, so the report takes the next round's clock, which comes after it.
    pub(super) send_failed: Vec<String>,
    pub(super) last_heartbeat: Instant,
    pub(super) now: Instant,
    pub(super) counters: ConsumerCounters,
    pub(super) events: VecDeque<ConsumerEvent>,
}

/// What the ingest half counts.
#[derive(Debug, Default)]
pub(super) struct IngestState {
    pub(super) notifications: u64,
    pub(super) from_strangers: u64,
}

impl EngineState {
    /// Nothing tracked yet; the per-request tables reserved for `capacity` requests.
    pub(super) fn new(config: ConsumerConfig, capacity: usize) -> Self {
        EngineState {
            config,
            engines: HashMap::new(),
            inflight: HashMap::with_capacity(capacity),
            by_id: HashMap::with_capacity(capacity),
            disconnected: HashSet::new(),
            send_failed: Vec::new(),
            last_heartbeat: Instant::ZERO,
            now: Instant::ZERO,
            counters: ConsumerCounters::default(),
            events: VecDeque::with_capacity(capacity),
        }
    }

    /// Queues the event for one core decision with its record: a decode or a release
    /// forgets the request, a failure or an expiry stops its heartbeats. Every key the core
    /// decides came from this driver's `register`, which tracks it until its last
    /// decision; a decision for any other key has no request to report and is dropped,
    /// loudly.
    pub(super) fn queue(&mut self, d: Decision, record: DecisionRecord) {
        let key = d.key();
        let request = match d {
            Decision::Completed(_) | Decision::Released(_) => self.forget(key),
            Decision::Failed(_) | Decision::Expired(_) => self.stop_heartbeat(key),
        };
        let Some(request) = request else {
            debug_assert!(false, "decision for a key never registered");
            tracing::error!(
                key = key.get(),
                "decision for a request the driver does not track"
            );
            return;
        };
        let event = match d {
            Decision::Completed(t) => ConsumerEvent::Decode {
                request,
                blocks: t.into_decode(),
                record,
            },
            Decision::Failed(_) => {
                let cause = record.first_failure.map(kvdrain::FailureCause::as_str);
                tracing::warn!(req = %request.id, cause = "transfer", first_failure = ?cause, "failed");
                ConsumerEvent::Failed { request, record }
            }
            Decision::Expired(q) => {
                tracing::warn!(req = %request.id, cause = "deadline", outstanding = ?q.outstanding(), "expired");
                ConsumerEvent::Expired {
                    request,
                    outstanding: q.outstanding(),
                    record,
                }
            }
            Decision::Released(t) => {
                let forced = t.forced();
                if forced {
                    tracing::warn!(cause = "quarantine", "released by the quarantine");
                }
                ConsumerEvent::Release {
                    request,
                    blocks: t.into_free(),
                    forced,
                    record,
                }
            }
        };
        self.events.push_back(event);
    }

    /// Stops heartbeating the request and returns what the driver keeps of it.
    fn stop_heartbeat(&mut self, key: RequestKey) -> Option<TrackedRequest> {
        let f = self.inflight.get_mut(&key)?;
        f.heartbeat = false;
        f.ticket = None;
        Some(f.request.clone())
    }

    /// Forgets the request and returns what the driver kept of it.
    fn forget(&mut self, key: RequestKey) -> Option<TrackedRequest> {
        let f = self.inflight.remove(&key)?;
        self.by_id.remove(&f.request.id);
        Some(f.request)
    }
}
