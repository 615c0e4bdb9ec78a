//! The demo over real NIXL: three agents (two producer ranks, one consumer rank) in this
//! process, each with its own UCX backend and DRAM block pool, driven by the real pusher and
//! pump ([`kvdrain_nixl`]).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kvdrain::{BlockHandle, Outstanding};
use kvdrain_nixl::consumer::{BlockRelease, Consumer, EngineSide, PushRequest, PushedRequest};
use kvdrain_nixl::pool::DramPool;
use kvdrain_nixl::producer::{Fault, FaultInjector, Offer, SourceBlocks};
use kvdrain_nixl::testbed::{P_ENGINE, Testbed, TestbedConfig};

use super::{Options, P_TP, Percentiles, Progress, Summary, pattern};

/// The consumer as the demo's loop drives it: on the loop's thread, or as the engine side
/// of a two-thread pump.
trait Pump {
    fn register(&mut self, request: PushRequest<'_>) -> Result<(), String>;
    /// One round; whether anything happened.
    fn step(&mut self, d: &mut DecodeSide<'_>) -> Result<bool, String>;
}

impl<const N: usize> Pump for Consumer<N> {
    fn register(&mut self, request: PushRequest<'_>) -> Result<(), String> {
        Consumer::register(self, request)
            .map(drop)
            .map_err(|e| e.to_string())
    }
    fn step(&mut self, d: &mut DecodeSide<'_>) -> Result<bool, String> {
        self.poll(d)
            .map(|r| r.notifications > 0)
            .map_err(|e| e.to_string())
    }
}

impl<const N: usize, const E: usize> Pump for EngineSide<'_, N, E> {
    fn register(&mut self, request: PushRequest<'_>) -> Result<(), String> {
        EngineSide::register(self, request)
            .map(drop)
            .map_err(|e| e.to_string())
    }
    fn step(&mut self, d: &mut DecodeSide<'_>) -> Result<bool, String> {
        if let Some(e) = self.pump_error() {
            return Err(format!("pump thread: {e}"));
        }
        Ok(self.poll(d) > 0)
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
    fn put_back(&mut self, slot: u64) {
        if let Some(h) = self.holders.get_mut(&slot) {
            *h -= 1;
            if *h == 0 {
                self.holders.remove(&slot);
                self.free.push(slot);
            }
        }
    }
}

struct DecodeSide<'a> {
    pool: &'a DramPool,
    o: &'a Options,
    slots: &'a mut Slots,
    s: &'a mut Summary,
    decided: &'a mut u64,
}

impl BlockRelease for DecodeSide<'_> {
    fn decode(&mut self, _request: &PushedRequest, blocks: BlockHandle) {
        let slot = blocks.0;
        let n = self.slots.request.get(&slot).copied().unwrap_or(u64::MAX);
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
        *self.decided += 1;
        self.slots.put_back(slot);
    }
    fn release(&mut self, _request: &PushedRequest, blocks: BlockHandle, forced: bool) {
        self.s.forced += u64::from(forced);
        self.slots.put_back(blocks.0);
    }
    fn failed(&mut self, _request: &PushedRequest) {
        self.s.failed += 1;
        *self.decided += 1;
    }
    fn expired(&mut self, _request: &PushedRequest, _outstanding: Outstanding) {
        self.s.expired += 1;
        *self.decided += 1;
    }
}

struct SourceSide<'a> {
    slots: &'a mut Slots,
    slot_of: &'a HashMap<String, u64>,
}

impl SourceBlocks for SourceSide<'_> {
    fn release(&mut self, request: &str) {
        if let Some(&slot) = self.slot_of.get(request) {
            self.slots.put_back(slot);
        }
    }
}

fn block_ids(o: &Options, slot: u64) -> Vec<Vec<u64>> {
    let k = o.blocks as u64;
    vec![(slot * k..slot * k + k).collect()]
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
    for r in 0..P_TP {
        let opts = o.clone();
        let injector: FaultInjector = Box::new(move |req: &str, _d| {
            let n: u64 = req.strip_prefix("p-")?.parse().ok()?;
            opts.fails(n, r).then_some(Fault::BadDescriptor)
        });
        tb.p.pushers[usize::from(r)].set_fault_injector(Some(injector));
    }
    let start = Instant::now();
    let mut s = Summary {
        transport: "real NIXL (UCX), 3 agents in one process".to_owned(),
        requests: o.requests,
        ..Summary::default()
    };
    let mut slots = Slots {
        free: (0..o.window as u64).rev().collect(),
        ..Slots::default()
    };
    let mut slot_of: HashMap<String, u64> = HashMap::new();
    let mut progress = Progress::new(o.requests);
    let mut decided = 0u64;
    let mut stopped: Option<String> = None;
    let Testbed {
        p,
        d: dside,
        handshake,
        ..
    } = &mut tb;
    let mut world = Loop {
        o,
        p_len,
        pushers: &mut p.pushers,
        pools: &p.pools,
        handshake,
        d_pool: &dside.pool,
        slots: &mut slots,
        slot_of: &mut slot_of,
        s: &mut s,
        progress: &mut progress,
        decided: &mut decided,
    };
    let result = if o.pump_thread {
        dside.consumer.with_pump_thread(|engine| world.run(engine))
    } else {
        world.run(&mut dside.consumer)
    };
    if let Err(why) = result {
        stopped = Some(why);
    }
    if let Some(why) = stopped {
        eprintln!("kvdrain demo: stopped early: {why}");
        s.unfinished = o.requests - decided;
    }
    // Let the producers hand back their last sources before the agents go.
    let drain = Instant::now();
    while tb.p.pushers.iter().any(|p| p.in_flight() > 0) && drain.elapsed() < Duration::from_secs(5)
    {
        for p in &mut tb.p.pushers {
            let mut src = SourceSide {
                slots: &mut slots,
                slot_of: &slot_of,
            };
            let _ = p.tick(&mut tb.handshake, &mut src);
        }
    }
    progress.finish();
    s.wall = start.elapsed();
    let c = tb.d.consumer.core_counters();
    s.completions = c.ingest.completions;
    s.failure_notices = c.ingest.failure_notices;
    let landed: u64 = tb.p.pushers.iter().map(|p| p.counters().landed).sum();
    s.bytes = landed * (o.blocks * p_len) as u64;
    s.latency = Percentiles::of(tb.d.consumer.latency().histogram());
    let ingest = tb.d.consumer.ingest_latency().histogram();
    s.ingest_latency = (!ingest.is_empty()).then(|| Percentiles::of(ingest));
    let metrics = kvdrain_nixl::metrics::Metrics::new();
    let (core, glue) = (tb.d.consumer.core_counters(), tb.d.consumer.counters());
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

/// The demo's main loop state (everything but the consumer).
struct Loop<'a> {
    o: &'a Options,
    p_len: usize,
    pushers: &'a mut Vec<kvdrain_nixl::producer::Pusher>,
    pools: &'a [DramPool],
    handshake: &'a mut kvdrain_nixl::handshake::StaticHandshake,
    d_pool: &'a DramPool,
    slots: &'a mut Slots,
    slot_of: &'a mut HashMap<String, u64>,
    s: &'a mut Summary,
    progress: &'a mut Progress,
    decided: &'a mut u64,
}

impl Loop<'_> {
    /// Pushes every request; `Err` says why the run stopped early.
    fn run(&mut self, pump: &mut impl Pump) -> Result<(), String> {
        let o = self.o;
        let p_len = self.p_len;
        let mut next = 0u64;
        let mut last_decision = (Instant::now(), 0u64);
        while *self.decided < o.requests {
            while next < o.requests {
                let Some(slot) = self.slots.free.pop() else {
                    break;
                };
                let n = next;
                next += 1;
                let (pid, did) = (format!("p-{n}"), format!("d-{n}"));
                self.slots.request.insert(slot, n);
                self.slots.holders.insert(slot, 1 + P_TP as u8);
                self.slot_of.insert(pid.clone(), slot);
                for (r, pool) in self.pools.iter().enumerate() {
                    for (b, &id) in block_ids(o, slot)[0].iter().enumerate() {
                        pool.write(id, &pattern(n, r as u16, b, p_len));
                    }
                }
                for p in self.pushers.iter_mut() {
                    p.offer(Offer {
                        request_id: pid.clone(),
                        transfer_id: None,
                        block_ids: block_ids(o, slot),
                    })
                    .map_err(|e| format!("offer refused: {e}"))?;
                }
                pump.register(PushRequest {
                    id: &did,
                    producer_engine: P_ENGINE,
                    remote_request_id: &pid,
                    transfer_id: Some(&pid),
                    blocks: BlockHandle(slot),
                    block_ids: block_ids(o, slot),
                    deadline_ms: None,
                })
                .map_err(|e| format!("registration refused: {e}"))?;
            }
            let mut busy = false;
            for p in self.pushers.iter_mut() {
                let mut src = SourceSide {
                    slots: self.slots,
                    slot_of: self.slot_of,
                };
                let t = p
                    .tick(self.handshake, &mut src)
                    .map_err(|e| format!("producer tick: {e}"))?;
                busy |= t.notifications + t.posted + t.finished + t.notices > 0;
            }
            let mut d = DecodeSide {
                pool: self.d_pool,
                o,
                slots: self.slots,
                s: self.s,
                decided: self.decided,
            };
            busy |= pump.step(&mut d).map_err(|e| format!("consumer: {e}"))?;
            self.progress.update(*self.decided);
            if *self.decided != last_decision.1 {
                last_decision = (Instant::now(), *self.decided);
            } else if last_decision.0.elapsed() > STALL {
                return Err(format!("no decision for {STALL:?}"));
            }
            if !busy {
                std::thread::yield_now();
            }
        }
        Ok(())
    }
}
