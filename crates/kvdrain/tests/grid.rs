//! The tracker as a state × event grid: `<state>_<event>` for every state a request can be
//! in and every event that can reach it. Each test states the spec rule it checks.
#![cfg(not(kvdrain_loom))]

use kvdrain::{
    AbortError, AgentId, BlockHandle, ClockError, Config, Decision, Duration, Expect, IgnoreReason,
    Instant, Ledger, Noticed, Outstanding, Pending, QuarantineCause, RegisterErrorKind,
    Registration,
};

const P0: AgentId = AgentId(0);
const P1: AgentId = AgentId(1);

type L = Ledger<8, 4>;

/// `settle_ms = 0` (vLLM's behaviour): every row but `settling` decides as before rule 8.
fn ledger(capacity: usize) -> L {
    settling_ledger(capacity, 0)
}

/// Deadline 100, quarantine 1000, failure notices settle for `settle_ms`.
fn settling_ledger(capacity: usize, settle_ms: u64) -> L {
    Ledger::new(Config {
        capacity,
        deadline: Duration::from_millis(100),
        quarantine: Duration::from_millis(1000),
        settle: Duration::from_millis(settle_ms),
        seed: 42,
    })
}

fn counting(l: &mut L, id: &str, n: u8) -> Pending {
    let r = Registration {
        id,
        blocks: BlockHandle(7),
        expect: Expect::Count(n),
        deadline: None,
    };
    l.register(r).expect("registered")
}

fn named(l: &mut L, id: &str) -> Pending {
    let r = Registration {
        id,
        blocks: BlockHandle(7),
        expect: Expect::Edges(&[P0, P1]),
        deadline: None,
    };
    l.register(r).expect("registered")
}

/// Decisions as words: `completed`, `failed`, `expired`, `released`, `released!` (forced).
fn words(decisions: Vec<Decision>) -> Vec<&'static str> {
    decisions
        .into_iter()
        .map(|d| match d {
            Decision::Completed(d) => {
                assert_eq!(d.into_decode(), BlockHandle(7));
                "completed"
            }
            Decision::Failed(_) => "failed",
            Decision::Expired(_) => "expired",
            Decision::Released(r) if r.forced() => "released!",
            Decision::Released(r) => {
                assert_eq!(r.into_free(), BlockHandle(7));
                "released"
            }
        })
        .collect()
}

/// Every decision waiting: those queued and those of drained requests.
fn poll(l: &mut L) -> Vec<&'static str> {
    words(l.decisions().collect())
}

/// The decisions the last `advance` or `fence` queued, not those of the ready ring.
fn queued(l: &mut L) -> Vec<Decision> {
    l.drain_queued().collect()
}

fn at(l: &mut L, now: u64) -> Vec<&'static str> {
    l.advance(Instant::from_millis(now)).expect("clock forward");
    words(queued(l))
}

fn fence(l: &mut L, agent: AgentId) -> Vec<&'static str> {
    l.fence(agent);
    words(queued(l))
}

fn gone(l: &mut L, agent: AgentId) -> Vec<&'static str> {
    l.gone(agent);
    words(queued(l))
}

fn ignored(l: &mut L, agent: AgentId, bytes: &[u8]) -> IgnoreReason {
    l.handle_notification(agent, bytes)
        .expect_err("ignored")
        .reason
}

fn notice(l: &mut L, agent: AgentId, bytes: &[u8]) -> Noticed {
    l.handle_notification(agent, bytes).expect("accepted")
}

// ---- Counting (waiting for edges) ----

#[test]
fn counting_completion_not_last_waits() {
    let mut l = ledger(4);
    let _t = counting(&mut l, "r", 2);
    assert_eq!(notice(&mut l, P0, b"r:2"), Noticed::Counted);
    assert!(poll(&mut l).is_empty());
}

#[test]
fn counting_completion_last_completes_and_frees_the_slot() {
    let mut l = ledger(4);
    let _t = counting(&mut l, "r", 2);
    let _ = notice(&mut l, P0, b"r:2");
    assert_eq!(notice(&mut l, P0, b"r:2"), Noticed::Decided); // rule 6: any sender counts
    assert_eq!(poll(&mut l), ["completed"]);
    assert!(l.is_empty()); // rule 7
}

#[test]
fn counting_failure_notice_waits_for_the_sibling() {
    // Rule 3 / catalogue C2, F1.
    let mut l = ledger(4);
    let _t = named(&mut l, "r");
    assert_eq!(notice(&mut l, P1, b"PUSH_FAIL:r:2"), Noticed::Counted);
    assert!(poll(&mut l).is_empty());
    assert_eq!(notice(&mut l, P0, b"r:2"), Noticed::Decided);
    assert_eq!(poll(&mut l), ["failed", "released"]);
}

#[test]
fn counting_late_success_never_overwrites_a_failure() {
    // Invariant 6 / F2: the failure is sticky whatever order the edges resolve in.
    let mut l = ledger(4);
    let _t = counting(&mut l, "r", 3);
    let _ = notice(&mut l, P0, b"r:3");
    let _ = notice(&mut l, P1, b"PUSH_FAIL:r:3");
    let _ = notice(&mut l, P0, b"r:3");
    assert_eq!(poll(&mut l), ["failed", "released"]);
}

#[test]
fn counting_duplicate_from_named_agent_is_ignored() {
    // Rule 6 / F7: one notice per edge, so a second cannot complete the count early.
    let mut l = ledger(4);
    let _t = named(&mut l, "r");
    let _ = notice(&mut l, P0, b"r:2");
    assert_eq!(
        ignored(&mut l, P0, b"PUSH_FAIL:r:2"),
        IgnoreReason::Duplicate
    );
    assert!(poll(&mut l).is_empty());
}

#[test]
fn counting_unexpected_sender_is_ignored() {
    let mut l = ledger(4);
    let _t = named(&mut l, "r");
    assert_eq!(
        ignored(&mut l, AgentId::STRANGER, b"r:2"),
        IgnoreReason::UnexpectedSender
    );
}

#[test]
fn counting_abort_quarantines_with_outstanding_edges() {
    // C1: the request ends for the client; its blocks stay fenced.
    let mut l = ledger(4);
    let t = named(&mut l, "r");
    let _ = notice(&mut l, P0, b"r:2");
    let q = l.abort(t).expect("aborted");
    assert_eq!(
        (q.cause(), q.outstanding()),
        (QuarantineCause::Aborted, Outstanding::Edges(0b10))
    );
    assert!(poll(&mut l).is_empty());
    assert_eq!(l.len(), 1);
}

#[test]
fn counting_fence_of_named_agent_fails_its_edge_and_waits_for_the_rest() {
    let mut l = ledger(4);
    let _t = named(&mut l, "r");
    assert!(fence(&mut l, P1).is_empty());
    assert_eq!(notice(&mut l, P0, b"r:2"), Noticed::Decided);
    assert_eq!(poll(&mut l), ["failed", "released"]);
}

#[test]
fn counting_fence_does_not_touch_counting_mode() {
    let mut l = ledger(4);
    let _t = counting(&mut l, "r", 1);
    assert_eq!(l.fence(P0), 0);
    assert_eq!(l.queued_decisions(), 0, "no decision");
    assert_eq!(notice(&mut l, P0, b"r:1"), Noticed::Decided);
}

#[test]
fn counting_gone_of_named_agent_fails_its_edge_and_waits_for_the_rest() {
    // Rule 3 and 9: a `gone` is a failure notice for each of the agent's edges.
    let mut l = ledger(4);
    let _t = named(&mut l, "r");
    assert_eq!(l.gone(P1), 1);
    assert_eq!(l.queued_decisions(), 0, "the sibling is still writing");
    assert_eq!(notice(&mut l, P0, b"r:2"), Noticed::Decided);
    assert_eq!(poll(&mut l), ["failed", "released"]);
    assert_eq!(l.engine_counters().gone_edges, 1);
    assert_eq!(l.engine_counters().fenced_edges, 0);
}

#[test]
fn counting_gone_does_not_touch_counting_mode_or_later_requests() {
    let mut l = ledger(4);
    let _t = counting(&mut l, "r", 1);
    assert_eq!(l.gone(P0), 0);
    assert_eq!(l.queued_decisions(), 0, "no decision");
    let _s = named(&mut l, "s");
    assert_eq!(notice(&mut l, P0, b"r:1"), Noticed::Decided);
    assert_eq!(notice(&mut l, P1, b"s:2"), Noticed::Counted);
    assert_eq!(notice(&mut l, P0, b"s:2"), Noticed::Decided);
    assert_eq!(poll(&mut l), ["completed", "completed"]);
    assert_eq!(l.engine_counters().gone_edges, 0);
}

#[test]
fn counting_deadline_expires_with_outstanding() {
    // Rule 2 / L1: decided at the first advance that reaches the deadline.
    let mut l = ledger(4);
    let _t = counting(&mut l, "r", 2);
    let _ = notice(&mut l, P0, b"r:2");
    assert!(at(&mut l, 99).is_empty());
    l.advance(Instant::from_millis(100)).expect("forward");
    let expired = queued(&mut l);
    let [Decision::Expired(q)] = expired.as_slice() else {
        panic!("{expired:?}")
    };
    assert_eq!(q.outstanding(), Outstanding::Count(1));
}

#[test]
fn counting_register_same_id_is_rejected() {
    let mut l = ledger(4);
    let _t = counting(&mut l, "r", 1);
    let again = Registration {
        id: "r",
        blocks: BlockHandle(8),
        expect: Expect::Count(1),
        deadline: None,
    };
    let e = l.register(again).expect_err("duplicate");
    assert_eq!(e.kind, RegisterErrorKind::DuplicateId);
    assert_eq!(e.registration.blocks, BlockHandle(8)); // handed back whole
}

// ---- Settling (decided, blocks fenced until the failure notices settle: rule 8) ----

/// A named request failed by `PUSH_FAIL` from P1 at `fail_at` and decided by P0's
/// completion at `decide_at`, with settle_ms = 50; returns the ledger and the decisions.
fn settled_after(fail_at: u64, decide_at: u64) -> (L, Vec<&'static str>) {
    let mut l = settling_ledger(4, 50);
    let _t = named(&mut l, "r");
    assert!(at(&mut l, fail_at).is_empty());
    assert_eq!(notice(&mut l, P1, b"PUSH_FAIL:r:2"), Noticed::Counted);
    assert!(at(&mut l, decide_at).is_empty());
    assert_eq!(notice(&mut l, P0, b"r:2"), Noticed::Decided);
    let decided = poll(&mut l);
    (l, decided)
}

#[test]
fn settling_release_waits_settle_ms_after_the_failure_notice() {
    // Rule 8: from the notice (10), not from the decision (20).
    let (mut l, decided) = settled_after(10, 20);
    assert_eq!(decided, ["failed"]);
    assert!(at(&mut l, 59).is_empty());
    assert_eq!(at(&mut l, 60), ["released"]);
    assert!(l.is_empty());
    let c = l.engine_counters();
    assert_eq!((c.settle_started, c.settle_released, c.settling), (1, 1, 0));
}

#[test]
fn settling_end_already_reached_releases_with_the_decision() {
    let (l, decided) = settled_after(10, 60);
    assert_eq!(decided, ["failed", "released"]);
    assert!(l.is_empty());
    assert_eq!(l.engine_counters().settle_started, 0);
}

#[test]
fn settling_notice_abort_and_register_see_a_tracked_decided_request() {
    let (mut l, _) = settled_after(0, 0);
    assert_eq!(ignored(&mut l, P0, b"PUSH_FAIL:r:2"), IgnoreReason::Late);
    assert_eq!(
        ignored(&mut l, AgentId::STRANGER, b"r:2"),
        IgnoreReason::Late
    );
    assert_eq!(l.abort_id("r").map(|_| ()), Err(AbortError::Late));
    let again = Registration {
        id: "r",
        blocks: BlockHandle(7),
        expect: Expect::Count(1),
        deadline: None,
    };
    let refused = l.register(again).map(|_| ()).expect_err("still tracked");
    assert_eq!(refused.kind, RegisterErrorKind::DuplicateId);
    assert_eq!(fence(&mut l, P1), Vec::<&str>::new());
    // The late notices did not move the settle end.
    assert_eq!(at(&mut l, 50), ["released"]);
}

#[test]
fn settling_holds_its_slot_until_released() {
    // Rule 7: a request waiting to settle counts against the capacity.
    let mut l = settling_ledger(1, 50);
    let _t = counting(&mut l, "r", 1);
    assert_eq!(notice(&mut l, P0, b"PUSH_FAIL:r:1"), Noticed::Decided);
    assert_eq!(poll(&mut l), ["failed"]);
    assert_eq!((l.len(), l.is_full()), (1, true));
    let refused = Registration {
        id: "s",
        blocks: BlockHandle(7),
        expect: Expect::Count(1),
        deadline: None,
    };
    let refused = l.register(refused).map(|_| ()).expect_err("full");
    assert_eq!(refused.kind, RegisterErrorKind::Full);
    assert_eq!(l.next_timer(), Some(Instant::from_millis(50)));
    assert_eq!(at(&mut l, 50), ["released"]);
    let _s = counting(&mut l, "s", 1);
}

#[test]
fn settling_the_last_failure_notice_counts() {
    let mut l = settling_ledger(4, 50);
    let _t = counting(&mut l, "r", 3);
    let _ = notice(&mut l, P0, b"PUSH_FAIL:r:3");
    assert!(at(&mut l, 30).is_empty());
    let _ = notice(&mut l, P1, b"PUSH_FAIL:r:3");
    assert_eq!(notice(&mut l, P0, b"r:3"), Noticed::Decided);
    assert_eq!(poll(&mut l), ["failed"]);
    assert!(at(&mut l, 79).is_empty());
    assert_eq!(at(&mut l, 80), ["released"]);
}

#[test]
fn settling_is_not_needed_after_a_fence() {
    // A fence is certain: nothing more lands. Completions and fences need no settling.
    let mut l = settling_ledger(4, 50);
    let _t = named(&mut l, "r");
    assert_eq!(fence(&mut l, P1), Vec::<&str>::new());
    assert_eq!(notice(&mut l, P0, b"r:2"), Noticed::Decided);
    assert_eq!(poll(&mut l), ["failed", "released"]);
}

#[test]
fn settling_a_fence_after_a_failure_notice_still_settles_the_notice() {
    let mut l = settling_ledger(4, 50);
    let _t = named(&mut l, "r");
    let _ = notice(&mut l, P0, b"PUSH_FAIL:r:2");
    assert!(at(&mut l, 20).is_empty());
    assert_eq!(fence(&mut l, P1), ["failed"]);
    assert_eq!(at(&mut l, 50), ["released"]);
}

#[test]
fn settling_an_aborted_request_ends_at_the_earlier_of_settle_and_quarantine_end() {
    // Quarantine ends at abort (0) + 1000. Settle ends at notice + settle_ms.
    for (settle_ms, fires_at, word) in [
        (500, 500, "released"),    // settle end first
        (1000, 1000, "released"),  // tie: the settle end wins, not forced
        (1500, 1000, "released!"), // quarantine end first: forced, not delayed
    ] {
        let mut l = settling_ledger(4, settle_ms);
        let t = counting(&mut l, "r", 2);
        let _ = l.abort(t);
        assert_eq!(notice(&mut l, P0, b"PUSH_FAIL:r:2"), Noticed::Counted);
        assert_eq!(notice(&mut l, P1, b"r:2"), Noticed::Decided);
        assert!(poll(&mut l).is_empty(), "settle_ms {settle_ms}");
        assert!(at(&mut l, fires_at - 1).is_empty(), "settle_ms {settle_ms}");
        assert_eq!(at(&mut l, fires_at), [word], "settle_ms {settle_ms}");
        assert!(l.is_empty());
    }
}

#[test]
fn settling_never_delays_the_forced_release_of_a_quarantine() {
    // Edges still outstanding at the quarantine end: forced release, whatever settles.
    let mut l = settling_ledger(4, 5000);
    let t = counting(&mut l, "r", 2);
    let _ = notice(&mut l, P0, b"PUSH_FAIL:r:2");
    let _ = l.abort(t);
    assert_eq!(at(&mut l, 1000), ["released!"]);
}

#[test]
fn settling_a_gone_settles_from_the_gone() {
    // Rule 8 and 9: decided at once, released settle_ms after the `gone` (20 + 50).
    let mut l = settling_ledger(4, 50);
    let _t = named(&mut l, "r");
    let _ = notice(&mut l, P0, b"r:2");
    assert!(at(&mut l, 20).is_empty());
    assert_eq!(gone(&mut l, P1), ["failed"]);
    assert_eq!(l.next_timer(), Some(Instant::from_millis(70)));
    assert!(at(&mut l, 69).is_empty());
    assert_eq!(at(&mut l, 70), ["released"]);
    let c = l.engine_counters();
    assert_eq!(
        (c.gone_edges, c.settle_started, c.settle_released),
        (1, 1, 1)
    );
}

#[test]
fn settling_a_gone_before_the_sibling_lands_settles_from_the_gone() {
    // The decision waits for the sibling (rule 3); the settle end is the gone's (10 + 50).
    let mut l = settling_ledger(4, 50);
    let _t = named(&mut l, "r");
    assert!(at(&mut l, 10).is_empty());
    assert!(gone(&mut l, P1).is_empty());
    assert!(at(&mut l, 30).is_empty());
    assert_eq!(notice(&mut l, P0, b"r:2"), Noticed::Decided);
    assert_eq!(poll(&mut l), ["failed"]);
    assert!(at(&mut l, 59).is_empty());
    assert_eq!(at(&mut l, 60), ["released"]);
}

#[test]
fn settling_the_later_of_a_failure_notice_and_a_gone_counts() {
    for (notice_first, release_at) in [(true, 70), (false, 80)] {
        let mut l = settling_ledger(4, 50);
        let _t = named(&mut l, "r");
        if notice_first {
            let _ = notice(&mut l, P0, b"PUSH_FAIL:r:2");
            assert!(at(&mut l, 20).is_empty());
            assert_eq!(gone(&mut l, P1), ["failed"]);
        } else {
            assert!(at(&mut l, 20).is_empty());
            assert!(gone(&mut l, P1).is_empty());
            assert!(at(&mut l, 30).is_empty());
            assert_eq!(notice(&mut l, P0, b"PUSH_FAIL:r:2"), Noticed::Decided);
            assert_eq!(poll(&mut l), ["failed"]);
        }
        assert!(at(&mut l, release_at - 1).is_empty(), "{notice_first}");
        assert_eq!(at(&mut l, release_at), ["released"], "{notice_first}");
    }
}

#[test]
fn settling_a_gone_leaves_a_settling_request_as_it_is() {
    // Every edge is resolved already: nothing to resolve, the settle end does not move.
    let (mut l, _) = settled_after(0, 0);
    assert_eq!(l.gone(P0), 0);
    assert_eq!(l.gone(P1), 0);
    assert!(at(&mut l, 40).is_empty());
    assert_eq!(at(&mut l, 50), ["released"]);
    assert_eq!(l.engine_counters().gone_edges, 0);
}

#[test]
fn settling_a_gone_after_completion_changes_nothing() {
    let mut l = settling_ledger(4, 50);
    let _t = named(&mut l, "r");
    let _ = notice(&mut l, P0, b"r:2");
    let _ = notice(&mut l, P1, b"r:2");
    assert_eq!(poll(&mut l), ["completed"]);
    assert_eq!(l.gone(P1), 0);
    assert_eq!(l.queued_decisions(), 0);
}

#[test]
fn settling_a_fence_after_a_gone_still_settles_the_gone() {
    // A fence is certain for its own agent; it cannot undo what the `gone` left landing.
    let mut l = settling_ledger(4, 50);
    let _t = named(&mut l, "r");
    assert!(at(&mut l, 10).is_empty());
    assert!(gone(&mut l, P0).is_empty());
    assert!(at(&mut l, 20).is_empty());
    assert_eq!(fence(&mut l, P1), ["failed"]);
    assert!(at(&mut l, 59).is_empty());
    assert_eq!(at(&mut l, 60), ["released"]);
}

#[test]
fn settling_a_gone_across_the_32_bit_clock_wrap() {
    let wrap = 1u64 << 32;
    let mut l = settling_ledger(4, 50);
    assert!(at(&mut l, wrap - 10).is_empty());
    let r = Registration {
        id: "r",
        blocks: BlockHandle(7),
        expect: Expect::Edges(&[P0, P1]),
        deadline: Some(Duration::from_millis(1000)),
    };
    let _t = l.register(r).expect("registered");
    assert!(gone(&mut l, P1).is_empty());
    assert!(at(&mut l, wrap + 5).is_empty());
    assert_eq!(notice(&mut l, P0, b"r:2"), Noticed::Decided);
    assert_eq!(poll(&mut l), ["failed"]);
    assert_eq!(l.next_timer(), Some(Instant::from_millis(wrap + 40)));
    assert_eq!(at(&mut l, wrap + 40), ["released"]);
}

#[test]
fn settling_across_the_32_bit_clock_wrap() {
    // The ingest half stamps notices with the low 32 bits of the clock; the owner rebuilds
    // the full time against its own clock, across the wrap at 2^32 ms.
    let wrap = 1u64 << 32;
    let mut l = settling_ledger(4, 50);
    assert!(at(&mut l, wrap - 10).is_empty());
    let r = Registration {
        id: "r",
        blocks: BlockHandle(7),
        expect: Expect::Edges(&[P0, P1]),
        deadline: Some(Duration::from_millis(1000)),
    };
    let _t = l.register(r).expect("registered");
    let _ = notice(&mut l, P1, b"PUSH_FAIL:r:2");
    assert!(at(&mut l, wrap + 5).is_empty());
    assert_eq!(notice(&mut l, P0, b"r:2"), Noticed::Decided);
    assert_eq!(poll(&mut l), ["failed"]);
    assert_eq!(l.next_timer(), Some(Instant::from_millis(wrap + 40)));
    assert!(at(&mut l, wrap + 39).is_empty());
    assert_eq!(at(&mut l, wrap + 40), ["released"]);
}

#[test]
fn settling_zero_releases_with_the_decision() {
    let mut l = settling_ledger(4, 0);
    let _t = named(&mut l, "r");
    let _ = notice(&mut l, P1, b"PUSH_FAIL:r:2");
    let _ = notice(&mut l, P0, b"r:2");
    assert_eq!(poll(&mut l), ["failed", "released"]);
    assert_eq!(l.engine_counters().settle_started, 0);
}

#[test]
fn decided_pull_hands_out_what_poll_would() {
    // `poll_decision` one at a time gives what the `decisions` iterator gives, in the
    // order the notices drained the requests.
    let mut l = settling_ledger(4, 0);
    let _a = named(&mut l, "a");
    let _b = counting(&mut l, "b", 1);
    let _ = notice(&mut l, P1, b"PUSH_FAIL:a:2");
    let _ = notice(&mut l, P0, b"a:2");
    let _ = notice(&mut l, P0, b"b:1");
    let mut pulled = Vec::new();
    while let Some(d) = l.poll_decision() {
        pulled.push(d);
    }
    assert_eq!(words(pulled), ["failed", "released", "completed"]);
    assert!(l.poll_decision().is_none());
    assert!(l.is_empty());
}

#[test]
fn decided_late_pull_hands_out_in_decision_order_across_operations() {
    // A caller that does not pull after each event gets every decision in the order it
    // was taken: the advance's (`a`'s settle-end release, `c`'s expiry and forced
    // release, in registration order), then `b`'s, drained before the advance and decided
    // at the pull.
    let mut l = settling_ledger(4, 50);
    let _a = named(&mut l, "a");
    let _b = counting(&mut l, "b", 1);
    let _c = Ledger::register(
        &mut l,
        Registration {
            id: "c",
            blocks: BlockHandle(7),
            expect: Expect::Count(1),
            deadline: Some(Duration::from_millis(10)),
        },
    )
    .expect("registered");
    let _ = notice(&mut l, P1, b"PUSH_FAIL:a:2");
    let _ = notice(&mut l, P0, b"a:2");
    assert_eq!(l.fence(P1), 0, "a's edges are resolved");
    assert_eq!(l.queued_decisions(), 0, "a is decided at the pull");
    assert_eq!(poll(&mut l)[..], ["failed"]);
    let _ = notice(&mut l, P0, b"b:1");
    l.advance(Instant::from_millis(1020)).expect("forward");
    assert_eq!(
        l.queued_decisions(),
        3,
        "c expired and released, a released"
    );
    // A key's high bits count registrations.
    let keys_in_order: Vec<_> = l.decisions().map(|d| d.key().get() >> 16).collect();
    assert_eq!(keys_in_order, [0, 2, 2, 1]);
    assert!(l.is_empty());
}

#[test]
fn decided_late_pull_keeps_the_slot_until_the_last_decision_is_handed_out() {
    // Capacity N: a decided request's slot comes back only when its `Completed` or
    // `Released` is handed out, so the queue can never overflow.
    let mut l = ledger(8);
    let tickets: Vec<Pending> = (0..8)
        .map(|i| counting(&mut l, ["a", "b", "c", "d", "e", "f", "g", "h"][i], 1))
        .collect();
    assert!(l.is_full());
    for id in ["a", "b", "c", "d", "e", "f", "g", "h"] {
        let _ = notice(&mut l, P0, format!("{id}:1").as_bytes());
    }
    // Not pulled yet: the ready ring holds them, the slots are not free.
    assert_eq!(l.len(), 8);
    assert!(l.is_full());
    assert_eq!(poll(&mut l).len(), 8);
    assert!(!l.is_full());
    drop(tickets);
    // Decided at an advance and not pulled: not tracked (len 0), the ids are late, the
    // slots wait for the hand-out.
    let tickets: Vec<Pending> = (0..8)
        .map(|i| counting(&mut l, ["i", "j", "k", "l", "m", "n", "o", "p"][i], 1))
        .collect();
    for t in tickets {
        let _ = l.abort(t).expect("aborted");
    }
    l.advance(Instant::from_millis(1000)).expect("forward");
    assert_eq!(l.queued_decisions(), 8);
    assert_eq!(l.len(), 0);
    assert!(
        l.is_full(),
        "every slot waits for its Released to be handed out"
    );
    assert_eq!(ignored(&mut l, P0, b"i:1"), IgnoreReason::Late);
    let refused = Ledger::register(
        &mut l,
        Registration {
            id: "q",
            blocks: BlockHandle(7),
            expect: Expect::Count(1),
            deadline: None,
        },
    )
    .map(|_| ())
    .expect_err("no slot free");
    assert_eq!(refused.kind, RegisterErrorKind::Full);
    // One hand-out frees one slot.
    assert_eq!(
        words(l.poll_decision().into_iter().collect()),
        ["released!"]
    );
    assert!(!l.is_full());
    let _q = counting(&mut l, "q", 1);
    assert!(l.is_full());
    assert_eq!(poll(&mut l), ["released!"; 7]);
    assert!(!l.is_full());
}

#[test]
fn expired_late_pull_reports_what_was_owed_at_the_deadline() {
    // The `Expired` decision is taken at the advance; an edge resolved before the pull
    // does not change what it reports.
    let mut l = ledger(4);
    let _t = named(&mut l, "r");
    l.advance(Instant::from_millis(100)).expect("forward");
    assert_eq!(notice(&mut l, P0, b"r:2"), Noticed::Counted);
    let Some(Decision::Expired(q)) = l.poll_decision() else {
        panic!("expired first")
    };
    assert_eq!(q.outstanding(), Outstanding::Edges(0b11));
    assert_eq!(q.cause(), QuarantineCause::Expired);
    assert_eq!(poll(&mut l), Vec::<&str>::new());
    assert_eq!(notice(&mut l, P1, b"r:2"), Noticed::Decided);
    assert_eq!(poll(&mut l), ["released"]);
}

// ---- Aborted / Expired (quarantined) ----

#[test]
fn aborted_late_notice_resolves_silently_then_releases_at_the_last() {
    let mut l = ledger(4);
    let t = counting(&mut l, "r", 2);
    let _ = l.abort(t);
    assert_eq!(notice(&mut l, P0, b"r:2"), Noticed::Counted);
    assert_eq!(notice(&mut l, P1, b"PUSH_FAIL:r:2"), Noticed::Decided);
    assert_eq!(poll(&mut l), ["released"]);
    assert!(l.is_empty());
}

#[test]
fn aborted_abort_again_is_late() {
    let mut l = ledger(4);
    let t = counting(&mut l, "r", 2);
    let _ = l.abort(t);
    assert_eq!(l.abort_id("r").map(|_| ()), Err(AbortError::Late));
}

#[test]
fn aborted_quarantine_end_forces_release() {
    // F5: the producer gave up too; the blocks come back after quarantine_ms.
    let mut l = ledger(4);
    let t = counting(&mut l, "r", 2);
    let _ = l.abort(t);
    assert!(at(&mut l, 999).is_empty()); // the deadline passing changes nothing
    assert_eq!(at(&mut l, 1000), ["released!"]);
    assert_eq!(ignored(&mut l, P0, b"r:2"), IgnoreReason::Late);
}

#[test]
fn aborted_fence_resolving_last_named_edge_releases() {
    let mut l = ledger(4);
    let t = named(&mut l, "r");
    let _ = notice(&mut l, P0, b"r:2");
    let _ = l.abort(t);
    assert_eq!(fence(&mut l, P1), ["released"]);
}

#[test]
fn aborted_gone_resolving_last_named_edge_releases_after_settling() {
    let mut l = settling_ledger(4, 50);
    let t = named(&mut l, "r");
    let _ = notice(&mut l, P0, b"r:2");
    let _ = l.abort(t);
    assert!(at(&mut l, 10).is_empty());
    assert!(
        gone(&mut l, P1).is_empty(),
        "aborted: no failed, no release yet"
    );
    assert!(at(&mut l, 59).is_empty());
    assert_eq!(at(&mut l, 60), ["released"]);
}

#[test]
fn aborted_gone_with_settle_zero_releases_at_once() {
    let mut l = ledger(4);
    let t = named(&mut l, "r");
    let _ = notice(&mut l, P0, b"r:2");
    let _ = l.abort(t);
    assert_eq!(gone(&mut l, P1), ["released"]);
}

#[test]
fn expired_gone_settling_past_the_quarantine_end_is_forced_there() {
    // Deadline 100, quarantine end 1100; a gone at 1090 settles until 1140: forced at 1100.
    let mut l = settling_ledger(4, 50);
    let _t = named(&mut l, "r");
    let _ = notice(&mut l, P0, b"r:2");
    assert_eq!(at(&mut l, 100), ["expired"]);
    assert!(at(&mut l, 1090).is_empty());
    assert!(gone(&mut l, P1).is_empty());
    assert!(at(&mut l, 1099).is_empty());
    assert_eq!(at(&mut l, 1100), ["released!"]);
    assert!(l.is_empty());
}

#[test]
fn expired_gone_then_late_notice_is_duplicate() {
    let mut l = settling_ledger(4, 50);
    let _t = named(&mut l, "r");
    assert_eq!(at(&mut l, 100), ["expired"]);
    assert!(gone(&mut l, P1).is_empty());
    assert_eq!(ignored(&mut l, P1, b"r:2"), IgnoreReason::Duplicate);
    assert_eq!(notice(&mut l, P0, b"r:2"), Noticed::Decided);
    assert!(poll(&mut l).is_empty(), "settling from the gone at 100");
    assert_eq!(at(&mut l, 150), ["released"]);
}

#[test]
fn aborted_register_same_id_is_rejected_while_fenced() {
    let mut l = ledger(4);
    let t = counting(&mut l, "r", 1);
    let _ = l.abort(t);
    let again = Registration {
        id: "r",
        blocks: BlockHandle(8),
        expect: Expect::Count(1),
        deadline: None,
    };
    assert_eq!(
        l.register(again).expect_err("tracked").kind,
        RegisterErrorKind::DuplicateId
    );
}

#[test]
fn expired_duplicate_named_notice_is_ignored() {
    let mut l = ledger(4);
    let _t = named(&mut l, "r");
    let _ = notice(&mut l, P0, b"r:2");
    assert_eq!(at(&mut l, 100), ["expired"]);
    assert_eq!(ignored(&mut l, P0, b"r:2"), IgnoreReason::Duplicate);
    assert_eq!(notice(&mut l, P1, b"r:2"), Noticed::Decided);
    assert_eq!(poll(&mut l), ["released"]);
}

#[test]
fn expired_quarantine_counts_from_the_deadline() {
    let mut l = ledger(4);
    let _t = counting(&mut l, "r", 1);
    assert_eq!(at(&mut l, 150), ["expired"]);
    assert!(at(&mut l, 1099).is_empty());
    assert_eq!(at(&mut l, 1100), ["released!"]);
}

#[test]
fn expired_clock_jump_over_deadline_and_quarantine_at_once() {
    let mut l = ledger(4);
    let _t = counting(&mut l, "r", 1);
    assert_eq!(at(&mut l, 5000), ["expired", "released!"]);
    assert!(l.is_empty());
}

// ---- Decided (completed / released, remembered as tombstones) ----

#[test]
fn decided_notice_is_late_and_costs_no_capacity() {
    // Rule 7: capacity 1, yet the decided id is still remembered.
    let mut l = ledger(1);
    let _t = counting(&mut l, "r1", 1);
    let _ = notice(&mut l, P0, b"r1:1");
    assert_eq!(poll(&mut l), ["completed"]);
    let _t2 = counting(&mut l, "r2", 1);
    assert_eq!(ignored(&mut l, P0, b"r1:1"), IgnoreReason::Late);
    assert_eq!(l.abort_id("r1").map(|_| ()), Err(AbortError::Late));
}

#[test]
fn decided_id_may_be_registered_again() {
    let mut l = ledger(4);
    let _t = counting(&mut l, "r", 1);
    let _ = notice(&mut l, P0, b"r:1");
    assert_eq!(poll(&mut l), ["completed"]);
    let _t = counting(&mut l, "r", 1);
    assert_eq!(notice(&mut l, P0, b"r:1"), Noticed::Decided);
    assert_eq!(poll(&mut l), ["completed"]);
}

#[test]
fn decided_abort_ticket_after_completion_is_late() {
    let mut l = ledger(4);
    let t = counting(&mut l, "r", 1);
    let _ = notice(&mut l, P0, b"r:1");
    assert_eq!(poll(&mut l), ["completed"]);
    assert_eq!(l.abort(t).map(|_| ()), Err(AbortError::Late));
}

// ---- Unknown (never registered) ----

#[test]
fn unknown_notice_creates_no_state_and_does_not_count_later() {
    // Rule 4: a notice before its register does not count for it.
    let mut l = ledger(4);
    assert_eq!(ignored(&mut l, P0, b"r:1"), IgnoreReason::Unknown);
    let _t = counting(&mut l, "r", 1);
    assert!(poll(&mut l).is_empty());
    assert_eq!(notice(&mut l, P0, b"r:1"), Noticed::Decided);
}

#[test]
fn unknown_abort_is_unknown() {
    let mut l = ledger(4);
    assert_eq!(l.abort_id("nope").map(|_| ()), Err(AbortError::Unknown));
}

#[test]
fn any_state_garbage_changes_nothing() {
    // Rule 5.
    let mut l = ledger(4);
    let _t = counting(&mut l, "r", 1);
    for bad in [
        &b""[..],
        b"r",
        b":1",
        b"r:0",
        b"r:65536",
        b"r:x",
        b"\xff:1",
        b"PUSH_FAIL:r",
    ] {
        assert!(
            matches!(ignored(&mut l, P0, bad), IgnoreReason::Malformed(_)),
            "{bad:?}"
        );
    }
    for producer_bound in [&b"HB:a,b"[..], b"PUSH_REG:\x81\xa1"] {
        assert_eq!(
            ignored(&mut l, P0, producer_bound),
            IgnoreReason::NotForConsumer
        );
    }
    assert_eq!(notice(&mut l, P0, b"r:1"), Noticed::Decided);
    let c = l.counters();
    assert_eq!((c.ingest.malformed, c.ingest.not_for_consumer), (8, 2));
}

#[test]
fn full_table_rejects_and_hands_the_registration_back() {
    let mut l = ledger(2);
    let _a = counting(&mut l, "a", 1);
    let _b = counting(&mut l, "b", 1);
    let c = Registration {
        id: "c",
        blocks: BlockHandle(3),
        expect: Expect::Count(1),
        deadline: None,
    };
    let e = l.register(c).expect_err("full");
    assert_eq!((e.kind, e.registration.id), (RegisterErrorKind::Full, "c"));
    assert!(l.is_full());
    let _ = notice(&mut l, P0, b"a:1");
    assert_eq!(poll(&mut l), ["completed"]);
    let _c = counting(&mut l, "c", 1);
}

#[test]
fn invalid_expectations_are_refused() {
    let mut l = ledger(4);
    for expect in [
        Expect::Count(0),
        Expect::Count(65),
        Expect::Edges(&[]),
        Expect::Edges(&[P0, P0]),
    ] {
        let r = Registration {
            id: "r",
            blocks: BlockHandle(1),
            expect,
            deadline: None,
        };
        assert!(matches!(
            l.register(r).expect_err("invalid").kind,
            RegisterErrorKind::BadCount | RegisterErrorKind::BadEdges
        ));
    }
    let five = [AgentId(0), AgentId(1), AgentId(2), AgentId(3), AgentId(4)];
    let r = Registration {
        id: "r",
        blocks: BlockHandle(1),
        expect: Expect::Edges(&five),
        deadline: None,
    };
    assert_eq!(
        l.register(r).expect_err("more than E").kind,
        RegisterErrorKind::BadEdges
    );
    // The stranger id can never be an edge, so a sender nobody named matches none.
    let r = Registration {
        id: "r",
        blocks: BlockHandle(1),
        expect: Expect::Edges(&[P0, AgentId::STRANGER]),
        deadline: None,
    };
    assert_eq!(
        l.register(r).expect_err("the stranger as an edge").kind,
        RegisterErrorKind::BadEdges
    );
    assert!(l.is_empty());
}

#[test]
fn clock_going_backwards_is_refused() {
    let mut l = ledger(4);
    let _ = at(&mut l, 10);
    assert_eq!(
        l.advance(Instant::from_millis(9)),
        Err(ClockError::Backwards {
            last: Instant::from_millis(10),
            now: Instant::from_millis(9)
        })
    );
    assert_eq!(l.now(), Instant::from_millis(10));
}

#[test]
fn deadlines_fire_in_registration_order_not_deadline_order() {
    let mut l = ledger(4);
    let r = |id, d| Registration {
        id,
        blocks: BlockHandle(7),
        expect: Expect::Count(1),
        deadline: Some(Duration::from_millis(d)),
    };
    let first = l.register(r("late-deadline", 50)).expect("ok").key();
    let second = l.register(r("early-deadline", 10)).expect("ok").key();
    l.advance(Instant::from_millis(60)).expect("forward");
    let keys: Vec<_> = queued(&mut l).iter().map(Decision::key).collect();
    assert_eq!(keys, [first, second]);
}
