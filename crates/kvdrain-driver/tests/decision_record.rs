//! The record every decision carries ([`DecisionRecord`]): one test per way a request
//! ends, each checking every field the record reports against what the scenario did,
//! with the edges named by the producer agents the directory was given.
//!
//! D rank 0 of TP 1 receives from a TP-4 producer engine (agents `p0`..`p3`), whose
//! agents are bare endpoints of the in-process fabric: the notices are sent by hand, so
//! each edge resolves when and how the test says. Deadline 1000, quarantine 2000, settle
//! 100.

mod common;

use common::{P_ENGINE, consumer_rank, producer_agents};
use kvdrain::{BlockHandle, Config, Duration, EdgeOutcome, Ended, FailureCause, Instant};
use kvdrain_driver::Transport;
use kvdrain_driver::consumer::{
    ConsumerDriver, ConsumerEvent, DecisionRecord, EdgeMode, ReceiveSpec, RecordEdges,
};
use kvdrain_driver::memory::{MemoryFabric, MemoryTransport};
use kvdrain_driver::transport::Peer;

fn at(ms: u64) -> Instant {
    Instant::from_millis(ms)
}

struct Rank {
    d: ConsumerDriver<64, 8>,
    fabric: MemoryFabric,
    dt: MemoryTransport,
    /// P's endpoints, `p0`..`p3`.
    p: Vec<MemoryTransport>,
}

fn rank(lease_ms: u64) -> Rank {
    let fabric = MemoryFabric::new();
    let dt = fabric.endpoint("d0");
    let p = (0..4).map(|r| fabric.endpoint(&format!("p{r}"))).collect();
    let mut ledger = Config::with_capacity(64);
    ledger.deadline = Duration::from_millis(1_000);
    ledger.quarantine = Duration::from_millis(2_000);
    ledger.settle = Duration::from_millis(100);
    let d = consumer_rank(ledger, Duration::from_millis(lease_ms), producer_agents(4));
    Rank { d, fabric, dt, p }
}

impl Rank {
    fn register(&mut self, id: &str, mode: EdgeMode, now: u64) {
        let spec = ReceiveSpec {
            id,
            producer_engine: P_ENGINE,
            remote_request_id: id,
            transfer_id: None,
            blocks: BlockHandle(7),
            block_ids: vec![vec![10, 11]],
            deadline: None,
        };
        self.d
            .engine()
            .register_with(&mut self.dt, spec, mode, at(now))
            .expect("registered");
    }

    /// Producer `rank` sends `bytes` to D.
    fn notice(&mut self, rank: usize, bytes: &[u8]) {
        self.p[rank]
            .send_notification(Peer::Agent("d0"), bytes)
            .expect("sent");
    }

    fn poll(&mut self, now: u64) -> Vec<ConsumerEvent> {
        self.d.poll(&mut self.dt, at(now)).expect("round");
        self.events()
    }

    fn events(&mut self) -> Vec<ConsumerEvent> {
        let mut engine = self.d.engine();
        std::iter::from_fn(|| engine.poll_event()).collect()
    }
}

/// The named edges as `(agent, outcome)`: the core's causes, by the directory's names.
fn edges(record: &DecisionRecord) -> Vec<(&str, EdgeOutcome)> {
    record
        .edges
        .named()
        .iter()
        .map(|e| (&*e.agent, e.outcome))
        .collect()
}

fn only(events: Vec<ConsumerEvent>) -> ConsumerEvent {
    match <[ConsumerEvent; 1]>::try_from(events) {
        Ok([e]) => e,
        Err(events) => panic!("one event expected: {events:?}"),
    }
}

#[test]
fn completed_every_edge_landed_by_name_and_nothing_failed() {
    let mut r = rank(60_000);
    // The core's clock moves at a round (a registration does not move it).
    assert!(r.poll(5).is_empty());
    r.register("r", EdgeMode::Named, 5);
    for p in 0..4 {
        r.notice(p, b"r:4");
    }
    let e = only(r.poll(20));
    assert!(matches!(e, ConsumerEvent::Decode { .. }), "{e:?}");
    assert_eq!(e.request().id, "r");
    let rec = e.record();
    assert_eq!(rec.key, e.request().key);
    assert_eq!((rec.registered_at, rec.deadline), (at(5), at(1_005)));
    let landed = EdgeOutcome::Landed;
    assert_eq!(
        edges(rec),
        [
            ("p0", landed),
            ("p1", landed),
            ("p2", landed),
            ("p3", landed)
        ]
    );
    assert_eq!(rec.first_failure, None);
    // Taken as its last notice was ingested, before the round advanced the core's clock
    // from 5 to 20: the ledger's times are its clock's.
    assert_eq!(rec.decided_at, Some(at(5)));
    assert_eq!(rec.released, Some((at(5), false)));
    assert!(!rec.forced());
    let unset = (
        rec.failure_notice_at,
        rec.gone_at,
        rec.fenced_at,
        rec.settle_end,
    );
    assert_eq!(unset, (None, None, None, None));
    assert_eq!(rec.ended, None);
}

/// One request, each edge resolved another way: `p0` lands, `p1` sends `PUSH_FAIL` at
/// 20, the driver reports `p2` gone at 30 and fences `p3` at 40. The failure is decided
/// by the fence; the blocks settle for the notice and the gone (rule 8) and come back at
/// 130, the later of their settle ends.
#[test]
fn failed_names_how_and_when_each_edge_resolved() {
    let mut r = rank(60_000);
    r.register("r", EdgeMode::Named, 0);
    r.notice(0, b"r:4");
    assert!(r.poll(10).is_empty());
    r.notice(1, b"PUSH_FAIL:r:4");
    assert!(r.poll(20).is_empty(), "p2 and p3 still owe");
    assert!(r.poll(30).is_empty());
    assert_eq!(r.d.engine().gone("p2"), 1);
    assert!(r.events().is_empty(), "p3 still owes");
    r.d.engine().advance(at(40));
    assert_eq!(r.d.engine().fence("p3"), 1);
    let failed = only(r.events());
    assert!(matches!(failed, ConsumerEvent::Failed { .. }), "{failed:?}");
    let released = r.poll(129);
    assert!(released.is_empty(), "settling: {released:?}");
    let released = only(r.poll(130));
    assert!(
        matches!(released, ConsumerEvent::Release { forced: false, .. }),
        "{released:?}"
    );
    let expected = [
        ("p0", EdgeOutcome::Landed),
        ("p1", EdgeOutcome::FailureNotice),
        ("p2", EdgeOutcome::Gone),
        ("p3", EdgeOutcome::Fenced),
    ];
    for e in [&failed, &released] {
        let rec = e.record();
        assert_eq!(edges(rec), expected, "{e:?}");
        assert_eq!(rec.first_failure, Some(FailureCause::Notice(at(20))));
        assert_eq!(
            (rec.failure_notice_at, rec.gone_at, rec.fenced_at),
            (Some(at(20)), Some(at(30)), Some(at(40)))
        );
        assert_eq!(rec.decided_at, Some(at(40)));
        assert_eq!(rec.settle_end, Some(at(130)));
        assert_eq!(rec.ended, None);
    }
    assert_eq!(failed.record().released, None, "not back yet");
    assert_eq!(released.record().released, Some((at(130), false)));
}

/// A producer the transport reports gone is reported gone to the core by the driver
/// itself, in the round that hears of it: its edge says `gone`, and the request's `gone`
/// has that round's time.
#[test]
fn a_producer_the_transport_reports_gone_is_named_gone() {
    let mut r = rank(60_000);
    r.register("r", EdgeMode::Named, 0);
    for p in [0, 1, 3] {
        r.notice(p, b"r:4");
    }
    assert!(r.poll(50).is_empty());
    r.fabric.kill("p2");
    let failed = only(r.poll(70));
    assert!(matches!(failed, ConsumerEvent::Failed { .. }), "{failed:?}");
    let rec = failed.record();
    let landed = EdgeOutcome::Landed;
    assert_eq!(
        edges(rec),
        [
            ("p0", landed),
            ("p1", landed),
            ("p2", EdgeOutcome::Gone),
            ("p3", landed)
        ]
    );
    assert_eq!(rec.gone_at, Some(at(70)));
    assert_eq!(rec.first_failure, Some(FailureCause::Gone(at(70))));
    assert_eq!(rec.settle_end, Some(at(170)));
}

/// A `gone` after the agent's edge already failed by notice resolves nothing of it: the
/// edge keeps its cause, and the request's record has the notice's time and no `gone`.
#[test]
fn a_gone_after_the_notice_leaves_the_notice_as_the_cause() {
    let mut r = rank(60_000);
    r.register("r", EdgeMode::Named, 0);
    r.notice(1, b"PUSH_FAIL:r:4");
    assert!(r.poll(10).is_empty());
    assert!(r.poll(20).is_empty());
    assert_eq!(r.d.engine().gone("p1"), 0, "nothing of p1 outstanding");
    for p in [0, 2, 3] {
        r.notice(p, b"r:4");
    }
    let failed = only(r.poll(30));
    let rec = failed.record();
    assert_eq!(edges(rec)[1], ("p1", EdgeOutcome::FailureNotice));
    assert_eq!((rec.failure_notice_at, rec.gone_at), (Some(at(10)), None));
    assert_eq!(rec.first_failure, Some(FailureCause::Notice(at(10))));
}

/// Two edges failed by notice: both say so, and the request keeps the last notice's time.
#[test]
fn two_failure_notices_name_both_edges_and_keep_the_last_time() {
    let mut r = rank(60_000);
    r.register("r", EdgeMode::Named, 0);
    r.notice(0, b"PUSH_FAIL:r:4");
    assert!(r.poll(10).is_empty());
    r.notice(1, b"PUSH_FAIL:r:4");
    r.notice(2, b"r:4");
    r.notice(3, b"r:4");
    let failed = only(r.poll(20));
    let rec = failed.record();
    let notice = EdgeOutcome::FailureNotice;
    assert_eq!(edges(rec)[..2], [("p0", notice), ("p1", notice)]);
    assert_eq!(rec.failure_notice_at, Some(at(20)), "the last one");
    assert_eq!(rec.first_failure, Some(FailureCause::Notice(at(20))));
}

/// Expired with an edge outstanding, then forced back by the quarantine: the record says
/// which agent still owed and that the release was forced.
#[test]
fn expired_then_forced_names_the_agent_that_still_owed() {
    let mut r = rank(60_000);
    r.register("r", EdgeMode::Named, 0);
    for p in [0, 1, 2] {
        r.notice(p, b"r:4");
    }
    assert!(r.poll(10).is_empty());
    let expired = only(r.poll(1_000));
    assert!(
        matches!(expired, ConsumerEvent::Expired { .. }),
        "{expired:?}"
    );
    let forced = only(r.poll(3_000));
    assert!(
        matches!(forced, ConsumerEvent::Release { forced: true, .. }),
        "{forced:?}"
    );
    for e in [&expired, &forced] {
        let rec = e.record();
        assert_eq!(edges(rec)[3], ("p3", EdgeOutcome::Outstanding), "{e:?}");
        assert_eq!(rec.ended, Some((Ended::Expired, at(1_000))));
        assert_eq!(rec.first_failure, Some(FailureCause::Expired(at(1_000))));
        assert_eq!(rec.decided_at, None);
    }
    assert_eq!(expired.record().released, None);
    assert_eq!(forced.record().released, Some((at(3_000), true)));
    assert!(forced.record().forced());
}

/// Aborted by the engine: the record of its release says when, and, in counting mode,
/// how many notices were expected and still owed (no agent names: counts name none).
#[test]
fn aborted_in_counting_mode_reports_the_count() {
    let mut r = rank(60_000);
    r.register("r", EdgeMode::Count, 0);
    r.notice(0, b"r:4");
    assert!(r.poll(10).is_empty());
    let _quarantined = r.d.engine().abort("r").expect("tracked");
    let released = only(r.poll(2_010));
    assert!(
        matches!(released, ConsumerEvent::Release { forced: true, .. }),
        "{released:?}"
    );
    let rec = released.record();
    assert_eq!(
        rec.edges,
        RecordEdges::Count {
            expected: 4,
            outstanding: 3,
            failed: false
        }
    );
    assert!(rec.edges.named().is_empty());
    assert_eq!(rec.ended, Some((Ended::Aborted, at(10))));
    assert_eq!(rec.first_failure, Some(FailureCause::Aborted(at(10))));
    assert_eq!(rec.released, Some((at(2_010), true)));
}

/// The record is the request's own even when its slot is taken by the next registration
/// right after the decision: it was read when the decision was handed out.
#[test]
fn a_record_outlives_the_slot_it_was_read_from() {
    let mut r = rank(60_000);
    r.register("a", EdgeMode::Named, 0);
    r.notice(0, b"PUSH_FAIL:a:4");
    r.notice(1, b"a:4");
    r.notice(2, b"a:4");
    r.notice(3, b"a:4");
    let failed = only(r.poll(10));
    let released = only(r.poll(110));
    for i in 0..64 {
        r.register(&format!("b{i}"), EdgeMode::Named, 110);
    }
    let rec = released.record();
    assert_eq!(released.request().id, "a");
    assert_eq!(edges(rec)[0], ("p0", EdgeOutcome::FailureNotice));
    assert_eq!(rec.failure_notice_at, Some(at(10)));
    assert_eq!(rec.released, Some((at(110), false)));
    assert_eq!(failed.record().key, rec.key);
}

/// On two threads a failure notice from `p1` races the engine half's `gone` of `p1`: the
/// core's edge claim lets exactly one of them resolve the edge and writes its cause with
/// it, so the record names the winner, never "failed, cause unknown". The `gone`'s return
/// says who won.
#[test]
fn a_failure_notice_racing_a_gone_of_its_agent_names_the_winner() {
    for round in 0..200 {
        let mut r = rank(60_000);
        r.register("r", EdgeMode::Named, 0);
        for p in [0, 2, 3] {
            r.notice(p, b"r:4");
        }
        assert!(r.poll(10).is_empty());
        let (mut ingest, mut engine) = r.d.split();
        let resolved = std::thread::scope(|s| {
            let notice = s.spawn(move || {
                ingest.set_arrival(at(10));
                let _ = ingest.ingest("p1", b"PUSH_FAIL:r:4");
            });
            if round % 2 == 0 {
                std::thread::yield_now();
            }
            let resolved = engine.gone("p1");
            notice.join().expect("ingest thread");
            resolved
        });
        let _ = r.d.engine().take_ready();
        let failed = r
            .events()
            .into_iter()
            .find(|e| matches!(e, ConsumerEvent::Failed { .. }))
            .expect("failed by the notice or the gone");
        let rec = failed.record();
        let winner = edges(rec)[1];
        match resolved {
            1 => {
                assert_eq!(winner, ("p1", EdgeOutcome::Gone));
                assert_eq!((rec.gone_at, rec.failure_notice_at), (Some(at(10)), None));
            }
            0 => {
                assert_eq!(winner, ("p1", EdgeOutcome::FailureNotice));
                assert_eq!((rec.gone_at, rec.failure_notice_at), (None, Some(at(10))));
            }
            n => panic!("one edge of p1, {n} resolved"),
        }
    }
}
