//! The producer (P) driver of one producer rank: the pairing table, leases, retired ids,
//! one [`PushPlan`] per request, owed `PUSH_FAIL` notices and source-block release.
//!
//! ```text
//!  offer ──▶ OFFERED ──┐ pair (exact id, transfer_id, base id)     ┌── STASHED ◀── PUSH_REG
//!     lease over│      └────────────────▶ PUSHING ◀───────────────┘
//!               ▼                          │ every edge terminal: SourceReleased
//!         SourceReleased ─▶ RETIRED ◀──────┘ (+ every owed PUSH_FAIL sent or unsendable)
//!                            │  PUSH_REG for it: PUSH_FAIL to every edge, nothing posted (F4)
//!                            └─ forgotten after `retired_capacity` newer ones
//! ```
//!
//! Per request the driver keeps the [`PushPlan`] (the `no_std` core's rules), the posted
//! WRITE handles and the lease:
//!
//! * every edge is planned before anything is posted (C2); a retired plan posts nothing (F4);
//! * a handle is kept until `Success` or a backend error (F7): a `PUSH_FAIL` for a posted
//!   edge goes out only after a backend error for that WRITE or for another WRITE to the same
//!   consumer rank; an unreadable status ([`WriteStatus::Unknown`]) is counted, sends nothing
//!   and keeps the source blocks fenced — the consumer's deadline decides;
//! * edges never posted (post or descriptor failure, failed handshake, retirement) are owed a
//!   `PUSH_FAIL` at once;
//! * a consumer rank's metadata is dropped ([`Transport::forget_peer`]) only when no WRITE to
//!   it is unfinished;
//! * the lease (`lease_ms` from the offer) is extended by heartbeats naming **P's** request id
//!   to `max(lease, now + lease_ms·2/3)` (vLLM); when it runs out the request is retired:
//!   nothing new is posted, but the source blocks come back only when every WRITE is
//!   terminal (F3).
//!
//! Drive it by calling [`ProducerDriver::tick`] with the transport and the monotonic time,
//! then [`ProducerDriver::poll_event`] until `None`; [`ProducerDriver::next_wakeup_ms`] says
//! when the next tick has work if no input comes first.

use std::collections::{BTreeMap, HashMap, VecDeque};

use kvdrain::producer::{EdgeState, PlanError, PushPlan, Topology};
use kvdrain::wire::{self, Body, Message};

use crate::PerRequest;
use crate::pairing::{PairingKeys, PairingTable, TableFull};
use crate::registration::PushRegistration;
use crate::transport::{
    DrainError, GonePeer, Notification, Peer, PostError, Posted, SendError, Transport, WriteSpec,
    WriteStatus,
};

/// This producer rank.
#[derive(Clone, Debug, PartialEq, Eq)]
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
    /// The lease on a finished request's source blocks, from its offer (vLLM
    /// `kv_lease_duration`, 30 s).
    pub lease_ms: u64,
    /// Requests offered or being pushed at once (an offer beyond it is refused and handed
    /// back), and registrations stashed at once.
    pub capacity: usize,
    /// Retired request ids remembered to refuse late registrations (F4).
    pub retired_capacity: usize,
}

impl ProducerConfig {
    /// vLLM's defaults: 30 s lease, 4096 requests, 4096 retired ids.
    pub fn new(engine_id: &str, tp_rank: u16, tp_size: u16) -> Self {
        ProducerConfig {
            engine_id: engine_id.to_owned(),
            tp_rank,
            tp_size,
            pp_stage: 0,
            pp_size: 1,
            mla: false,
            lease_ms: 30_000,
            capacity: 4096,
            retired_capacity: 4096,
        }
    }

    /// How far a heartbeat pushes the lease: `lease_ms · 2 / 3` (vLLM).
    pub fn lease_extension_ms(&self) -> u64 {
        self.lease_ms * 2 / 3
    }
}

/// A finished request whose source blocks are held for pushing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offer {
    /// P's request id: heartbeats name it.
    pub request_id: String,
    /// The router's pairing key, if the engine knows it.
    pub transfer_id: Option<String>,
    /// Source block ids per KV-cache group.
    pub block_ids: Vec<Vec<u64>>,
}

/// Why an offer was refused; the offer is handed back.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum OfferError {
    /// As many requests are offered as the capacity allows.
    #[error("offer table full")]
    Full(Offer),
    /// A request with this id is offered or being pushed already.
    #[error("request offered twice")]
    Duplicate(Offer),
}

/// What the engine must act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProducerEvent {
    /// Every WRITE of P's request `request_id` is terminal: its source blocks may be reused.
    SourceReleased {
        /// P's request id.
        request_id: String,
    },
    /// A heartbeat named P's request `request_id`; its lease was extended.
    LeaseExtended {
        /// P's request id.
        request_id: String,
    },
}

/// What one [`ProducerDriver::tick`] did.
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

/// Counters of a producer rank.
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
    /// Heartbeat ids that extended a lease.
    pub heartbeats: u64,
    /// Other notifications (ignored).
    pub ignored: u64,
    /// Writes posted.
    pub posted: u64,
    /// Writes that landed.
    pub landed: u64,
    /// Writes that could not be described or posted (C2), handshake failures included.
    pub post_failures: u64,
    /// Posted writes that ended with a backend error (F7).
    pub failed_after_post: u64,
    /// Posted writes whose status became unreadable (NOT_FOUND not caused here): no
    /// notice, source blocks fenced (F7).
    pub status_unknown: u64,
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
    /// Leases that ran out (the request was retired).
    pub leases_expired: u64,
    /// Offers refused (full table or duplicate).
    pub offers_refused: u64,
    /// Plan steps the driver took in a wrong order (a driver bug; always 0).
    pub plan_errors: u64,
}

struct OfferEntry {
    block_ids: Vec<Vec<u64>>,
    lease_until: u64,
}

struct Push<W> {
    keys: PairingKeys,
    registration: PushRegistration,
    /// `None`: answered for a retired request; nothing is posted.
    source: Option<Vec<Vec<u64>>>,
    plan: PushPlan,
    started: bool,
    /// The WRITEs posted and not yet terminal, by consumer rank.
    writes: PerRequest<(u16, W)>,
    lease_until: u64,
    released: bool,
}

/// The consumer registration a retired request was pushed or failed for: D's engine id
/// and D's request id. Every rank of that consumer sends its own copy of `PUSH_REG` (F11);
/// a copy that comes after the request retired was answered already (the plan covered every
/// rank this producer writes) and is a duplicate, not a late registration owed failure
/// notices (F4): answering it again would repeat a notice per edge, which counting mode
/// cannot tell from a sibling's and which would fail a request whose data landed.
type Answered = (String, String);

fn answered(reg: &PushRegistration) -> Answered {
    (reg.decode_engine_id.clone(), reg.request_id.clone())
}

/// The producer driver of one P rank. `W`: the transport's write handle.
pub struct ProducerDriver<W> {
    config: ProducerConfig,
    offers: PairingTable<OfferEntry>,
    stash: PairingTable<PushRegistration>,
    /// Requests being pushed, by P id (ordered: a tick visits them in a fixed order);
    /// `active` finds them by a registration's keys.
    pushes: BTreeMap<String, Push<W>>,
    active: PairingTable<()>,
    /// Retired requests, each with the consumer registration it was answered for, if any.
    retired: PairingTable<Option<Answered>>,
    retired_order: VecDeque<String>,
    /// Posted writes per consumer rank that are neither `Success` nor a backend error.
    unfinished: HashMap<(String, u16), u32>,
    /// Consumer ranks whose metadata should be refreshed once nothing to them is unfinished.
    stale: Vec<(String, u16)>,
    events: VecDeque<ProducerEvent>,
    counters: ProducerCounters,
    inbox: Vec<Notification>,
    now: u64,
    /// No offer's lease ends before this (a lower bound: heartbeats only push leases out).
    offers_expire_from: u64,
    /// An `offer` or `retire` since the last tick left work for the next one (a push to
    /// start, notices owed, sources to release).
    work_queued: bool,
}

impl<W> std::fmt::Debug for ProducerDriver<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProducerDriver")
            .field("config", &self.config)
            .field("offers", &self.offers.len())
            .field("stash", &self.stash.len())
            .field("pushes", &self.pushes.len())
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

/// The bytes of a completion (`REQ:TP`) or, with `failure`, of a failure notice
/// (`PUSH_FAIL:REQ:TP`) for `request_id`; empty for an id the wire cannot carry (one that
/// starts with a reserved prefix).
pub fn notice_bytes(request_id: &str, tp_size: u16, failure: bool) -> Vec<u8> {
    let c = Body {
        request_id,
        tp_size,
    };
    let mut buf = vec![0; wire::PUSH_FAIL_PREFIX.len() + c.encoded_len()];
    let n = if failure {
        c.encode_failure(&mut buf)
    } else {
        c.encode(&mut buf)
    };
    // The buffer is sized for the longest form.
    buf.truncate(n.unwrap_or(0));
    buf
}

impl<W> ProducerDriver<W> {
    /// A driver for one producer rank; every table is sized now.
    pub fn new(config: ProducerConfig) -> Self {
        let cap = config.capacity;
        ProducerDriver {
            offers: PairingTable::with_capacity(cap),
            stash: PairingTable::with_capacity(cap),
            pushes: BTreeMap::new(),
            active: PairingTable::with_capacity(cap),
            retired: PairingTable::with_capacity(config.retired_capacity),
            retired_order: VecDeque::with_capacity(config.retired_capacity),
            unfinished: HashMap::new(),
            stale: Vec::new(),
            events: VecDeque::new(),
            counters: ProducerCounters::default(),
            inbox: Vec::new(),
            now: 0,
            offers_expire_from: u64::MAX,
            work_queued: false,
            config,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ProducerConfig {
        &self.config
    }

    /// Counters.
    pub fn counters(&self) -> ProducerCounters {
        self.counters
    }

    /// Requests offered, stashed-and-paired or being pushed (not yet done here).
    pub fn in_flight(&self) -> usize {
        self.offers.len() + self.pushes.len()
    }

    /// The earliest monotonic time at which [`tick`](Self::tick) has work that no new input
    /// brings: an offer's or a push's lease runs out, or (the driver's own clock: at once) an
    /// [`offer`](Self::offer) or [`retire`](Self::retire) since the last tick left a push to
    /// start, notices to send or sources to release. `None` when only new input can change
    /// anything: a notification, an offer, a retire, or a posted WRITE's status changing in
    /// the transport (a transport that cannot wake its caller for that is polled while
    /// [`in_flight`](Self::in_flight) is not 0). An engine loop (or a simulator) may sleep
    /// until then or the next input, whichever comes first.
    pub fn next_wakeup_ms(&self) -> Option<u64> {
        if self.work_queued {
            return Some(self.now);
        }
        let offers = self.offers.iter().map(|(_, o)| o.lease_until);
        let pushes = self
            .pushes
            .values()
            .filter(|p| p.source.is_some() && !p.plan.is_retired())
            .map(|p| p.lease_until);
        offers.chain(pushes).min()
    }

    /// Requests whose sources stay fenced because a WRITE's status is unknown (F7): no
    /// notice was sent for it and only `Success` or a backend error to the same consumer
    /// rank ends the fence.
    pub fn fenced_unknown(&self) -> usize {
        self.pushes
            .values()
            .filter(|p| p.plan.has_unknown())
            .count()
    }

    /// The next event for the engine.
    pub fn poll_event(&mut self) -> Option<ProducerEvent> {
        self.events.pop_front()
    }

    /// A finished request's source blocks are held for pushing under a lease of
    /// `lease_ms` from `now_ms`; it is pushed once its registration arrives (or at the
    /// next tick, if it came first).
    ///
    /// # Errors
    /// [`OfferError`] with the offer: nothing is held.
    pub fn offer(&mut self, offer: Offer, now_ms: u64) -> Result<(), OfferError> {
        self.now = self.now.max(now_ms);
        let keys = PairingKeys::new(&offer.request_id, offer.transfer_id.as_deref());
        if self.offers.contains(&keys.id) || self.pushes.contains_key(&keys.id) {
            self.counters.offers_refused += 1;
            return Err(OfferError::Duplicate(offer));
        }
        if self.offers.len() + self.pushes.len() >= self.config.capacity {
            self.counters.offers_refused += 1;
            return Err(OfferError::Full(offer));
        }
        let entry = OfferEntry {
            block_ids: offer.block_ids,
            lease_until: self.now.saturating_add(self.config.lease_ms),
        };
        self.offers_expire_from = self.offers_expire_from.min(entry.lease_until);
        if let Some((_, reg)) = self.stash.take(&keys) {
            self.begin(keys, reg, Some(entry));
            self.work_queued = true;
            return Ok(());
        }
        match self.offers.insert(keys, entry) {
            Ok(()) => Ok(()),
            Err(TableFull(keys, entry)) => {
                self.counters.offers_refused += 1;
                Err(OfferError::Full(Offer {
                    request_id: keys.id,
                    transfer_id: keys.transfer_id,
                    block_ids: entry.block_ids,
                }))
            }
        }
    }

    /// The request ended on this producer (aborted, or the engine's own lease): no new
    /// write is posted, a failure notice goes to every consumer rank not written yet at the
    /// next tick, and the source blocks come back once no write is in flight (F3). A
    /// registration arriving later is answered with failure notices (F4).
    pub fn retire(&mut self, request_id: &str) {
        let keys = PairingKeys::new(request_id, None);
        let pushed_for = self
            .pushes
            .get(request_id)
            .map(|p| answered(&p.registration));
        self.remember_retired(keys.clone(), pushed_for);
        if let Some(push) = self.pushes.get_mut(request_id) {
            push.plan.retire();
            self.work_queued = true;
        } else if self.offers.remove(request_id).is_some() {
            self.release_source(request_id);
        } else if let Some((_, reg)) = self.stash.take(&keys) {
            // Registered but never offered: it will never be pushed; say so now (F4).
            self.counters.registrations_retired += 1;
            self.begin(keys, reg, None);
            self.work_queued = true;
        }
    }

    /// One round at monotonic time `now_ms`: notifications, leases, new pushes, status
    /// polls, owed notices, releases.
    ///
    /// # Errors
    /// [`DrainError`] if draining notifications failed (nothing else was done).
    pub fn tick<T: Transport<Write = W>>(
        &mut self,
        transport: &mut T,
        now_ms: u64,
    ) -> Result<TickReport, DrainError> {
        self.now = self.now.max(now_ms);
        let mut report = TickReport::default();
        let mut inbox = std::mem::take(&mut self.inbox);
        inbox.clear();
        let drained = transport.drain_notifications(&mut inbox);
        report.notifications = inbox.len();
        for (_sender, bytes) in &inbox {
            self.on_notification(bytes);
        }
        inbox.clear();
        self.inbox = inbox;
        drained?;
        // Whatever `offer` or `retire` left is done by this tick.
        self.work_queued = false;
        while let Some(gone) = transport.peer_gone() {
            if let GonePeer::ConsumerRank { engine, rank } = gone {
                self.peer_failed(&engine, rank);
            }
        }
        self.expire_offers();
        // Visit every push in place (the map is put back before anything looks it up).
        let mut pushes = std::mem::take(&mut self.pushes);
        let mut errored = Vec::new();
        for push in pushes.values_mut() {
            if push.lease_until <= self.now && push.source.is_some() && !push.plan.is_retired() {
                self.counters.leases_expired += 1;
                push.plan.retire();
                self.remember_retired(push.keys.clone(), Some(answered(&push.registration)));
            }
            if !push.started {
                push.started = true;
                self.start(push, transport, &mut report);
            }
            if !push.writes.is_empty() {
                self.poll_writes(push, transport, &mut report, &mut errored);
            }
        }
        self.pushes = pushes;
        // A backend error on one transfer to a consumer rank bounds every unknown one to it.
        for (engine, rank) in errored {
            self.peer_failed(&engine, rank);
        }
        let mut pushes = std::mem::take(&mut self.pushes);
        let mut done = Vec::new();
        for (key, push) in &mut pushes {
            self.send_owed(push, transport, &mut report);
            if push.plan.is_terminal() && !push.released {
                push.released = true;
                if push.source.is_some() {
                    report.released += 1;
                    self.release_source(key);
                }
            }
            if push.released && push.plan.owed_notices().next().is_none() {
                done.push(key.clone());
            }
        }
        for key in done {
            if let Some(push) = pushes.remove(&key) {
                self.active.remove(&key);
                // Moved, not copied: the push is over.
                let PushRegistration {
                    decode_engine_id,
                    request_id,
                    ..
                } = push.registration;
                self.remember_retired(push.keys, Some((decode_engine_id, request_id)));
            }
        }
        self.pushes = pushes;
        self.refresh_stale(transport);
        Ok(report)
    }

    fn release_source(&mut self, request_id: &str) {
        tracing::debug!(req = request_id, "source blocks released");
        self.counters.released += 1;
        self.events.push_back(ProducerEvent::SourceReleased {
            request_id: request_id.to_owned(),
        });
    }

    /// Remembers `keys` as retired; `pushed_for`: the registration it was answered for
    /// (kept when it is remembered again with one).
    fn remember_retired(&mut self, keys: PairingKeys, pushed_for: Option<Answered>) {
        if let Some(held) = self.retired.get_mut_exact(&keys.id) {
            if pushed_for.is_some() {
                *held = pushed_for;
            }
            return;
        }
        while self.retired.len() >= self.config.retired_capacity {
            match self.retired_order.pop_front() {
                Some(old) => {
                    self.retired.remove(&old);
                }
                None => return,
            }
        }
        self.retired_order.push_back(keys.id.clone());
        // Room was made above.
        let _ = self.retired.insert(keys, pushed_for);
    }

    fn plan_step(&mut self, step: Result<(), PlanError>) {
        if step.is_err() {
            self.counters.plan_errors += 1;
            debug_assert!(
                false,
                "producer driver took a plan step out of order: {step:?}"
            );
        }
    }

    fn expire_offers(&mut self) {
        let now = self.now;
        if now < self.offers_expire_from {
            return;
        }
        self.offers_expire_from = self
            .offers
            .iter()
            .map(|(_, o)| o.lease_until)
            .filter(|&until| until > now)
            .min()
            .unwrap_or(u64::MAX);
        let mut expired: Vec<String> = self
            .offers
            .iter()
            .filter(|(_, o)| o.lease_until <= now)
            .map(|(k, _)| k.id.clone())
            .collect();
        // A fixed order whatever the table's.
        expired.sort_unstable();
        for id in expired {
            if let Some((keys, _)) = self.offers.remove(&id) {
                self.counters.leases_expired += 1;
                self.release_source(&id);
                self.remember_retired(keys, None);
            }
        }
    }

    fn on_notification(&mut self, bytes: &[u8]) {
        match wire::parse(bytes) {
            Ok(Message::Registration(payload)) => match PushRegistration::from_msgpack(payload) {
                Ok(reg) => self.on_registration(reg),
                Err(e) => {
                    tracing::warn!(cause = "malformed_registration", error = %e, "PUSH_REG dropped");
                    self.counters.registrations_malformed += 1;
                }
            },
            Ok(Message::Heartbeat(hb)) => {
                let until = self.now.saturating_add(self.config.lease_extension_ms());
                for id in hb.ids() {
                    let lease = if let Some(p) = self.pushes.get_mut(id) {
                        Some(&mut p.lease_until)
                    } else {
                        self.offers
                            .get_mut_exact(id)
                            .map(|o: &mut OfferEntry| &mut o.lease_until)
                    };
                    if let Some(lease) = lease {
                        *lease = (*lease).max(until);
                        self.counters.heartbeats += 1;
                        self.events.push_back(ProducerEvent::LeaseExtended {
                            request_id: id.to_owned(),
                        });
                    }
                }
            }
            _ => self.counters.ignored += 1,
        }
    }

    fn on_registration(&mut self, reg: PushRegistration) {
        self.counters.registrations += 1;
        let keys = PairingKeys::new(&reg.request_id, reg.transfer_id.as_deref());
        if self.active.find(&keys).is_some() || self.stash.find(&keys).is_some() {
            self.counters.registrations_duplicate += 1;
        } else if let Some((p_keys, entry)) = self.offers.take(&keys) {
            self.begin(p_keys, reg, Some(entry));
        } else if let Some(p_id) = self.retired.find(&keys).map(str::to_owned) {
            let copy = self.retired.get(&keys).is_some_and(|a| {
                a.as_ref().is_some_and(|(engine, id)| {
                    *engine == reg.decode_engine_id && *id == reg.request_id
                })
            });
            if copy || self.pushes.contains_key(&p_id) {
                self.counters.registrations_duplicate += 1;
                return;
            }
            self.counters.registrations_retired += 1;
            self.begin(PairingKeys::new(&p_id, None), reg, None);
        } else if let Err(TableFull(..)) = self.stash.insert(keys, reg) {
            tracing::warn!(cause = "stash_full", "PUSH_REG dropped");
            self.counters.registrations_dropped += 1;
        }
    }

    /// A registration paired with an offer (or with a retired id: `entry` is `None`).
    fn begin(&mut self, keys: PairingKeys, reg: PushRegistration, entry: Option<OfferEntry>) {
        let topology = self.topology(&reg);
        let Ok(mut plan) = PushPlan::new(&topology, self.config.pp_stage, self.config.tp_rank)
        else {
            // No edge can be named, so no notice can be owed (invariant 3); nothing was
            // posted, so the blocks go back now.
            tracing::warn!(req = %keys.id, cause = "unplannable", "registration's topology cannot be planned");
            self.counters.unplannable += 1;
            if entry.is_some() {
                self.release_source(&keys.id);
            }
            let pushed_for = (reg.decode_engine_id, reg.request_id);
            self.remember_retired(keys, Some(pushed_for));
            return;
        };
        let (source, lease_until) = match entry {
            Some(e) => (Some(e.block_ids), e.lease_until),
            None => {
                plan.retire();
                (None, self.now)
            }
        };
        let id = keys.id.clone();
        tracing::debug!(req = %id, retired = source.is_none(), "registration paired");
        // `active` has the same capacity as the offers and stash that feed it.
        let _ = self.active.insert(keys.clone(), ());
        self.pushes.insert(
            id,
            Push {
                keys,
                registration: reg,
                released: source.is_none(),
                source,
                plan,
                started: false,
                writes: PerRequest::new(),
                lease_until,
            },
        );
    }

    fn topology(&self, reg: &PushRegistration) -> Topology {
        Topology {
            p_tp: self.config.tp_size,
            p_pp: self.config.pp_size,
            d_tp: reg.decode_tp_size,
            mla: self.config.mla,
        }
    }

    /// Posts every edge the plan allows.
    fn start<T: Transport<Write = W>>(
        &mut self,
        push: &mut Push<W>,
        transport: &mut T,
        report: &mut TickReport,
    ) {
        let _span = tracing::debug_span!("push", req = %push.keys.id).entered();
        let Some(source) = push.source.as_ref() else {
            return;
        };
        tracing::debug!("posting");
        let topology = self.topology(&push.registration);
        let body = notice_bytes(&push.registration.request_id, self.config.tp_size, false);
        // By index: the plan's edges are fixed once planned, and posting changes their states.
        for i in 0..push.plan.edges().len() {
            let edge = push.plan.edges()[i];
            let d = edge.d_rank;
            if push.plan.may_post(d).is_err() {
                continue;
            }
            let spec = WriteSpec {
                producer_request_id: &push.keys.id,
                registration: &push.registration,
                topology,
                tp_rank: self.config.tp_rank,
                d_rank: d,
                shape: edge.shape,
                source,
                completion: &body,
            };
            match transport.post_write(&spec) {
                Ok(Posted::InFlight(w)) => {
                    let step = push.plan.posted(d);
                    self.plan_step(step);
                    push.writes.push((d, w));
                    *self
                        .unfinished
                        .entry((push.registration.decode_engine_id.clone(), d))
                        .or_default() += 1;
                    self.counters.posted += 1;
                    report.posted += 1;
                }
                Ok(Posted::Done) => {
                    let step = push.plan.posted(d).and_then(|()| push.plan.landed(d));
                    self.plan_step(step);
                    self.counters.posted += 1;
                    self.counters.landed += 1;
                    report.posted += 1;
                    report.finished += 1;
                }
                Err(e) => {
                    if e == PostError::Handshake {
                        tracing::warn!(d_rank = d, cause = "handshake", "handshake failed");
                        self.counters.handshake_failures += 1;
                    }
                    tracing::warn!(d_rank = d, cause = "post", error = ?e, "write not posted");
                    self.counters.post_failures += 1;
                    let step = push.plan.post_failed(d);
                    self.plan_step(step);
                }
            }
        }
    }

    fn finished_one(&mut self, engine: &str, d: u16) {
        let key = (engine.to_owned(), d);
        if let Some(n) = self.unfinished.get_mut(&key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.unfinished.remove(&key);
            }
        }
    }

    fn poll_writes<T: Transport<Write = W>>(
        &mut self,
        push: &mut Push<W>,
        transport: &mut T,
        report: &mut TickReport,
        errored: &mut Vec<(String, u16)>,
    ) {
        let engine = push.registration.decode_engine_id.clone();
        let _span = tracing::debug_span!("push", req = %push.keys.id).entered();
        let mut i = 0;
        while i < push.writes.len() {
            let d = push.writes[i].0;
            match transport.poll_write(&mut push.writes[i].1) {
                WriteStatus::InProgress => i += 1,
                WriteStatus::Unknown => {
                    if push.plan.edge(d).map(|e| e.state) == Some(EdgeState::Posted) {
                        tracing::warn!(
                            d_rank = d,
                            cause = "status_unknown",
                            "write status lost: no PUSH_FAIL, sources stay fenced"
                        );
                        self.counters.status_unknown += 1;
                        let step = push.plan.status_unknown(d);
                        self.plan_step(step);
                    }
                    i += 1;
                }
                WriteStatus::Success => {
                    let step = push.plan.landed_after_unknown(d);
                    self.plan_step(step);
                    push.writes.swap_remove(i);
                    self.counters.landed += 1;
                    report.finished += 1;
                    self.finished_one(&engine, d);
                }
                WriteStatus::BackendError => {
                    tracing::warn!(
                        d_rank = d,
                        cause = "after_post",
                        "write failed after posting"
                    );
                    let step = push.plan.backend_error(d);
                    self.plan_step(step);
                    push.writes.swap_remove(i);
                    self.counters.failed_after_post += 1;
                    report.finished += 1;
                    self.finished_one(&engine, d);
                    errored.push((engine.clone(), d));
                }
            }
        }
    }

    /// A backend error (or a disconnect) for consumer rank `(engine, d)`: every write to it
    /// whose status was unknown is bounded now and owes its notice; its metadata is
    /// refreshed once nothing to it is unfinished.
    fn peer_failed(&mut self, engine: &str, d: u16) {
        let mut bounded = 0;
        for push in self.pushes.values_mut() {
            if push.registration.decode_engine_id != engine
                || push.plan.edge(d).map(|e| e.state) != Some(EdgeState::Unknown)
            {
                continue;
            }
            if push.plan.backend_error(d).is_err() {
                self.counters.plan_errors += 1;
            }
            push.writes.retain(|(w, _)| *w != d);
            bounded += 1;
        }
        for _ in 0..bounded {
            self.finished_one(engine, d);
        }
        let key = (engine.to_owned(), d);
        if !self.stale.contains(&key) {
            self.stale.push(key);
        }
    }

    fn refresh_stale<T: Transport<Write = W>>(&mut self, transport: &mut T) {
        let unfinished = &self.unfinished;
        self.stale.retain(|(engine, rank)| {
            if unfinished.contains_key(&(engine.clone(), *rank)) {
                return true;
            }
            transport.forget_peer(Peer::ConsumerRank {
                engine,
                rank: *rank,
            });
            false
        });
    }

    fn send_owed<T: Transport<Write = W>>(
        &mut self,
        push: &mut Push<W>,
        transport: &mut T,
        report: &mut TickReport,
    ) {
        let owed: PerRequest<u16> = push.plan.owed_notices().collect();
        if owed.is_empty() {
            return;
        }
        let body = notice_bytes(&push.registration.request_id, self.config.tp_size, true);
        let engine = push.registration.decode_engine_id.clone();
        for d in owed {
            let to = Peer::ConsumerRank {
                engine: &engine,
                rank: d,
            };
            let mut sent = transport.send_notification(to, &body);
            if sent == Err(SendError::Stale) && !self.unfinished.contains_key(&(engine.clone(), d))
            {
                // Nothing to that rank is unfinished: its metadata may be refreshed (F7).
                transport.forget_peer(to);
                self.stale.retain(|(e, r)| !(e == &engine && *r == d));
                sent = transport.send_notification(to, &body);
            }
            match sent {
                Ok(()) => {
                    tracing::debug!(req = %push.keys.id, d_rank = d, "PUSH_FAIL sent");
                    let step = push.plan.noticed(d);
                    self.plan_step(step);
                    self.counters.notices_sent += 1;
                    report.notices += 1;
                }
                // A write to that rank is unfinished: keep the notice owed, retry later.
                Err(SendError::Stale) => {
                    let key = (engine.clone(), d);
                    if !self.stale.contains(&key) {
                        self.stale.push(key);
                    }
                }
                Err(SendError::Unreachable | SendError::PeerGone) => {
                    tracing::warn!(req = %push.keys.id, d_rank = d, cause = "notice_unsendable", "PUSH_FAIL could not be sent");
                    let step = push.plan.unreachable(d);
                    self.plan_step(step);
                    self.counters.notices_unsendable += 1;
                }
            }
        }
    }
}
