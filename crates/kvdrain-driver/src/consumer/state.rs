//! What the driver keeps between calls: per request (the [`TrackedRequest`], whether it is
//! heartbeated, its ticket), per producer (engines, disconnected agents, failed sends), and
//! the decisions queued for the engine; and what the ingest half counts.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use kvdrain::{Decision, Instant, Pending, RequestKey};

use super::{ConsumerConfig, ConsumerCounters, ConsumerEvent, RemoteProducer, TrackedRequest};
use crate::PerRequest;

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

    /// Queues the event for one core decision: a decode or a release forgets the request,
    /// a failure or an expiry stops its heartbeats.
    pub(super) fn queue(&mut self, d: Decision) {
        let key = d.key();
        let event = match d {
            Decision::Completed(t) => ConsumerEvent::Decode {
                request: self.forget(key),
                blocks: t.into_decode(),
            },
            Decision::Failed(_) => {
                let request = self.stop_heartbeat(key);
                tracing::warn!(req = %request.id, cause = "transfer", "failed");
                ConsumerEvent::Failed { request }
            }
            Decision::Expired(q) => {
                let request = self.stop_heartbeat(key);
                tracing::warn!(req = %request.id, cause = "deadline", outstanding = ?q.outstanding(), "expired");
                ConsumerEvent::Expired {
                    request,
                    outstanding: q.outstanding(),
                }
            }
            Decision::Released(t) => {
                let forced = t.forced();
                if forced {
                    tracing::warn!(cause = "quarantine", "released by the quarantine");
                }
                ConsumerEvent::Release {
                    request: self.forget(key),
                    blocks: t.into_free(),
                    forced,
                }
            }
        };
        self.events.push_back(event);
    }

    fn stop_heartbeat(&mut self, key: RequestKey) -> TrackedRequest {
        match self.inflight.get_mut(&key) {
            Some(f) => {
                f.heartbeat = false;
                f.ticket = None;
                f.request.clone()
            }
            None => self.unknown(key),
        }
    }

    fn forget(&mut self, key: RequestKey) -> TrackedRequest {
        match self.inflight.remove(&key) {
            Some(f) => {
                self.by_id.remove(&f.request.id);
                f.request
            }
            None => self.unknown(key),
        }
    }

    /// A decision for a key the driver does not know: every key comes from `register`, so
    /// this cannot happen; the blocks are still handed over.
    fn unknown(&self, key: RequestKey) -> TrackedRequest {
        debug_assert!(false, "decision for a key never registered");
        TrackedRequest {
            key,
            id: String::new(),
            producer_engine: String::new(),
            remote_request_id: String::new(),
            producers: PerRequest::new(),
            registered_at: self.now,
        }
    }
}
