"""``Decision.record``: what the ledger knew of a request when a decision was taken. One
test per way a request ends, each checking every field against what the scenario did,
with the agents named by the strings given to ``register``.

Deadline 1000, quarantine 2000, settle 100 unless a test says otherwise."""

from __future__ import annotations

import gc

import pytest

import kvdrain
from kvdrain import Decision, Ledger, Record

P = ["p0", "p1", "p2", "p3"]


def ledger(settle_ms: int = 100) -> Ledger:
    return Ledger(16, deadline_ms=1000, quarantine_ms=2000, settle_ms=settle_ms)


def record(d: Decision) -> Record:
    rec = d.record
    assert rec is not None, d
    return rec


def fields(rec: Record) -> dict[str, object]:
    return {
        "registered_ms": rec.registered_ms,
        "deadline_ms": rec.deadline_ms,
        "counting": rec.counting,
        "expected": rec.expected,
        "owed": rec.owed,
        "edges": rec.edges,
        "failure_notice_ms": rec.failure_notice_ms,
        "gone_ms": rec.gone_ms,
        "fenced_ms": rec.fenced_ms,
        "ended": rec.ended,
        "ended_ms": rec.ended_ms,
        "decided_ms": rec.decided_ms,
        "settle_end_ms": rec.settle_end_ms,
        "released_ms": rec.released_ms,
        "forced": rec.forced,
        "first_failure": rec.first_failure,
        "first_failure_ms": rec.first_failure_ms,
    }


def test_completed_every_edge_landed_and_nothing_failed() -> None:
    led = ledger()
    led.advance(5)
    rid = "".join(["r", "1"])  # a fresh str object
    led.register(rid, None, P)
    led.advance(20)
    led.feed({p: [b"r1:4"] for p in P})
    (d,) = led.poll()
    assert d.kind == "completed"
    rec = record(d)
    assert rec.request_id is rid
    assert fields(rec) == {
        "registered_ms": 5,
        "deadline_ms": 1005,
        "counting": False,
        "expected": 4,
        "owed": 0,
        "edges": [(p, "landed", None) for p in P],
        "failure_notice_ms": None,
        "gone_ms": None,
        "fenced_ms": None,
        "ended": None,
        "ended_ms": None,
        "decided_ms": 20,
        "settle_end_ms": None,
        "released_ms": 20,
        "forced": False,
        "first_failure": None,
        "first_failure_ms": None,
    }
    assert "landed" in repr(rec) and "'r1'" in repr(rec)


def test_failed_names_how_and_when_each_edge_resolved() -> None:
    """p0 lands, p1 sends PUSH_FAIL at 20, p2 is gone at 30, p3 fenced at 40: decided by
    the fence, released at 130 (the gone's settle end, the later one)."""
    led = ledger()
    led.register("r", None, P)
    led.feed({"p0": [b"r:4"]}, now_ms=10)
    led.advance(20)
    led.feed({"p1": [b"PUSH_FAIL:r:4"]}, now_ms=20)
    assert led.poll() == []
    assert led.gone("p2", now_ms=30) == []
    (failed,) = led.fence("p3", now_ms=40)
    assert failed.kind == "failed"
    assert led.advance(129) == []
    (released,) = led.advance(130)
    assert (released.kind, released.forced) == ("released", False)
    for d in (failed, released):
        rec = record(d)
        assert rec.edges == [
            ("p0", "landed", None),
            ("p1", "failure_notice", 20),
            ("p2", "gone", 30),
            ("p3", "fenced", 40),
        ]
        assert (rec.failure_notice_ms, rec.gone_ms, rec.fenced_ms) == (20, 30, 40)
        assert (rec.first_failure, rec.first_failure_ms) == ("failure_notice", 20)
        assert (rec.decided_ms, rec.settle_end_ms, rec.owed) == (40, 130, 0)
        assert (rec.ended, rec.ended_ms) == (None, None)
    assert record(failed).released_ms is None
    assert (record(released).released_ms, record(released).forced) == (130, False)


def test_a_gone_after_the_notice_keeps_the_notice_as_the_cause() -> None:
    led = ledger()
    led.register("r", None, ["p0", "p1"])
    led.feed({"p1": [b"PUSH_FAIL:r:2"]}, now_ms=10)
    assert led.poll() == []
    assert led.gone("p1", now_ms=20) == []
    led.feed({"p0": [b"r:2"]})
    (failed,) = led.poll()
    rec = record(failed)
    assert rec.edges == [("p0", "landed", None), ("p1", "failure_notice", 10)]
    assert rec.gone_ms is None
    assert (rec.first_failure, rec.first_failure_ms) == ("failure_notice", 10)


def test_two_failure_notices_leave_the_edge_times_unset() -> None:
    led = ledger()
    led.register("r", None, ["p0", "p1"])
    led.feed({"p0": [b"PUSH_FAIL:r:2"]}, now_ms=10)
    led.feed({"p1": [b"PUSH_FAIL:r:2"]}, now_ms=15)
    (failed,) = led.poll()
    rec = record(failed)
    assert rec.edges == [("p0", "failure_notice", None), ("p1", "failure_notice", None)]
    assert rec.failure_notice_ms == 15  # the last one


def test_expired_then_forced_names_the_agent_that_still_owed() -> None:
    led = ledger()
    led.register("r", None, ["p0", "p1"])
    led.feed({"p0": [b"r:2"]})
    (expired,) = led.advance(1000)
    (forced,) = led.advance(3000)
    assert (expired.kind, forced.kind, forced.forced) == ("expired", "released", True)
    for d in (expired, forced):
        rec = record(d)
        assert rec.edges == [("p0", "landed", None), ("p1", "outstanding", None)]
        assert (rec.owed, rec.ended, rec.ended_ms) == (1, "expired", 1000)
        assert (rec.first_failure, rec.first_failure_ms) == ("expired", 1000)
        assert rec.decided_ms is None
    assert (record(expired).released_ms, record(expired).forced) == (None, False)
    assert (record(forced).released_ms, record(forced).forced) == (3000, True)


def test_aborted_in_counting_mode_reports_the_count() -> None:
    led = ledger()
    led.register("r", None, 3)
    led.feed({"anyone": [b"r:1"]})
    aborted = led.abort("r", now_ms=10)
    assert aborted is not None and aborted.kind == "aborted"
    (released,) = led.advance(2010)
    for d in (aborted, released):
        rec = record(d)
        assert (rec.counting, rec.expected, rec.owed, rec.edges) == (True, 3, 2, [])
        assert (rec.ended, rec.ended_ms) == ("aborted", 10)
        assert (rec.first_failure, rec.first_failure_ms) == ("aborted", 10)
    assert record(aborted).released_ms is None
    assert (record(released).released_ms, record(released).forced) == (2010, True)


def test_the_record_outlives_the_slot_and_the_ledger() -> None:
    """Read when the decision was taken: later registrations reuse the slot, and the
    ledger may be gone, and the record still says what happened to its own request."""
    led = ledger(settle_ms=0)
    led.register("a", None, ["p0", "p1"])
    led.feed({"p0": [b"PUSH_FAIL:a:2"], "p1": [b"a:2"]}, now_ms=7)
    (failed,) = led.poll()
    (released,) = led.advance(7)  # it settles from its arrival at 7
    for i in range(16):
        led.register(f"b{i}", None, ["p9"])
    del led  # the decisions keep the agent names, not the ledger
    gc.collect()
    rec = record(released)
    assert rec.request_id == "a"
    assert rec.edges == [("p0", "failure_notice", 7), ("p1", "landed", None)]
    # Decided at the engine's clock (0: no advance before the poll), released at 7.
    assert (rec.decided_ms, rec.released_ms) == (0, 7)
    assert record(failed).edges == rec.edges


def test_each_read_is_a_new_object_with_the_same_fields() -> None:
    led = ledger()
    led.register("r", None, 1)
    led.feed({"x": [b"r:1"]})
    (d,) = led.poll()
    first, second = record(d), record(d)
    assert first is not second
    assert fields(first) == fields(second)


def test_the_record_is_exported_and_not_constructible() -> None:
    assert kvdrain.Record is Record
    with pytest.raises(TypeError):
        Record()


def test_two_gone_edges_name_their_cause_and_leave_the_times_unset() -> None:
    """Each edge's cause is the core's; the request keeps the last ``gone``'s time only,
    so neither of two ``gone`` edges claims it."""
    led = ledger()
    led.register("r", None, ["p0", "p1", "p2"])
    led.feed({"p0": [b"r:3"]})
    assert led.gone("p1", now_ms=10) == []
    (failed,) = led.gone("p2", now_ms=25)
    rec = record(failed)
    assert rec.edges == [("p0", "landed", None), ("p1", "gone", None), ("p2", "gone", None)]
    # The request's `gone` time is the last one's, and so is its first failure's.
    assert (rec.gone_ms, rec.first_failure, rec.first_failure_ms) == (25, "gone", 25)


def test_a_notice_after_a_fence_of_its_agent_leaves_the_fence_as_the_cause() -> None:
    led = ledger()
    led.register("r", None, ["p0", "p1"])
    assert led.fence("p1", now_ms=5) == []
    led.feed({"p1": [b"PUSH_FAIL:r:2"]}, now_ms=6)  # a duplicate: the edge is resolved
    led.feed({"p0": [b"r:2"]})
    (failed, released) = led.poll()
    assert (failed.kind, released.kind) == ("failed", "released")
    for d in (failed, released):
        rec = record(d)
        assert rec.edges == [("p0", "landed", None), ("p1", "fenced", 5)]
        assert (rec.failure_notice_ms, rec.fenced_ms, rec.settle_end_ms) == (None, 5, None)
        assert (rec.first_failure, rec.first_failure_ms) == ("fenced", 5)
