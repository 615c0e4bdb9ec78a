//! The consumer (D) driver of one decode rank: the agent directory, registration from a
//! topology, the heartbeat schedule, unreached and lost producers, and decisions out.
//!
//! ```text
//!  register ──▶ core register ──▶ PUSH_REG to every producer agent ──▶ WAITING
//!     (unreached agents reported: F6)                                   │ HB: every lease/6
//!   notices (drained, sender → AgentId) ─▶ core ─▶ Decode | Failed | Expired | Release
//!   send fails with PeerGone / transport reports a peer gone ─▶ core gone (settles)
//!   heartbeats stop at the request's decision or abort (F9)
//! ```
//!
//! * **Directory**: producer agent names get [`AgentId`]s when their engine is added, never
//!   from traffic; a sender nobody introduced is [`AgentId::STRANGER`] and matches no
//!   edge.
//! * **Registration**: the edges of this rank come from the producer engine's topology
//!   ([`Topology::producers_of`](kvdrain::producer::Topology::producers_of)); named edges
//!   when every producer is named and they fit `E`, vLLM's count
//!   (`pp × max(1, P_tp / D_tp)`) otherwise or when the caller asks for it
//!   ([`EdgeMode::Count`]). The request is tracked in the core **before** `PUSH_REG` goes
//!   out, so no completion can beat its state.
//! * **Heartbeats** carry P's request ids (`remote_request_id`), grouped per producer
//!   engine, every `lease / 6`, from registration until the decision (F9).
//! * **Lost producers** (rule 9 of the replay contract): an agent the transport reports
//!   gone, or whose send failed with [`SendError::PeerGone`], is reported to the core with
//!   [`gone`](kvdrain::Engine::gone) at the next poll, with that poll's clock (a failed
//!   send is known only when it returns, after its round's clock), and with no other
//!   wait: its outstanding edges fail then, as if it had sent a failure notice for each,
//!   and their blocks settle for `Config::settle`, because the bytes it had already handed to
//!   its transport keep landing (measured over UCX TCP: up to 173 ms after a reset). A
//!   gone says nothing about requests registered later: their `PUSH_REG` does not reach
//!   the agent (reported unreached, F6) and their edge waits for the deadline.
//!   [`fence`](ConsumerEngine::fence), which releases without settling,
//!   is only for a transport that can prove nothing more of the producer's can land.
//!
//! The driver hands out two halves and keeps only what needs both: [`ConsumerIngest`]
//! (notifications in) and [`ConsumerEngine`] (everything else). On one thread, drive it
//! with [`ConsumerDriver::poll`] (transport and monotonic time in), then take
//! [`ConsumerEngine::poll_event`] from [`ConsumerDriver::engine`] until `None`;
//! [`ConsumerEngine::next_timer`] says when the next poll has work if no notification
//! comes first. On two, [`ConsumerDriver::split`]: the ingest thread drains and ingests,
//! the engine thread calls [`ConsumerEngine::poll`] when the ingest half decided a request
//! or at the next wakeup, whichever comes first.
//!
//! * **Failure notices are dated at their drain**: [`ConsumerDriver::poll`] gives the
//!   core the round's `now` as the batch's arrival before ingesting it, and an ingest
//!   thread gives each batch its time with [`ConsumerIngest::set_arrival`], so a
//!   `PUSH_FAIL:` settles for `Config::settle` from when it was drained, not from the
//!   engine half's previous round.
//!
//! A transport whose drain fails leaves the rest of the round done: the poll reports the
//! [`DrainError`] after lost producers were reported, the clock advanced (deadlines,
//! quarantines and settle ends decided) and heartbeats sent.
//!
//! | file | concept |
//! | --- | --- |
//! | `mod.rs` | the driver, its two halves, lost and fenced producers, the round |
//! | `config.rs` | [`ConsumerConfig`], and [`RemoteProducer`]: a producer engine it receives from |
//! | `events.rs` | what leaves it: [`ConsumerEvent`] and the [`TrackedRequest`] it carries, [`PollReport`], [`ConsumerCounters`] |
//! | `register.rs` | registration, step by step: [`ReceiveSpec`] and [`EdgeMode`] in, [`Registered`] or [`ConsumerError`] out |
//! | `heartbeat.rs` | the heartbeat schedule (F9) |
//! | `record.rs` | [`DecisionRecord`]: what happened to a request, carried by every event |
//! | `state.rs` | what the driver keeps per request and per producer, and the decisions queued |

mod config;
mod events;
mod heartbeat;
mod record;
mod register;
mod state;

use std::sync::Arc;

use kvdrain::{
    AbortError, AgentId, Engine, Ignored, Ingest, Instant, Ledger, Noticed, Quarantined, Recorded,
};

use crate::directory::AgentDirectory;
use crate::transport::{DrainError, GonePeer, Notification, Peer, SendError, Transport};

pub use config::{ConsumerConfig, RemoteProducer};
pub use events::{ConsumerCounters, ConsumerEvent, PollReport, TrackedRequest};
pub use record::{DecisionRecord, EdgeRecord, RecordEdges};
pub use register::{ConsumerError, EdgeMode, ReceiveSpec, Registered};
use state::{EngineState, IngestState};

/// The consumer driver of one D rank. `N`: requests tracked at once (a power of two); `E`:
/// named producers per request.
///
/// It owns the state and hands out its two halves; it does not repeat their methods. The
/// [`ConsumerIngest`] half feeds notifications into the core, lock-free; the
/// [`ConsumerEngine`] half does everything else (registration, aborts, lost producers,
/// clock, heartbeats, decisions, when to wake next). On two threads,
/// [`split`](Self::split) it after adding the producer engines: the ingest half goes to the
/// thread that drains notifications (the core's `Ledger::split`). On one thread, take the
/// engine half with [`engine`](Self::engine) where it is needed, and let
/// [`poll`](Self::poll) drain, ingest and run the engine's round in one call. What the
/// driver keeps for itself needs the whole of it: adding producer engines (before a
/// split), that one-thread round, and the counters of both halves.
#[derive(Debug)]
pub struct ConsumerDriver<const N: usize, const E: usize = 8> {
    ledger: Box<Ledger<N, E>>,
    directory: AgentDirectory,
    ingest: IngestState,
    state: EngineState,
    inbox: Vec<Notification>,
}

/// The ingest half of a split [`ConsumerDriver`]: `Send`, one per driver.
#[derive(Debug)]
pub struct ConsumerIngest<'a, const N: usize, const E: usize> {
    ingest: Ingest<'a, N, E>,
    directory: &'a AgentDirectory,
    state: &'a mut IngestState,
}

/// The engine half of a [`ConsumerDriver`] ([`split`](ConsumerDriver::split) for an
/// engine thread, [`engine`](ConsumerDriver::engine) on one thread): registration, aborts,
/// lost and fenced producers, clock, heartbeats, decisions, and when to wake next.
#[derive(Debug)]
pub struct ConsumerEngine<'a, const N: usize, const E: usize> {
    engine: Engine<'a, N, E>,
    directory: &'a AgentDirectory,
    state: &'a mut EngineState,
}

impl<const N: usize, const E: usize> ConsumerIngest<'_, N, E> {
    /// One notification from `sender`, into the core. [`Noticed::Decided`]: a decision
    /// waits for the engine half's [`take_ready`](ConsumerEngine::take_ready).
    ///
    /// # Errors
    /// The core's [`Ignored`] report for input that changed nothing.
    pub fn ingest<'m>(&mut self, sender: &str, bytes: &'m [u8]) -> Result<Noticed, Ignored<'m>> {
        self.state.notifications += 1;
        let id = self.directory.id_or_stranger(sender);
        if id == AgentId::STRANGER {
            self.state.from_strangers += 1;
        }
        self.ingest.handle_notification(id, bytes)
    }

    /// The notifications ingested from now on arrived at `now` (on the clock the engine
    /// half is given): call it once per drained batch, with the time of the drain, so that
    /// a failure notice settles from its arrival rather than from the engine half's last
    /// round (the core's [`Ingest::set_arrival`]: an earlier time than one given before is
    /// ignored). The driver reads no clock: the time comes in, as everywhere else.
    pub fn set_arrival(&mut self, now: Instant) {
        self.ingest.set_arrival(now);
    }
}

impl<const N: usize, const E: usize> ConsumerDriver<N, E> {
    /// A driver for one D rank; the ledger is built on the heap.
    pub fn new(config: ConsumerConfig) -> Self {
        ConsumerDriver {
            ledger: Box::new(Ledger::new(config.ledger)),
            directory: AgentDirectory::default(),
            ingest: IngestState::default(),
            state: EngineState::new(config, N),
            inbox: Vec::new(),
        }
    }

    /// The two halves, for an ingest thread and an engine thread. Both borrow the driver:
    /// run them under `std::thread::scope`. Add producer engines before splitting.
    pub fn split(&mut self) -> (ConsumerIngest<'_, N, E>, ConsumerEngine<'_, N, E>) {
        let (ingest, engine) = self.ledger.split();
        (
            ConsumerIngest {
                ingest,
                directory: &self.directory,
                state: &mut self.ingest,
            },
            ConsumerEngine {
                engine,
                directory: &self.directory,
                state: &mut self.state,
            },
        )
    }

    /// The engine half alone, for a caller on one thread: registration, aborts, lost
    /// producers, clock, decisions and when to wake next are its methods, and this driver
    /// does not repeat them. Build it where it is needed (it borrows the driver for as
    /// long as it lives, and building it costs nothing).
    pub fn engine(&mut self) -> ConsumerEngine<'_, N, E> {
        self.split().1
    }

    /// The configuration.
    pub fn config(&self) -> &ConsumerConfig {
        &self.state.config
    }

    /// Names the agents of a producer engine (loaded by the transport) and remembers the
    /// engine; a re-added agent is no longer treated as disconnected.
    ///
    /// # Errors
    /// [`ConsumerError::Directory`] if the names do not fit.
    pub fn add_producer_engine(
        &mut self,
        engine: RemoteProducer,
    ) -> Result<&RemoteProducer, ConsumerError> {
        for name in &engine.agents {
            self.directory.intern(name)?;
            self.state.disconnected.remove(name);
        }
        let id = engine.engine_id.clone();
        Ok(self
            .state
            .engines
            .entry(id)
            .insert_entry(Arc::new(engine))
            .into_mut())
    }

    /// The directory of producer agents.
    pub fn directory(&self) -> &AgentDirectory {
        &self.directory
    }

    /// One round at monotonic time `now` on one thread: notifications (deciding at
    /// once), then [`ConsumerEngine::poll`].
    ///
    /// # Errors
    /// [`DrainError`] if draining notifications failed (the rest of the round still ran).
    #[must_use = "a failed drain is reported here, after the round"]
    pub fn poll<T: Transport>(
        &mut self,
        transport: &mut T,
        now: Instant,
    ) -> Result<PollReport, DrainError> {
        // Ignored input is counted by the core.
        self.poll_observed(transport, now, |_, _, _| {})
    }

    /// [`poll`](Self::poll), showing `observe` each drained notification with its sender
    /// and what the core made of it, in the order they were ingested (for a harness
    /// that checks every input, or a log).
    ///
    /// # Errors
    /// As [`poll`](Self::poll).
    #[must_use = "a failed drain is reported here, after the round"]
    pub fn poll_observed<T: Transport>(
        &mut self,
        transport: &mut T,
        now: Instant,
        mut observe: impl for<'m> FnMut(&str, &'m [u8], Result<Noticed, Ignored<'m>>),
    ) -> Result<PollReport, DrainError> {
        let mut inbox = std::mem::take(&mut self.inbox);
        inbox.clear();
        // A failed drain is reported after the round, which runs in full: what was drained
        // before the failure is ingested, and lost producers, the clock (deadlines,
        // quarantines, settle ends) and heartbeats do not wait for the transport to recover.
        let drained = transport.drain_notifications(&mut inbox);
        let (mut ingest, mut engine) = self.split();
        let before = engine.pending_events();
        // Drained at `now`, before the engine's round advances to it: dated there.
        ingest.set_arrival(now);
        for (sender, bytes) in &inbox {
            let noticed = ingest.ingest(sender, bytes);
            // Decided on this thread: queued at once, in the order the notices came.
            if let Ok(Noticed::Decided) = noticed {
                // The report counts the round's decisions from the queue, not from this.
                let _ = engine.take_ready();
            }
            observe(sender, bytes, noticed);
        }
        // Every ready request was taken as its notice decided it (none are left for the
        // round to take); the report counts decisions from the queue.
        let _ = engine.poll(transport, now);
        let report = PollReport {
            notifications: inbox.len(),
            decisions: engine.pending_events() - before,
        };
        inbox.clear();
        self.inbox = inbox;
        drained.map(|()| report)
    }

    /// The core's counters.
    pub fn core_counters(&self) -> kvdrain::Counters {
        self.ledger.counters()
    }

    /// The driver's counters (both halves).
    pub fn counters(&self) -> ConsumerCounters {
        ConsumerCounters {
            notifications: self.ingest.notifications,
            from_strangers: self.ingest.from_strangers,
            ..self.state.counters
        }
    }
}

impl<const N: usize, const E: usize> ConsumerEngine<'_, N, E> {
    /// The engine gives up on request `id`: over for the client now, heartbeats stop, its
    /// blocks come back through [`ConsumerEvent::Release`] once no write can land.
    ///
    /// # Errors
    /// [`AbortError`] if the request is unknown or already decided.
    pub fn abort(&mut self, id: &str) -> Result<Quarantined, AbortError> {
        let st = &mut *self.state;
        let key = st.by_id.get(id).copied();
        let ticket = key
            .and_then(|k| st.inflight.get_mut(&k))
            .and_then(|f| f.ticket.take());
        let result = match ticket {
            Some(t) => self.engine.abort(t),
            None => self.engine.abort_id(id),
        };
        if let Some(f) = key.and_then(|k| st.inflight.get_mut(&k)) {
            f.heartbeat = false;
        }
        result
    }

    /// Producer agent `name` went away (the control plane saw it die, its connection
    /// reset, or its metadata invalidated), but nothing proves that the bytes it had
    /// already handed to its transport cannot still land: report it to the core with
    /// [`gone`](kvdrain::Engine::gone) now. Its outstanding named edges fail at once, as
    /// by a failure notice, and their blocks settle for `Config::settle` (a counting-mode
    /// request still waits for its count or its deadline). Nothing more is sent to it
    /// until its engine is added again. Returns the edges resolved. The driver calls this
    /// itself for a failed send or a peer the transport reports gone.
    pub fn gone(&mut self, name: &str) -> u32 {
        self.state.disconnected.insert(name.to_owned());
        let Some(id) = self.directory.get(name) else {
            return 0;
        };
        tracing::warn!(agent = name, cause = "gone", "producer gone");
        self.state.counters.gones += 1;
        // The core's clock to the driver's first: the edges settle from the moment the
        // peer was seen gone, not from the last advance before it.
        self.advance(self.state.now);
        let resolved = self.engine.gone(id);
        self.state.counters.gone_edges += u64::from(resolved);
        self.take_queued();
        resolved
    }

    /// The transport proves that producer agent `name` can no longer write here: nothing
    /// of it is in flight and none of it can still land. Fences it in the core now: its
    /// outstanding named edges fail and release without settling. A peer merely seen
    /// gone (a failed send, a reset connection, a dead process, invalidated metadata)
    /// proves nothing of the kind: report it with [`gone`](Self::gone).
    /// Returns the edges resolved.
    pub fn fence(&mut self, name: &str) -> u32 {
        self.state.disconnected.insert(name.to_owned());
        let Some(id) = self.directory.get(name) else {
            return 0;
        };
        tracing::warn!(agent = name, cause = "fence", "producer fenced");
        self.state.counters.fences += 1;
        let resolved = self.engine.fence(id);
        self.state.counters.fenced_edges += u64::from(resolved);
        self.take_queued();
        resolved
    }

    /// Queues the event of a decision just pulled from the core, with the record the
    /// core handed out with it.
    fn hand_out(&mut self, recorded: Recorded<E>) {
        let record = DecisionRecord::new(&recorded.record, self.directory);
        self.state.queue(recorded.decision, record);
    }

    /// Takes the decisions the last core `gone`, `fence` or `advance` queued, in order (those of
    /// requests the ingest half drained stay for [`take_ready`](Self::take_ready)).
    fn take_queued(&mut self) {
        while let Some(recorded) = self.engine.poll_queued_recorded() {
            self.hand_out(recorded);
        }
    }

    /// Takes the decisions the ingest half made ready; returns how many ready requests
    /// were taken (each gives one or two events, one after the other).
    #[must_use = "the ready requests taken: what a caller timing the hand-off counts"]
    pub fn take_ready(&mut self) -> usize {
        let mut taken = 0;
        let mut last = None;
        while let Some(recorded) = self.engine.poll_recorded() {
            let key = recorded.decision.key();
            if last != Some(key) {
                taken += 1;
                last = Some(key);
            }
            self.hand_out(recorded);
        }
        taken
    }

    /// One engine round at monotonic time `now`: peers whose send failed since the last
    /// round and peers the transport reports gone reported to the core (at this round's
    /// clock), ready decisions taken, the clock advanced, heartbeats sent when due. It does
    /// not drain the transport: notifications come in through the ingest half (or
    /// [`ConsumerDriver::poll`], which drains, ingests, then calls this). Call it again at
    /// [`next_timer`](Self::next_timer) or when the ingest half decided a request.
    /// Returns the ready requests taken.
    #[must_use = "the ready requests taken: what a caller timing the hand-off counts"]
    pub fn poll<T: Transport>(&mut self, transport: &mut T, now: Instant) -> usize {
        self.state.now = self.state.now.max(now);
        for name in std::mem::take(&mut self.state.send_failed) {
            self.gone(&name);
        }
        while let Some(gone) = transport.peer_gone() {
            if let GonePeer::Agent(name) = gone {
                tracing::warn!(agent = %name, cause = "peer_gone", "producer disconnected");
                self.state.counters.disconnects += 1;
                self.gone(&name);
            }
        }
        let taken = self.take_ready();
        self.advance(self.state.now);
        self.heartbeat_if_due(transport);
        taken
    }

    /// Advances the core's clock to `now` (deadlines, quarantines).
    pub fn advance(&mut self, now: Instant) {
        self.state.now = self.state.now.max(now);
        let now = self.state.now;
        // The driver's clock only moves forward: `advance` cannot refuse it.
        let _ = self.engine.advance(now);
        self.take_queued();
    }

    /// The next decision for the engine.
    #[must_use = "an event taken and dropped is lost: its blocks are never decoded or reused"]
    pub fn poll_event(&mut self) -> Option<ConsumerEvent> {
        self.state.events.pop_front()
    }

    /// Decisions queued and not yet taken with [`poll_event`](Self::poll_event).
    pub fn pending_events(&self) -> usize {
        self.state.events.len()
    }

    /// Requests registered and not yet released (quarantined ones included).
    pub fn in_flight(&self) -> usize {
        self.state.inflight.len()
    }

    /// Whether the core's table is full: a registration now would be refused
    /// ([`RegisterErrorKind::Full`](kvdrain::RegisterErrorKind::Full)).
    pub fn is_full(&self) -> bool {
        !self.engine.has_room()
    }

    /// The earliest monotonic time at which [`poll`](Self::poll) has work that no new
    /// input brings: a producer whose send failed is to be reported gone (now), a heartbeat
    /// round is due (while any request is tracked), or a core deadline, quarantine or
    /// settling ends ([`Engine::next_timer`]; a lost producer's edges settle in the core).
    /// `None` when only new input (a notification, a registration, an abort, a producer
    /// seen gone) can change anything. An engine thread may sleep until then or until
    /// the ingest half decides a request, whichever comes first; a loop on one thread,
    /// until then or the next notification.
    #[must_use = "when the next poll has work: sleep until then or the next input"]
    pub fn next_timer(&self) -> Option<Instant> {
        let st = &*self.state;
        let gone = (!st.send_failed.is_empty()).then_some(st.now);
        [gone, self.next_heartbeat(), self.engine.next_timer()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Sends one notification; `false` if it could not be queued. A peer whose send
    /// fails with [`SendError::PeerGone`] is sent nothing more and is reported gone to
    /// the core at the start of the next poll.
    fn send<T: Transport>(&mut self, transport: &mut T, agent: &str, msg: &[u8]) -> bool {
        if self.state.disconnected.contains(agent) {
            return false;
        }
        match transport.send_notification(Peer::Agent(agent), msg) {
            Ok(()) => true,
            Err(SendError::PeerGone) => {
                tracing::warn!(agent, cause = "peer_gone", "producer disconnected");
                self.state.counters.disconnects += 1;
                self.state.disconnected.insert(agent.to_owned());
                self.state.send_failed.push(agent.to_owned());
                false
            }
            Err(SendError::Unreachable | SendError::Stale) => false,
        }
    }
}
