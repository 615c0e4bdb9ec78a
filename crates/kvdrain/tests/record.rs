//! The record of a request ([`Engine::record`], [`Engine::poll_recorded`]): one test per
//! way a request ends, each checking every field the record reports against what the
//! scenario did, and each named edge's cause as the core wrote it.
#![cfg(not(kvdrain_loom))]

use kvdrain::{
    AgentId, BlockHandle, Config, Decision, Duration, EdgeOutcome, Ended, Expect, FailureCause,
    Instant, Ledger, Record, Recorded, RecordedEdges, Registration, RequestKey,
};

const P0: AgentId = AgentId(0);
const P1: AgentId = AgentId(1);

type L = Ledger<8, 4>;

/// Deadline 100, quarantine 1000, settle 50.
fn ledger() -> L {
    Ledger::new(Config {
        capacity: 8,
        deadline: Duration::from_millis(100),
        quarantine: Duration::from_millis(1000),
        settle: Duration::from_millis(50),
        seed: 42,
    })
}

fn register(l: &mut L, id: &str, expect: Expect<'_>) -> RequestKey {
    l.register(Registration {
        id,
        blocks: BlockHandle(7),
        expect,
        deadline: None,
    })
    .expect("registered")
    .key()
}

fn ms(t: u64) -> Instant {
    Instant::from_millis(t)
}

fn at(l: &mut L, t: u64) {
    l.advance(ms(t)).expect("clock forward");
}

/// Every decision waiting, each with the record handed out with it.
fn decide(l: &mut L) -> Vec<(&'static str, Record<4>)> {
    let (_, mut engine) = l.split();
    let mut out = Vec::new();
    while let Some(Recorded {
        decision: d,
        record,
    }) = engine.poll_recorded()
    {
        let word = match &d {
            Decision::Completed(_) => "completed",
            Decision::Failed(_) => "failed",
            Decision::Expired(_) => "expired",
            Decision::Released(r) if r.forced() => "released!",
            Decision::Released(_) => "released",
        };
        assert_eq!(record.key, d.key());
        // The same record `record` reads until the next registration.
        assert_eq!(engine.record(d.key()), Some(record));
        out.push((word, record));
    }
    out
}

fn named(edges: &[(AgentId, EdgeOutcome)]) -> Vec<(AgentId, EdgeOutcome)> {
    edges.to_vec()
}

#[test]
fn completed_named_every_edge_landed_none_failed() {
    let mut l = ledger();
    at(&mut l, 10);
    let key = register(&mut l, "r", Expect::Edges(&[P0, P1]));
    let _ = l.handle_notification(P1, b"r:2");
    at(&mut l, 20);
    let _ = l.handle_notification(P0, b"r:2");
    let d = decide(&mut l);
    assert_eq!(d.len(), 1);
    let (word, rec) = d[0];
    assert_eq!(word, "completed");
    assert_eq!(rec.key, key);
    assert_eq!((rec.registered_at, rec.deadline), (ms(10), ms(110)));
    assert_eq!(
        named(rec.edges.named()),
        [(P0, EdgeOutcome::Landed), (P1, EdgeOutcome::Landed)]
    );
    assert_eq!(rec.first_failure(), None);
    assert_eq!(rec.decided_at, Some(ms(20)));
    assert_eq!(rec.released, Some((ms(20), false)));
    assert_eq!((rec.settle_end, rec.ended), (None, None));
}

#[test]
fn while_tracked_the_record_shows_what_is_still_owed() {
    let mut l = ledger();
    let key = register(&mut l, "r", Expect::Edges(&[P0, P1]));
    let _ = l.handle_notification(P0, b"r:2");
    let (_, engine) = l.split();
    let rec = engine.record(key).expect("tracked");
    assert_eq!(
        named(rec.edges.named()),
        [(P0, EdgeOutcome::Landed), (P1, EdgeOutcome::Outstanding)]
    );
    assert_eq!((rec.decided_at, rec.released), (None, None));
}

#[test]
fn failed_by_a_notice_settles_and_names_the_failed_edge() {
    let mut l = ledger();
    let _ = register(&mut l, "r", Expect::Edges(&[P0, P1]));
    at(&mut l, 30);
    let _ = l.handle_notification(P1, b"PUSH_FAIL:r:2");
    let _ = l.handle_notification(P0, b"r:2");
    let failed = decide(&mut l);
    assert_eq!(failed[0].0, "failed");
    at(&mut l, 80);
    let released = decide(&mut l);
    assert_eq!(released[0].0, "released");
    for (_, rec) in failed.iter().chain(&released) {
        assert_eq!(
            named(rec.edges.named()),
            [(P0, EdgeOutcome::Landed), (P1, EdgeOutcome::FailureNotice)]
        );
        assert_eq!(rec.first_failure(), Some(FailureCause::Notice(ms(30))));
        assert_eq!(rec.decided_at, Some(ms(30)));
        assert_eq!(rec.settle_end, Some(ms(80)));
    }
    assert_eq!(failed[0].1.released, None);
    assert_eq!(released[0].1.released, Some((ms(80), false)));
}

#[test]
fn failed_by_gone_reports_the_gone_and_its_settling() {
    let mut l = ledger();
    let _ = register(&mut l, "r", Expect::Edges(&[P0, P1]));
    let _ = l.handle_notification(P0, b"r:2");
    at(&mut l, 40);
    assert_eq!(l.gone(P1), 1);
    let d = decide(&mut l);
    let (word, rec) = d[0];
    assert_eq!(word, "failed");
    assert_eq!(
        named(rec.edges.named()),
        [(P0, EdgeOutcome::Landed), (P1, EdgeOutcome::Gone)]
    );
    assert_eq!(rec.first_failure(), Some(FailureCause::Gone(ms(40))));
    assert_eq!(rec.failure_notice_at, None);
    assert_eq!(rec.settle_end, Some(ms(90)));
}

#[test]
fn expired_then_forced_release_keeps_what_was_owed() {
    let mut l = ledger();
    let _ = register(&mut l, "r", Expect::Count(2));
    let _ = l.handle_notification(P0, b"r:2");
    at(&mut l, 100);
    let expired = decide(&mut l);
    assert_eq!(expired[0].0, "expired");
    at(&mut l, 1100);
    let released = decide(&mut l);
    assert_eq!(released[0].0, "released!");
    let rec = released[0].1;
    assert_eq!(
        rec.edges,
        RecordedEdges::Count {
            expected: 2,
            outstanding: 1,
            failed: false
        }
    );
    assert_eq!(rec.ended, Some((Ended::Expired, ms(100))));
    assert_eq!(rec.first_failure(), Some(FailureCause::Expired(ms(100))));
    assert!(rec.forced());
    assert_eq!(rec.released, Some((ms(1100), true)));
}

#[test]
fn aborted_then_fenced_releases_without_settling() {
    let mut l = ledger();
    let _ = register(&mut l, "r", Expect::Edges(&[P0, P1]));
    at(&mut l, 5);
    let _ = l.abort_id("r").expect("tracked");
    at(&mut l, 7);
    let _ = l.handle_notification(P0, b"r:2");
    assert_eq!(l.fence(P1), 1);
    let d = decide(&mut l);
    let (word, rec) = d[0];
    assert_eq!(word, "released");
    assert_eq!(
        named(rec.edges.named()),
        [(P0, EdgeOutcome::Landed), (P1, EdgeOutcome::Fenced)]
    );
    assert_eq!(rec.ended, Some((Ended::Aborted, ms(5))));
    assert_eq!(rec.fenced_at, Some(ms(7)));
    assert_eq!(rec.first_failure(), Some(FailureCause::Aborted(ms(5))));
    assert_eq!(rec.settle_end, None);
    assert_eq!(rec.released, Some((ms(7), false)));
}

#[test]
fn a_reused_slot_has_no_record_of_the_request_before() {
    let mut l = ledger();
    let first = register(&mut l, "a", Expect::Count(1));
    let _ = l.handle_notification(P0, b"a:1");
    assert_eq!(decide(&mut l).len(), 1);
    // The freed slot is the next one taken.
    let second = register(&mut l, "b", Expect::Count(1));
    let (_, engine) = l.split();
    assert_eq!(engine.record(first), None);
    assert_eq!(engine.record(second).map(|r| r.key), Some(second));
}

/// A history is written only when something goes wrong, and a registration does not
/// clear the slot's line: what the slot's earlier request went through must not show in
/// the next one's record, whether that one completes or fails.
#[test]
fn a_reused_slot_starts_with_an_empty_history() {
    let mut l = ledger();
    // Everything that writes a history: an abort, a fence, a `gone`, a failure notice,
    // an expiry with a forced release.
    let _ = register(&mut l, "a", Expect::Edges(&[P0, P1]));
    at(&mut l, 5);
    let _ = l.abort_id("a").expect("tracked");
    assert_eq!(l.fence(P1), 1);
    assert_eq!(l.gone(P0), 1);
    at(&mut l, 100);
    assert!(decide(&mut l).iter().any(|(word, _)| *word == "released"));
    let _ = register(&mut l, "b", Expect::Count(2));
    let _ = l.handle_notification(P1, b"PUSH_FAIL:b:2");
    at(&mut l, 300);
    let expired = decide(&mut l);
    assert_eq!(expired[0].0, "expired");
    at(&mut l, 1300);
    assert_eq!(decide(&mut l)[0].0, "released!");

    // The next request in that slot completes: a clean record.
    at(&mut l, 1400);
    let key = register(&mut l, "c", Expect::Edges(&[P0, P1]));
    let _ = l.handle_notification(P0, b"c:2");
    let _ = l.handle_notification(P1, b"c:2");
    let d = decide(&mut l);
    let (word, rec) = d[0];
    assert_eq!((word, rec.key), ("completed", key));
    assert_eq!(rec.registered_at, ms(1400));
    assert_eq!(
        (rec.gone_at, rec.fenced_at, rec.failure_notice_at, rec.ended),
        (None, None, None, None)
    );
    assert_eq!((rec.settle_end, rec.first_failure()), (None, None));
    assert_eq!(rec.released, Some((ms(1400), false)));

    // And the one after fails by a notice: only its own failure shows.
    let _ = register(&mut l, "d", Expect::Edges(&[P0, P1]));
    at(&mut l, 1450);
    let _ = l.handle_notification(P0, b"PUSH_FAIL:d:2");
    let _ = l.handle_notification(P1, b"d:2");
    let d = decide(&mut l);
    let (word, rec) = d[0];
    assert_eq!(word, "failed");
    assert_eq!((rec.gone_at, rec.fenced_at, rec.ended), (None, None, None));
    assert_eq!(rec.first_failure(), Some(FailureCause::Notice(ms(1450))));
    assert_eq!(
        (rec.decided_at, rec.settle_end),
        (Some(ms(1450)), Some(ms(1500)))
    );
    assert_eq!(rec.released, None);
}

const P2: AgentId = AgentId(2);
const P3: AgentId = AgentId(3);

/// One request, four edges, each ended its own way: the record names every cause, from
/// the core, whatever order they came in.
#[test]
fn each_edge_names_its_own_cause() {
    let mut l = ledger();
    let _ = register(&mut l, "r", Expect::Edges(&[P0, P1, P2, P3]));
    at(&mut l, 10);
    assert_eq!(l.fence(P3), 1);
    let _ = l.handle_notification(P0, b"r:4");
    at(&mut l, 20);
    assert_eq!(l.gone(P2), 1);
    let _ = l.handle_notification(P1, b"PUSH_FAIL:r:4");
    let d = decide(&mut l);
    let (word, rec) = d[0];
    assert_eq!(word, "failed");
    assert_eq!(
        named(rec.edges.named()),
        [
            (P0, EdgeOutcome::Landed),
            (P1, EdgeOutcome::FailureNotice),
            (P2, EdgeOutcome::Gone),
            (P3, EdgeOutcome::Fenced),
        ]
    );
    assert_eq!(
        (rec.fenced_at, rec.gone_at, rec.failure_notice_at),
        (Some(ms(10)), Some(ms(20)), Some(ms(20)))
    );
    assert_eq!(rec.first_failure(), Some(FailureCause::Fenced(ms(10))));
    assert!(
        rec.edges
            .named()
            .iter()
            .all(|&(a, o)| o.failed() == (a != P0))
    );
}

/// Whichever resolves an edge first keeps its cause: a notice after a `gone` or a
/// `fence` of its agent is a duplicate, and a `gone` after a notice resolves nothing.
#[test]
fn the_first_resolution_keeps_its_cause() {
    let mut l = ledger();
    let _ = register(&mut l, "a", Expect::Edges(&[P0, P1]));
    let _ = register(&mut l, "b", Expect::Edges(&[P0, P1]));
    let _ = l.handle_notification(P1, b"PUSH_FAIL:a:2");
    assert_eq!(l.gone(P1), 1, "only b's edge of P1 was outstanding");
    assert!(l.handle_notification(P1, b"PUSH_FAIL:b:2").is_err());
    assert_eq!(l.fence(P0), 2);
    let d = decide(&mut l);
    let causes: Vec<_> = d
        .iter()
        .map(|(w, r)| (*w, named(r.edges.named())))
        .collect();
    assert_eq!(
        causes[..2],
        [
            (
                "failed",
                vec![(P0, EdgeOutcome::Fenced), (P1, EdgeOutcome::FailureNotice)]
            ),
            (
                "failed",
                vec![(P0, EdgeOutcome::Fenced), (P1, EdgeOutcome::Gone)]
            ),
        ]
    );
}

/// `poll_recorded` and `poll_queued_recorded` hand out the same decisions, in the same
/// order, as `poll_decision` and `drain_queued`, each with the record `record` reads.
#[test]
fn recorded_polls_hand_out_what_the_plain_ones_do() {
    fn run(recorded: bool) -> Vec<(String, Option<Record<4>>)> {
        let mut l = ledger();
        let _ = register(&mut l, "x", Expect::Edges(&[P0, P1]));
        let _ = register(&mut l, "y", Expect::Count(1));
        let _ = register(&mut l, "z", Expect::Edges(&[P0]));
        let _ = l.handle_notification(P0, b"z:1");
        let _ = l.handle_notification(P1, b"y:1");
        let _ = l.handle_notification(P0, b"PUSH_FAIL:x:2");
        assert_eq!(l.gone(P1), 1);
        let (_, mut engine) = l.split();
        let mut out = Vec::new();
        loop {
            let queued = if recorded {
                engine
                    .poll_queued_recorded()
                    .map(|r| (r.decision, Some(r.record)))
            } else {
                engine.drain_queued().next().map(|d| (d, None))
            };
            let next = match queued {
                Some(q) => Some(q),
                None if recorded => engine.poll_recorded().map(|r| (r.decision, Some(r.record))),
                None => engine.poll_decision().map(|d| (d, None)),
            };
            let Some((d, record)) = next else { break };
            let record = record.or_else(|| engine.record(d.key()));
            out.push((format!("{d:?}"), record));
        }
        out
    }
    let (plain, recorded) = (run(false), run(true));
    let kinds: Vec<_> = plain.iter().map(|(d, _)| &d[..6]).collect();
    assert_eq!(kinds, ["Failed", "Comple", "Comple"], "{plain:?}");
    assert_eq!(plain, recorded);
}
