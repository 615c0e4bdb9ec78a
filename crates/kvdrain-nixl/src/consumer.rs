//! The consumer (D) pump of one D rank over real NIXL: the shared
//! [`kvdrain_driver::consumer::ConsumerDriver`] driven through
//! [`NixlConsumerTransport`], its decisions handed to the engine's [`BlockRelease`] hooks.
//! Every protocol rule (directory, registration from the topology, heartbeats, unreached
//! and lost producers, fences) is the driver's; this file loads metadata, moves bytes, reads the
//! clock and measures notification → decision latency.
//!
//! It does not wrap the driver's methods: registration, aborts and lost producers are the
//! driver's engine half ([`ConsumerEngine`]), handed out with the NIXL transport it sends
//! through ([`Consumer::engine`], [`EngineSide::engine`]); counters are the driver's
//! ([`Consumer::driver`]). What is the glue's own: the agent and its metadata, the clock,
//! the round that times each decision, handing decisions to [`BlockRelease`] ([`deliver`]),
//! and the pump thread.
//!
//! Two ways to run it: [`Consumer::poll`] drains and decides on the caller's thread;
//! [`Consumer::with_pump_thread`] starts a pump thread that drains NIXL notifications into
//! the driver's lock-free ingest half while the caller's thread is the engine thread
//! ([`EngineSide`]: the engine half, its rounds, and waiting for the next one) — the
//! design the core was built and loom-checked for (`Ledger::split`). The pump wakes the
//! engine thread (`Thread::unpark`) after every batch that decided a request, so an engine
//! loop with nothing else to do waits in [`EngineSide::wait`] — until that wake-up or the
//! engine half's next wakeup (a heartbeat, a deadline, a settle or quarantine end) —
//! instead of spinning or sleeping a guessed timeout, and pulls each decision as soon as
//! it is published.
//!
//! Latency, per deciding notification: [`Consumer::ingest_latency`] (drained → decided in
//! the ingest half), [`Consumer::handoff_latency`] (decided → pulled by the engine thread)
//! and [`Consumer::latency`] (drained → pulled, the sum).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError, mpsc};
use std::time::{Duration, Instant};

use kvdrain::{BlockHandle, Noticed, Outstanding};
use kvdrain_driver::consumer::{ConsumerDriver, ConsumerEvent};

use crate::agent::{AgentError, UcxAgent};
use crate::metrics::Latency;
use crate::transport::NixlConsumerTransport;

pub use kvdrain_driver::consumer::{
    ConsumerConfig, ConsumerCounters, ConsumerEngine, DecisionRecord, EdgeMode, EdgeRecord,
    PollReport, ReceiveSpec, RecordEdges, Registered, RemoteProducer, TrackedRequest,
};

/// The engine's side of the decisions: where blocks go.
pub trait BlockRelease {
    /// `completed`: every write landed; the blocks now belong to the running request.
    fn decode(&mut self, request: &TrackedRequest, blocks: BlockHandle);
    /// The blocks of a request that did not complete are safe to reuse (after `failed`,
    /// `expired` or an abort). `forced`: the quarantine ran out with writes outstanding.
    fn release(&mut self, request: &TrackedRequest, blocks: BlockHandle, forced: bool);
    /// `failed`: a producer reported a failed write, was seen gone, or was fenced; apply
    /// the KV load failure policy now. [`release`](Self::release) follows (once the
    /// failure has settled).
    fn failed(&mut self, request: &TrackedRequest) {
        let _ = request;
    }
    /// `expired`: the deadline passed with `outstanding` writes owed; the request fails for
    /// the client now, its blocks come back later through [`release`](Self::release).
    fn expired(&mut self, request: &TrackedRequest, outstanding: Outstanding) {
        let _ = (request, outstanding);
    }
    /// What happened to the request ([`DecisionRecord`]: its edges by producer agent and
    /// how each resolved, its failure, deadline, settle end and release), handed just
    /// before each of the calls above for the same decision. For a log line of every
    /// request that did not complete, or an operator's view.
    fn record(&mut self, request: &TrackedRequest, record: &DecisionRecord) {
        let _ = (request, record);
    }
}

/// Failure of a [`Consumer`] operation: NIXL's, or the driver's
/// ([`ConsumerError`](kvdrain_driver::consumer::ConsumerError)).
#[derive(Debug, thiserror::Error)]
pub enum NixlConsumerError {
    /// A NIXL call failed.
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// The driver refused (unknown engine, topology, full directory, core refusal).
    #[error(transparent)]
    Driver(#[from] kvdrain_driver::consumer::ConsumerError),
}

/// The D-side pump of one consumer rank over real NIXL. `N`: requests tracked at once (a
/// power of two); `E`: producers per request.
#[derive(Debug)]
pub struct Consumer<const N: usize, const E: usize = 8> {
    driver: ConsumerDriver<N, E>,
    epoch: Instant,
    latency: Latency,
    ingest_latency: Latency,
    handoff_latency: Latency,
    /// When each deciding notice of the current [`poll`](Self::poll) was decided.
    decided_at: Vec<Instant>,
    // Last: dropped after everything that refers to its remote agents.
    agent: UcxAgent,
}

impl<const N: usize, const E: usize> Consumer<N, E> {
    /// A consumer for `agent` (whose KV memory is registered already).
    pub fn new(agent: UcxAgent, config: ConsumerConfig) -> Self {
        Consumer {
            driver: ConsumerDriver::new(config),
            epoch: Instant::now(),
            latency: Latency::default(),
            ingest_latency: Latency::default(),
            handoff_latency: Latency::default(),
            decided_at: Vec::new(),
            agent,
        }
    }

    /// The agent.
    pub fn agent(&self) -> &UcxAgent {
        &self.agent
    }

    /// The clock the driver runs on: ms since this consumer was made (monotonic), as the
    /// drivers' [`Instant`](kvdrain::Instant). Read it before taking the
    /// [`engine`](Self::engine) half, which borrows the consumer.
    pub fn now(&self) -> kvdrain::Instant {
        kvdrain::Instant::from_millis(ms_since(self.epoch))
    }

    /// The driver (its counters, the core's counters, its configuration).
    pub fn driver(&self) -> &ConsumerDriver<N, E> {
        &self.driver
    }

    /// Loads the metadata of every rank of a producer engine (notification-only, as vLLM's
    /// `notif_agents_only`: no descriptors) and names its agents. `rank_metadata` is in
    /// `(pp_stage, tp_rank)` order; `engine.agents` is filled from the loaded names.
    ///
    /// # Errors
    /// [`NixlConsumerError`] if a metadata blob does not load or the names do not fit.
    pub fn add_producer_engine(
        &mut self,
        mut engine: RemoteProducer,
        rank_metadata: &[Vec<u8>],
    ) -> Result<&RemoteProducer, NixlConsumerError> {
        engine.agents.clear();
        for md in rank_metadata {
            engine.agents.push(self.agent.load_remote_metadata(md)?);
        }
        Ok(self.driver.add_producer_engine(engine)?)
    }

    /// The driver's engine half on this thread, with the NIXL transport it sends through:
    /// [`register`](ConsumerEngine::register) a request (at [`now`](Self::now)),
    /// [`abort`](ConsumerEngine::abort) one,
    /// [`gone`](ConsumerEngine::gone) when the control plane saw a
    /// producer go away (died, connection reset, metadata invalidated: its edges fail at
    /// once and settle, since bytes it had handed to UCX keep landing),
    /// [`fence`](ConsumerEngine::fence) only when NIXL proves nothing
    /// more of it can land. The decisions these queue reach [`BlockRelease`] at the next
    /// [`poll`](Self::poll), or at once through [`deliver`].
    pub fn engine(&mut self) -> (ConsumerEngine<'_, N, E>, NixlConsumerTransport<'_>) {
        (
            self.driver.engine(),
            NixlConsumerTransport::new(&self.agent),
        )
    }

    /// One round on this thread ([`ConsumerDriver::poll`]): notifications (deciding at
    /// once, latency measured from the drain), lost producers, clock, heartbeats; then
    /// the decisions go to `release`.
    ///
    /// # Errors
    /// [`AgentError`] if draining notifications failed (nothing was lost from the core);
    /// the rest of the round ran and its decisions were delivered.
    pub fn poll(&mut self, release: &mut impl BlockRelease) -> Result<PollReport, AgentError> {
        let now = self.now();
        let mut transport = NixlConsumerTransport::new(&self.agent);
        let decided_at = &mut self.decided_at;
        decided_at.clear();
        let polled = self
            .driver
            .poll_observed(&mut transport, now, |_, _, noticed| {
                if let Ok(Noticed::Decided) = noticed {
                    decided_at.push(Instant::now());
                }
            });
        // Each decision timed from the drain's return, as the pump thread does.
        if let Some(drained) = transport.drained_at {
            for &at in &self.decided_at {
                self.latency.record(at.duration_since(drained));
            }
        }
        let drain_error = transport.drain_error.take();
        deliver(&mut self.driver.engine(), release);
        // The round ran in full and its decisions are delivered; then the drain's failure.
        polled.map_err(|_| drain_error.unwrap_or_else(|| drain_failed(&self.agent)))
    }

    /// Runs `body` as the engine thread while a pump thread drains NIXL notifications into
    /// the driver's ingest half (no lock between them); the pump stops when `body` returns
    /// (or panics). Notification → decision latency is measured from the pump's drain to
    /// the engine thread taking the decision, and split at the decision point. After each
    /// batch that decided a request, and when it stops on a drain error, the pump unparks
    /// the thread that called this (the engine thread): [`EngineSide::wait`] returns.
    pub fn with_pump_thread<R>(&mut self, body: impl FnOnce(&mut EngineSide<'_, N, E>) -> R) -> R {
        let stop = AtomicBool::new(false);
        let pump_error = Mutex::new(None);
        let published = AtomicU64::new(0);
        let (stamps_tx, stamps) = mpsc::channel::<Stamp>();
        let nixl = self.agent.agent();
        let name = self.agent.name();
        let engine_thread = std::thread::current();
        let (mut ingest, engine) = self.driver.split();
        let epoch = self.epoch;
        std::thread::scope(|s| {
            let (stop, error, published) = (&stop, &pump_error, &published);
            let ingest_latency = &mut self.ingest_latency;
            s.spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    let batch = match crate::agent::drain_notifications(nixl, name) {
                        Ok(batch) => batch,
                        Err(e) => {
                            *error.lock().unwrap_or_else(PoisonError::into_inner) = Some(e);
                            // An engine thread waiting for the pump hears of it now.
                            engine_thread.unpark();
                            return;
                        }
                    };
                    let received = Instant::now();
                    // The batch's failure notices settle from now, on the driver's clock,
                    // not from the engine thread's last round (rule 8).
                    ingest.set_arrival(kvdrain::Instant::from_millis(ms_since(epoch)));
                    let mut decided_any = false;
                    for (sender, bytes) in &batch {
                        if let Ok(Noticed::Decided) = ingest.ingest(sender, bytes) {
                            let decided = Instant::now();
                            ingest_latency.record(decided.duration_since(received));
                            // The engine side is gone only after the pump stopped.
                            let _ = stamps_tx.send(Stamp { received, decided });
                            decided_any = true;
                        }
                    }
                    if decided_any {
                        published.fetch_add(1, Ordering::Release);
                        engine_thread.unpark();
                    }
                    if batch.is_empty() {
                        std::thread::yield_now();
                    }
                }
            });
            let guard = StopOnDrop(stop);
            let mut side = EngineSide {
                engine,
                agent: &self.agent,
                epoch: self.epoch,
                latency: &mut self.latency,
                handoff_latency: &mut self.handoff_latency,
                stamps,
                published,
                seen: 0,
                pump_error: error,
            };
            let result = body(&mut side);
            drop(guard);
            result
        })
    }

    /// Notification → decision latency of every decided notice (to the decision handed
    /// out by the engine side).
    pub fn latency(&mut self) -> &mut Latency {
        &mut self.latency
    }

    /// With a pump thread: drain → decision point in the ingest half, per deciding notice
    /// (kvdrain's own part of [`latency`](Self::latency); the rest is the hand-off to the
    /// engine thread).
    pub fn ingest_latency(&mut self) -> &mut Latency {
        &mut self.ingest_latency
    }

    /// With a pump thread: decision point in the ingest half → decision pulled by the
    /// engine thread, per deciding notice (the hand-off between the two threads).
    pub fn handoff_latency(&mut self) -> &mut Latency {
        &mut self.handoff_latency
    }
}

/// When the pump drained a deciding notification and when the ingest half decided.
#[derive(Clone, Copy, Debug)]
struct Stamp {
    received: Instant,
    decided: Instant,
}

/// Stops the pump however the engine thread leaves the scope.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// The engine thread's view of a [`Consumer`] while its pump thread runs
/// ([`Consumer::with_pump_thread`]): the driver's engine half, the rounds that time the
/// hand-off of each decision, and the wait for the next round.
#[derive(Debug)]
pub struct EngineSide<'a, const N: usize, const E: usize> {
    engine: ConsumerEngine<'a, N, E>,
    agent: &'a UcxAgent,
    epoch: Instant,
    latency: &'a mut Latency,
    handoff_latency: &'a mut Latency,
    stamps: mpsc::Receiver<Stamp>,
    /// Batches the pump decided a request in (it unparks the engine thread after each).
    published: &'a AtomicU64,
    /// `published` as of the last [`poll`](EngineSide::poll).
    seen: u64,
    pump_error: &'a Mutex<Option<AgentError>>,
}

impl<'a, const N: usize, const E: usize> EngineSide<'a, N, E> {
    /// The clock the driver runs on (as [`Consumer::now`]).
    pub fn now(&self) -> kvdrain::Instant {
        kvdrain::Instant::from_millis(ms_since(self.epoch))
    }

    /// The driver's engine half, with the NIXL transport it sends through (as
    /// [`Consumer::engine`]): register, abort, report lost or fenced producers. Take the
    /// rounds with [`poll`](Self::poll), which times the hand-off of the decisions the
    /// pump made ready, not with the half's own `poll`.
    pub fn engine(&mut self) -> (&mut ConsumerEngine<'a, N, E>, NixlConsumerTransport<'a>) {
        (&mut self.engine, NixlConsumerTransport::new(self.agent))
    }

    /// One engine round: decisions the pump made ready (latency recorded), lost producers,
    /// clock, heartbeats; then the decisions go to `release`. Returns the decisions
    /// delivered.
    pub fn poll(&mut self, release: &mut impl BlockRelease) -> usize {
        self.seen = self.published.load(Ordering::Acquire);
        let now = self.now();
        let mut transport = NixlConsumerTransport::new(self.agent);
        let taken = self.engine.poll(&mut transport, now);
        let pulled = Instant::now();
        for stamp in self.stamps.try_iter().take(taken) {
            self.latency.record(pulled.duration_since(stamp.received));
            self.handoff_latency
                .record(pulled.duration_since(stamp.decided));
        }
        deliver(&mut self.engine, release)
    }

    /// Waits until the next round has work: the pump has published a decision since the
    /// last [`poll`](Self::poll), or the engine half's
    /// [`next_timer`](ConsumerEngine::next_timer) came (a heartbeat, a producer to
    /// report gone, a deadline, a settle or quarantine end), or another thread unparks
    /// this one (a wake-up for other work, or the pump stopping on an error). Spins
    /// briefly, then parks; with nothing tracked it parks until woken. Call it from the
    /// engine thread (the one that called [`Consumer::with_pump_thread`]) when a round
    /// found nothing to do; a decision published between that round and this call is not
    /// missed (the wake-up is a park token). It may return early (a spurious wake-up):
    /// poll, then wait again.
    pub fn wait(&mut self) {
        self.wait_for(None);
    }

    /// [`wait`](Self::wait), returning at `also` at the latest: for an engine thread with
    /// work of its own due then (producers it ticks, whose agents must be polled).
    pub fn wait_until(&mut self, also: Instant) {
        self.wait_for(Some(also));
    }

    fn wait_for(&mut self, also: Option<Instant>) {
        const SPINS: u32 = 64;
        for _ in 0..SPINS {
            if self.published.load(Ordering::Acquire) != self.seen {
                return;
            }
            std::hint::spin_loop();
        }
        // Due at `at` on the driver's clock: once `at` whole ms have passed since the
        // epoch, `now` reads at least `at`.
        let wakeup = self
            .engine
            .next_timer()
            .map(|at| self.epoch + Duration::from_millis(at.millis()));
        match wakeup.into_iter().chain(also).min() {
            Some(due) => {
                let left = due.saturating_duration_since(Instant::now());
                if !left.is_zero() {
                    std::thread::park_timeout(left);
                }
            }
            None => std::thread::park(),
        }
    }

    /// Why the pump thread stopped early, if it did (a drain error).
    pub fn pump_error(&mut self) -> Option<AgentError> {
        self.pump_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

/// Hands every decision the engine half has queued to `release`, in order; returns how
/// many.
pub fn deliver<const N: usize, const E: usize>(
    engine: &mut ConsumerEngine<'_, N, E>,
    release: &mut impl BlockRelease,
) -> usize {
    let mut n = 0;
    while let Some(event) = engine.poll_event() {
        n += 1;
        release.record(event.request(), event.record());
        match event {
            ConsumerEvent::Decode {
                request, blocks, ..
            } => release.decode(&request, blocks),
            ConsumerEvent::Failed { request, .. } => release.failed(&request),
            ConsumerEvent::Expired {
                request,
                outstanding,
                ..
            } => release.expired(&request, outstanding),
            ConsumerEvent::Release {
                request,
                blocks,
                forced,
                ..
            } => release.release(&request, blocks, forced),
        }
    }
    n
}

/// Ms since `epoch`, the driver's clock.
fn ms_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// A drain failure whose NIXL error the transport did not keep.
fn drain_failed(agent: &UcxAgent) -> AgentError {
    AgentError::Nixl {
        agent: agent.name().to_owned(),
        op: "get_notifications",
        source: nixl_sys::NixlError::BackendError,
    }
}
