//! P(TP=2) → D(TP=1) over real NIXL in one process: three agents, DRAM pools, the real
//! pusher and pump. Serialized; fails with the loader's message without NIXL unless
//! `KVDRAIN_SKIP_NIXL=1`.

mod common;

use std::time::Duration;

use common::*;
use kvdrain::{BlockHandle, Outstanding};
use kvdrain_nixl::consumer::{BlockRelease, TrackedRequest};
use kvdrain_nixl::handshake::{ConsumerRank, Handshake, HandshakeError};
use kvdrain_nixl::loader::require_nixl_or_skip;
use kvdrain_nixl::pool::DramPool;
use kvdrain_nixl::producer::{Fault, FaultInjector};
use kvdrain_nixl::testbed::{Testbed, TestbedConfig};

const LIMIT: Duration = Duration::from_secs(10);
/// How often a loop that ticks producers polls their agents (a producer learns of a
/// registration only by draining its notifications).
const PRODUCER_POLL: Duration = Duration::from_micros(200);

fn testbed(test: &str) -> (Testbed, TestbedConfig, Engines) {
    let cfg = TestbedConfig::new(&prefix(test));
    let tb = Testbed::new(&cfg).expect("testbed over real NIXL");
    let e = Engines::new(cfg.p_tp);
    (tb, cfg, e)
}

/// Checks D's blocks *inside* the `completed` hook: the data is in place before decode
/// starts.
struct CheckAtDecode<'a> {
    pool: &'a DramPool,
    cfg: &'a TestbedConfig,
    seeds: &'a dyn Fn(&str) -> u64,
    inner: &'a mut Engines,
}

impl BlockRelease for CheckAtDecode<'_> {
    fn decode(&mut self, request: &TrackedRequest, blocks: BlockHandle) {
        let seed = (self.seeds)(&request.id);
        for (i, &b) in block_ids(blocks.0)[0].iter().enumerate() {
            assert_eq!(
                self.pool.read(b),
                expected_d_block(self.cfg.p_tp, self.cfg.p_block_len, seed, i),
                "{}: D block {b} not in place at `completed`",
                request.id
            );
        }
        self.inner.d.decode(request, blocks);
    }
    fn release(&mut self, request: &TrackedRequest, blocks: BlockHandle, forced: bool) {
        self.inner.d.release(request, blocks, forced);
    }
    fn failed(&mut self, request: &TrackedRequest) {
        self.inner.d.failed(request);
    }
    fn expired(&mut self, request: &TrackedRequest, o: Outstanding) {
        self.inner.d.expired(request, o);
    }
}

/// Ticks P ranks `ranks` and D (checking bytes at decode) until `done`.
fn drive_checked(
    tb: &mut Testbed,
    cfg: &TestbedConfig,
    e: &mut Engines,
    ranks: &[usize],
    seeds: &dyn Fn(&str) -> u64,
    what: &str,
    mut done: impl FnMut(&Testbed, &Engines) -> bool,
) {
    let start = std::time::Instant::now();
    while !done(tb, e) {
        assert!(
            start.elapsed() < LIMIT,
            "timed out waiting for {what}: D {:?} P {:?} counters {:?}",
            e.d.events,
            e.p.iter().map(|p| &p.events).collect::<Vec<_>>(),
            tb.d.consumer.driver().core_counters()
        );
        for &r in ranks {
            tick_p(tb, e, r);
        }
        let mut check = CheckAtDecode {
            pool: &tb.d.pool,
            cfg,
            seeds,
            inner: e,
        };
        tb.d.consumer.poll(&mut check).expect("consumer poll");
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[test]
fn tp2_to_tp1_bytes_are_in_place_at_completed() {
    tp2_to_tp1(true);
}

/// The same without NIXL's progress threads (what the demo runs): only the pusher's and the
/// pump's own polls make progress.
#[test]
fn tp2_to_tp1_without_progress_threads() {
    tp2_to_tp1(false);
}

fn tp2_to_tp1(progress_thread: bool) {
    let _s = serial();
    if !require_nixl_or_skip("tp2_to_tp1") {
        return;
    }
    let mut cfg = TestbedConfig::new(&prefix("basic"));
    cfg.progress_thread = progress_thread;
    let mut tb = Testbed::new(&cfg).expect("testbed over real NIXL");
    let mut e = Engines::new(cfg.p_tp);
    let seeds = |id: &str| -> u64 {
        id.rsplit('-')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
            + 100
    };
    for n in 0..8 {
        fill_sources(&tb, n, n + 100);
        offer_all(&mut tb, n, n);
        assert!(register(&mut tb, n, n, None).is_empty());
    }
    drive_checked(
        &mut tb,
        &cfg,
        &mut e,
        &[0, 1],
        &seeds,
        "8 completions",
        |_, e| (0..8).all(|n| e.d.saw("decode", &d_id(n))),
    );
    // Every rank released its source blocks once its write was terminal, once.
    for p in &e.p {
        for n in 0..8 {
            let count = p
                .events
                .iter()
                .filter(|(ev, id)| *ev == "source" && *id == p_id(n))
                .count();
            assert_eq!(count, 1, "source release of {}", p_id(n));
        }
    }
    let c = tb.d.consumer.driver().core_counters();
    assert_eq!(
        (c.engine.completed, c.engine.failed, c.ingest.completions),
        (8, 0, 16)
    );
    let m = kvdrain_nixl::metrics::Metrics::new();
    m.observe_consumer(
        &c,
        &tb.d.consumer.driver().counters(),
        tb.d.consumer.latency(),
    );
    let metrics = m.encode();
    assert!(
        metrics.contains("kvdrain:nixl_num_completed_reqs_total 8\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kvdrain:nixl_num_failed_reqs_total 0\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kvdrain:nixl_notif_to_decision_seconds_count 8\n"),
        "{metrics}"
    );
    assert!(tb.d.consumer.latency().quantile(0.99).is_some());
}

/// The consumer as designed: a pump thread drains NIXL notifications into the driver's
/// lock-free ingest half while this thread is the engine thread (registrations, ticks,
/// decisions). Bytes are checked inside the `completed` hook.
#[test]
fn tp2_to_tp1_with_a_pump_thread() {
    let _s = serial();
    if !require_nixl_or_skip("tp2_to_tp1_with_a_pump_thread") {
        return;
    }
    let cfg = TestbedConfig::new(&prefix("pump"));
    let mut tb = Testbed::new(&cfg).expect("testbed over real NIXL");
    let mut e = Engines::new(cfg.p_tp);
    let seeds = |id: &str| -> u64 {
        id.rsplit('-')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
            + 100
    };
    for n in 0..8 {
        fill_sources(&tb, n, n + 100);
        offer_all(&mut tb, n, n);
    }
    let Testbed { d, p, handshake } = &mut tb;
    d.consumer.with_pump_thread(|engine| {
        for n in 0..8 {
            let pid = p_id(n);
            let now = engine.now();
            let (half, mut nixl) = engine.engine();
            let registered = half
                .register(
                    &mut nixl,
                    kvdrain_nixl::consumer::ReceiveSpec {
                        id: &d_id(n),
                        producer_engine: kvdrain_nixl::testbed::P_ENGINE,
                        remote_request_id: &pid,
                        transfer_id: Some(&pid),
                        blocks: BlockHandle(n),
                        block_ids: block_ids(n),
                        deadline: None,
                    },
                    now,
                )
                .expect("register");
            assert!(registered.unreached.is_empty());
        }
        let start = std::time::Instant::now();
        while !(0..8).all(|n| e.d.saw("decode", &d_id(n))) {
            assert!(start.elapsed() < LIMIT, "D {:?}", e.d.events);
            assert!(engine.pump_error().is_none());
            for (r, pusher) in p.pushers.iter_mut().enumerate() {
                pusher.tick(handshake, &mut e.p[r]).expect("producer tick");
            }
            let mut check = CheckAtDecode {
                pool: &d.pool,
                cfg: &cfg,
                seeds: &seeds,
                inner: &mut e,
            };
            engine.poll(&mut check);
            // Until the pump publishes a decision, D's next wakeup, or the producers
            // ticked on this thread are to poll their agents again (NIXL tells a
            // producer of a registration only when asked).
            engine.wait_until(std::time::Instant::now() + PRODUCER_POLL);
        }
    });
    let c = tb.d.consumer.driver().core_counters();
    assert_eq!(
        (c.engine.completed, c.engine.failed, c.ingest.completions),
        (8, 0, 16)
    );
    assert_eq!(
        tb.d.consumer.driver().counters().notifications,
        16,
        "all drained by the pump"
    );
    assert_eq!(tb.d.consumer.latency().count(), 8);
    assert_eq!(tb.d.consumer.ingest_latency().count(), 8);
    assert_eq!(tb.d.consumer.handoff_latency().count(), 8);
}

/// A deadline the PR #50754 scenarios never reach: they wait for notices only.
const NO_DEADLINE_MS: u64 = 120_000;

/// The three scenarios of vLLM PR #50754 (P TP2 → D TP1, D expects 2), ten times each, each
/// followed by a healthy request that reuses the same source data and the same D blocks.
#[test]
fn pr50754_scenarios_ten_times_each_then_a_healthy_request() {
    let _s = serial();
    if !require_nixl_or_skip("pr50754_scenarios_ten_times_each_then_a_healthy_request") {
        return;
    }
    let (mut tb, cfg, mut e) = testbed("pr50754");
    // Request n uses slot 0 for its D blocks; the data seed is the same for every run.
    const SEED: u64 = 7;
    let seeds = |_: &str| SEED;
    fill_sources(&tb, 0, SEED);
    // Faults are keyed by P request id: "…-fail0" fails rank 0's write, "…-fail1" rank 1's.
    for r in 0..2u16 {
        let injector: FaultInjector = Box::new(move |req: &str, _d| {
            req.ends_with(&format!("-fail{r}"))
                .then_some(Fault::BadDescriptor)
        });
        tb.p.pushers[usize::from(r)].set_fault_injector(Some(injector));
    }
    let mut n = 0u64;
    for scenario in ["both_succeed", "fail_first", "fail_after"] {
        for round in 0..10 {
            // (first rank, second rank, which rank fails)
            let (first, second, failing) = match scenario {
                "both_succeed" => (0, 1, None),
                "fail_first" => (round % 2, 1 - round % 2, Some(round % 2)),
                _ => (round % 2, 1 - round % 2, Some(1 - round % 2)),
            };
            let id = n;
            n += 1;
            let suffix = failing.map_or(String::new(), |r| format!("-fail{r}"));
            let pid = format!("{}{suffix}", p_id(id));
            for p in &mut tb.p.pushers {
                p.offer(kvdrain_nixl::producer::Offer {
                    request_id: pid.clone(),
                    transfer_id: None,
                    block_ids: block_ids(0),
                })
                .expect("offer");
            }
            clear_d_blocks(&tb, 0);
            register_request(
                &mut tb.d,
                kvdrain_nixl::consumer::ReceiveSpec {
                    id: &d_id(id),
                    producer_engine: kvdrain_nixl::testbed::P_ENGINE,
                    remote_request_id: &pid,
                    transfer_id: Some(&pid),
                    blocks: BlockHandle(0),
                    block_ids: block_ids(0),
                    // Nothing here waits for a deadline: one that bites while a loaded host
                    // is slow to post the first write would decide the request `expired`
                    // before its notices (seen once at load 25 on 2 cores).
                    deadline: Some(kvdrain::Duration::from_millis(NO_DEADLINE_MS)),
                },
            );
            let before = tb.d.consumer.driver().core_counters().ingest;
            // Only the first producer runs until D has counted its notice: no decision yet.
            drive_checked(
                &mut tb,
                &cfg,
                &mut e,
                &[first],
                &seeds,
                "first notice",
                |tb, _| {
                    let now = tb.d.consumer.driver().core_counters().ingest;
                    now.completions + now.failure_notices
                        > before.completions + before.failure_notices
                },
            );
            assert!(
                e.d.events.is_empty(),
                "{scenario}: decided on the first notice: {:?}",
                e.d.events
            );
            drive_checked(
                &mut tb,
                &cfg,
                &mut e,
                &[first, second],
                &seeds,
                "decision",
                |_, e| e.d.saw("decode", &d_id(id)) || e.d.saw("release", &d_id(id)),
            );
            let got = e.d.take();
            let want: Vec<(&str, String)> = match failing {
                None => vec![("decode", d_id(id))],
                Some(_) => vec![("failed", d_id(id)), ("release", d_id(id))],
            };
            assert_eq!(got, want, "{scenario} round {round}");
            if failing.is_none() {
                check_d_blocks(&tb, &cfg, 0, SEED).expect("completed request holds the data");
            }

            // The healthy request: same data, same D blocks.
            let healthy = n;
            n += 1;
            clear_d_blocks(&tb, 0);
            offer_all(&mut tb, healthy, 0);
            assert!(register(&mut tb, healthy, 0, Some(NO_DEADLINE_MS)).is_empty());
            drive_checked(&mut tb, &cfg, &mut e, &[0, 1], &seeds, "healthy", |_, e| {
                e.d.saw("decode", &d_id(healthy))
            });
            assert_eq!(
                e.d.take(),
                vec![("decode", d_id(healthy))],
                "{scenario} round {round}: healthy"
            );
            // Every producer handed its source blocks back exactly once per request.
            run_until(&mut tb, &mut e, LIMIT, "source releases", |tb, _| {
                tb.p.pushers.iter().all(|p| p.in_flight() == 0)
            });
        }
    }
    let c = tb.d.consumer.driver().core_counters();
    assert_eq!(c.engine.completed, 40);
    assert_eq!(c.engine.failed, 20);
    assert_eq!(c.ingest.failure_notices, 20);
    assert_eq!(c.engine.expired, 0);
    let p: u64 =
        tb.p.pushers
            .iter()
            .map(|p| p.counters().post_failures)
            .sum();
    assert_eq!(p, 20, "one real descriptor failure per failing round");
    let m = kvdrain_nixl::metrics::Metrics::new();
    let ranks: Vec<_> = tb.p.pushers.iter().map(|p| p.counters()).collect();
    m.observe_producers(&ranks);
    let text = m.encode();
    assert!(
        text.contains("kvdrain:nixl_num_failed_transfers_total{cause=\"post\"} 20\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "kvdrain:nixl_num_sent_notifications_total{side=\"producer\",kind=\"push_fail\"} 20\n"
        ),
        "{text}"
    );
}

/// F4: the engine retired the request on P (lease over) before D's registration arrived:
/// nothing is posted, P answers with `PUSH_FAIL` for every edge, D fails at once.
#[test]
fn registration_for_a_retired_request_is_answered_with_failure_notices() {
    let _s = serial();
    if !require_nixl_or_skip("registration_for_a_retired_request_is_answered_with_failure_notices")
    {
        return;
    }
    let (mut tb, _cfg, mut e) = testbed("f4");
    fill_sources(&tb, 0, 1);
    offer_all(&mut tb, 0, 0);
    for r in 0..2 {
        tb.p.pushers[r].retire(&p_id(0), &mut e.p[r]);
        assert!(
            e.p[r].saw("source", &p_id(0)),
            "nothing posted: blocks back at once"
        );
    }
    register(&mut tb, 0, 0, Some(5_000));
    run_until(&mut tb, &mut e, LIMIT, "failed", |_, e| {
        e.d.saw("release", &d_id(0))
    });
    assert_eq!(e.d.take(), vec![("failed", d_id(0)), ("release", d_id(0))]);
    assert!(tb.d.pool.read(0).iter().all(|&b| b == 0), "no write landed");
    let posted: u64 = tb.p.pushers.iter().map(|p| p.counters().posted).sum();
    assert_eq!(posted, 0);
    assert_eq!(
        tb.d.consumer
            .driver()
            .core_counters()
            .ingest
            .failure_notices,
        2
    );
}

/// F8: one producer's handshake with D fails. Where it still got D's metadata it says so with
/// `PUSH_FAIL` (D fails fast); where it did not, D's deadline ends the request.
#[test]
fn handshake_failure_tells_d_where_it_can() {
    let _s = serial();
    if !require_nixl_or_skip("handshake_failure_tells_d_where_it_can") {
        return;
    }
    struct Refusing {
        rank: Option<ConsumerRank>,
    }
    impl Handshake for Refusing {
        fn consumer_rank(
            &mut self,
            engine_id: &str,
            d_rank: u16,
        ) -> Result<ConsumerRank, HandshakeError> {
            Err(HandshakeError {
                engine_id: engine_id.to_owned(),
                d_rank,
                reason: "compatibility hash mismatch".to_owned(),
                metadata: self.rank.as_ref().map(|r| r.metadata.clone()),
            })
        }
    }
    for reachable in [true, false] {
        let (mut tb, _cfg, mut e) = testbed(if reachable { "f8-reach" } else { "f8-silent" });
        let mut refusing = Refusing {
            rank: reachable.then(|| tb.d.rank().expect("rank")),
        };
        fill_sources(&tb, 0, 3);
        offer_all(&mut tb, 0, 0);
        // Reachable: the notice fails it long before this deadline; silent: the deadline.
        register(&mut tb, 0, 0, Some(if reachable { 20_000 } else { 800 }));
        let start = std::time::Instant::now();
        while !e.d.saw("release", &d_id(0)) && !e.d.saw("forced", &d_id(0)) {
            assert!(start.elapsed() < LIMIT, "no decision: {:?}", e.d.events);
            tick_p(&mut tb, &mut e, 0);
            tb.p.pushers[1]
                .tick(&mut refusing, &mut e.p[1])
                .expect("tick");
            tick_d(&mut tb, &mut e);
            std::thread::sleep(Duration::from_micros(200));
        }
        let events = e.d.take();
        if reachable {
            assert_eq!(events, vec![("failed", d_id(0)), ("release", d_id(0))]);
        } else {
            assert_eq!(events[0], ("expired", d_id(0)), "{events:?}");
        }
        assert!(
            e.p[1].saw("source", &p_id(0)),
            "P rank 1 released its blocks (nothing posted)"
        );
        assert_eq!(tb.p.pushers[1].counters().handshake_failures, 1);
    }
}

/// F9: heartbeats go to P while the request is in flight and stop at its decision (here the
/// deadline: the registration never pairs on P).
#[test]
fn heartbeats_stop_at_the_decision() {
    let _s = serial();
    if !require_nixl_or_skip("heartbeats_stop_at_the_decision") {
        return;
    }
    let mut cfg = TestbedConfig::new(&prefix("f9"));
    cfg.lease_ms = 300; // heartbeat every 50 ms
    let mut tb = Testbed::new(&cfg).expect("testbed");
    let mut e = Engines::new(cfg.p_tp);
    // P holds request "cmpl-p-0" but D's registration pairs with another key: stuck.
    offer_all(&mut tb, 0, 0);
    register_request(
        &mut tb.d,
        kvdrain_nixl::consumer::ReceiveSpec {
            id: &d_id(0),
            producer_engine: kvdrain_nixl::testbed::P_ENGINE,
            remote_request_id: &p_id(0),
            transfer_id: Some("no-such-transfer"),
            blocks: BlockHandle(0),
            block_ids: block_ids(0),
            deadline: Some(kvdrain::Duration::from_millis(1500)),
        },
    );
    run_until(&mut tb, &mut e, LIMIT, "expiry", |_, e| {
        e.d.saw("expired", &d_id(0))
    });
    let sent_at_expiry = tb.d.consumer.driver().counters().heartbeats_sent;
    // 2 agents × at least a few rounds of 50 ms within the 1.5 s deadline.
    assert!(
        sent_at_expiry >= 6,
        "heartbeats while in flight: {sent_at_expiry}"
    );
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_millis(400) {
        tick_p(&mut tb, &mut e, 0);
        tick_p(&mut tb, &mut e, 1);
        tick_d(&mut tb, &mut e);
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        tb.d.consumer.driver().counters().heartbeats_sent,
        sent_at_expiry,
        "heartbeats continued after the decision"
    );
    let received = e.p[0]
        .events
        .iter()
        .filter(|(ev, _)| *ev == "heartbeat")
        .count();
    assert!(
        received >= 1,
        "P's engine saw the heartbeats (lease extension hook)"
    );
}

/// Garbage on the wire (non-UTF-8 bytes, an agent nobody introduced) is ignored with a
/// reason and poisons no later poll.
#[test]
fn garbage_notifications_do_not_poison_later_polls() {
    let _s = serial();
    if !require_nixl_or_skip("garbage_notifications_do_not_poison_later_polls") {
        return;
    }
    let (mut tb, cfg, mut e) = testbed("garbage");
    let d_name = tb.d.consumer.agent().name().to_owned();
    let p0 = tb.p.pushers[0].agent().agent().clone();
    p0.load_remote_md(&tb.d.rank().expect("rank").metadata)
        .expect("load D");
    p0.send_notification(&d_name, b"\xff\xfe\x00garbage", None)
        .expect("send");
    p0.send_notification(&d_name, b"PUSH_REG:\x81\xff", None)
        .expect("send");
    let stranger =
        kvdrain_nixl::agent::UcxAgent::new(&format!("{}-stranger", cfg.prefix)).expect("agent");
    stranger
        .load_remote_metadata(&tb.d.rank().expect("rank").metadata)
        .expect("load D");
    fill_sources(&tb, 0, 9);
    register(&mut tb, 0, 0, None);
    stranger
        .agent()
        .send_notification(&d_name, b"cmpl-d-0:2", None)
        .expect("send");
    // Everything odd is counted (and changes nothing) before the producers write.
    run_only(&mut tb, &mut e, &[], LIMIT, "garbage counted", |tb, _| {
        let c = tb.d.consumer.driver().core_counters().ingest;
        c.malformed + c.not_for_consumer + c.unexpected_sender == 3
    });
    assert!(e.d.events.is_empty());
    offer_all(&mut tb, 0, 0);
    run_until(&mut tb, &mut e, LIMIT, "completion", |_, e| {
        e.d.saw("decode", &d_id(0))
    });
    check_d_blocks(&tb, &cfg, 0, 9).expect("data");
    let c = tb.d.consumer.driver().core_counters().ingest;
    assert_eq!(c.malformed, 1);
    assert_eq!(c.not_for_consumer, 1);
    assert_eq!(c.unexpected_sender, 1, "{c:?}");
    assert_eq!(tb.d.consumer.driver().counters().from_strangers, 1);
}
