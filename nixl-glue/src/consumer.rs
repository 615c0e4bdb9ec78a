//! The consumer (D) pump: NIXL notifications in, the core's decisions out to the engine.
//!
//! One [`Consumer`] per D rank, driven by one thread that calls [`Consumer::poll`] in a loop.
//! Each poll:
//!
//! 1. carries out fences found since the last poll (a producer became unreachable);
//! 2. drains every notification with a fresh `NotificationMap` (raw bytes; a non-UTF-8
//!    message cannot poison later polls), maps each sender agent name to its [`AgentId`]
//!    ([`AgentDirectory`]) and feeds [`Ledger::handle_notification`]; when a notice resolves a
//!    request's last edge the decision is taken **at once** ([`Ledger::poll`]) and handed to
//!    the engine's [`BlockRelease`] — the notification → decision latency is recorded;
//! 3. advances the core's clock (deadlines, quarantines);
//! 4. every `lease_ms / 6` sends `HB:` to every producer agent for the requests still in
//!    flight; a request stops being heartbeated at its decision (catalogue F9).
//!
//! Registration ([`Consumer::register`]) tracks the request in the core *before* sending
//! `PUSH_REG:` to every producer agent of the engine, so a completion can never arrive ahead
//! of its state; producers the registration could not reach are reported (F6): their edges
//! stay outstanding until the deadline (a send error proves nothing about delivery).
//!
//! A send to a producer that fails with a backend error (UCX `REMOTE_DISCONNECT`: the peer is
//! gone) fences that agent in the core at the next poll, so its outstanding edges resolve as
//! failed; the engine can also fence a producer its control plane knows is gone
//! ([`Consumer::fence_producer`]). No protocol decision is taken here.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use kvdrain::producer::{Topology, TopologyError};
use kvdrain::{
    AbortError, AgentId, BlockHandle, Config, Decision, Expect, Ledger, Noticed, Outstanding,
    Quarantined, RegisterErrorKind, Registration, RequestKey,
};
use nixl_sys::NixlError;

use crate::agent::{AgentError, UcxAgent};
use crate::directory::{AgentDirectory, DirectoryFull};
use crate::metrics::Latency;
use crate::registration::PushRegistration;

/// The engine's side of the decisions: where blocks go.
pub trait BlockRelease {
    /// `completed`: every write landed; the blocks now belong to the running request.
    fn decode(&mut self, request: &PushedRequest, blocks: BlockHandle);
    /// The blocks of a request that did not complete are safe to reuse (after `failed`,
    /// `expired` or an abort). `forced`: the quarantine ran out with writes outstanding.
    fn release(&mut self, request: &PushedRequest, blocks: BlockHandle, forced: bool);
    /// `failed`: a producer reported or was fenced as unable to write; apply the KV load
    /// failure policy now. [`release`](Self::release) follows at once.
    fn failed(&mut self, request: &PushedRequest) {
        let _ = request;
    }
    /// `expired`: the deadline passed with `outstanding` writes owed; the request fails for
    /// the client now, its blocks come back later through [`release`](Self::release).
    fn expired(&mut self, request: &PushedRequest, outstanding: Outstanding) {
        let _ = (request, outstanding);
    }
}

/// What the pump remembers of a registered request; handed to every [`BlockRelease`] hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushedRequest {
    /// The core's key.
    pub key: RequestKey,
    /// D's request id.
    pub id: String,
    /// The producer engine.
    pub producer_engine: String,
    /// P's request id (named in heartbeats).
    pub remote_request_id: String,
    /// The producer agents this rank waits for, in edge order.
    pub producers: Vec<String>,
    /// When it was registered.
    pub registered_at: Instant,
}

impl PushedRequest {
    /// The producers still owing a write in `outstanding` (named-edge mode; empty when
    /// counting).
    pub fn owing(&self, outstanding: Outstanding) -> Vec<&str> {
        match outstanding {
            Outstanding::Edges(bits) => self
                .producers
                .iter()
                .enumerate()
                .filter(|&(i, _)| i < 64 && bits & (1 << i) != 0)
                .map(|(_, p)| p.as_str())
                .collect(),
            Outstanding::Count(_) => Vec::new(),
        }
    }
}

/// This D rank.
#[derive(Clone, Debug)]
pub struct ConsumerConfig {
    /// D's engine id.
    pub engine_id: String,
    /// D's side-channel host (sent in registrations).
    pub host: String,
    /// D's side-channel port.
    pub port: u16,
    /// This rank.
    pub tp_rank: u16,
    /// D's TP size.
    pub tp_size: u16,
    /// The producers' lease in ms: heartbeats go out every `lease_ms / 6` (vLLM).
    pub lease_ms: u64,
    /// The core's settings (capacity, default deadline, quarantine).
    pub ledger: Config,
}

/// A producer engine as D knows it after the (notification-only) handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducerEngine {
    /// P's engine id.
    pub engine_id: String,
    /// P's side-channel host.
    pub host: String,
    /// P's side-channel port.
    pub port: u16,
    /// P's TP size.
    pub tp_size: u16,
    /// P's PP size.
    pub pp_size: u16,
    /// MLA (the latent is replicated to every consumer rank).
    pub mla: bool,
    /// Agent names, index `pp_stage * tp_size + tp_rank` (filled by
    /// [`Consumer::add_producer_engine`]).
    pub agents: Vec<String>,
}

/// A request the engine wants pushed into this rank.
#[derive(Debug)]
pub struct PushRequest<'a> {
    /// D's request id.
    pub id: &'a str,
    /// The producer engine (added with [`Consumer::add_producer_engine`]).
    pub producer_engine: &'a str,
    /// P's request id (for heartbeats).
    pub remote_request_id: &'a str,
    /// Router pairing key, if any.
    pub transfer_id: Option<&'a str>,
    /// The engine's handle on the destination blocks; back in `decode` or `release`.
    pub blocks: BlockHandle,
    /// D's logical block ids per KV-cache group (uncached suffix), as sent in `PUSH_REG`.
    pub block_ids: Vec<Vec<u64>>,
    /// Deadline in ms from now; `None` uses the ledger's default.
    pub deadline_ms: Option<u64>,
}

/// A registration that is being tracked.
#[derive(Debug, PartialEq, Eq)]
pub struct Registered {
    /// The core's key.
    pub key: RequestKey,
    /// Producer agents the `PUSH_REG` could not be sent to (F6). Their edges stay
    /// outstanding until the deadline: the engine may abort.
    pub unreached: Vec<String>,
}

/// What one [`Consumer::poll`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollReport {
    /// Notifications drained.
    pub notifications: usize,
    /// Decisions handed to the engine.
    pub decisions: usize,
}

/// Failure of a consumer operation.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    /// A NIXL call failed.
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// [`PushRequest::producer_engine`] was never added.
    #[error("unknown producer engine {0:?}")]
    UnknownEngine(String),
    /// The producer/consumer shapes do not fit.
    #[error("producer engine {engine:?} cannot write consumer rank {rank}: {source}")]
    Topology {
        /// Producer engine.
        engine: String,
        /// This rank.
        rank: u16,
        /// Why.
        #[source]
        source: TopologyError,
    },
    /// Too many producer agents.
    #[error(transparent)]
    Directory(#[from] DirectoryFull),
    /// The core refused the registration; the blocks come back unchanged.
    #[error("registration of {id:?} refused: {kind:?}")]
    Rejected {
        /// D's request id.
        id: String,
        /// Why.
        kind: RegisterErrorKind,
        /// The engine's blocks, handed back.
        blocks: BlockHandle,
    },
}

/// Glue-level counters of a consumer.
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
    /// Producers found disconnected (and fenced).
    pub disconnects: u64,
    /// Producers fenced (disconnects and explicit fences).
    pub fences: u64,
}

#[derive(Debug)]
struct InFlight {
    request: PushedRequest,
    /// Until the decision (F9).
    heartbeat: bool,
    /// Until decided or aborted.
    ticket: Option<kvdrain::Pending>,
}

/// The D-side pump of one consumer rank over real NIXL. `N`: requests tracked at once (a
/// power of two); `E`: producers per request.
#[derive(Debug)]
pub struct Consumer<const N: usize, const E: usize = 8> {
    agent: UcxAgent,
    config: ConsumerConfig,
    ledger: Box<Ledger<N, E>>,
    directory: AgentDirectory,
    engines: HashMap<String, ProducerEngine>,
    inflight: HashMap<RequestKey, InFlight>,
    by_id: HashMap<String, RequestKey>,
    disconnected: HashSet<String>,
    to_fence: Vec<String>,
    epoch: Instant,
    last_heartbeat: Instant,
    counters: ConsumerCounters,
    latency: Latency,
    scratch: Vec<Decision>,
}

impl<const N: usize, const E: usize> Consumer<N, E> {
    /// A consumer for `agent` (whose KV memory is registered already).
    pub fn new(agent: UcxAgent, config: ConsumerConfig) -> Self {
        let now = Instant::now();
        Consumer {
            ledger: Box::new(Ledger::new(config.ledger)),
            agent,
            config,
            directory: AgentDirectory::default(),
            engines: HashMap::new(),
            inflight: HashMap::new(),
            by_id: HashMap::new(),
            disconnected: HashSet::new(),
            to_fence: Vec::new(),
            epoch: now,
            last_heartbeat: now,
            counters: ConsumerCounters::default(),
            latency: Latency::default(),
            scratch: Vec::new(),
        }
    }

    /// The agent.
    pub fn agent(&self) -> &UcxAgent {
        &self.agent
    }

    /// Loads the metadata of every rank of a producer engine (notification-only, as vLLM's
    /// `notif_agents_only`: no descriptors) and names its agents. `rank_metadata` is in
    /// `(pp_stage, tp_rank)` order; `engine.agents` is filled from the loaded names.
    ///
    /// # Errors
    /// [`ConsumerError`] if a metadata blob does not load.
    pub fn add_producer_engine(
        &mut self,
        mut engine: ProducerEngine,
        rank_metadata: &[Vec<u8>],
    ) -> Result<&ProducerEngine, ConsumerError> {
        engine.agents.clear();
        for md in rank_metadata {
            let name = self.agent.load_remote_metadata(md)?;
            self.directory.intern(&name)?;
            self.disconnected.remove(&name);
            engine.agents.push(name);
        }
        let id = engine.engine_id.clone();
        Ok(self.engines.entry(id).insert_entry(engine).into_mut())
    }

    /// Tracks `request` in the core, then sends `PUSH_REG` to every agent of its producer
    /// engine.
    ///
    /// # Errors
    /// [`ConsumerError::Rejected`] (with the blocks) if the core refused it; nothing was sent.
    pub fn register(&mut self, request: PushRequest<'_>) -> Result<Registered, ConsumerError> {
        let _span = tracing::debug_span!("register", req = request.id).entered();
        let Some(engine) = self.engines.get(request.producer_engine) else {
            return Err(ConsumerError::UnknownEngine(
                request.producer_engine.to_owned(),
            ));
        };
        let topology = Topology {
            p_tp: engine.tp_size,
            p_pp: engine.pp_size,
            d_tp: self.config.tp_size,
            mla: engine.mla,
        };
        let topology_error = |source| ConsumerError::Topology {
            engine: engine.engine_id.clone(),
            rank: self.config.tp_rank,
            source,
        };
        topology.validate().map_err(topology_error)?;
        let producers: Vec<String> = topology
            .producers_of(self.config.tp_rank)
            .filter_map(|(stage, tp)| {
                let i = usize::from(stage) * usize::from(engine.tp_size) + usize::from(tp);
                engine.agents.get(i).cloned()
            })
            .collect();
        if producers.is_empty() {
            return Err(topology_error(TopologyError::RankOutOfRange));
        }
        let ids: Vec<AgentId> = producers
            .iter()
            .map(|p| self.directory.id_or_stranger(p))
            .collect();
        let expected = topology.expected_per_consumer_rank();
        // Named edges when every producer is named and they fit; vLLM's counting otherwise.
        let expect = if ids.len() <= E
            && ids.len() as u32 == expected
            && !ids.contains(&AgentDirectory::STRANGER)
        {
            Expect::Edges(&ids)
        } else {
            Expect::Count(u8::try_from(expected).unwrap_or(u8::MAX))
        };
        let ticket = self
            .ledger
            .register(Registration {
                id: request.id,
                blocks: request.blocks,
                expect,
                deadline_ms: request.deadline_ms,
            })
            .map_err(|e| ConsumerError::Rejected {
                id: request.id.to_owned(),
                kind: e.kind,
                blocks: e.registration.blocks,
            })?;
        let key = ticket.key();
        let registration = PushRegistration {
            request_id: request.id.to_owned(),
            decode_engine_id: self.config.engine_id.clone(),
            decode_host: self.config.host.clone(),
            decode_port: self.config.port,
            decode_tp_size: self.config.tp_size,
            local_block_ids: request.block_ids,
            remote_engine_id: engine.engine_id.clone(),
            remote_host: engine.host.clone(),
            remote_port: engine.port,
            remote_tp_size: engine.tp_size,
            remote_pp_size: engine.pp_size,
            transfer_id: request.transfer_id.map(str::to_owned),
        }
        .to_notification();
        let agents = engine.agents.clone();
        self.by_id.insert(request.id.to_owned(), key);
        self.inflight.insert(
            key,
            InFlight {
                request: PushedRequest {
                    key,
                    id: request.id.to_owned(),
                    producer_engine: request.producer_engine.to_owned(),
                    remote_request_id: request.remote_request_id.to_owned(),
                    producers,
                    registered_at: Instant::now(),
                },
                heartbeat: true,
                ticket: Some(ticket),
            },
        );
        let mut unreached = Vec::new();
        for agent in agents {
            if self.send(&agent, &registration) {
                self.counters.registrations_sent += 1;
            } else {
                tracing::warn!(
                    agent,
                    cause = "registration_unsent",
                    "PUSH_REG could not be sent"
                );
                self.counters.registrations_failed += 1;
                unreached.push(agent);
            }
        }
        tracing::debug!(unreached = unreached.len(), "registered, PUSH_REG sent");
        Ok(Registered { key, unreached })
    }

    /// The engine gives up on request `id`: over for the client now, heartbeats stop, its
    /// blocks come back through [`BlockRelease::release`] once no write can land.
    ///
    /// # Errors
    /// [`AbortError`] if the request is unknown or already decided.
    pub fn abort(&mut self, id: &str) -> Result<Quarantined, AbortError> {
        let key = self.by_id.get(id).copied();
        let ticket = key
            .and_then(|k| self.inflight.get_mut(&k))
            .and_then(|f| f.ticket.take());
        let result = match ticket {
            Some(t) => self.ledger.abort(t),
            None => self.ledger.abort_id(id),
        };
        if let Some(f) = key.and_then(|k| self.inflight.get_mut(&k)) {
            f.heartbeat = false;
        }
        result
    }

    /// The control plane knows producer agent `name` can no longer write here (dead, or its
    /// metadata invalidated with none of its writes in flight): fence it in the core now.
    /// Returns the edges resolved.
    pub fn fence_producer(&mut self, name: &str, release: &mut impl BlockRelease) -> u32 {
        self.disconnected.insert(name.to_owned());
        let Some(id) = self.directory.get(name) else {
            return 0;
        };
        tracing::warn!(agent = name, cause = "fence", "producer fenced");
        self.counters.fences += 1;
        let mut decisions = std::mem::take(&mut self.scratch);
        let resolved = self.ledger.fence(id, |d| decisions.push(d));
        for d in decisions.drain(..) {
            self.deliver(d, release);
        }
        self.scratch = decisions;
        resolved
    }

    /// One round: fences, notifications (deciding at once), clock, heartbeats.
    ///
    /// # Errors
    /// [`AgentError`] if draining notifications failed (nothing was lost from the core).
    pub fn poll(&mut self, release: &mut impl BlockRelease) -> Result<PollReport, AgentError> {
        let mut report = PollReport::default();
        for name in std::mem::take(&mut self.to_fence) {
            self.fence_producer(&name, release);
        }
        let batch = self.agent.drain_notifications()?;
        let received = Instant::now();
        report.notifications = batch.len();
        self.counters.notifications += batch.len() as u64;
        let mut decisions = std::mem::take(&mut self.scratch);
        // Decide as each notice comes in; hand the decisions to the engine after the batch,
        // so one request's decode hook does not delay the next request's decision.
        for (sender, bytes) in &batch {
            let id = self.directory.id_or_stranger(sender);
            if id == AgentDirectory::STRANGER {
                tracing::debug!(agent = %sender, "notification from a stranger");
                self.counters.from_strangers += 1;
            }
            if let Ok(Noticed::Decided) = self.ledger.handle_notification(id, bytes) {
                self.ledger.poll(|d| decisions.push(d));
                self.latency.record(received.elapsed());
            }
        }
        report.decisions += decisions.len();
        for d in decisions.drain(..) {
            self.deliver(d, release);
        }
        let now_ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        // One monotonic clock, only ever moving forward: `advance` cannot refuse it.
        let _ = self.ledger.advance(now_ms, |d| decisions.push(d));
        report.decisions += decisions.len();
        for d in decisions.drain(..) {
            self.deliver(d, release);
        }
        self.scratch = decisions;
        let interval = Duration::from_millis((self.config.lease_ms / 6).max(1));
        if self.last_heartbeat.elapsed() >= interval {
            self.last_heartbeat = Instant::now();
            self.heartbeat();
        }
        Ok(report)
    }

    /// Requests registered and not yet released (quarantined ones included).
    pub fn in_flight(&self) -> usize {
        self.inflight.len()
    }

    /// The core's counters.
    pub fn core_counters(&self) -> kvdrain::Counters {
        self.ledger.counters()
    }

    /// The glue's counters.
    pub fn counters(&self) -> ConsumerCounters {
        self.counters
    }

    /// Notification → decision latency of every decided notice.
    pub fn latency(&mut self) -> &mut Latency {
        &mut self.latency
    }

    fn deliver(&mut self, d: Decision, release: &mut impl BlockRelease) {
        let key = d.key();
        match d {
            Decision::Completed(t) => {
                let r = self.forget(key);
                tracing::debug!(req = %r.id, "completed");
                release.decode(&r, t.into_decode());
            }
            Decision::Failed(_) => {
                let r = self.stop_heartbeat(key);
                tracing::warn!(req = %r.id, cause = "transfer", "failed");
                release.failed(&r);
            }
            Decision::Expired(q) => {
                let r = self.stop_heartbeat(key);
                tracing::warn!(req = %r.id, cause = "deadline", outstanding = ?q.outstanding(), "expired");
                release.expired(&r, q.outstanding());
            }
            Decision::Released(t) => {
                let r = self.forget(key);
                let forced = t.forced();
                if forced {
                    tracing::warn!(req = %r.id, cause = "quarantine", "released by the quarantine");
                } else {
                    tracing::debug!(req = %r.id, "released");
                }
                release.release(&r, t.into_free(), forced);
            }
        }
    }

    fn stop_heartbeat(&mut self, key: RequestKey) -> PushedRequest {
        match self.inflight.get_mut(&key) {
            Some(f) => {
                f.heartbeat = false;
                f.ticket = None;
                f.request.clone()
            }
            None => Self::unknown(key),
        }
    }

    fn forget(&mut self, key: RequestKey) -> PushedRequest {
        match self.inflight.remove(&key) {
            Some(f) => {
                self.by_id.remove(&f.request.id);
                f.request
            }
            None => Self::unknown(key),
        }
    }

    /// A decision for a key the pump does not know (cannot happen: every key comes from
    /// `register`); the blocks are still handed over.
    fn unknown(key: RequestKey) -> PushedRequest {
        PushedRequest {
            key,
            id: String::new(),
            producer_engine: String::new(),
            remote_request_id: String::new(),
            producers: Vec::new(),
            registered_at: Instant::now(),
        }
    }

    /// `HB:` with the P request ids still in flight, per producer engine, to each of its
    /// agents.
    fn heartbeat(&mut self) {
        let mut per_engine: HashMap<&str, Vec<&str>> = HashMap::new();
        for f in self.inflight.values().filter(|f| f.heartbeat) {
            let id = f.request.remote_request_id.as_str();
            if !id.is_empty() && !id.contains(',') {
                per_engine
                    .entry(f.request.producer_engine.as_str())
                    .or_default()
                    .push(id);
            }
        }
        let mut sends = Vec::new();
        for (engine, ids) in per_engine {
            let Some(engine) = self.engines.get(engine) else {
                continue;
            };
            let len = 3 + ids.iter().map(|i| i.len() + 1).sum::<usize>();
            let mut buf = vec![0; len];
            let Ok(n) = kvdrain::wire::encode_heartbeat(ids.iter().copied(), &mut buf) else {
                continue;
            };
            buf.truncate(n);
            for agent in &engine.agents {
                sends.push((agent.clone(), buf.clone()));
            }
        }
        for (agent, msg) in sends {
            if self.send(&agent, &msg) {
                self.counters.heartbeats_sent += 1;
            } else {
                tracing::warn!(
                    agent,
                    cause = "heartbeat_unsent",
                    "heartbeat could not be sent"
                );
                self.counters.heartbeats_failed += 1;
            }
        }
    }

    /// Sends one notification; `false` if it could not be queued. A backend error (the peer
    /// disconnected) schedules a fence of that agent for the next poll.
    fn send(&mut self, agent: &str, msg: &[u8]) -> bool {
        if self.disconnected.contains(agent) {
            return false;
        }
        match self.agent.agent().send_notification(agent, msg, None) {
            Ok(()) => true,
            Err(NixlError::BackendError) => {
                tracing::warn!(
                    agent,
                    cause = "disconnect",
                    "producer disconnected; fencing it"
                );
                self.counters.disconnects += 1;
                self.disconnected.insert(agent.to_owned());
                self.to_fence.push(agent.to_owned());
                false
            }
            Err(_) => false,
        }
    }
}
