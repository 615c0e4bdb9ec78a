//! Heap allocations per request in the drivers, counted by a global allocator.
//!
//! P(TP=2) → D(TP=1) over the in-process transport, named edges. After a warm-up that
//! grows every map and queue to its working size, each request is offered on both P ranks,
//! registered on D, pushed, decided and its sources released; the allocations made inside
//! each driver call (its transport's included: the in-process wire copies what it carries;
//! the offer and request the engine hands in are built before counting) are counted on
//! this thread and divided by the number of requests.
//!
//! What remains per request is owned data that outlives the call: ids and agent names as
//! `String`s, the `PUSH_REG` msgpack payload, block-id lists, events handed to the engine,
//! and the map entries keyed by those strings. The bounds below are the figures measured
//! when the short per-request lists moved inline ([`kvdrain_driver::PerRequest`]): one
//! more allocation per request on either side fails the test, and a change that removes
//! some lowers them. Run with `--nocapture` to see the figures.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

mod common;

use common::{D_ENGINE, P_ENGINE, consumer_rank, producer_agents};
use kvdrain::{BlockHandle, Config, Duration, Instant};
use kvdrain_driver::consumer::{ConsumerDriver, ConsumerEvent, ReceiveSpec};
use kvdrain_driver::memory::{MemoryFabric, MemoryTransport, MemoryWrite, WriteFault};
use kvdrain_driver::producer::{Offer, ProducerConfig, ProducerDriver, ProducerEvent};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards every call to `System` unchanged; the counter is a const-initialised
// thread-local `Cell` without a destructor, so touching it never allocates or re-enters.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

const P_TP: u16 = 2;

struct Cluster {
    fabric: MemoryFabric,
    d: ConsumerDriver<64, 8>,
    dt: MemoryTransport,
    p: Vec<(ProducerDriver<MemoryWrite>, MemoryTransport)>,
    now: Instant,
    /// Allocations inside consumer calls and inside producer calls.
    d_allocs: u64,
    p_allocs: u64,
    decided: Vec<&'static str>,
    sources_released: usize,
}

fn cluster() -> Cluster {
    let fabric = MemoryFabric::new();
    let dt = fabric.endpoint("d0");
    fabric.publish_consumer(D_ENGINE, 0, "d0");
    let mut ledger = Config::with_capacity(64);
    ledger.settle = Duration::from_millis(0);
    let d = consumer_rank(ledger, Duration::from_millis(30_000), producer_agents(P_TP));
    let p = (0..P_TP)
        .map(|r| {
            (
                ProducerDriver::new(ProducerConfig::new(P_ENGINE, r, P_TP)),
                fabric.endpoint(&format!("p{r}")),
            )
        })
        .collect();
    Cluster {
        fabric,
        d,
        dt,
        p,
        now: Instant::ZERO,
        d_allocs: 0,
        p_allocs: 0,
        decided: Vec::with_capacity(1 << 16),
        sources_released: 0,
    }
}

impl Cluster {
    /// One request from offer to released sources.
    fn request(&mut self, id: &str) {
        for (p, _) in &mut self.p {
            // The engine's own data, built before counting: only the driver's are counted.
            let offer = Offer {
                request_id: id.to_owned(),
                transfer_id: None,
                block_ids: vec![vec![1, 2]],
            };
            let before = allocations();
            p.offer(offer, self.now).expect("offer");
            self.p_allocs += allocations() - before;
        }
        let request = ReceiveSpec {
            id,
            producer_engine: P_ENGINE,
            remote_request_id: id,
            transfer_id: None,
            blocks: BlockHandle(7),
            block_ids: vec![vec![10, 11]],
            deadline: None,
        };
        let before = allocations();
        self.d
            .engine()
            .register(&mut self.dt, request, self.now)
            .expect("register");
        self.d_allocs += allocations() - before;
        let decided = self.decided.len();
        let released = self.sources_released;
        for _ in 0..16 {
            self.step();
            if self.decided.len() > decided && self.sources_released == released + 2 {
                self.fabric.take_landed();
                return;
            }
        }
        panic!("request {id} not done: {:?}", &self.decided[decided..]);
    }

    fn step(&mut self) {
        self.now += Duration::from_millis(1);
        for (p, t) in &mut self.p {
            let before = allocations();
            p.tick(t, self.now).expect("producer tick");
            while let Some(e) = p.poll_event() {
                if let ProducerEvent::SourceReleased { .. } = e {
                    self.sources_released += 1;
                }
            }
            self.p_allocs += allocations() - before;
        }
        let before = allocations();
        self.d.poll(&mut self.dt, self.now).expect("consumer poll");
        while let Some(e) = self.d.engine().poll_event() {
            self.decided.push(match e {
                ConsumerEvent::Decode { .. } => "decode",
                ConsumerEvent::Failed { .. } => "failed",
                ConsumerEvent::Expired { .. } => "expired",
                ConsumerEvent::Release { .. } => "release",
            });
        }
        self.d_allocs += allocations() - before;
    }
}

/// Allocations per request (consumer side, producer side) over `n` requests after a
/// warm-up of the same kind.
fn per_request(fail_rank: Option<u16>, n: u64) -> (f64, f64) {
    let mut c = cluster();
    if let Some(rank) = fail_rank {
        // C2: that rank's descriptors are refused, its write is never posted and it owes
        // a `PUSH_FAIL`.
        c.fabric.set_fault_script(Some(Box::new(move |s| {
            if s.tp_rank == rank {
                WriteFault::Descriptor
            } else {
                WriteFault::None
            }
        })));
    }
    for i in 0..64 {
        c.request(&format!("warm-{i}"));
    }
    c.d_allocs = 0;
    c.p_allocs = 0;
    let ids: Vec<String> = (0..n).map(|i| format!("req-{i}")).collect();
    for id in &ids {
        c.request(id);
    }
    let expected = if fail_rank.is_some() {
        "failed"
    } else {
        "decode"
    };
    assert!(c.decided.iter().filter(|&&k| k == expected).count() as u64 >= n);
    (c.d_allocs as f64 / n as f64, c.p_allocs as f64 / n as f64)
}

#[test]
fn allocations_per_request_stay_within_the_measured_figures() {
    let (d_ok, p_ok) = per_request(None, 256);
    let (d_fail, p_fail) = per_request(Some(1), 256);
    println!(
        "allocations per request, P(TP=2) -> D(TP=1): healthy D {d_ok:.2} P {p_ok:.2} (both \
         ranks); one write refused D {d_fail:.2} P {p_fail:.2}"
    );
    assert!(
        d_ok <= D_HEALTHY && p_ok <= P_HEALTHY,
        "healthy: D {d_ok} P {p_ok}"
    );
    assert!(
        d_fail <= D_FAILED && p_fail <= P_FAILED,
        "failed: D {d_fail} P {p_fail}"
    );
}

// The measured figures (allocations per request; module doc). Before the per-request lists
// moved inline (and the consumer shared its engines' agent names instead of copying them
// per registration) they were D 43 / P 143 healthy and D 49 / P 137 with one write refused.
const D_HEALTHY: f64 = 38.0;
const P_HEALTHY: f64 = 139.0;
const D_FAILED: f64 = 43.0;
const P_FAILED: f64 = 133.0;
