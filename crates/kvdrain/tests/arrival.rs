//! A failure notice dated at its arrival (`Ingest::set_arrival`), not only at the engine's
//! last `advance`: rule 8 holds the blocks `settle` after the notice *arrived*. Rows in
//! the style of `grid.rs`: the arrival ahead of the clock, equal to it, behind it, across
//! the 2^32 ms wrap of the stamps, on both paths (the split halves and the whole ledger),
//! and bounded by the quarantine of an aborted request.
#![cfg(not(kvdrain_loom))]

use kvdrain::{
    AgentId, BlockHandle, Config, Decision, Duration, Expect, Instant, Ledger, Noticed, Pending,
    Registration,
};

const P0: AgentId = AgentId(0);
const P1: AgentId = AgentId(1);
const SETTLE: u64 = 500;
const QUARANTINE: u64 = 1_500;

type L = Ledger<8, 4>;

/// Settle 500, quarantine 1500 (the issue's example), deadlines out of the way.
fn ledger() -> L {
    Ledger::new(Config {
        capacity: 4,
        deadline: Duration::from_secs(1 << 40),
        quarantine: Duration::from_millis(QUARANTINE),
        settle: Duration::from_millis(SETTLE),
        seed: 7,
    })
}

fn named(l: &mut L, id: &str) -> Pending {
    l.register(Registration {
        id,
        blocks: BlockHandle(7),
        expect: Expect::Edges(&[P0, P1]),
        deadline: None,
    })
    .expect("registered")
}

fn words(decisions: impl Iterator<Item = Decision>) -> Vec<&'static str> {
    decisions
        .map(|d| match d {
            Decision::Completed(_) => "completed",
            Decision::Failed(_) => "failed",
            Decision::Expired(_) => "expired",
            Decision::Released(r) if r.forced() => "released!",
            Decision::Released(_) => "released",
        })
        .collect()
}

fn at(l: &mut L, now: u64) -> Vec<&'static str> {
    l.advance(Instant::from_millis(now)).expect("clock forward");
    words(l.decisions())
}

/// The first instant, from `from` on, at which `l` releases: advances one ms at a time
/// around `expect` (and checks nothing is released before it).
fn released_at(l: &mut L, from: u64, expect: u64) -> u64 {
    assert!(at(l, from.max(expect.saturating_sub(2))).is_empty());
    for now in expect.saturating_sub(1)..=expect + 1 {
        if at(l, now) == ["released"] {
            return now;
        }
    }
    panic!("not released by {}", expect + 1)
}

/// Clock advanced to `clock`, P0's write landed, then P1's `PUSH_FAIL:` handed in with
/// arrival `arrival` (none: `None`) on the whole-ledger path; returns the decisions of
/// the pull right after it.
fn failed_with_arrival(l: &mut L, clock: u64, arrival: Option<u64>) -> Vec<&'static str> {
    let _t = named(l, "r");
    assert!(at(l, clock).is_empty());
    assert_eq!(l.handle_notification(P0, b"r:2"), Ok(Noticed::Counted));
    if let Some(arrival) = arrival {
        l.set_arrival(Instant::from_millis(arrival));
    }
    assert_eq!(
        l.handle_notification(P1, b"PUSH_FAIL:r:2"),
        Ok(Noticed::Decided)
    );
    words(l.decisions())
}

#[test]
fn arrival_ahead_of_the_clock_settles_from_the_arrival() {
    // The issue's example: steps at 0, 10, then 600; the notice arrived at 600.
    let mut l = ledger();
    assert!(at(&mut l, 0).is_empty());
    assert_eq!(failed_with_arrival(&mut l, 10, Some(600)), ["failed"]);
    assert!(
        at(&mut l, 600).is_empty(),
        "not released in the step it is seen"
    );
    assert_eq!(released_at(&mut l, 600, 600 + SETTLE), 1_100);
}

#[test]
fn without_an_arrival_a_notice_is_dated_at_the_last_advance() {
    let mut l = ledger();
    assert_eq!(failed_with_arrival(&mut l, 10, None), ["failed"]);
    assert_eq!(l.arrival(), None);
    assert_eq!(released_at(&mut l, 10, 10 + SETTLE), 510);
}

#[test]
fn arrival_equal_to_the_clock() {
    let mut l = ledger();
    assert_eq!(failed_with_arrival(&mut l, 10, Some(10)), ["failed"]);
    assert_eq!(released_at(&mut l, 10, 10 + SETTLE), 510);
}

#[test]
fn arrival_behind_the_clock_is_never_earlier_than_the_clock() {
    // The arrival (5) is older than the last advance (300): the clock dates it.
    let mut l = ledger();
    assert_eq!(failed_with_arrival(&mut l, 300, Some(5)), ["failed"]);
    assert_eq!(released_at(&mut l, 300, 300 + SETTLE), 800);
}

#[test]
fn an_earlier_arrival_than_one_given_is_ignored() {
    let mut l = ledger();
    l.set_arrival(Instant::from_millis(600));
    l.set_arrival(Instant::from_millis(300));
    assert_eq!(l.arrival(), Some(Instant::from_millis(600)));
    assert_eq!(failed_with_arrival(&mut l, 10, None), ["failed"]);
    assert_eq!(released_at(&mut l, 10, 600 + SETTLE), 1_100);
}

#[test]
fn arrival_across_the_wrap_of_the_stamps() {
    // Clock 10 ms before 2^32, arrival 20 ms after: the stamps are 2^32 - 10 and 20.
    let wrap = 1u64 << 32;
    for (clock, arrival) in [
        (wrap - 10, wrap + 20),
        (wrap - 10, wrap - 10),
        (wrap + 20, wrap - 10),
        (3 * wrap - 1, 3 * wrap + 1_000),
    ] {
        let mut l = ledger();
        assert_eq!(
            failed_with_arrival(&mut l, clock, Some(arrival)),
            ["failed"]
        );
        let dated = clock.max(arrival);
        assert_eq!(
            released_at(&mut l, clock, dated + SETTLE),
            dated + SETTLE,
            "clock {clock}, arrival {arrival}"
        );
    }
}

#[test]
fn an_arrival_left_stale_for_too_long_only_delays() {
    // An arrival 2^31 + 100 ms behind the clock reads as ahead of it: the release comes
    // later than the clock's date would give, never earlier.
    let mut l = ledger();
    l.set_arrival(Instant::from_millis(1));
    let clock = 1 + (1u64 << 31) + 100;
    assert_eq!(failed_with_arrival(&mut l, clock, None), ["failed"]);
    assert!(at(&mut l, clock + SETTLE).is_empty());
    assert!(at(&mut l, clock + SETTLE + 1_000_000).is_empty());
}

#[test]
fn the_split_halves_date_a_notice_at_its_arrival() {
    let mut l = ledger();
    let _t = named(&mut l, "r");
    let (mut ingest, mut engine) = l.split();
    engine.advance(Instant::from_millis(10)).expect("forward");
    assert_eq!(ingest.handle_notification(P0, b"r:2"), Ok(Noticed::Counted));
    ingest.set_arrival(Instant::from_millis(600));
    assert_eq!(ingest.arrival(), Some(Instant::from_millis(600)));
    assert_eq!(
        ingest.handle_notification(P1, b"PUSH_FAIL:r:2"),
        Ok(Noticed::Decided)
    );
    // Decided at a pull while the engine's clock is still 10.
    assert_eq!(words(engine.decisions()), ["failed"]);
    engine
        .advance(Instant::from_millis(1_099))
        .expect("forward");
    assert_eq!(engine.poll_decision(), None);
    engine
        .advance(Instant::from_millis(1_100))
        .expect("forward");
    assert_eq!(words(engine.decisions()), ["released"]);
    // The arrival is the ledger's: a later split keeps it.
    let (ingest, _engine) = l.split();
    assert_eq!(ingest.arrival(), Some(Instant::from_millis(600)));
}

#[test]
fn the_quarantine_end_still_bounds_an_aborted_request() {
    // Aborted at 10 (quarantine ends 1510); its last edge fails at arrival 1200 (settles
    // until 1700): the quarantine end releases it, forced.
    let mut l = ledger();
    let t = named(&mut l, "r");
    assert!(at(&mut l, 10).is_empty());
    let _q = l.abort(t).expect("aborted");
    assert_eq!(l.handle_notification(P0, b"r:2"), Ok(Noticed::Counted));
    l.set_arrival(Instant::from_millis(1_200));
    assert_eq!(
        l.handle_notification(P1, b"PUSH_FAIL:r:2"),
        Ok(Noticed::Decided)
    );
    assert!(words(l.decisions()).is_empty());
    assert!(at(&mut l, 1_509).is_empty());
    assert_eq!(at(&mut l, 10 + QUARANTINE), ["released!"]);
}

#[test]
fn completions_are_not_dated() {
    // An arrival far ahead changes nothing for a request whose edges all landed.
    let mut l = ledger();
    let _t = named(&mut l, "r");
    l.set_arrival(Instant::from_millis(1 << 40));
    assert_eq!(l.handle_notification(P0, b"r:2"), Ok(Noticed::Counted));
    assert_eq!(l.handle_notification(P1, b"r:2"), Ok(Noticed::Decided));
    assert_eq!(words(l.decisions()), ["completed"]);
}
