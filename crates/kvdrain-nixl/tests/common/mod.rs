//! Helpers shared by the real-NIXL integration tests.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kvdrain::BlockHandle;
use kvdrain_nixl::consumer::ReceiveSpec;
use kvdrain_nixl::producer::Offer;
use kvdrain_nixl::testbed::{ConsumerSide, P_ENGINE, Recorder, Testbed, TestbedConfig, pattern};

/// Real NIXL tests run one at a time (the nixl-sys README warns of deadlocks).
pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Agent-name prefix unique across tests and concurrently running test processes.
pub fn prefix(test: &str) -> String {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    format!("kvd-{}-{test}-{n}", std::process::id())
}

/// The engines of a test: D's decisions and each P rank's source releases / heartbeats.
#[derive(Debug, Default)]
pub struct Engines {
    pub d: Recorder,
    pub p: Vec<Recorder>,
}

impl Engines {
    pub fn new(p_tp: u16) -> Self {
        Engines {
            d: Recorder::default(),
            p: (0..p_tp).map(|_| Recorder::default()).collect(),
        }
    }
}

/// Polls the consumer once.
pub fn tick_d(tb: &mut Testbed, e: &mut Engines) {
    tb.d.consumer.poll(&mut e.d).expect("consumer poll");
}

/// Ticks producer rank `r` once.
pub fn tick_p(tb: &mut Testbed, e: &mut Engines, r: usize) {
    tb.p.pushers[r]
        .tick(&mut tb.handshake, &mut e.p[r])
        .expect("producer tick");
}

/// Ticks everything until `done` holds, panicking after `limit`.
pub fn run_until(
    tb: &mut Testbed,
    e: &mut Engines,
    limit: Duration,
    what: &str,
    done: impl FnMut(&Testbed, &Engines) -> bool,
) {
    let ranks: Vec<usize> = (0..tb.p.pushers.len()).collect();
    run_only(tb, e, &ranks, limit, what, done);
}

/// Ticks only D (and the given producers) until `done`.
pub fn run_only(
    tb: &mut Testbed,
    e: &mut Engines,
    ranks: &[usize],
    limit: Duration,
    what: &str,
    mut done: impl FnMut(&Testbed, &Engines) -> bool,
) {
    let start = Instant::now();
    while !done(tb, e) {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}; D events {:?}, P events {:?}, D counters {:?}",
            e.d.events,
            e.p.iter().map(|p| &p.events).collect::<Vec<_>>(),
            tb.d.consumer.driver().core_counters()
        );
        for &r in ranks {
            tick_p(tb, e, r);
        }
        tick_d(tb, e);
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Request `n` uses D blocks `[n*k, n*k+k)` and P blocks `[n*k, n*k+k)` on every rank.
pub const BLOCKS_PER_REQUEST: u64 = 4;

pub fn d_id(n: u64) -> String {
    format!("cmpl-d-{n}")
}

pub fn p_id(n: u64) -> String {
    format!("cmpl-p-{n}")
}

pub fn block_ids(slot: u64) -> Vec<Vec<u64>> {
    vec![(slot * BLOCKS_PER_REQUEST..(slot + 1) * BLOCKS_PER_REQUEST).collect()]
}

/// Fills P's source blocks of `slot` with the data of `data_seed` on every rank.
pub fn fill_sources(tb: &Testbed, slot: u64, data_seed: u64) {
    for (r, pool) in tb.p.pools.iter().enumerate() {
        let len = pool.layout().block_len;
        for (i, &b) in block_ids(slot)[0].iter().enumerate() {
            pool.write(b, &pattern(data_seed, r as u16, i, len));
        }
    }
}

/// What D block `i` of a request with `data_seed` must hold: every rank's part in slot order.
pub fn expected_d_block(p_tp: u16, p_block_len: usize, data_seed: u64, i: usize) -> Vec<u8> {
    (0..p_tp)
        .flat_map(|r| pattern(data_seed, r, i, p_block_len))
        .collect()
}

/// Checks D's blocks of `slot` hold the data of `data_seed`.
pub fn check_d_blocks(
    tb: &Testbed,
    cfg: &TestbedConfig,
    slot: u64,
    data_seed: u64,
) -> Result<(), String> {
    for (i, &b) in block_ids(slot)[0].iter().enumerate() {
        if tb.d.pool.read(b) != expected_d_block(cfg.p_tp, cfg.p_block_len, data_seed, i) {
            return Err(format!(
                "D block {b} (index {i}) does not hold request data {data_seed}"
            ));
        }
    }
    Ok(())
}

/// Clears D's blocks of `slot`.
pub fn clear_d_blocks(tb: &Testbed, slot: u64) {
    for &b in &block_ids(slot)[0] {
        tb.d.pool.clear(b);
    }
}

/// Offers request `n` (P blocks of `slot`) on every P rank.
pub fn offer_all(tb: &mut Testbed, n: u64, slot: u64) {
    for p in &mut tb.p.pushers {
        p.offer(Offer {
            request_id: p_id(n),
            transfer_id: None,
            block_ids: block_ids(slot),
        })
        .expect("offer");
    }
}

/// Registers request `n` (D blocks of `slot`) with D; returns the producers it could not reach.
pub fn register(tb: &mut Testbed, n: u64, slot: u64, deadline_ms: Option<u64>) -> Vec<String> {
    let pid = p_id(n);
    register_request(
        &mut tb.d,
        ReceiveSpec {
            id: &d_id(n),
            producer_engine: P_ENGINE,
            remote_request_id: &pid,
            transfer_id: Some(&pid),
            blocks: BlockHandle(slot),
            block_ids: block_ids(slot),
            deadline: deadline_ms.map(kvdrain::Duration::from_millis),
        },
    )
}

/// Registers `request` with D's consumer at D's clock, through its engine half; returns the
/// producers it could not reach.
pub fn register_request(d: &mut ConsumerSide, request: ReceiveSpec<'_>) -> Vec<String> {
    let now = d.consumer.now();
    let (mut engine, mut nixl) = d.consumer.engine();
    engine
        .register(&mut nixl, request, now)
        .expect("register")
        .unreached
}
