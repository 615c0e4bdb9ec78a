//! The demo over real NIXL: three agents (two producer ranks, one consumer rank) in this
//! process, each with its own UCX backend and DRAM block pool, driven by the real pusher and
//! pump ([`kvdrain_nixl`]).
//!
//! Threads (default): the producers (both P ranks: write the source blocks, offer, tick)
//! on their own thread, as P runs on another node; D's pump thread drains NIXL
//! notifications into the ingest half; the engine thread (this one) starts requests,
//! pulls decisions and checks the bytes, and when a round finds nothing to do waits in
//! [`EngineSide::wait`] until the pump publishes a decision, the producers free a slot, or
//! the consumer driver has work due (a heartbeat, a deadline), so a decision is pulled as
//! soon as it is published and no wait is a guessed timeout. With `--no-pump-thread` one loop
//! does all of it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::thread::Thread;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use kvdrain::{BlockHandle, Outstanding};
use kvdrain_nixl::consumer::{BlockRelease, Consumer, EngineSide, ReceiveSpec, TrackedRequest};
use kvdrain_nixl::handshake::StaticHandshake;
use kvdrain_nixl::pool::DramPool;
use kvdrain_nixl::producer::{Fault, FaultInjector, Offer, Pusher, SourceBlocks};
use kvdrain_nixl::testbed::{P_ENGINE, Testbed, TestbedConfig};

use super::report::latency_histogram;
use super::{Options, P_TP, Percentiles, Progress, Summary, pattern};

/// The consumer as the demo's loop drives it: on the loop's thread, or as the engine side
/// of a two-thread pump.
trait Pump {
    fn register(&mut self, request: ReceiveSpec<'_>) -> Result<(), String>;
    /// One round; whether anything happened.
    fn step(&mut self, d: &mut DecodeSide<'_>) -> Result<bool, String>;
    /// Nothing happened in a round: wait for something to do.
    fn idle(&mut self);
}

impl<const N: usize> Pump for Consumer<N> {
    fn register(&mut self, request: ReceiveSpec<'_>) -> Result<(), String> {
        let now = self.now();
        let (mut engine, mut nixl) = self.engine();
        engine
            .register(&mut nixl, request, now)
            .map(drop)
            .map_err(|e| e.to_string())
    }
    fn step(&mut self, d: &mut DecodeSide<'_>) -> Result<bool, String> {
        self.poll(d)
            .map(|r| r.notifications > 0)
            .map_err(|e| e.to_string())
    }
    fn idle(&mut self) {
        // The same loop drains NIXL and ticks the producers: it cannot sleep.
        std::thread::yield_now();
    }
}

impl<const N: usize, const E: usize> Pump for EngineSide<'_, N, E> {
    fn register(&mut self, request: ReceiveSpec<'_>) -> Result<(), String> {
        let now = self.now();
        let (engine, mut nixl) = self.engine();
        engine
            .register(&mut nixl, request, now)
            .map(drop)
            .map_err(|e| e.to_string())
    }
    fn step(&mut self, d: &mut DecodeSide<'_>) -> Result<bool, String> {
        if let Some(e) = self.pump_error() {
            return Err(format!("pump thread: {e}"));
        }
        Ok(self.poll(d) > 0)
    }
    fn idle(&mut self) {
        // Woken by the pump (a decision), the producers (a free slot, or their thread
        // stopping), or the driver's next wakeup (a heartbeat, a deadline, a quarantine
        // end), whichever comes first.
        self.wait();
    }
}

/// A run stops waiting after this long without any decision.
const STALL: Duration = Duration::from_secs(60);

/// Engine-side bookkeeping: which request holds which slot, and how many of its three
/// owners (D, P rank 0, P rank 1) still hold the slot.
#[derive(Debug, Default)]
struct Slots {
    request: HashMap<u64, u64>,
    holders: HashMap<u64, u8>,
    free: Vec<u64>,
}

impl Slots {
    /// One owner lets go of `slot`; whether the slot is now free.
    fn put_back(&mut self, slot: u64) -> bool {
        if let Some(h) = self.holders.get_mut(&slot) {
            *h -= 1;
            if *h == 0 {
                self.holders.remove(&slot);
                self.free.push(slot);
                return true;
            }
        }
        false
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Nanoseconds since the run's start.
#[derive(Clone, Copy, Debug)]
struct Epoch(Instant);

impl Epoch {
    fn now(self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// When each request's last write was posted: the producers' fault injector is called
/// right before each post, with the P request id. Indexed by request number modulo the
/// table's length and tagged with the number, so a stale entry is never read as another
/// request's.
#[derive(Debug)]
struct PostStamps {
    tag: Box<[AtomicU64]>,
    at: Box<[AtomicU64]>,
}

impl PostStamps {
    fn new(window: usize) -> PostStamps {
        let table = || (0..4 * window).map(|_| AtomicU64::new(u64::MAX)).collect();
        PostStamps {
            tag: table(),
            at: table(),
        }
    }

    /// A write of request `n` is being posted at `now` (on the producers' thread).
    fn stamp(&self, n: u64, now: u64) {
        let i = (n % self.tag.len() as u64) as usize;
        if self.tag[i].load(Ordering::Relaxed) != n {
            self.at[i].store(now, Ordering::Relaxed);
            self.tag[i].store(n, Ordering::Release);
        } else {
            self.at[i].fetch_max(now, Ordering::Release);
        }
    }

    /// When request `n`'s last write so far was posted.
    fn get(&self, n: u64) -> Option<u64> {
        let i = (n % self.tag.len() as u64) as usize;
        (self.tag[i].load(Ordering::Acquire) == n).then(|| self.at[i].load(Ordering::Acquire))
    }
}

/// The clocks both sides stamp requests with.
#[derive(Debug)]
struct Timing {
    epoch: Epoch,
    /// When the producers offered the request in each slot (ns since `epoch`).
    offered: Box<[AtomicU64]>,
    posted: Arc<PostStamps>,
}

/// What the engine thread measures per decided request (ns).
#[derive(Debug)]
struct Measured {
    /// Offer → decision handed to the engine.
    end_to_end: Histogram<u64>,
    /// Last write posted → decision handed to the engine.
    post_to_decision: Histogram<u64>,
}

struct DecodeSide<'a> {
    pool: &'a DramPool,
    o: &'a Options,
    slots: &'a Mutex<Slots>,
    s: &'a mut Summary,
    decided: &'a mut u64,
    timing: &'a Timing,
    measured: &'a mut Measured,
}

impl DecodeSide<'_> {
    /// Request `n` in `slot` was decided (now).
    fn decided(&mut self, slot: u64, n: u64) {
        let now = self.timing.epoch.now();
        if let Some(at) = self.timing.offered.get(slot as usize) {
            let offered = at.load(Ordering::Acquire);
            self.measured
                .end_to_end
                .saturating_record(now.saturating_sub(offered));
        }
        if let Some(posted) = self.timing.posted.get(n) {
            self.measured
                .post_to_decision
                .saturating_record(now.saturating_sub(posted));
        }
        *self.decided += 1;
    }
}

impl BlockRelease for DecodeSide<'_> {
    fn decode(&mut self, _request: &TrackedRequest, blocks: BlockHandle) {
        let slot = blocks.0;
        let n = lock(self.slots)
            .request
            .get(&slot)
            .copied()
            .unwrap_or(u64::MAX);
        self.decided(slot, n);
        let p_len = self.o.block_size / usize::from(P_TP);
        let intact = (0..self.o.blocks).all(|b| {
            let got = self.pool.read(slot * self.o.blocks as u64 + b as u64);
            (0..P_TP).all(|r| {
                let at = usize::from(r) * p_len;
                got[at..at + p_len] == pattern(n, r, b, p_len)[..]
            })
        });
        self.s.corrupt += u64::from(!intact);
        self.s.completed += 1;
        lock(self.slots).put_back(slot);
    }
    fn release(&mut self, _request: &TrackedRequest, blocks: BlockHandle, forced: bool) {
        self.s.forced += u64::from(forced);
        lock(self.slots).put_back(blocks.0);
    }
    fn failed(&mut self, request: &TrackedRequest) {
        self.s.failed += 1;
        let found = lock(self.slots).request_slot(request);
        match found {
            Some((slot, n)) => self.decided(slot, n),
            None => *self.decided += 1,
        }
    }
    fn expired(&mut self, _request: &TrackedRequest, _outstanding: Outstanding) {
        self.s.expired += 1;
        *self.decided += 1;
    }
}

impl Slots {
    /// The slot and number `n` of D request `d-{n}`.
    fn request_slot(&self, request: &TrackedRequest) -> Option<(u64, u64)> {
        let n: u64 = request.id.strip_prefix("d-")?.parse().ok()?;
        self.request.iter().find_map(|(&slot, &m)| {
            (m == n && self.holders.contains_key(&slot)).then_some((slot, n))
        })
    }
}

struct SourceSide<'a> {
    slots: &'a Mutex<Slots>,
    slot_of: &'a HashMap<String, u64>,
    /// Woken when a slot becomes free (the engine thread may wait for one).
    engine: Option<&'a Thread>,
}

impl SourceBlocks for SourceSide<'_> {
    fn release(&mut self, request: &str) {
        if let Some(&slot) = self.slot_of.get(request) {
            if lock(self.slots).put_back(slot) {
                if let Some(engine) = self.engine {
                    engine.unpark();
                }
            }
        }
    }
}

fn block_ids(o: &Options, slot: u64) -> Vec<Vec<u64>> {
    let k = o.blocks as u64;
    vec![(slot * k..slot * k + k).collect()]
}

/// Both producer ranks: their pushers, source pools and the handshake they share.
struct Producers<'a> {
    o: &'a Options,
    p_len: usize,
    pushers: &'a mut Vec<Pusher>,
    pools: &'a [DramPool],
    handshake: &'a mut StaticHandshake,
    slot_of: HashMap<String, u64>,
    timing: &'a Timing,
}

impl Producers<'_> {
    /// Prefill of request `n` into `slot` is done: write its source blocks, offer them.
    fn start(&mut self, n: u64, slot: u64) -> Result<(), String> {
        let pid = format!("p-{n}");
        self.slot_of.insert(pid.clone(), slot);
        for (r, pool) in self.pools.iter().enumerate() {
            for (b, &id) in block_ids(self.o, slot)[0].iter().enumerate() {
                pool.write(id, &pattern(n, r as u16, b, self.p_len));
            }
        }
        self.timing.offered[slot as usize].store(self.timing.epoch.now(), Ordering::Release);
        for p in self.pushers.iter_mut() {
            p.offer(Offer {
                request_id: pid.clone(),
                transfer_id: None,
                block_ids: block_ids(self.o, slot),
            })
            .map_err(|e| format!("offer refused: {e}"))?;
        }
        Ok(())
    }

    /// One round of both pushers; whether anything happened.
    fn tick(&mut self, slots: &Mutex<Slots>, engine: Option<&Thread>) -> Result<bool, String> {
        let mut busy = false;
        for p in self.pushers.iter_mut() {
            let mut src = SourceSide {
                slots,
                slot_of: &self.slot_of,
                engine,
            };
            let t = p
                .tick(self.handshake, &mut src)
                .map_err(|e| format!("producer tick: {e}"))?;
            busy |= t.notifications + t.posted + t.finished + t.notices > 0;
        }
        Ok(busy)
    }

    /// Lets the producers hand back their last sources (at most 5 s).
    fn drain(&mut self, slots: &Mutex<Slots>) {
        let drain = Instant::now();
        while self.pushers.iter().any(|p| p.in_flight() > 0)
            && drain.elapsed() < Duration::from_secs(5)
        {
            let _ = self.tick(slots, None);
        }
    }

    /// The producer thread: start what the engine thread sends, tick, until `stop`.
    fn run(
        &mut self,
        starts: &mpsc::Receiver<(u64, u64)>,
        slots: &Mutex<Slots>,
        engine: &Thread,
        stop: &AtomicBool,
    ) -> Result<(), String> {
        while !stop.load(Ordering::Acquire) {
            let mut busy = false;
            for (n, slot) in starts.try_iter() {
                self.start(n, slot)?;
                busy = true;
            }
            busy |= self.tick(slots, Some(engine))?;
            if !busy {
                std::thread::yield_now();
            }
        }
        self.drain(slots);
        Ok(())
    }
}

/// Runs the demo over real NIXL.
///
/// # Errors
/// Why NIXL could not be used (the caller falls back to the in-process transport). A
/// failure after the agents are up ends the run and shows in the summary instead.
pub fn run(o: &Options) -> Result<Summary, String> {
    // The injected failures make NIXL log one error line each; keep its log to fatal errors
    // unless the user chose a level.
    let muted = std::env::var_os("NIXL_LOG_LEVEL").is_none();
    if muted {
        // SAFETY: no other thread exists yet (NIXL is not loaded; the demo spawns none), so
        // nothing reads the environment concurrently.
        unsafe { std::env::set_var("NIXL_LOG_LEVEL", "FATAL") };
    }
    let lib = kvdrain_nixl::ensure_nixl().map_err(|e| e.to_string())?;
    let p_len = o.block_size / usize::from(P_TP);
    let cfg = TestbedConfig {
        prefix: format!("kvdrain-demo-{}", std::process::id()),
        p_tp: P_TP,
        p_block_len: p_len,
        blocks: o.window * o.blocks,
        lease_ms: 30_000,
        deadline_ms: 30_000,
        quarantine_ms: 60_000,
        progress_thread: o.progress_thread,
    };
    let mut tb = Testbed::new(&cfg).map_err(|e| format!("could not set up the agents: {e}"))?;
    eprintln!(
        "kvdrain demo: P(TP=2) → D(TP=1) over real NIXL (UCX), three agents in this process\n  \
         runtime: {}\n  NIXL progress threads {}; NIXL log level {}\n  \
         {} requests × {} blocks of {} B, window {}, injected failure rate {}",
        lib.display(),
        if o.progress_thread {
            "on"
        } else {
            "off (the loop drives progress)"
        },
        if muted {
            "FATAL (set NIXL_LOG_LEVEL to change)"
        } else {
            "from NIXL_LOG_LEVEL"
        },
        o.requests,
        o.blocks,
        o.block_size,
        o.window,
        o.fail_rate
    );
    let start = Instant::now();
    let epoch = Epoch(start);
    let timing = Timing {
        epoch,
        offered: (0..o.window).map(|_| AtomicU64::new(0)).collect(),
        posted: Arc::new(PostStamps::new(o.window)),
    };
    for r in 0..P_TP {
        let opts = o.clone();
        let posted = Arc::clone(&timing.posted);
        // Called right before each post: the injected failures, and the post's time.
        let injector: FaultInjector = Box::new(move |req: &str, _d| {
            let n: u64 = req.strip_prefix("p-")?.parse().ok()?;
            posted.stamp(n, epoch.now());
            opts.fails(n, r).then_some(Fault::BadDescriptor)
        });
        tb.p.pushers[usize::from(r)].set_fault_injector(Some(injector));
    }
    let mut s = Summary {
        transport: "real NIXL (UCX), 3 agents in one process".to_owned(),
        requests: o.requests,
        ..Summary::default()
    };
    let slots = Mutex::new(Slots {
        free: (0..o.window as u64).rev().collect(),
        ..Slots::default()
    });
    let mut measured = Measured {
        end_to_end: latency_histogram(),
        post_to_decision: latency_histogram(),
    };
    let mut progress = Progress::new(o.requests);
    let mut decided = 0u64;
    let Testbed {
        p,
        d: dside,
        handshake,
        ..
    } = &mut tb;
    let mut producers = Producers {
        o,
        p_len,
        pushers: &mut p.pushers,
        pools: &p.pools,
        handshake,
        slot_of: HashMap::new(),
        timing: &timing,
    };
    let mut world = Loop {
        o,
        d_pool: &dside.pool,
        slots: &slots,
        s: &mut s,
        progress: &mut progress,
        decided: &mut decided,
        timing: &timing,
        measured: &mut measured,
    };
    let result = if o.pump_thread {
        dside
            .consumer
            .with_pump_thread(|engine| world.run_threads(engine, &mut producers))
    } else {
        let ran = world.run_one_loop(&mut dside.consumer, &mut producers);
        producers.drain(&slots);
        ran
    };
    if let Err(why) = result {
        eprintln!("kvdrain demo: stopped early: {why}");
        s.unfinished = o.requests - decided;
    }
    progress.finish();
    s.wall = start.elapsed();
    let c = tb.d.consumer.driver().core_counters();
    s.completions = c.ingest.completions;
    s.failure_notices = c.ingest.failure_notices;
    let landed: u64 = tb.p.pushers.iter().map(|p| p.counters().landed).sum();
    s.bytes = landed * (o.blocks * p_len) as u64;
    s.latency = Percentiles::of(tb.d.consumer.latency().histogram());
    let optional = |h: &Histogram<u64>| (!h.is_empty()).then(|| Percentiles::of(h));
    s.ingest_latency = optional(tb.d.consumer.ingest_latency().histogram());
    s.handoff_latency = optional(tb.d.consumer.handoff_latency().histogram());
    s.end_to_end = optional(&measured.end_to_end);
    s.post_to_decision = optional(&measured.post_to_decision);
    let metrics = kvdrain_nixl::metrics::Metrics::new();
    let (core, glue) = (
        tb.d.consumer.driver().core_counters(),
        tb.d.consumer.driver().counters(),
    );
    metrics.observe_consumer(&core, &glue, tb.d.consumer.latency());
    metrics.observe_producers(
        tb.p.pushers
            .iter()
            .map(|p| p.counters())
            .collect::<Vec<_>>()
            .iter(),
    );
    s.metrics = metrics.encode();
    Ok(s)
}

/// The engine thread's state (everything but the consumer and the producers).
struct Loop<'a> {
    o: &'a Options,
    d_pool: &'a DramPool,
    slots: &'a Mutex<Slots>,
    s: &'a mut Summary,
    progress: &'a mut Progress,
    decided: &'a mut u64,
    timing: &'a Timing,
    measured: &'a mut Measured,
}

/// Where requests go once the engine thread picked their slot.
trait Starter {
    fn start(&mut self, n: u64, slot: u64) -> Result<(), String>;
}

impl Starter for Producers<'_> {
    fn start(&mut self, n: u64, slot: u64) -> Result<(), String> {
        Producers::start(self, n, slot)
    }
}

impl Starter for mpsc::Sender<(u64, u64)> {
    fn start(&mut self, n: u64, slot: u64) -> Result<(), String> {
        self.send((n, slot))
            .map_err(|_| "the producer thread is gone".to_owned())
    }
}

impl Loop<'_> {
    /// Default: producers on their own thread, D's pump thread, and this one as the engine
    /// thread; `Err` says why the run stopped early.
    fn run_threads(
        &mut self,
        pump: &mut impl Pump,
        producers: &mut Producers<'_>,
    ) -> Result<(), String> {
        let stop = AtomicBool::new(false);
        let engine = std::thread::current();
        let (mut starts, started) = mpsc::channel();
        let slots = self.slots;
        std::thread::scope(|scope| {
            let (stop, engine) = (&stop, &engine);
            let p = std::thread::Builder::new()
                .name("kvdrain-demo-p".into())
                .spawn_scoped(scope, move || {
                    let result = producers.run(&started, slots, engine, stop);
                    // Whatever happened, the engine thread must not wait for it.
                    engine.unpark();
                    result
                })
                .map_err(|e| format!("cannot start the producer thread: {e}"))?;
            let ran = self.run(pump, &mut starts, Some(&p));
            stop.store(true, Ordering::Release);
            let produced = p
                .join()
                .map_err(|_| "the producer thread panicked".to_owned())?;
            // The producers' own error says more than "the producer thread stopped".
            produced.and(ran)
        })
    }

    /// `--no-pump-thread`: one loop drains, decides, and ticks the producers.
    fn run_one_loop(
        &mut self,
        pump: &mut impl Pump,
        producers: &mut Producers<'_>,
    ) -> Result<(), String> {
        self.run(pump, producers, None)
    }

    /// Starts every request and takes every decision; `Err` says why the run stopped
    /// early. Without a producer thread (`p_thread`), `starter` is the producers and they
    /// are ticked here.
    fn run<S: Starter + MaybeTick>(
        &mut self,
        pump: &mut impl Pump,
        starter: &mut S,
        p_thread: Option<&std::thread::ScopedJoinHandle<'_, Result<(), String>>>,
    ) -> Result<(), String> {
        let o = self.o;
        let mut next = 0u64;
        let mut last_decision = (Instant::now(), 0u64);
        while *self.decided < o.requests {
            while next < o.requests {
                let Some(slot) = ({
                    let mut slots = lock(self.slots);
                    let slot = slots.free.pop();
                    if let Some(slot) = slot {
                        slots.request.insert(slot, next);
                        slots.holders.insert(slot, 1 + P_TP as u8);
                    }
                    slot
                }) else {
                    break;
                };
                let n = next;
                next += 1;
                let (pid, did) = (format!("p-{n}"), format!("d-{n}"));
                starter.start(n, slot)?;
                pump.register(ReceiveSpec {
                    id: &did,
                    producer_engine: P_ENGINE,
                    remote_request_id: &pid,
                    transfer_id: Some(&pid),
                    blocks: BlockHandle(slot),
                    block_ids: block_ids(o, slot),
                    deadline: None,
                })
                .map_err(|e| format!("registration refused: {e}"))?;
            }
            let mut busy = starter.tick(self.slots)?;
            let mut d = DecodeSide {
                pool: self.d_pool,
                o,
                slots: self.slots,
                s: self.s,
                decided: self.decided,
                timing: self.timing,
                measured: self.measured,
            };
            busy |= pump.step(&mut d).map_err(|e| format!("consumer: {e}"))?;
            self.progress.update(*self.decided);
            if *self.decided != last_decision.1 {
                last_decision = (Instant::now(), *self.decided);
            } else if last_decision.0.elapsed() > STALL {
                return Err(format!("no decision for {STALL:?}"));
            }
            if p_thread.is_some_and(|p| p.is_finished()) {
                return Err("the producer thread stopped".to_owned());
            }
            if !busy {
                pump.idle();
            }
        }
        Ok(())
    }
}

/// The producers when they run on the engine's loop; nothing when on their own thread.
trait MaybeTick {
    fn tick(&mut self, slots: &Mutex<Slots>) -> Result<bool, String>;
}

impl MaybeTick for Producers<'_> {
    fn tick(&mut self, slots: &Mutex<Slots>) -> Result<bool, String> {
        Producers::tick(self, slots, None)
    }
}

impl MaybeTick for mpsc::Sender<(u64, u64)> {
    fn tick(&mut self, _slots: &Mutex<Slots>) -> Result<bool, String> {
        Ok(false)
    }
}
