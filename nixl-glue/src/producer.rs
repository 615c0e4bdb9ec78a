//! The producer (P) pusher: one WRITE per consumer edge, each with its completion attached,
//! polled until terminal, with the failure notices the core's [`PushPlan`] says are owed.
//!
//! One [`Pusher`] per P rank (one NIXL agent), driven by one thread that calls
//! [`Pusher::tick`]. Each tick:
//!
//! 1. drains notifications: `PUSH_REG:` (matched on raw bytes, then msgpack) pairs with a
//!    finished request by exact key ([`PushRegistration::pairing_key`]; either may come
//!    first), `HB:` is passed to the engine for the ids it knows ([`SourceBlocks::heartbeat`]);
//! 2. starts every paired request: a [`PushPlan`] names every edge before anything is posted
//!    (C2); per edge it handshakes (cached), describes the write, creates it with the
//!    completion `{D_request_id}:{P_tp}` attached (`OptArgs` with `set_has_notification` and the
//!    message) and posts it with `None` options (options on post would replace the
//!    notification); nothing is posted once the plan is retired (F4);
//! 3. polls `get_xfer_status` on every posted write until `Success` or an error — NIXL sends a
//!    deferred notification only from that poll — and reports it to the plan (F7);
//! 4. sends `PUSH_FAIL:{D_request_id}:{P_tp}` for every edge the plan says is owed (post or
//!    descriptor failure, failure after posting, retirement), and marks edges whose consumer
//!    cannot be reached (F8);
//! 5. hands a request's source blocks back ([`SourceBlocks::release`]) only once the plan is
//!    terminal — every write finished or failed — never on a lease alone (F3).
//!
//! Lease policy stays in the engine: it extends leases on heartbeats and calls
//! [`Pusher::retire`] when one runs out or the request is aborted.

use std::collections::{HashMap, HashSet, VecDeque};

use kvdrain::producer::{PushPlan, Topology};
use kvdrain::wire::{self, Body, Message};
use nixl_sys::{MemType, NixlError, OptArgs, XferDescList, XferOp, XferRequest, XferStatus};

use crate::agent::{AgentError, UcxAgent};
use crate::descriptors::{self, Span};
use crate::handshake::Handshake;
use crate::pool::BlockLayout;
use crate::registration::PushRegistration;

/// The engine's side of a producer: its source blocks and leases.
pub trait SourceBlocks {
    /// Every write of `request` is terminal: its source blocks may be reused (F3).
    fn release(&mut self, request: &str);
    /// A consumer's heartbeat named `request` (one this pusher holds): extend its lease.
    fn heartbeat(&mut self, request: &str) {
        let _ = request;
    }
}

/// This P rank.
#[derive(Clone, Debug)]
pub struct ProducerConfig {
    /// P's engine id.
    pub engine_id: String,
    /// This rank's TP index.
    pub tp_rank: u16,
    /// P's TP size (sent in every completion).
    pub tp_size: u16,
    /// This rank's PP stage.
    pub pp_stage: u16,
    /// P's PP size.
    pub pp_size: u16,
    /// MLA (the latent is written whole to each target).
    pub mla: bool,
}

/// A finished request whose source blocks are held for pushing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offer {
    /// P's request id: the key registrations pair with and heartbeats name.
    pub request_id: String,
    /// Source block ids per KV-cache group.
    pub block_ids: Vec<Vec<u64>>,
}

/// A fault to inject into one edge (tests and the demo's failure rate). Both are real NIXL
/// failures, not simulations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Aim the write past the consumer's registered memory: `create_xfer_req` fails (C2).
    BadDescriptor,
    /// Invalidate the consumer's metadata right after posting: a write still in progress then
    /// fails its status poll (F7). A write that completed inside the post is unaffected.
    FailAfterPost,
}

/// Chooses a fault per `(P request id, D rank)`.
pub type FaultInjector = Box<dyn FnMut(&str, u16) -> Option<Fault> + Send>;

/// What one [`Pusher::tick`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TickReport {
    /// Notifications drained.
    pub notifications: usize,
    /// Writes posted.
    pub posted: usize,
    /// Writes that reached a terminal status.
    pub finished: usize,
    /// Failure notices sent.
    pub notices: usize,
    /// Requests whose source blocks were released.
    pub released: usize,
}

/// Glue-level counters of a producer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProducerCounters {
    /// `PUSH_REG` decoded.
    pub registrations: u64,
    /// `PUSH_REG` that did not decode (dropped, as vLLM does).
    pub registrations_malformed: u64,
    /// `PUSH_REG` for a request being pushed already (another consumer rank's copy).
    pub registrations_duplicate: u64,
    /// `PUSH_REG` dropped because the stash of unpaired ones was full.
    pub registrations_dropped: u64,
    /// `PUSH_REG` for a request retired here: answered with failure notices (F4).
    pub registrations_retired: u64,
    /// Heartbeat ids passed to the engine.
    pub heartbeats: u64,
    /// Other notifications (ignored).
    pub ignored: u64,
    /// Writes posted.
    pub posted: u64,
    /// Writes that landed.
    pub landed: u64,
    /// Writes that could not be described or posted (C2).
    pub post_failures: u64,
    /// Writes that failed after posting (F7).
    pub failed_after_post: u64,
    /// Handshakes that failed (F8).
    pub handshake_failures: u64,
    /// `PUSH_FAIL` sent.
    pub notices_sent: u64,
    /// `PUSH_FAIL` owed to a consumer that could not be reached.
    pub notices_unsendable: u64,
    /// Requests whose source blocks were released.
    pub released: u64,
    /// Registrations whose topology the plan refused (nothing owed: the edges cannot be named).
    pub unplannable: u64,
}

/// A consumer rank this pusher has handshaken with.
#[derive(Clone, Debug)]
struct Peer {
    name: String,
    /// `None` when the handshake got the metadata but failed afterwards: notices only.
    layout: Option<BlockLayout>,
}

struct Push {
    registration: PushRegistration,
    plan: PushPlan,
    xfers: Vec<(u16, XferRequest)>,
    released: bool,
}

/// A bounded insertion-ordered set of keys.
#[derive(Debug, Default)]
struct Bounded {
    order: VecDeque<String>,
    set: HashSet<String>,
}

impl Bounded {
    fn insert(&mut self, key: &str, cap: usize) {
        if self.set.insert(key.to_owned()) {
            self.order.push_back(key.to_owned());
            while self.order.len() > cap {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }
}

/// The P-side pusher of one producer rank over real NIXL.
pub struct Pusher {
    config: ProducerConfig,
    layout: BlockLayout,
    offers: HashMap<String, Vec<Vec<u64>>>,
    stash: HashMap<String, PushRegistration>,
    paired: Vec<(PushRegistration, Option<Vec<Vec<u64>>>)>,
    pushes: HashMap<String, Push>,
    retired: Bounded,
    peers: HashMap<(String, u16), Peer>,
    counters: ProducerCounters,
    faults: Option<FaultInjector>,
    // Last: requests above are dropped before the agent and its registrations.
    agent: UcxAgent,
}

impl std::fmt::Debug for Pusher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pusher")
            .field("agent", &self.agent.name())
            .field("config", &self.config)
            .field("offers", &self.offers.len())
            .field("stash", &self.stash.len())
            .field("pushes", &self.pushes.len())
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl Pusher {
    /// Unpaired registrations kept at most (catalogue F11).
    pub const STASH_CAPACITY: usize = 4096;
    /// Retired request ids remembered to refuse late registrations (F4).
    pub const RETIRED_CAPACITY: usize = 4096;

    /// A pusher for `agent`, whose source blocks (laid out as `layout`) are registered.
    pub fn new(agent: UcxAgent, config: ProducerConfig, layout: BlockLayout) -> Self {
        Pusher {
            config,
            layout,
            offers: HashMap::new(),
            stash: HashMap::new(),
            paired: Vec::new(),
            pushes: HashMap::new(),
            retired: Bounded::default(),
            peers: HashMap::new(),
            counters: ProducerCounters::default(),
            faults: None,
            agent,
        }
    }

    /// The agent.
    pub fn agent(&self) -> &UcxAgent {
        &self.agent
    }

    /// Injects faults into chosen edges from now on.
    pub fn set_fault_injector(&mut self, faults: Option<FaultInjector>) {
        self.faults = faults;
    }

    /// Counters.
    pub fn counters(&self) -> ProducerCounters {
        self.counters
    }

    /// Requests offered or being pushed (not yet released and noticed).
    pub fn in_flight(&self) -> usize {
        self.offers.len() + self.pushes.len() + self.paired.len()
    }

    /// A finished request's source blocks are held for pushing; it is pushed once its
    /// registration arrives (or at once, if it came first).
    pub fn offer(&mut self, offer: Offer) {
        match self.stash.remove(&offer.request_id) {
            Some(reg) => self.paired.push((reg, Some(offer.block_ids))),
            None => {
                self.offers.insert(offer.request_id, offer.block_ids);
            }
        }
    }

    /// The request ended on this producer (lease over, aborted): no new write is posted, a
    /// failure notice goes to every consumer rank not written yet, and the source blocks come
    /// back once no write is in flight. A registration arriving later is answered with
    /// failure notices (F4).
    pub fn retire(&mut self, request_id: &str, blocks: &mut impl SourceBlocks) {
        self.retired.insert(request_id, Self::RETIRED_CAPACITY);
        if let Some(push) = self.pushes.get_mut(request_id) {
            push.plan.retire();
        } else if let Some(i) = self
            .paired
            .iter()
            .position(|(r, _)| r.pairing_key() == request_id)
        {
            let (reg, _) = self.paired.swap_remove(i);
            self.counters.released += 1;
            blocks.release(request_id);
            self.paired.push((reg, None));
        } else if self.offers.remove(request_id).is_some() {
            self.counters.released += 1;
            blocks.release(request_id);
        }
    }

    /// One round: notifications, new pushes, status polls, owed notices, releases.
    ///
    /// # Errors
    /// [`AgentError`] if draining notifications failed.
    pub fn tick(
        &mut self,
        handshake: &mut impl Handshake,
        blocks: &mut impl SourceBlocks,
    ) -> Result<TickReport, AgentError> {
        let mut report = TickReport::default();
        let batch = self.agent.drain_notifications()?;
        report.notifications = batch.len();
        for (_sender, bytes) in &batch {
            self.on_notification(bytes, blocks);
        }
        for (reg, source) in std::mem::take(&mut self.paired) {
            self.start(reg, source, handshake, blocks, &mut report);
        }
        let keys: Vec<String> = self.pushes.keys().cloned().collect();
        for key in keys {
            let Some(mut push) = self.pushes.remove(&key) else {
                continue;
            };
            self.progress(&key, &mut push, handshake, blocks, &mut report);
            let owes = push.plan.owed_notices().next().is_some();
            if push.released && !owes {
                self.retired.insert(&key, Self::RETIRED_CAPACITY);
            } else {
                self.pushes.insert(key, push);
            }
        }
        Ok(report)
    }

    fn on_notification(&mut self, bytes: &[u8], blocks: &mut impl SourceBlocks) {
        match wire::parse(bytes) {
            Ok(Message::Registration(payload)) => match PushRegistration::from_msgpack(payload) {
                Ok(reg) => self.on_registration(reg),
                Err(e) => {
                    tracing::warn!(cause = "malformed_registration", error = %e, "PUSH_REG dropped");
                    self.counters.registrations_malformed += 1;
                }
            },
            Ok(Message::Heartbeat(hb)) => {
                for id in hb.ids() {
                    if self.offers.contains_key(id) || self.pushes.contains_key(id) {
                        self.counters.heartbeats += 1;
                        blocks.heartbeat(id);
                    }
                }
            }
            _ => self.counters.ignored += 1,
        }
    }

    fn on_registration(&mut self, reg: PushRegistration) {
        self.counters.registrations += 1;
        let key = reg.pairing_key().to_owned();
        let pending = |(r, _): &(PushRegistration, _)| r.pairing_key() == key;
        if self.pushes.contains_key(&key) || self.paired.iter().any(pending) {
            self.counters.registrations_duplicate += 1;
        } else if let Some(source) = self.offers.remove(&key) {
            self.paired.push((reg, Some(source)));
        } else if self.retired.set.contains(&key) {
            self.counters.registrations_retired += 1;
            self.paired.push((reg, None));
        } else if self.stash.contains_key(&key) {
            self.counters.registrations_duplicate += 1;
        } else if self.stash.len() >= Self::STASH_CAPACITY {
            tracing::warn!(req = %key, cause = "stash_full", "PUSH_REG dropped");
            self.counters.registrations_dropped += 1;
        } else {
            self.stash.insert(key, reg);
        }
    }

    /// Plans every edge, then posts each one the plan allows. `source: None`: the request is
    /// retired here, so every edge is owed a notice and nothing is posted.
    fn start(
        &mut self,
        registration: PushRegistration,
        source: Option<Vec<Vec<u64>>>,
        handshake: &mut impl Handshake,
        blocks: &mut impl SourceBlocks,
        report: &mut TickReport,
    ) {
        let key = registration.pairing_key().to_owned();
        let _span = tracing::debug_span!("push", req = %key).entered();
        tracing::debug!(retired = source.is_none(), "registration paired");
        let topology = self.topology(&registration);
        let Ok(mut plan) = PushPlan::new(&topology, self.config.pp_stage, self.config.tp_rank)
        else {
            // No edge can be named, so no notice can be owed (invariant 3); nothing was
            // posted, so the blocks go back now.
            tracing::warn!(
                cause = "unplannable",
                "registration's topology cannot be planned"
            );
            self.counters.unplannable += 1;
            if source.is_some() {
                self.counters.released += 1;
                report.released += 1;
                blocks.release(&key);
            }
            self.retired.insert(&key, Self::RETIRED_CAPACITY);
            return;
        };
        let mut xfers = Vec::new();
        match &source {
            None => plan.retire(),
            Some(source) => {
                for edge in plan.edges().to_vec() {
                    let d = edge.d_rank;
                    if plan.may_post(d).is_err() {
                        continue;
                    }
                    match self.describe_and_post(
                        &registration,
                        &topology,
                        edge.shape,
                        source,
                        d,
                        handshake,
                    ) {
                        Ok(Some(req)) => {
                            let _ = plan.posted(d);
                            xfers.push((d, req));
                            report.posted += 1;
                        }
                        Ok(None) => {
                            let _ = plan.posted(d);
                            let _ = plan.landed(d);
                            self.counters.landed += 1;
                            report.posted += 1;
                            report.finished += 1;
                        }
                        Err(()) => {
                            tracing::warn!(d_rank = d, cause = "post", "write not posted");
                            self.counters.post_failures += 1;
                            let _ = plan.post_failed(d);
                        }
                    }
                }
            }
        }
        let push = Push {
            registration,
            plan,
            xfers,
            released: source.is_none(),
        };
        self.pushes.insert(key, push);
    }

    /// Handshakes with consumer rank `d` (cached), computes the spans and posts the write.
    fn describe_and_post(
        &mut self,
        reg: &PushRegistration,
        topology: &Topology,
        shape: kvdrain::producer::WriteShape,
        source: &[Vec<u64>],
        d: u16,
        handshake: &mut impl Handshake,
    ) -> Result<Option<XferRequest>, ()> {
        let engine = reg.decode_engine_id.as_str();
        let Some(Peer {
            layout: Some(layout),
            ..
        }) = self.peer(handshake, engine, d)
        else {
            tracing::warn!(engine, d_rank = d, cause = "handshake", "handshake failed");
            self.counters.handshake_failures += 1;
            return Err(());
        };
        let spans = descriptors::spans(
            topology,
            self.config.tp_rank,
            shape,
            (&self.layout, source),
            (&layout, &reg.local_block_ids),
        )
        .map_err(|_| ())?;
        let fault = self.faults.as_mut().and_then(|f| f(reg.pairing_key(), d));
        self.post(reg, engine, d, &spans, &layout, fault)
    }

    /// Creates and posts one WRITE with its completion attached. `Ok(None)`: finished inside
    /// the post (its notification is sent); `Ok(Some)`: in progress, poll it.
    fn post(
        &mut self,
        reg: &PushRegistration,
        engine: &str,
        d_rank: u16,
        spans: &[Span],
        remote: &BlockLayout,
        fault: Option<Fault>,
    ) -> Result<Option<XferRequest>, ()> {
        let Some(peer) = self.peers.get(&(engine.to_owned(), d_rank)).cloned() else {
            return Err(());
        };
        let completion = Body {
            request_id: &reg.request_id,
            tp_size: self.config.tp_size,
        };
        let mut body = vec![0; completion.encoded_len()];
        completion.encode(&mut body).map_err(|_| ())?;
        // Past the end of the consumer's registered memory: a real creation failure.
        let shift = match fault {
            Some(Fault::BadDescriptor) => remote.block_len * remote.num_blocks,
            _ => 0,
        };
        let mut local = XferDescList::new(MemType::Dram).map_err(|_| ())?;
        let mut far = XferDescList::new(MemType::Dram).map_err(|_| ())?;
        for s in spans {
            local.add_desc(s.src, s.len, 0);
            far.add_desc(s.dst + shift, s.len, 0);
        }
        let mut args = OptArgs::new().map_err(|_| ())?;
        args.set_has_notification(true).map_err(|_| ())?;
        args.set_notification_message(&body).map_err(|_| ())?;
        let agent = self.agent.agent();
        let req = agent
            .create_xfer_req(XferOp::Write, &local, &far, &peer.name, Some(&args))
            .map_err(|_| ())?;
        // `None`: options here would replace the notification set at creation.
        match agent.post_xfer_req(&req, None) {
            Ok(true) => {
                self.counters.posted += 1;
                if fault == Some(Fault::FailAfterPost) {
                    let _ = agent.invalidate_remote_md(&peer.name);
                    self.peers.remove(&(engine.to_owned(), d_rank));
                }
                Ok(Some(req))
            }
            Ok(false) => {
                self.counters.posted += 1;
                Ok(None)
            }
            // A failed post sends nothing; the handle is released here (nixl.md §2.4).
            Err(_) => Err(()),
        }
    }

    fn progress(
        &mut self,
        key: &str,
        push: &mut Push,
        handshake: &mut impl Handshake,
        blocks: &mut impl SourceBlocks,
        report: &mut TickReport,
    ) {
        let _span = tracing::debug_span!("push", req = key).entered();
        let engine = push.registration.decode_engine_id.clone();
        let agent = self.agent.agent();
        push.xfers
            .retain(|(d, req)| match agent.get_xfer_status(req) {
                Ok(XferStatus::InProgress) => true,
                Ok(XferStatus::Success) => {
                    let _ = push.plan.landed(*d);
                    self.counters.landed += 1;
                    report.finished += 1;
                    false
                }
                Err(e) => {
                    tracing::warn!(d_rank = *d, cause = "after_post", error = %e, "write failed");
                    let _ = push.plan.failed(*d);
                    self.counters.failed_after_post += 1;
                    report.finished += 1;
                    if matches!(e, NixlError::NotFound | NixlError::BackendError) {
                        // Stale or disconnected: handshake afresh before the next use.
                        self.peers.remove(&(engine.clone(), *d));
                    }
                    false
                }
            });
        let owed: Vec<u16> = push.plan.owed_notices().collect();
        for d in owed {
            if self.notify_failure(handshake, &push.registration, d) {
                let _ = push.plan.noticed(d);
                tracing::debug!(d_rank = d, "PUSH_FAIL sent");
                self.counters.notices_sent += 1;
                report.notices += 1;
            } else {
                let _ = push.plan.unreachable(d);
                tracing::warn!(
                    d_rank = d,
                    cause = "notice_unsendable",
                    "PUSH_FAIL could not be sent"
                );
                self.counters.notices_unsendable += 1;
            }
        }
        if push.plan.is_terminal() && !push.released {
            push.released = true;
            tracing::debug!("source blocks released");
            self.counters.released += 1;
            report.released += 1;
            blocks.release(key);
        }
    }

    /// Sends `PUSH_FAIL` for edge `d`; one fresh handshake if the cached metadata went stale.
    fn notify_failure(
        &mut self,
        handshake: &mut impl Handshake,
        reg: &PushRegistration,
        d: u16,
    ) -> bool {
        let completion = Body {
            request_id: &reg.request_id,
            tp_size: self.config.tp_size,
        };
        let mut body = vec![0; wire::PUSH_FAIL_PREFIX.len() + completion.encoded_len()];
        if completion.encode_failure(&mut body).is_err() {
            return false;
        }
        let engine = reg.decode_engine_id.as_str();
        for attempt in 0..2 {
            let Some(peer) = self.peer(handshake, engine, d) else {
                return false;
            };
            match self
                .agent
                .agent()
                .send_notification(&peer.name, &body, None)
            {
                Ok(()) => return true,
                Err(NixlError::NotFound) if attempt == 0 => {
                    self.peers.remove(&(engine.to_owned(), d));
                }
                Err(_) => return false,
            }
        }
        false
    }

    /// The consumer rank, handshaking (and loading its metadata) the first time.
    fn peer(&mut self, handshake: &mut impl Handshake, engine: &str, d: u16) -> Option<Peer> {
        let key = (engine.to_owned(), d);
        if let Some(p) = self.peers.get(&key) {
            return Some(p.clone());
        }
        let (metadata, layout) = match handshake.consumer_rank(engine, d) {
            Ok(rank) => (rank.metadata, Some(rank.layout)),
            Err(e) => (e.metadata?, None),
        };
        let name = self.agent.load_remote_metadata(&metadata).ok()?;
        let peer = Peer { name, layout };
        self.peers.insert(key, peer.clone());
        Some(peer)
    }

    fn topology(&self, reg: &PushRegistration) -> Topology {
        Topology {
            p_tp: self.config.tp_size,
            p_pp: self.config.pp_size,
            d_tp: reg.decode_tp_size,
            mla: self.config.mla,
        }
    }
}
