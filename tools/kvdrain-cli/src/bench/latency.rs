//! `kvdrain bench latency`: notification → decision latency through the two-thread
//! consumer (`Ledger::split`), next to the same work on one thread and to a bare hand-off
//! between the same two threads.
//!
//! ```text
//!  feeder thread (ingest half)                     engine thread (engine half)
//!  ───────────────────────────                     ───────────────────────────
//!  wait for the pace; stamp the request's          spin on poll_decision()
//!  last notice (side table, by slot);        ──▶   Completed(slot): now − stamp → histogram;
//!  handle_notification(bytes)                      register the request R ahead in that slot
//! ```
//!
//! Three paths, one harness ([`Feed`] on the feeding side, [`Take`] on the taking side):
//!
//! | path | feeding side | taking side |
//! | --- | --- | --- |
//! | `two_threads` | `Ingest::handle_notification` on the feeder thread | `Engine::poll_decision` on the engine thread, then `register` |
//! | `one_thread` | the same, on one thread | pulled right after the notice that decided, on that thread |
//! | `handoff` | the slot index pushed on a plain SPSC ring | popped on the engine thread |
//!
//! `one_thread` is kvdrain's own work (parse, lookup, count, decide, pull); `handoff` is
//! what two threads cost whatever runs on them (a cache line moving between cores, the
//! spinning reader seeing it); `two_threads` is what an engine that drains notifications
//! on their own thread sees. Requests are registered `--inflight` ahead (counting mode,
//! `--edges` notices each, completions only, no clock), `M` = `--requests` of them; the
//! feeder sends request `k`'s notices once `k` is registered (`registration_waits` counts
//! the times it had to wait for the engine).
//!
//! Pace: `--rate` notices per second, delivered `--batch` at a time (as NIXL's
//! `getNotifs` hands over what accumulated since the last call): a batch goes when its
//! last notice is due. Two figures per request: from *drained* (the stamp taken just
//! before `handle_notification` of its last notice) and from *arrival* (when that notice
//! was due on an even pace, so it includes the wait for the rest of its batch and any
//! lateness of the feeder). A batch that is late (by more than one batch interval:
//! `late_batches`) goes at once and the following ones catch up, as notices queue behind
//! a descheduled pump. `--rate 0` sends flat out (arrival = drained). Timed loops
//! allocate nothing (counted, every thread).
//!
//! The `split` line puts the three side by side at p50 and p99: `kvdrain_ns_*`
//! (`one_thread`), `handoff_ns_*`, `two_threads_ns_*`, `rest_ns_*` = two threads − kvdrain
//! − hand-off (the paths run one after the other, so noise can make it negative),
//! `two_over_one_*`, and whether the two-thread p99 meets the goal of 10 µs.

use std::hint::{black_box, spin_loop};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use hdrhistogram::Histogram;
use kvdrain::{
    AgentId, BlockHandle, Config, Decision, Engine, Expect, Ingest, Ledger, Noticed, Registration,
};

use super::args::LatencyArgs;
use super::{Failure, Line, alloc, on_big_stack, put_allocations, stack_for, stream};

/// Percentiles the lines carry, with their key suffixes.
const QUANTILES: [(&str, f64); 4] = [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999)];

/// The taker gives up after this long without a decision (a lost notice; never in a
/// sound run).
const STALL_NS: u64 = 10_000_000_000;

/// The goal for the two-thread path's p99, in ns.
pub const GOAL_P99_NS: u64 = 10_000;

/// What one run measures.
#[derive(Clone, Copy, Debug)]
struct Plan {
    requests: u64,
    edges: u8,
    inflight: usize,
    /// Nanoseconds between two batches; 0: flat out.
    batch_ns: u64,
    batch: usize,
}

/// Nanoseconds since a shared epoch (a monotonic clock: `Instant`).
#[derive(Clone, Copy, Debug)]
struct Clock(Instant);

impl Clock {
    fn now(self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// The feeder's schedule: which notice goes when, and when it was due on an even pace.
#[derive(Debug)]
struct Pacer {
    clock: Clock,
    batch: usize,
    batch_ns: u64,
    /// When the current batch goes (its last notice is due).
    due: u64,
    /// Notices of the current batch already sent.
    sent: usize,
    late_batches: u64,
}

impl Pacer {
    fn new(clock: Clock, plan: &Plan) -> Pacer {
        Pacer {
            clock,
            batch: plan.batch,
            batch_ns: plan.batch_ns,
            due: clock.now() + plan.batch_ns,
            sent: 0,
            late_batches: 0,
        }
    }

    /// Waits until the next notice may go; returns when it was due on an even pace (flat
    /// out: now).
    #[inline]
    fn next(&mut self) -> u64 {
        if self.batch_ns == 0 {
            return self.clock.now();
        }
        if self.sent == self.batch {
            self.sent = 0;
            self.due += self.batch_ns;
        }
        if self.sent == 0 {
            // Behind: the batch goes at once and the next ones catch up (notices queue as
            // they would behind a descheduled pump).
            if self.clock.now() > self.due + self.batch_ns {
                self.late_batches += 1;
            }
            while self.clock.now() < self.due {
                spin_loop();
            }
        }
        self.sent += 1;
        // Notice `i` of a batch was due `batch - 1 - i` notice intervals before the batch.
        let step = self.batch_ns / self.batch as u64;
        self.due - (self.batch - self.sent) as u64 * step
    }
}

/// Per-slot stamps of the request the slot holds: written by the feeder before the last
/// notice, read by the taker after the decision (`Release`/`Acquire`, so the pair does not
/// lean on the core's own ordering).
#[derive(Debug)]
struct Stamps {
    drained: Box<[AtomicU64]>,
    arrival: Box<[AtomicU64]>,
}

impl Stamps {
    fn new(slots: usize) -> Stamps {
        let zeros = || (0..slots).map(|_| AtomicU64::new(0)).collect();
        Stamps {
            drained: zeros(),
            arrival: zeros(),
        }
    }
}

/// Latency histograms in ns (1 ns to 60 s, 3 significant digits: `saturating_record`
/// never allocates).
#[derive(Debug)]
struct Record {
    drained: Histogram<u64>,
    arrival: Histogram<u64>,
}

impl Record {
    fn new() -> Result<Record, Failure> {
        let h = || {
            Histogram::new_with_bounds(1, 60_000_000_000, 3)
                .map_err(|e| Failure::Check(format!("histogram: {e}")))
        };
        Ok(Record {
            drained: h()?,
            arrival: h()?,
        })
    }

    #[inline]
    fn take(&mut self, now: u64, stamps: &Stamps, slot: usize) {
        let drained = stamps.drained[slot].load(Ordering::Acquire);
        let arrival = stamps.arrival[slot].load(Ordering::Acquire);
        self.drained.saturating_record(now.saturating_sub(drained));
        self.arrival.saturating_record(now.saturating_sub(arrival));
    }
}

/// The feeding side: one notice of the request in `slot`.
trait Feed {
    /// `Ok(true)` when it decided the request, `Err(())` when it was not accepted.
    fn notice(&mut self, slot: usize, edge: u8, last: bool) -> Result<bool, ()>;
}

/// The taking side: decisions out, requests back in.
trait Take {
    /// The slot of the next decided request, if any; `Err(())` on a decision the harness
    /// does not expect.
    fn take(&mut self) -> Result<Option<usize>, ()>;
    /// Registers request `k` in slot `k % R`; `Err(())` if refused.
    fn register(&mut self, k: u64, slot: usize) -> Result<(), ()>;
}

struct Notices<'a, 'l, const N: usize> {
    ingest: Ingest<'l, N, 8>,
    messages: &'a [Vec<u8>],
}

impl<const N: usize> Feed for Notices<'_, '_, N> {
    #[inline]
    fn notice(&mut self, slot: usize, edge: u8, _last: bool) -> Result<bool, ()> {
        match self
            .ingest
            .handle_notification(AgentId(u16::from(edge)), &self.messages[slot])
        {
            Ok(Noticed::Decided) => Ok(true),
            Ok(Noticed::Counted) => Ok(false),
            Err(_) => Err(()),
        }
    }
}

struct Decisions<'a, 'l, const N: usize> {
    engine: Engine<'l, N, 8>,
    ids: &'a [String],
    edges: u8,
}

impl<const N: usize> Take for Decisions<'_, '_, N> {
    #[inline]
    fn take(&mut self) -> Result<Option<usize>, ()> {
        match self.engine.poll_decision() {
            None => Ok(None),
            Some(Decision::Completed(done)) => Ok(Some(done.into_decode().0 as usize)),
            Some(_) => Err(()),
        }
    }

    #[inline]
    fn register(&mut self, _k: u64, slot: usize) -> Result<(), ()> {
        let registration = Registration {
            id: &self.ids[slot],
            blocks: BlockHandle(slot as u64),
            expect: Expect::Count(self.edges),
            deadline: None,
        };
        // A harness that never aborts has no use for the `Pending` ticket.
        self.engine.register(registration).map(drop).map_err(drop)
    }
}

/// A plain single-producer single-consumer ring of slot indices: the hand-off alone.
#[derive(Debug)]
struct Ring {
    cells: Box<[AtomicU64]>,
    tail: Padded,
    head: Padded,
}

#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded(AtomicU64);

impl Ring {
    fn new(capacity: usize) -> Ring {
        Ring {
            cells: (0..capacity.next_power_of_two())
                .map(|_| AtomicU64::new(0))
                .collect(),
            tail: Padded::default(),
            head: Padded::default(),
        }
    }

    fn mask(&self) -> u64 {
        self.cells.len() as u64 - 1
    }

    /// Producer side; `false` when full.
    #[inline]
    fn push(&self, value: u64) -> bool {
        let tail = self.tail.0.load(Ordering::Relaxed);
        if tail - self.head.0.load(Ordering::Acquire) > self.mask() {
            return false;
        }
        self.cells[(tail & self.mask()) as usize].store(value, Ordering::Relaxed);
        self.tail.0.store(tail + 1, Ordering::Release);
        true
    }

    /// Consumer side.
    #[inline]
    fn pop(&self) -> Option<u64> {
        let head = self.head.0.load(Ordering::Relaxed);
        if head == self.tail.0.load(Ordering::Acquire) {
            return None;
        }
        let value = self.cells[(head & self.mask()) as usize].load(Ordering::Relaxed);
        self.head.0.store(head + 1, Ordering::Release);
        Some(value)
    }
}

struct RingFeed<'a>(&'a Ring);

impl Feed for RingFeed<'_> {
    #[inline]
    fn notice(&mut self, slot: usize, _edge: u8, last: bool) -> Result<bool, ()> {
        if !last {
            black_box(slot);
            return Ok(false);
        }
        // Flow control keeps at most R requests in flight: the ring (≥ R) never fills.
        if self.0.push(slot as u64) {
            Ok(true)
        } else {
            Err(())
        }
    }
}

struct RingTake<'a>(&'a Ring);

impl Take for RingTake<'_> {
    #[inline]
    fn take(&mut self) -> Result<Option<usize>, ()> {
        Ok(self.0.pop().map(|slot| slot as usize))
    }

    #[inline]
    fn register(&mut self, _k: u64, _slot: usize) -> Result<(), ()> {
        Ok(())
    }
}

/// What one path measured.
#[derive(Debug)]
struct PathResult {
    record: Record,
    decided: u64,
    /// Notices not accepted, decisions out of order or unexpected, registrations refused.
    anomalies: u64,
    registration_waits: u64,
    late_batches: u64,
    allocations: u64,
}

/// What the feeder saw.
#[derive(Debug, Default)]
struct Fed {
    anomalies: u64,
    registration_waits: u64,
    late_batches: u64,
}

/// State the two threads share.
#[derive(Debug)]
struct Shared {
    clock: Clock,
    stamps: Stamps,
    /// Requests registered so far (`Release` after each registration).
    registered: AtomicU64,
    /// The feeder thread is up (its start-up allocations are done).
    ready: AtomicBool,
    /// The feeder sent every notice; how many of them decided.
    fed: AtomicBool,
    /// The taker gave up (no decision for [`STALL_NS`]): the feeder stops waiting.
    stalled: AtomicBool,
    decided_by_feeder: AtomicU64,
}

impl Shared {
    fn new(plan: &Plan) -> Shared {
        Shared {
            clock: Clock(Instant::now()),
            stamps: Stamps::new(plan.inflight),
            registered: AtomicU64::new(0),
            ready: AtomicBool::new(false),
            fed: AtomicBool::new(false),
            stalled: AtomicBool::new(false),
            decided_by_feeder: AtomicU64::new(0),
        }
    }
}

/// The feeder thread's loop: every notice of every request, at the pace.
fn feed(plan: &Plan, shared: &Shared, feeder: &mut impl Feed) -> Fed {
    let mut fed = Fed::default();
    let mut pacer = Pacer::new(shared.clock, plan);
    let mut decided = 0u64;
    for k in 0..plan.requests {
        if shared.registered.load(Ordering::Acquire) <= k {
            fed.registration_waits += 1;
            while shared.registered.load(Ordering::Acquire) <= k {
                if shared.stalled.load(Ordering::Relaxed) {
                    fed.anomalies += 1;
                    shared.fed.store(true, Ordering::Release);
                    return fed;
                }
                spin_loop();
            }
        }
        let slot = (k % plan.inflight as u64) as usize;
        for edge in 0..plan.edges {
            match send_notice(plan, shared, &mut pacer, feeder, slot, edge) {
                Ok(true) => decided += 1,
                Ok(false) => {}
                Err(()) => fed.anomalies += 1,
            }
        }
    }
    fed.late_batches = pacer.late_batches;
    shared.decided_by_feeder.store(decided, Ordering::Relaxed);
    shared.fed.store(true, Ordering::Release);
    fed
}

/// Notice `edge` of the request in `slot`, at the pace; the last one is stamped first
/// (arrival and drained times) so the taker can measure its decision. `Ok(true)`: it
/// decided the request.
fn send_notice(
    plan: &Plan,
    shared: &Shared,
    pacer: &mut Pacer,
    feeder: &mut impl Feed,
    slot: usize,
    edge: u8,
) -> Result<bool, ()> {
    let arrival = pacer.next();
    let last = edge + 1 == plan.edges;
    if last {
        shared.stamps.arrival[slot].store(arrival, Ordering::Release);
        shared.stamps.drained[slot].store(shared.clock.now(), Ordering::Release);
    }
    feeder.notice(slot, edge, last)
}

/// Registers the first window (requests `0..R`).
fn register_window(plan: &Plan, shared: &Shared, taker: &mut impl Take) -> u64 {
    let mut refused = 0;
    let first = plan.requests.min(plan.inflight as u64);
    for k in 0..first {
        refused += u64::from(taker.register(k, k as usize).is_err());
    }
    shared.registered.store(first, Ordering::Release);
    refused
}

/// The taking loop on the engine thread: every decision, each request R ahead registered.
fn drain(plan: &Plan, shared: &Shared, taker: &mut impl Take, record: &mut Record) -> (u64, u64) {
    let (mut decided, mut anomalies) = (0u64, 0u64);
    let mut next = plan.requests.min(plan.inflight as u64);
    let (mut idle, mut last) = (0u32, shared.clock.now());
    while decided < plan.requests {
        match taker.take() {
            Ok(Some(slot)) => {
                let now = shared.clock.now();
                record.take(now, &shared.stamps, slot);
                (idle, last) = (0, now);
                decided += 1;
                if next < plan.requests {
                    let want = (next % plan.inflight as u64) as usize;
                    // Decisions come in notice order, so the freed slot is the next one's.
                    anomalies += u64::from(want != slot);
                    anomalies += u64::from(taker.register(next, want).is_err());
                    next += 1;
                    shared.registered.store(next, Ordering::Release);
                }
            }
            Ok(None) => {
                if shared.fed.load(Ordering::Acquire)
                    && decided >= shared.decided_by_feeder.load(Ordering::Relaxed)
                {
                    break; // nothing more will come
                }
                // A lost notice would leave both threads waiting: give up after a while.
                idle = idle.wrapping_add(1);
                if idle % 4096 == 0 && shared.clock.now() - last > STALL_NS {
                    shared.stalled.store(true, Ordering::Relaxed);
                    anomalies += 1;
                    break;
                }
                spin_loop();
            }
            Err(()) => anomalies += 1,
        }
    }
    (decided, anomalies)
}

/// Feeder on a second thread, taker on this one.
fn two_threads(
    plan: &Plan,
    mut feeder: impl Feed + Send,
    mut taker: impl Take,
) -> Result<PathResult, Failure> {
    let shared = Shared::new(plan);
    let mut record = Record::new()?;
    std::thread::scope(|s| {
        let shared = &shared;
        let handle = std::thread::Builder::new()
            .name("kvdrain-feeder".into())
            .spawn_scoped(s, move || {
                shared.ready.store(true, Ordering::Release);
                while shared.registered.load(Ordering::Acquire) == 0 {
                    spin_loop();
                }
                feed(plan, shared, &mut feeder)
            })
            .map_err(|e| Failure::Check(format!("cannot start the feeder thread: {e}")))?;
        while !shared.ready.load(Ordering::Acquire) {
            spin_loop();
        }
        let before = alloc::allocations();
        let refused = register_window(plan, shared, &mut taker);
        let (decided, anomalies) = drain(plan, shared, &mut taker, &mut record);
        let allocations = alloc::allocations() - before;
        let fed = handle
            .join()
            .map_err(|_| Failure::Check("feeder thread panicked".into()))?;
        Ok(PathResult {
            record,
            decided,
            anomalies: anomalies + refused + fed.anomalies,
            registration_waits: fed.registration_waits,
            late_batches: fed.late_batches,
            allocations,
        })
    })
}

/// Feeder and taker on this thread: the decision is pulled right after the notice that
/// made it, the request R ahead registered at once.
fn one_thread(
    plan: &Plan,
    feeder: &mut impl Feed,
    taker: &mut impl Take,
) -> Result<PathResult, Failure> {
    let shared = Shared::new(plan);
    let mut record = Record::new()?;
    let before = alloc::allocations();
    let mut anomalies = register_window(plan, &shared, taker);
    let mut pacer = Pacer::new(shared.clock, plan);
    let mut decided = 0u64;
    let mut next = plan.requests.min(plan.inflight as u64);
    for k in 0..plan.requests {
        let slot = (k % plan.inflight as u64) as usize;
        for edge in 0..plan.edges {
            match send_notice(plan, &shared, &mut pacer, feeder, slot, edge) {
                Ok(false) => continue,
                Ok(true) => {}
                Err(()) => {
                    anomalies += 1;
                    continue;
                }
            }
            match taker.take() {
                Ok(Some(taken)) => {
                    record.take(shared.clock.now(), &shared.stamps, taken);
                    decided += 1;
                    anomalies += u64::from(taken != slot);
                }
                Ok(None) | Err(()) => anomalies += 1,
            }
            if next < plan.requests {
                let want = (next % plan.inflight as u64) as usize;
                anomalies += u64::from(taker.register(next, want).is_err());
                next += 1;
            }
        }
    }
    let allocations = alloc::allocations() - before;
    Ok(PathResult {
        record,
        decided,
        anomalies,
        registration_waits: 0,
        late_batches: pacer.late_batches,
        allocations,
    })
}

/// Which path a [`run_kvdrain`] call takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Threads {
    One,
    Two,
}

/// `two_threads` or `one_thread` through a fresh `Ledger<N, 8>`.
fn run_kvdrain<const N: usize>(
    plan: &Plan,
    threads: Threads,
    ids: &[String],
    messages: &[Vec<u8>],
) -> Result<PathResult, Failure> {
    let mut ledger: Ledger<N, 8> = Ledger::new(Config::with_capacity(N));
    let (ingest, engine) = ledger.split();
    let mut feeder = Notices { ingest, messages };
    let mut taker = Decisions {
        engine,
        ids,
        edges: plan.edges,
    };
    match threads {
        Threads::Two => two_threads(plan, feeder, taker),
        Threads::One => one_thread(plan, &mut feeder, &mut taker),
    }
}

type KvdrainFn = fn(&Plan, Threads, &[String], &[Vec<u8>]) -> Result<PathResult, Failure>;

macro_rules! latency_shapes {
    ($n:expr; $($size:literal)*) => {
        match $n {
            $( $size => Some((run_kvdrain::<$size> as KvdrainFn, size_of::<Ledger<$size, 8>>())), )*
            _ => None,
        }
    };
}

/// `kvdrain bench latency`.
pub fn main(args: &LatencyArgs) -> Result<(), Failure> {
    let LatencyArgs {
        requests,
        edges,
        inflight,
        rate,
        batch,
    } = *args;
    let n = inflight.next_power_of_two().max(64);
    let (kvdrain, bytes) = latency_shapes!(n; 64 128 256 512 1024 2048 4096)
        .ok_or_else(|| Failure::Usage(format!("--inflight {inflight}: at most 4096")))?;
    let batch_ns = match rate {
        0 => 0,
        r => (batch as u64).saturating_mul(1_000_000_000) / r,
    };
    if rate > 0 && batch_ns < batch as u64 {
        return Err(Failure::Usage(format!(
            "--rate {rate}: at most 1e9 notices per second (0 for flat out)"
        )));
    }
    if batch_ns > STALL_NS / 2 {
        return Err(Failure::Usage(format!(
            "--rate {rate} --batch {batch}: a batch at least every {} s",
            STALL_NS / 2_000_000_000
        )));
    }
    let plan = Plan {
        requests: requests as u64,
        edges,
        inflight,
        batch_ns,
        batch,
    };
    let ids: Vec<String> = (0..inflight).map(stream::request_id).collect();
    let messages: Vec<Vec<u8>> = ids
        .iter()
        .map(|id| format!("{id}:{edges}").into_bytes())
        .collect();
    let counting = alloc::counting();
    let (one, ring, two) = on_big_stack(stack_for(bytes), || {
        let one = kvdrain(&plan, Threads::One, &ids, &messages)?;
        let ring = Ring::new(inflight);
        let ring = two_threads(&plan, RingFeed(&ring), RingTake(&ring))?;
        let two = kvdrain(&plan, Threads::Two, &ids, &messages)?;
        Ok::<_, Failure>((one, ring, two))
    })??;
    let paths = [
        ("one_thread", &one),
        ("handoff", &ring),
        ("two_threads", &two),
    ];
    for (name, result) in paths {
        path_line(name, args, counting, result).print();
    }
    split_line(&one, &ring, &two).print();
    for (name, result) in paths {
        if result.decided != plan.requests || result.anomalies != 0 {
            return Err(Failure::Check(format!(
                "latency {name}: {} of {} requests decided, {} anomalies",
                result.decided, plan.requests, result.anomalies
            )));
        }
        if counting && result.allocations != 0 {
            return Err(Failure::Check(format!(
                "latency {name}: {} allocations in the timed loop",
                result.allocations
            )));
        }
    }
    Ok(())
}

/// `"<prefix>p50":…,"<prefix>p90",…,"<prefix>max"` of `h`, in ns.
fn put_quantiles(line: &mut Line, prefix: &str, h: &Histogram<u64>) {
    for (key, q) in QUANTILES {
        line.put(format!("{prefix}{key}"), h.value_at_quantile(q));
    }
    line.put(format!("{prefix}max"), h.max());
}

fn path_line(name: &str, args: &LatencyArgs, counting: bool, r: &PathResult) -> Line {
    let mut line = Line::new();
    line.put("bench", "latency")
        .put("path", name)
        .put("requests", args.requests)
        .put("edges", args.edges)
        .put("inflight", args.inflight)
        .put("rate", args.rate)
        .put("batch", args.batch)
        .put("samples", r.record.drained.len());
    put_quantiles(&mut line, "ns_", &r.record.drained);
    put_quantiles(&mut line, "arrival_ns_", &r.record.arrival);
    line.put("registration_waits", r.registration_waits)
        .put("late_batches", r.late_batches)
        .put("anomalies", r.anomalies);
    put_allocations(&mut line, counting, r.allocations);
    line
}

/// How the two-thread latency splits into kvdrain's work and the hand-off.
fn split_line(one: &PathResult, ring: &PathResult, two: &PathResult) -> Line {
    let q = |r: &PathResult, q: f64| r.record.drained.value_at_quantile(q);
    let ratio = |a: u64, b: u64| super::num(a as f64 / b.max(1) as f64);
    let mut line = Line::new();
    line.put("bench", "latency").put("path", "split");
    for (key, quantile) in [("p50", 0.5), ("p99", 0.99)] {
        let (k, h, t) = (q(one, quantile), q(ring, quantile), q(two, quantile));
        line.put(format!("kvdrain_ns_{key}"), k)
            .put(format!("handoff_ns_{key}"), h)
            .put(format!("two_threads_ns_{key}"), t)
            .put(format!("rest_ns_{key}"), t as i64 - k as i64 - h as i64)
            .put(format!("two_over_one_{key}"), ratio(t, k));
    }
    let p99 = q(two, 0.99);
    line.put("goal_ns_p99", GOAL_P99_NS)
        .put("goal_met", p99 <= GOAL_P99_NS);
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_hands_over_in_order_and_refuses_when_full() {
        let ring = Ring::new(3);
        assert_eq!(ring.cells.len(), 4);
        assert!((0..4).all(|v| ring.push(v)));
        assert!(!ring.push(4));
        assert_eq!(ring.pop(), Some(0));
        assert!(ring.push(4));
        assert_eq!(
            std::iter::from_fn(|| ring.pop()).collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );
        assert_eq!(ring.pop(), None);
    }

    #[test]
    fn the_pacer_dates_each_notice_of_a_batch_on_an_even_pace() {
        let plan = Plan {
            requests: 1,
            edges: 1,
            inflight: 1,
            batch_ns: 4_000,
            batch: 4,
        };
        let mut pacer = Pacer::new(Clock(Instant::now()), &plan);
        let due = pacer.due;
        let dates: Vec<u64> = (0..4).map(|_| pacer.next()).collect();
        assert_eq!(dates, [due - 3_000, due - 2_000, due - 1_000, due]);
        assert!(pacer.clock.now() >= due);
    }

    #[test]
    fn every_path_decides_every_request() {
        let args = LatencyArgs {
            requests: 500,
            edges: 2,
            inflight: 16,
            rate: 0,
            batch: 4,
        };
        let plan = Plan {
            requests: 500,
            edges: 2,
            inflight: 16,
            batch_ns: 0,
            batch: 4,
        };
        let ids: Vec<String> = (0..16).map(stream::request_id).collect();
        let messages: Vec<Vec<u8>> = ids
            .iter()
            .map(|id| format!("{id}:2").into_bytes())
            .collect();
        let results = on_big_stack(stack_for(size_of::<Ledger<64, 8>>()), || {
            let ring = Ring::new(16);
            [
                run_kvdrain::<64>(&plan, Threads::One, &ids, &messages),
                two_threads(&plan, RingFeed(&ring), RingTake(&ring)),
                run_kvdrain::<64>(&plan, Threads::Two, &ids, &messages),
            ]
        })
        .expect("bench thread");
        for r in results {
            let r = r.expect("path runs");
            assert_eq!((r.decided, r.anomalies), (500, 0));
            assert_eq!(r.record.drained.len(), 500);
            assert!(r.record.drained.value_at_quantile(0.5) <= r.record.drained.max());
            let line = path_line("x", &args, false, &r);
            assert_eq!(line.clone().into_map()["samples"], 500);
        }
    }
}
