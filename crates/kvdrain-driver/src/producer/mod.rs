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
//!   consumer rank; an unreadable status
//!   ([`WriteStatus::Unknown`](crate::transport::WriteStatus::Unknown)) is counted, sends
//!   nothing and keeps the source blocks fenced — the consumer's deadline decides;
//! * edges never posted (post or descriptor failure, failed handshake, retirement) are owed a
//!   `PUSH_FAIL` at once;
//! * a consumer rank's metadata is dropped ([`Transport::forget_peer`]) only when no WRITE to
//!   it is unfinished;
//! * the lease (`lease` from the offer) is extended by heartbeats naming **P's** request id
//!   to `max(lease end, now + lease·2/3)` (vLLM); when it runs out the request is retired:
//!   nothing new is posted, but the source blocks come back only when every WRITE is
//!   terminal (F3).
//!
//! ## Drive contract
//!
//! 1. [`offer`](ProducerDriver::offer) each finished request's source blocks (its lease
//!    starts); [`retire`](ProducerDriver::retire) one the engine aborts;
//! 2. call [`tick`](ProducerDriver::tick) with the transport and the monotonic time on every
//!    scheduler step. One round, in this order: drain notifications, take lost peers, expire
//!    offers, then per push (in P-id order) expire its lease, post it once, poll its WRITEs;
//!    bound unknown WRITEs to a rank that errored, send owed notices, release sources, forget
//!    finished pushes and refresh stale peers. A failed drain stops none of it: the error is
//!    returned after the round;
//! 3. take [`poll_event`](ProducerDriver::poll_event) until `None`;
//!    [`next_timer`](ProducerDriver::next_timer) says when the next tick has work if
//!    no input comes first.
//!
//! | file | concept |
//! | --- | --- |
//! | `mod.rs` | the driver's state, the per-request `Push` record and the round |
//! | `config.rs` | [`ProducerConfig`] |
//! | `events.rs` | what leaves it: [`ProducerEvent`], [`TickReport`], [`ProducerCounters`] |
//! | `offers.rs` | [`Offer`]s and their leases |
//! | [`pairing`] | the exact / `transfer_id` / base-id pairing tables |
//! | `inbox.rs` | a drained `PUSH_REG` (paired, stashed or answered) or `HB:` |
//! | `post.rs` | the post loop: one WRITE per edge the plan allows |
//! | `status.rs` | status polling: `Success`, backend error, unknown |
//! | `stale.rs` | WRITEs unfinished per consumer rank and stale peers' metadata |
//! | `notices.rs` | [`notice_bytes`] and sending the owed `PUSH_FAIL`s |
//! | `retired.rs` | retiring a request and the retired ids (F4) |

mod config;
mod events;
mod inbox;
mod notices;
mod offers;
pub mod pairing;
mod post;
mod retired;
mod stale;
mod status;

use std::collections::{BTreeMap, HashMap, VecDeque};

use kvdrain::Instant;
use kvdrain::producer::{PlanError, PushPlan};

use crate::PerRequest;
use crate::registration::PushRegistration;
use crate::transport::{DrainError, GonePeer, Notification, Transport};

pub use config::ProducerConfig;
pub use events::{ProducerCounters, ProducerEvent, TickReport};
pub use notices::notice_bytes;
use offers::OfferEntry;
pub use offers::{Offer, OfferError};
use pairing::{PairingKeys, PairingTable};
use retired::{Answered, answered};

struct Push<W> {
    keys: PairingKeys,
    registration: PushRegistration,
    /// `None`: answered for a retired request; nothing is posted.
    source: Option<Vec<Vec<u64>>>,
    plan: PushPlan,
    started: bool,
    /// The WRITEs posted and not yet terminal, by consumer rank.
    writes: PerRequest<(u16, W)>,
    lease_until: Instant,
    released: bool,
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
    now: Instant,
    /// No offer's lease ends before this (a lower bound: heartbeats only push leases out).
    offers_expire_from: Instant,
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
            now: Instant::ZERO,
            offers_expire_from: Instant::MAX,
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
    #[must_use = "when the next tick has work: sleep until then or the next input"]
    pub fn next_timer(&self) -> Option<Instant> {
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
    #[must_use = "an event taken and dropped is lost: its source blocks are never freed"]
    pub fn poll_event(&mut self) -> Option<ProducerEvent> {
        self.events.pop_front()
    }

    /// One round at monotonic time `now`: notifications, leases, new pushes, status
    /// polls, owed notices, releases.
    ///
    /// # Errors
    /// [`DrainError`] if draining notifications failed (the rest of the round still ran:
    /// whatever was drained before the failure, lost peers, leases, posts, status polls,
    /// owed notices, releases and stale peers).
    #[must_use = "a failed drain is reported here, after the round"]
    pub fn tick<T: Transport<Write = W>>(
        &mut self,
        transport: &mut T,
        now: Instant,
    ) -> Result<TickReport, DrainError> {
        self.now = self.now.max(now);
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
        // A failed drain holds nothing else up: WRITEs already posted still end and
        // notices already owed still go (the consumer driver does the same).

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
        drained.map(|()| report)
    }

    fn release_source(&mut self, request_id: &str) {
        tracing::debug!(req = request_id, "source blocks released");
        self.counters.released += 1;
        self.events.push_back(ProducerEvent::SourceReleased {
            request_id: request_id.to_owned(),
        });
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
}
