//! Both drivers end to end over the in-process transport: one test per protocol rule.

mod common;

use common::{D_ENGINE, P_ENGINE, consumer_rank, producer_agents};
use kvdrain::{BlockHandle, Config, Duration, Instant, Outstanding};
use kvdrain_driver::consumer::{ConsumerDriver, ConsumerEvent, EdgeMode, ReceiveSpec, Registered};
use kvdrain_driver::memory::{MemoryFabric, MemoryTransport, MemoryWrite, WriteFault};
use kvdrain_driver::producer::{Offer, ProducerConfig, ProducerDriver, ProducerEvent};
use kvdrain_driver::registration::PushRegistration;

struct Cluster {
    fabric: MemoryFabric,
    d: ConsumerDriver<64, 8>,
    dt: MemoryTransport,
    p: Vec<(ProducerDriver<MemoryWrite>, MemoryTransport)>,
    d_events: Vec<ConsumerEvent>,
    p_events: Vec<Vec<ProducerEvent>>,
    now: Instant,
}

/// A cluster whose consumer releases with the decision (`settle_ms = 0`, vLLM's way): the
/// rules below are about who owes what, not about settling.
fn cluster(p_tp: u16, lease_ms: u64, extra_agents: &[&str]) -> Cluster {
    cluster_settling(p_tp, lease_ms, extra_agents, 0)
}

fn cluster_settling(p_tp: u16, lease_ms: u64, extra_agents: &[&str], settle_ms: u64) -> Cluster {
    let fabric = MemoryFabric::new();
    let dt = fabric.endpoint("d0");
    fabric.publish_consumer(D_ENGINE, 0, "d0");
    let mut ledger = Config::with_capacity(64);
    ledger.deadline = Duration::from_millis(1_000);
    ledger.quarantine = Duration::from_millis(2_000);
    ledger.settle = Duration::from_millis(settle_ms);
    let mut agents = producer_agents(p_tp);
    for (i, extra) in extra_agents.iter().enumerate() {
        agents[i] = (*extra).to_owned();
    }
    let p = (0..p_tp)
        .map(|r| {
            let mut config = ProducerConfig::new(P_ENGINE, r, p_tp);
            config.lease = Duration::from_millis(lease_ms);
            (
                ProducerDriver::new(config),
                fabric.endpoint(&format!("p{r}")),
            )
        })
        .collect();
    let d = consumer_rank(ledger, Duration::from_millis(lease_ms), agents);
    Cluster {
        fabric,
        d,
        dt,
        p,
        d_events: Vec::new(),
        p_events: vec![Vec::new(); usize::from(p_tp)],
        now: Instant::ZERO,
    }
}

impl Cluster {
    fn step(&mut self) {
        self.now += Duration::from_millis(1);
        for (r, (p, t)) in self.p.iter_mut().enumerate() {
            p.tick(t, self.now).expect("producer tick");
            while let Some(e) = p.poll_event() {
                self.p_events[r].push(e);
            }
        }
        self.d.poll(&mut self.dt, self.now).expect("consumer poll");
        while let Some(e) = self.d.engine().poll_event() {
            self.d_events.push(e);
        }
    }

    fn run(&mut self, steps: u64) {
        for _ in 0..steps {
            self.step();
        }
    }

    fn run_until(&mut self, limit: u64, mut done: impl FnMut(&Self) -> bool) {
        for _ in 0..limit {
            if done(self) {
                return;
            }
            self.step();
        }
        panic!(
            "not done after {limit} steps: D {:?}, P {:?}",
            self.d_events, self.p_events
        );
    }

    fn offer(&mut self, p_id: &str, transfer_id: Option<&str>) {
        for (p, _) in &mut self.p {
            p.offer(
                Offer {
                    request_id: p_id.into(),
                    transfer_id: transfer_id.map(str::to_owned),
                    block_ids: vec![vec![1, 2]],
                },
                self.now,
            )
            .expect("offer");
        }
    }

    fn register(&mut self, d_id: &str, p_id: &str, transfer_id: Option<&str>) -> Registered {
        self.d
            .engine()
            .register(
                &mut self.dt,
                ReceiveSpec {
                    id: d_id,
                    producer_engine: P_ENGINE,
                    remote_request_id: p_id,
                    transfer_id,
                    blocks: BlockHandle(7),
                    block_ids: vec![vec![10, 11]],
                    deadline: None,
                },
                self.now,
            )
            .expect("register")
    }

    fn d_kinds(&self) -> Vec<&'static str> {
        self.d_events
            .iter()
            .map(|e| match e {
                ConsumerEvent::Decode { .. } => "decode",
                ConsumerEvent::Failed { .. } => "failed",
                ConsumerEvent::Expired { .. } => "expired",
                ConsumerEvent::Release { forced: false, .. } => "release",
                ConsumerEvent::Release { forced: true, .. } => "forced",
            })
            .collect()
    }

    fn released(&self, rank: usize, p_id: &str) -> usize {
        self.p_events[rank]
            .iter()
            .filter(
                |e| matches!(e, ProducerEvent::SourceReleased { request_id } if request_id == p_id),
            )
            .count()
    }
}

#[test]
fn healthy_push_completes_and_each_rank_releases_its_sources_once() {
    let mut c = cluster(2, 30_000, &[]);
    c.offer("req-1", None);
    let reg = c.register("req-1", "req-1", None);
    assert!(reg.unreached.is_empty());
    c.run_until(20, |c| !c.d_events.is_empty());
    assert_eq!(c.d_kinds(), ["decode"]);
    c.run(3);
    assert_eq!((c.released(0, "req-1"), c.released(1, "req-1")), (1, 1));
    let landed = c.fabric.take_landed();
    assert_eq!(landed.len(), 2);
    assert!(landed.iter().all(|w| w.dest == vec![vec![10, 11]]));
    assert_eq!(c.p[0].0.counters().landed, 1);
    assert_eq!(c.p[0].0.in_flight(), 0, "forgotten once done");
}

#[test]
fn c2_never_posted_edges_get_push_fail_at_once() {
    let mut c = cluster(2, 30_000, &[]);
    c.fabric.set_fault_script(Some(Box::new(|s| {
        if s.tp_rank == 1 {
            WriteFault::Descriptor
        } else {
            WriteFault::None
        }
    })));
    c.offer("r", None);
    c.register("r", "r", None);
    c.run_until(20, |c| c.d_events.len() >= 2);
    assert_eq!(c.d_kinds(), ["failed", "release"]);
    let p1 = c.p[1].0.counters();
    assert_eq!((p1.post_failures, p1.notices_sent, p1.posted), (1, 1, 0));
    assert_eq!(
        c.released(1, "r"),
        1,
        "nothing posted: sources back at once"
    );
    assert_eq!(c.d.core_counters().ingest.failure_notices, 1);
}

#[test]
fn f7_backend_error_after_post_owes_a_push_fail() {
    let mut c = cluster(2, 30_000, &[]);
    c.fabric.set_write_polls(3);
    c.fabric.set_fault_script(Some(Box::new(|s| {
        if s.tp_rank == 1 {
            WriteFault::BackendError
        } else {
            WriteFault::None
        }
    })));
    c.offer("r", None);
    c.register("r", "r", None);
    c.run_until(30, |c| c.d_events.len() >= 2);
    assert_eq!(c.d_kinds(), ["failed", "release"]);
    let p1 = c.p[1].0.counters();
    assert_eq!(
        (p1.posted, p1.failed_after_post, p1.notices_sent),
        (1, 1, 1)
    );
    assert_eq!(c.released(1, "r"), 1);
}

#[test]
fn f7_unknown_status_sends_nothing_keeps_sources_fenced_and_the_deadline_decides() {
    let mut c = cluster(2, 30_000, &[]);
    c.fabric.set_fault_script(Some(Box::new(|s| {
        if s.tp_rank == 1 && s.producer_request_id == "r-1" {
            WriteFault::Unknown
        } else if s.tp_rank == 1 && s.producer_request_id == "r-2" {
            WriteFault::BackendError
        } else {
            WriteFault::None
        }
    })));
    c.offer("r-1", None);
    c.register("r-1", "r-1", None);
    c.run(900);
    assert!(c.d_events.is_empty(), "nothing decided before the deadline");
    let p1 = c.p[1].0.counters();
    assert_eq!((p1.status_unknown, p1.notices_sent), (1, 0), "{p1:?}");
    assert_eq!(
        c.released(1, "r-1"),
        0,
        "sources fenced while the write may land"
    );
    c.run_until(200, |c| !c.d_events.is_empty());
    assert_eq!(c.d_kinds(), ["expired"], "D's deadline decides");
    assert_eq!(c.released(1, "r-1"), 0);
    // A backend error on another transfer to the same consumer rank bounds the unknown one.
    c.offer("r-2", None);
    c.register("r-2", "r-2", None);
    c.run_until(50, |c| c.released(1, "r-1") == 1);
    let p1 = c.p[1].0.counters();
    assert_eq!(p1.failed_after_post, 1);
    assert_eq!(
        p1.notices_sent, 2,
        "r-2's own notice and r-1's, now bounded"
    );
    assert_eq!(p1.plan_errors, 0);
}

#[test]
fn f3_lease_running_out_mid_write_stops_posts_but_sources_wait_for_the_write() {
    let mut c = cluster(2, 12, &[]);
    c.fabric.set_write_polls(40);
    c.offer("r", None);
    // D's registration goes out, but D is not polled: no heartbeat reaches P in time.
    c.register("r", "r", None);
    for _ in 0..30 {
        c.now += Duration::from_millis(1);
        for (r, (p, t)) in c.p.iter_mut().enumerate() {
            p.tick(t, c.now).expect("tick");
            while let Some(e) = p.poll_event() {
                c.p_events[r].push(e);
            }
        }
    }
    let p0 = c.p[0].0.counters();
    assert_eq!((p0.posted, p0.leases_expired), (1, 1), "{p0:?}");
    assert_eq!(
        c.released(0, "r"),
        0,
        "F3: source held while the write reads it"
    );
    c.run_until(40, |c| c.released(0, "r") == 1 && c.released(1, "r") == 1);
    assert_eq!(
        c.p[0].0.counters().notices_sent,
        0,
        "a posted edge owes nothing"
    );
    c.run_until(5, |c| !c.d_events.is_empty());
    assert_eq!(c.d_kinds(), ["decode"], "the writes landed");
}

#[test]
fn f4_registration_for_a_retired_request_is_answered_with_push_fail() {
    let mut c = cluster(2, 30_000, &[]);
    c.offer("r", None);
    for (p, _) in &mut c.p {
        p.retire("r");
    }
    c.run(1);
    assert_eq!((c.released(0, "r"), c.released(1, "r")), (1, 1));
    c.register("r", "r", None);
    c.run_until(10, |c| c.d_events.len() >= 2);
    assert_eq!(c.d_kinds(), ["failed", "release"]);
    for (p, _) in &c.p {
        let k = p.counters();
        assert_eq!(
            (k.registrations_retired, k.posted, k.notices_sent),
            (1, 0, 1)
        );
    }
    assert!(c.fabric.take_landed().is_empty());
}

/// F11: every rank of a consumer sends its own `PUSH_REG`. A copy that reaches a producer
/// after the request was pushed and retired there was answered already: it is a duplicate,
/// not a late registration owed a `PUSH_FAIL` per edge (which counting mode would count as
/// siblings' notices).
#[test]
fn f11_a_late_copy_of_an_answered_registration_is_a_duplicate_not_f4() {
    let mut c = cluster(2, 30_000, &[]);
    c.offer("r", None);
    c.register("r", "r", None);
    c.run_until(10, |c| !c.d_events.is_empty());
    c.run(3);
    assert_eq!(c.d_kinds(), ["decode"]);
    assert_eq!((c.released(0, "r"), c.released(1, "r")), (1, 1));
    let copy = PushRegistration {
        request_id: "r".into(),
        decode_engine_id: D_ENGINE.into(),
        decode_host: "127.0.0.1".into(),
        decode_port: 1,
        decode_tp_size: 1,
        local_block_ids: vec![vec![10, 11]],
        remote_engine_id: P_ENGINE.into(),
        remote_host: "127.0.0.1".into(),
        remote_port: 2,
        remote_tp_size: 2,
        remote_pp_size: 1,
        transfer_id: None,
    }
    .to_notification();
    let heard = c.d.counters().notifications;
    for r in 0..2 {
        c.fabric.inject("d1", &format!("p{r}"), &copy);
    }
    c.run(5);
    for (p, _) in &c.p {
        let k = p.counters();
        assert_eq!(
            (
                k.registrations_duplicate,
                k.registrations_retired,
                k.notices_sent
            ),
            (1, 0, 0),
            "{k:?}"
        );
    }
    assert_eq!(
        c.d.counters().notifications,
        heard,
        "nothing more reached D"
    );
}

/// `EdgeMode::Count` asks for vLLM's count although every producer is named; and
/// `next_timer` names the next heartbeat, then the deadline once nothing else is due.
#[test]
fn count_mode_on_request_and_the_next_timer() {
    let mut c = cluster(2, 600, &[]);
    assert_eq!(
        c.d.engine().next_timer(),
        None,
        "nothing tracked, nothing due"
    );
    c.d.engine()
        .register_with(
            &mut c.dt,
            ReceiveSpec {
                id: "r",
                producer_engine: P_ENGINE,
                remote_request_id: "r",
                transfer_id: None,
                blocks: BlockHandle(7),
                block_ids: vec![vec![10, 11]],
                deadline: Some(Duration::from_millis(250)),
            },
            EdgeMode::Count,
            c.now,
        )
        .expect("register");
    // Heartbeats every 600 / 6 = 100 ms from the last round (at 0), before the deadline.
    assert_eq!(c.d.engine().next_timer(), Some(Instant::from_millis(100)));
    c.run_until(400, |c| !c.d_events.is_empty());
    assert_eq!(c.now.millis(), 250, "decided by the poll at its deadline");
    match &c.d_events[..] {
        [ConsumerEvent::Expired { outstanding, .. }] => {
            assert_eq!(*outstanding, Outstanding::Count(2));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn f10_vllm_ids_pair_by_base_id_and_heartbeats_use_the_producer_id() {
    // vLLM randomizes ids per engine: P and D see one request under different suffixes.
    let (p_id, d_id) = ("cmpl-abc-0-1a2b3c4d", "cmpl-abc-0-DEADBEEF");
    let mut c = cluster(2, 60, &[]);
    c.fabric.set_write_polls(150);
    c.offer(p_id, None);
    c.register(d_id, p_id, None);
    c.run_until(400, |c| !c.d_events.is_empty());
    assert_eq!(c.d_kinds(), ["decode"]);
    let p0 = c.p[0].0.counters();
    assert_eq!(p0.leases_expired, 0, "heartbeats kept the lease: {p0:?}");
    assert!(p0.heartbeats >= 10, "{p0:?}");
    assert!(c.p_events[0].contains(&ProducerEvent::LeaseExtended {
        request_id: p_id.into()
    }));
    // F9: heartbeats stop at the decision.
    let sent = c.d.counters().heartbeats_sent;
    c.run(100);
    assert_eq!(c.d.counters().heartbeats_sent, sent);
}

#[test]
fn f10_pairs_by_transfer_id_and_registration_may_come_first() {
    let mut c = cluster(1, 30_000, &[]);
    c.register("d-side-id", "p-side-id", Some("xfer-77"));
    c.run(2);
    assert_eq!(c.p[0].0.in_flight(), 0, "stashed, nothing offered yet");
    c.offer("p-side-id", Some("xfer-77"));
    c.run_until(10, |c| !c.d_events.is_empty());
    assert_eq!(c.d_kinds(), ["decode"]);
}

#[test]
fn f6_unreached_producer_is_reported_and_its_edge_waits_for_the_deadline() {
    let mut c = cluster(2, 30_000, &["ghost"]);
    c.offer("r", None);
    let reg = c.register("r", "r", None);
    assert_eq!(reg.unreached, ["ghost"]);
    assert_eq!(c.d.counters().registrations_failed, 1);
    c.run(500);
    assert!(
        c.d_events.is_empty(),
        "p1 wrote, the ghost never will: pending"
    );
    c.run_until(600, |c| !c.d_events.is_empty());
    assert_eq!(c.d_kinds(), ["expired"]);
}

#[test]
fn a_producer_gone_mid_write_is_reported_gone() {
    let mut c = cluster(2, 30_000, &[]);
    c.fabric.set_write_polls(50);
    c.offer("r", None);
    c.register("r", "r", None);
    c.run(5);
    c.fabric.kill("p1");
    // p1's edge resolves by the gone (or by the PUSH_FAIL its producer driver sent for
    // the write the death failed, if that came first); the failure waits for p0's write.
    c.run_until(100, |c| c.d_events.len() >= 2);
    assert_eq!(c.d_kinds(), ["failed", "release"]);
    let counters = c.d.counters();
    let core = c.d.core_counters();
    assert_eq!(counters.gones, 1);
    assert_eq!(counters.gone_edges, core.engine.gone_edges);
    assert_eq!(core.engine.gone_edges + core.ingest.failure_notices, 1);
    assert_eq!(counters.fences, 0, "a dead peer is not a fenced one");
}

/// A dead producer's bytes already in flight can still land after its death is seen
/// (measured over UCX TCP), so the driver reports it gone, not fenced: its edge fails at
/// once, as by a failure notice, and the blocks come back only `settle_ms` later.
#[test]
fn a_dead_producer_fails_its_edges_at_once_and_settles_for_settle_ms() {
    let mut c = cluster_settling(2, 30_000, &[], 40);
    c.fabric.set_write_polls(1);
    c.offer("r", None);
    c.register("r", "r", None);
    c.fabric.kill("p1");
    let killed_at = c.now;
    c.run_until(100, |c| c.d.counters().gones == 1);
    let seen_at = c.now;
    assert_eq!(c.d.counters().disconnects, 1);
    assert_eq!(c.d.core_counters().engine.gone_edges, 1);
    c.run_until(100, |c| !c.d_events.is_empty());
    assert_eq!(c.d_kinds(), ["failed"], "decided once p0 landed, not later");
    c.run_until(200, |c| c.d_events.len() >= 2);
    assert_eq!(c.d_kinds(), ["failed", "release"]);
    assert!(
        c.now >= seen_at + Duration::from_millis(40),
        "released at {} after a death at {killed_at} seen at {seen_at}",
        c.now
    );
    assert!(
        c.now <= seen_at + Duration::from_millis(41),
        "released at {}, not at the settle end {}",
        c.now,
        seen_at + Duration::from_millis(40)
    );
}

#[test]
fn a_gone_says_nothing_about_requests_registered_later() {
    let mut c = cluster(2, 30_000, &[]);
    c.offer("r", None);
    c.register("r", "r", None);
    c.run_until(100, |c| !c.d_events.is_empty());
    assert_eq!(c.d_kinds(), ["decode"]);
    c.fabric.kill("p1");
    c.run_until(100, |c| c.d.counters().gones == 1);
    // p1 is known gone: s's PUSH_REG does not go to it (F6), and its edge waits for the
    // deadline; the gone reported before resolves nothing of s.
    c.offer("s", None);
    let reg =
        c.d.engine()
            .register(
                &mut c.dt,
                ReceiveSpec {
                    id: "s",
                    producer_engine: P_ENGINE,
                    remote_request_id: "s",
                    transfer_id: None,
                    blocks: BlockHandle(7),
                    block_ids: vec![vec![10, 11]],
                    deadline: Some(Duration::from_millis(300)),
                },
                c.now,
            )
            .expect("register");
    assert_eq!(reg.unreached, ["p1"]);
    assert_eq!(c.d.counters().gones, 1);
    c.run_until(400, |c| c.d_events.len() >= 2);
    assert_eq!(c.d_kinds(), ["decode", "expired"]);
}

#[test]
fn split_consumer_ingests_on_one_thread_and_decides_on_another() {
    use kvdrain_driver::Transport;
    use std::sync::atomic::{AtomicBool, Ordering};

    let mut c = cluster(2, 30_000, &[]);
    let mut ingest_endpoint = c.fabric.endpoint("d0");
    let stop = AtomicBool::new(false);
    let requests = 50; // the ledger holds 64
    let (mut decoded, mut ingested) = (0, 0u64);
    let (mut ingest, mut engine) = c.d.split();
    std::thread::scope(|s| {
        let stop = &stop;
        let ingester = s.spawn(move || {
            let mut batch = Vec::new();
            let mut seen = 0u64;
            while !stop.load(Ordering::Acquire) {
                batch.clear();
                ingest_endpoint
                    .drain_notifications(&mut batch)
                    .expect("drain");
                for (sender, bytes) in &batch {
                    let _ = ingest.ingest(sender, bytes);
                    seen += 1;
                }
                std::thread::yield_now();
            }
            seen
        });
        // Stops the ingest thread however this thread leaves the scope (a panic too).
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Release);
            }
        }
        let guard = StopOnDrop(stop);
        let mut now = Instant::ZERO;
        for n in 0..requests {
            let id = format!("r-{n}");
            for (p, _) in &mut c.p {
                p.offer(
                    Offer {
                        request_id: id.clone(),
                        transfer_id: None,
                        block_ids: vec![vec![1]],
                    },
                    now,
                )
                .expect("offer");
            }
            engine
                .register(
                    &mut c.dt,
                    ReceiveSpec {
                        id: &id,
                        producer_engine: P_ENGINE,
                        remote_request_id: &id,
                        transfer_id: None,
                        blocks: BlockHandle(n),
                        block_ids: vec![vec![n]],
                        deadline: None,
                    },
                    now,
                )
                .expect("register");
        }
        let start = std::time::Instant::now();
        while decoded < requests && start.elapsed().as_secs() < 20 {
            now += Duration::from_millis(1);
            for (p, t) in &mut c.p {
                p.tick(t, now).expect("tick");
                while p.poll_event().is_some() {}
            }
            // The engine half never drains: the ingest thread owns the mailbox. The decodes
            // are counted from the events below, not from the requests taken.
            let _ = engine.take_ready();
            engine.advance(now);
            while let Some(e) = engine.poll_event() {
                assert!(matches!(e, ConsumerEvent::Decode { .. }), "{e:?}");
                decoded += 1;
            }
            std::thread::yield_now();
        }
        drop(guard);
        ingested = ingester.join().expect("ingest thread");
    });
    assert_eq!(decoded, requests, "decoded in 20 s");
    assert_eq!(ingested, 2 * requests);
    assert_eq!(c.d.counters().notifications, 2 * requests);
    assert_eq!(c.d.core_counters().engine.completed, requests);
}

#[test]
fn f4_a_stashed_registration_of_a_request_retired_before_its_offer_is_answered() {
    let mut c = cluster(2, 30_000, &[]);
    c.register("r", "r", None);
    c.run(2);
    for (p, _) in &mut c.p {
        p.retire("r");
    }
    c.run_until(10, |c| c.d_events.len() >= 2);
    assert_eq!(c.d_kinds(), ["failed", "release"]);
    assert_eq!(c.p[0].0.counters().registrations_retired, 1);
    assert_eq!(c.p[0].0.in_flight(), 0, "nothing left in the stash");
}

/// Wraps a transport: sends to consumer ranks read as stale metadata until the driver drops
/// the peer's metadata, and every `forget_peer` is recorded.
struct StaleUntilForgotten {
    inner: MemoryTransport,
    forgot: Vec<(String, u16)>,
    stale: bool,
}

impl kvdrain_driver::Transport for StaleUntilForgotten {
    type Write = MemoryWrite;
    fn post_write(
        &mut self,
        spec: &kvdrain_driver::transport::WriteSpec<'_>,
    ) -> Result<kvdrain_driver::transport::Posted<MemoryWrite>, kvdrain_driver::transport::PostError>
    {
        self.inner.post_write(spec)
    }
    fn poll_write(&mut self, w: &mut MemoryWrite) -> kvdrain_driver::transport::WriteStatus {
        self.inner.poll_write(w)
    }
    fn send_notification(
        &mut self,
        to: kvdrain_driver::transport::Peer<'_>,
        bytes: &[u8],
    ) -> Result<(), kvdrain_driver::transport::SendError> {
        if self.stale && matches!(to, kvdrain_driver::transport::Peer::ConsumerRank { .. }) {
            return Err(kvdrain_driver::transport::SendError::Stale);
        }
        self.inner.send_notification(to, bytes)
    }
    fn drain_notifications(
        &mut self,
        out: &mut Vec<kvdrain_driver::transport::Notification>,
    ) -> Result<(), kvdrain_driver::transport::DrainError> {
        self.inner.drain_notifications(out)
    }
    fn peer_gone(&mut self) -> Option<kvdrain_driver::transport::GonePeer> {
        self.inner.peer_gone()
    }
    fn forget_peer(&mut self, to: kvdrain_driver::transport::Peer<'_>) {
        if let kvdrain_driver::transport::Peer::ConsumerRank { engine, rank } = to {
            self.forgot.push((engine.to_owned(), rank));
        }
        self.stale = false;
    }
}

/// F7: a producer never drops a consumer rank's metadata (nor re-handshakes) while a
/// transfer to it is unfinished — an owed notice waits instead — and does once nothing to
/// it is unfinished.
#[test]
fn f7_stale_peer_metadata_is_refreshed_only_when_nothing_to_it_is_unfinished() {
    let mut c = cluster(1, 30_000, &[]);
    c.fabric
        .set_fault_script(Some(Box::new(|s| match s.producer_request_id {
            "r-1" => WriteFault::Unknown,
            "r-2" => WriteFault::Descriptor,
            _ => WriteFault::BackendError,
        })));
    let (mut p, t) = c.p.pop().expect("one rank");
    let mut t = StaleUntilForgotten {
        inner: t,
        forgot: Vec::new(),
        stale: true,
    };
    let tick =
        |p: &mut ProducerDriver<MemoryWrite>, t: &mut StaleUntilForgotten, c: &mut Cluster| {
            c.now += Duration::from_millis(1);
            p.tick(t, c.now).expect("tick");
            c.d.poll(&mut c.dt, c.now).expect("poll");
            while let Some(e) = c.d.engine().poll_event() {
                c.d_events.push(e);
            }
        };
    for id in ["r-1", "r-2"] {
        p.offer(
            Offer {
                request_id: id.into(),
                transfer_id: None,
                block_ids: vec![vec![1]],
            },
            Instant::ZERO,
        )
        .expect("offer");
        c.register(id, id, None);
    }
    for _ in 0..20 {
        tick(&mut p, &mut t, &mut c);
    }
    let k = p.counters();
    assert_eq!(
        (k.status_unknown, k.post_failures, k.notices_sent),
        (1, 1, 0),
        "{k:?}"
    );
    assert!(
        t.forgot.is_empty(),
        "metadata dropped while r-1's write may land"
    );
    // Another transfer to the same rank ends with a backend error: r-1's write is bounded,
    // nothing to the rank is unfinished, the metadata is refreshed and both notices go.
    p.offer(
        Offer {
            request_id: "r-3".into(),
            transfer_id: None,
            block_ids: vec![vec![1]],
        },
        c.now,
    )
    .expect("offer");
    c.register("r-3", "r-3", None);
    for _ in 0..20 {
        tick(&mut p, &mut t, &mut c);
    }
    assert_eq!(t.forgot, [(D_ENGINE.to_owned(), 0)]);
    let k = p.counters();
    assert_eq!((k.failed_after_post, k.notices_sent), (1, 3), "{k:?}");
    assert_eq!(p.in_flight(), 0);
}

#[test]
fn offers_beyond_capacity_are_handed_back() {
    let mut config = ProducerConfig::new(P_ENGINE, 0, 1);
    config.capacity = 2;
    let mut p: ProducerDriver<MemoryWrite> = ProducerDriver::new(config);
    let offer = |id: &str| Offer {
        request_id: id.into(),
        transfer_id: None,
        block_ids: vec![vec![1]],
    };
    p.offer(offer("a"), Instant::ZERO).expect("room");
    assert!(matches!(
        p.offer(offer("a"), Instant::ZERO),
        Err(kvdrain_driver::producer::OfferError::Duplicate(o)) if o.request_id == "a"
    ));
    p.offer(offer("b"), Instant::ZERO).expect("room");
    assert!(matches!(
        p.offer(offer("c"), Instant::ZERO),
        Err(kvdrain_driver::producer::OfferError::Full(o)) if o.request_id == "c"
    ));
    assert_eq!(p.counters().offers_refused, 2);
}
