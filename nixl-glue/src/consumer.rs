//! The consumer (D) pump of one D rank over real NIXL: the shared
//! [`kvdrain_driver::consumer::ConsumerDriver`] driven through
//! [`NixlConsumerTransport`], its decisions handed to the engine's [`BlockRelease`] hooks.
//! Every protocol rule (directory, registration from the topology, heartbeats, unreached
//! and lost producers, fences) is the driver's; this file loads metadata, moves bytes, reads the
//! clock and measures notification → decision latency.
//!
//! Two ways to run it: [`Consumer::poll`] drains and decides on the caller's thread;
//! [`Consumer::with_pump_thread`] starts a pump thread that drains NIXL notifications into
//! the driver's lock-free ingest half while the caller's thread is the engine thread
//! ([`EngineSide`]: registrations, aborts, fences, clock, heartbeats, decisions) — the
//! design the core was built and loom-checked for (`Ledger::split`). The pump wakes the
//! engine thread (`Thread::unpark`) after every batch that decided a request, so an engine
//! loop with nothing else to do waits in [`EngineSide::wait`] instead of spinning or
//! sleeping, and pulls each decision as soon as it is published.
//!
//! Latency, per deciding notification: [`Consumer::ingest_latency`] (drained → decided in
//! the ingest half), [`Consumer::handoff_latency`] (decided → pulled by the engine thread)
//! and [`Consumer::latency`] (drained → pulled, the sum).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError, mpsc};
use std::time::{Duration, Instant};

use kvdrain::{AbortError, BlockHandle, Noticed, Outstanding, Quarantined};
use kvdrain_driver::consumer::{ConsumerDriver, ConsumerEngine, ConsumerEvent};

use crate::agent::{AgentError, UcxAgent};
use crate::metrics::Latency;
use crate::transport::NixlConsumerTransport;

pub use kvdrain_driver::consumer::{
    ConsumerConfig, ConsumerCounters, PollReport, ProducerEngine, PushRequest, PushedRequest,
    Registered,
};

/// The engine's side of the decisions: where blocks go.
pub trait BlockRelease {
    /// `completed`: every write landed; the blocks now belong to the running request.
    fn decode(&mut self, request: &PushedRequest, blocks: BlockHandle);
    /// The blocks of a request that did not complete are safe to reuse (after `failed`,
    /// `expired` or an abort). `forced`: the quarantine ran out with writes outstanding.
    fn release(&mut self, request: &PushedRequest, blocks: BlockHandle, forced: bool);
    /// `failed`: a producer reported a failed write, was seen gone, or was fenced; apply
    /// the KV load failure policy now. [`release`](Self::release) follows (once the
    /// failure has settled).
    fn failed(&mut self, request: &PushedRequest) {
        let _ = request;
    }
    /// `expired`: the deadline passed with `outstanding` writes owed; the request fails for
    /// the client now, its blocks come back later through [`release`](Self::release).
    fn expired(&mut self, request: &PushedRequest, outstanding: Outstanding) {
        let _ = (request, outstanding);
    }
}

/// Failure of a consumer operation.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
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
            agent,
        }
    }

    /// The agent.
    pub fn agent(&self) -> &UcxAgent {
        &self.agent
    }

    /// The driver's clock: ms since `epoch` (where this side reads its clock).
    fn now(&self) -> kvdrain::Instant {
        kvdrain::Instant::from_millis(
            u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX),
        )
    }

    /// Loads the metadata of every rank of a producer engine (notification-only, as vLLM's
    /// `notif_agents_only`: no descriptors) and names its agents. `rank_metadata` is in
    /// `(pp_stage, tp_rank)` order; `engine.agents` is filled from the loaded names.
    ///
    /// # Errors
    /// [`ConsumerError`] if a metadata blob does not load or the names do not fit.
    pub fn add_producer_engine(
        &mut self,
        mut engine: ProducerEngine,
        rank_metadata: &[Vec<u8>],
    ) -> Result<&ProducerEngine, ConsumerError> {
        engine.agents.clear();
        for md in rank_metadata {
            engine.agents.push(self.agent.load_remote_metadata(md)?);
        }
        Ok(self.driver.add_producer_engine(engine)?)
    }

    /// Tracks `request` in the core, then sends `PUSH_REG` to every agent of its producer
    /// engine.
    ///
    /// # Errors
    /// [`ConsumerError::Driver`] (with the blocks, if the core refused); nothing was sent.
    pub fn register(&mut self, request: PushRequest<'_>) -> Result<Registered, ConsumerError> {
        let now = self.now();
        let mut transport = NixlConsumerTransport {
            agent: &self.agent,
            drain_error: None,
        };
        Ok(self.driver.register(&mut transport, request, now)?)
    }

    /// The engine gives up on request `id`: over for the client now, heartbeats stop, its
    /// blocks come back through [`BlockRelease::release`] once no write can land.
    ///
    /// # Errors
    /// [`AbortError`] if the request is unknown or already decided.
    pub fn abort(&mut self, id: &str) -> Result<Quarantined, AbortError> {
        self.driver.abort(id)
    }

    /// The control plane saw producer agent `name` go away (died, connection reset,
    /// metadata invalidated): report it gone to the core now; its edges fail at once and
    /// their blocks settle for `settle_ms`, since bytes it had already handed to UCX keep
    /// landing. Returns the edges resolved.
    pub fn gone_producer(&mut self, name: &str, release: &mut impl BlockRelease) -> u32 {
        let resolved = self.driver.gone_producer(name);
        self.deliver(release);
        resolved
    }

    /// The transport proves that producer agent `name` can no longer write here (nothing
    /// of it in flight, none of it can land): fence it in the core now, without settling.
    /// A peer merely seen gone is [`gone_producer`](Self::gone_producer). Returns the edges
    /// resolved.
    pub fn fence_producer(&mut self, name: &str, release: &mut impl BlockRelease) -> u32 {
        let resolved = self.driver.fence_producer(name);
        self.deliver(release);
        resolved
    }

    /// One round: notifications (deciding at once, latency measured), fences, clock,
    /// heartbeats.
    ///
    /// # Errors
    /// [`AgentError`] if draining notifications failed (nothing was lost from the core).
    pub fn poll(&mut self, release: &mut impl BlockRelease) -> Result<PollReport, AgentError> {
        let batch = self.agent.drain_notifications()?;
        let received = Instant::now();
        for (sender, bytes) in &batch {
            if let Ok(Noticed::Decided) = self.driver.ingest(sender, bytes) {
                self.latency.record(received.elapsed());
            }
        }
        let decided_by_notices = self.pending_events();
        let now = self.now();
        let mut transport = NixlConsumerTransport {
            agent: &self.agent,
            drain_error: None,
        };
        let polled = self.driver.poll(&mut transport, now);
        let drain_error = transport.drain_error.take();
        let mut report = match polled {
            Ok(report) => report,
            Err(_) => return Err(drain_error.unwrap_or_else(|| self.drain_failed())),
        };
        report.notifications += batch.len();
        report.decisions += decided_by_notices;
        self.deliver(release);
        Ok(report)
    }

    /// Runs `body` as the engine thread while a pump thread drains NIXL notifications into
    /// the driver's ingest half (no lock between them); the pump stops when `body` returns
    /// (or panics). Notification → decision latency is measured from the pump's drain to
    /// the engine thread taking the decision, and split at the decision point. After each
    /// batch that decided a request the pump unparks the thread that called this (the
    /// engine thread): [`EngineSide::wait`] returns.
    pub fn with_pump_thread<R>(&mut self, body: impl FnOnce(&mut EngineSide<'_, N, E>) -> R) -> R {
        let stop = AtomicBool::new(false);
        let pump_error = Mutex::new(None);
        let published = AtomicU64::new(0);
        let (stamps_tx, stamps) = mpsc::channel::<Stamp>();
        let nixl = self.agent.agent();
        let name = self.agent.name();
        let engine_thread = std::thread::current();
        let (mut ingest, engine) = self.driver.split();
        std::thread::scope(|s| {
            let (stop, error, published) = (&stop, &pump_error, &published);
            let ingest_latency = &mut self.ingest_latency;
            s.spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    let batch = match crate::agent::drain_notifications(nixl, name) {
                        Ok(batch) => batch,
                        Err(e) => {
                            *error.lock().unwrap_or_else(PoisonError::into_inner) = Some(e);
                            return;
                        }
                    };
                    let received = Instant::now();
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

    fn drain_failed(&self) -> AgentError {
        AgentError::Nixl {
            agent: self.agent.name().to_owned(),
            op: "get_notifications",
            source: nixl_sys::NixlError::BackendError,
        }
    }

    fn pending_events(&self) -> usize {
        self.driver.pending_events()
    }

    fn deliver(&mut self, release: &mut impl BlockRelease) {
        while let Some(event) = self.driver.poll_event() {
            match event {
                ConsumerEvent::Decode { request, blocks } => release.decode(&request, blocks),
                ConsumerEvent::Failed { request } => release.failed(&request),
                ConsumerEvent::Expired {
                    request,
                    outstanding,
                } => release.expired(&request, outstanding),
                ConsumerEvent::Release {
                    request,
                    blocks,
                    forced,
                } => release.release(&request, blocks, forced),
            }
        }
    }

    /// Requests registered and not yet released (quarantined ones included).
    pub fn in_flight(&self) -> usize {
        self.driver.in_flight()
    }

    /// The core's counters.
    pub fn core_counters(&self) -> kvdrain::Counters {
        self.driver.core_counters()
    }

    /// The driver's counters.
    pub fn counters(&self) -> ConsumerCounters {
        self.driver.counters()
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
/// ([`Consumer::with_pump_thread`]).
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

impl<const N: usize, const E: usize> EngineSide<'_, N, E> {
    /// The driver's clock: ms since `epoch` (where this side reads its clock).
    fn now(&self) -> kvdrain::Instant {
        kvdrain::Instant::from_millis(
            u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX),
        )
    }

    /// As [`Consumer::register`].
    ///
    /// # Errors
    /// As [`Consumer::register`].
    pub fn register(&mut self, request: PushRequest<'_>) -> Result<Registered, ConsumerError> {
        let now = self.now();
        let mut transport = NixlConsumerTransport {
            agent: self.agent,
            drain_error: None,
        };
        Ok(self.engine.register(&mut transport, request, now)?)
    }

    /// As [`Consumer::abort`].
    ///
    /// # Errors
    /// As [`Consumer::abort`].
    pub fn abort(&mut self, id: &str) -> Result<Quarantined, AbortError> {
        self.engine.abort(id)
    }

    /// As [`Consumer::gone_producer`].
    pub fn gone_producer(&mut self, name: &str, release: &mut impl BlockRelease) -> u32 {
        let resolved = self.engine.gone_producer(name);
        self.deliver(release);
        resolved
    }

    /// As [`Consumer::fence_producer`].
    pub fn fence_producer(&mut self, name: &str, release: &mut impl BlockRelease) -> u32 {
        let resolved = self.engine.fence_producer(name);
        self.deliver(release);
        resolved
    }

    /// One engine round: decisions the pump made ready (latency recorded), fences, clock,
    /// heartbeats; then the decisions go to `release`. Returns the decisions delivered.
    pub fn poll(&mut self, release: &mut impl BlockRelease) -> usize {
        self.seen = self.published.load(Ordering::Acquire);
        let now = self.now();
        let mut transport = NixlConsumerTransport {
            agent: self.agent,
            drain_error: None,
        };
        let taken = self.engine.poll(&mut transport, now);
        let pulled = Instant::now();
        for stamp in self.stamps.try_iter().take(taken) {
            self.latency.record(pulled.duration_since(stamp.received));
            self.handoff_latency
                .record(pulled.duration_since(stamp.decided));
        }
        self.deliver(release)
    }

    /// Waits until the pump has published a decision since the last
    /// [`poll`](Self::poll), or until `timeout` passed, or until another thread unparks
    /// this one (a wake-up for other work): spins briefly, then parks. Call it from the
    /// engine thread (the one that called [`Consumer::with_pump_thread`]) when a round
    /// found nothing to do; a decision published between that round and this call is not
    /// missed (the wake-up is a park token).
    pub fn wait(&mut self, timeout: Duration) {
        const SPINS: u32 = 64;
        for _ in 0..SPINS {
            if self.published.load(Ordering::Acquire) != self.seen {
                return;
            }
            std::hint::spin_loop();
        }
        std::thread::park_timeout(timeout);
    }

    fn deliver(&mut self, release: &mut impl BlockRelease) -> usize {
        let mut n = 0;
        while let Some(event) = self.engine.poll_event() {
            n += 1;
            match event {
                ConsumerEvent::Decode { request, blocks } => release.decode(&request, blocks),
                ConsumerEvent::Failed { request } => release.failed(&request),
                ConsumerEvent::Expired {
                    request,
                    outstanding,
                } => release.expired(&request, outstanding),
                ConsumerEvent::Release {
                    request,
                    blocks,
                    forced,
                } => release.release(&request, blocks, forced),
            }
        }
        n
    }

    /// Requests registered and not yet released (quarantined ones included).
    pub fn in_flight(&self) -> usize {
        self.engine.in_flight()
    }

    /// Why the pump thread stopped early, if it did (a drain error).
    pub fn pump_error(&mut self) -> Option<AgentError> {
        self.pump_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}
