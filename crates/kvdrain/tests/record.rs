//! The record of a request ([`Engine::record`]): one test per way a request ends, each
//! checking every field the record reports against what the scenario did.
#![cfg(not(kvdrain_loom))]

use kvdrain::{
    AgentId, BlockHandle, Config, Decision, Duration, EdgeOutcome, Ended, Expect, FailureCause,
    Instant, Ledger, Record, RecordedEdges, Registration, RequestKey,
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

/// Every decision waiting, each with the record read right after it was handed out.
fn decide(l: &mut L) -> Vec<(&'static str, Record<4>)> {
    let (_, mut engine) = l.split();
    let mut out = Vec::new();
    while let Some(d) = engine.poll_decision() {
        let word = match &d {
            Decision::Completed(_) => "completed",
            Decision::Failed(_) => "failed",
            Decision::Expired(_) => "expired",
            Decision::Released(r) if r.forced() => "released!",
            Decision::Released(_) => "released",
        };
        let record = engine
            .record(d.key())
            .expect("read before the next registration");
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
            [(P0, EdgeOutcome::Landed), (P1, EdgeOutcome::Failed)]
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
