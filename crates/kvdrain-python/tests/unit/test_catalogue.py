"""The failure catalogue (docs/protocol.md) through the Python API: counting and named
edges, duplicates, unknown ids, garbage bytes, deadlines, abort, fence, settling, full tables
and misuse."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

import kvdrain
from kvdrain import Decision, Ledger


def kinds(decisions: list[Decision]) -> list[tuple[str, str]]:
    return [(d.kind, d.request_id) for d in decisions]


def test_decisions_carry_the_callers_objects() -> None:
    led = Ledger(16)
    blocks = object()
    rid = "".join(["cmpl-", "42"])  # a fresh str object
    led.register(rid, blocks, 1)
    led.feed({"p": [b"cmpl-42:1"]})
    (d,) = led.poll()
    assert d.kind == "completed"
    assert d.request_id is rid and d.blocks is blocks
    assert d.at_ms == 0 and d.forced is False and d.outstanding is None
    assert "completed" in repr(d)


def test_counting_mode_counts_anyone() -> None:
    led = Ledger(16)
    led.register("r", None, 3)
    led.feed({"a": [b"r:1"], "b": [b"r:1"]})
    assert led.poll() == []
    led.feed({"stranger": [b"r:1"]})
    assert kinds(led.poll()) == [("completed", "r")]


# settle_ms=0 below: vLLM's release-with-the-decision, whatever the settling default.


def test_failure_never_cuts_the_count_short_c2_f1() -> None:
    led = Ledger(16, settle_ms=0)
    led.register("r", [1], ["p0", "p1"])
    led.feed({"p1": [b"PUSH_FAIL:r:2"]})
    assert led.poll() == []
    led.feed({"p0": [b"r:2"]})
    assert kinds(led.poll()) == [("failed", "r"), ("released", "r")]


def test_first_failure_is_sticky_f2() -> None:
    led = Ledger(16, settle_ms=0)
    led.register("r", None, 3)
    led.feed({"a": [b"PUSH_FAIL:r:1", b"r:1", b"r:1"]})
    assert kinds(led.poll()) == [("failed", "r"), ("released", "r")]


def test_named_edges_duplicate_and_unexpected_sender_f7() -> None:
    led = Ledger(16)
    led.register("r", None, ["p0", "p1"])
    led.feed({"p0": [b"r:2", b"r:2"], "intruder": [b"r:2"]})
    assert led.poll() == []
    c = led.counters()
    assert (c["duplicate"], c["unexpected_sender"], c["completions"]) == (1, 1, 1)
    led.feed({"p1": [b"r:2"]})
    assert kinds(led.poll()) == [("completed", "r")]


def test_late_notices_after_a_decision_change_nothing() -> None:
    led = Ledger(16)
    led.register("r", None, 1)
    led.feed({"a": [b"r:1"]})
    assert len(led.poll()) == 1
    led.feed({"a": [b"r:1", b"PUSH_FAIL:r:1"]})
    assert led.poll() == []
    assert led.counters()["late"] == 2


def test_unknown_ids_create_no_state_f12() -> None:
    led = Ledger(16)
    led.feed({"a": [b"nobody:1", b"PUSH_FAIL:nobody:2"]})
    assert len(led) == 0 and led.poll() == []
    assert led.counters()["unknown"] == 2
    led.register("nobody", None, 1)  # the early notices do not count for it
    assert led.poll() == []


GARBAGE: list[object] = [
    b"",
    b":",
    b"r",
    b"r:",
    b"r:x",
    b"r:0",
    b"r:65536",
    b":1",
    b"\xff\xfe:1",
    b"PUSH_FAIL:",
    b"PUSH_FAIL::1",
    b"\x00" * 300,
    bytes(range(256)),
    "r:1",  # a str, not bytes
    None,
    12,
    bytearray(b"r:1"),
]


def test_garbage_never_raises_and_disturbs_nothing() -> None:
    led = Ledger(16)
    led.register("r", [1], 2)
    assert led.feed({"a": GARBAGE, "b": []}) == []  # type: ignore[dict-item]
    assert led.poll() == [] and len(led) == 1
    c = led.counters()
    assert c["malformed"] == 13 and c["not_bytes"] == 4
    led.feed({"a": [b"r:1", b"r:1"]})
    assert kinds(led.poll()) == [("completed", "r")]


def test_feed_accepts_any_mapping_of_iterables() -> None:
    class Notifs(dict[str, tuple[bytes, ...]]):
        pass

    led = Ledger(16)
    led.register("r", None, 3)
    led.feed(Notifs(a=(b"r:1",)))
    led.feed({"b": iter([b"r:1"])})
    led.feed({"c": b"r:1"})  # type: ignore[dict-item]  # one message, not a list
    assert kinds(led.poll()) == [("completed", "r")]


def test_producer_bound_messages_come_back_as_given() -> None:
    led = Ledger(16)
    hb, reg = b"HB:a,b", b"PUSH_REG:\x81"
    out = led.feed({"p": [hb, b"zz:1"], "q": [reg]})
    assert out == [("p", hb), ("q", reg)]
    assert out[0][1] is hb
    assert led.counters()["not_for_consumer"] == 2


def test_deadline_expires_then_quarantine_forces_release_l1() -> None:
    led = Ledger(16, deadline_ms=100, quarantine_ms=1000)
    led.register("r", [1], ["p0", "p1"])
    led.register("own", None, 1, deadline_ms=50)
    led.feed({"p0": [b"r:2"]})
    (d,) = led.advance(50)
    assert (d.kind, d.request_id, d.outstanding) == ("expired", "own", 1)
    (d,) = led.advance(100)
    assert (d.kind, d.outstanding, d.at_ms) == ("expired", ["p1"], 100)
    assert led.next_timer_ms == 1050
    assert kinds(led.advance(1050)) == [("released", "own")]
    (d,) = led.advance(5000)
    assert (d.kind, d.request_id, d.forced) == ("released", "r", True)
    assert len(led) == 0


def test_expired_request_released_when_its_last_edge_lands() -> None:
    led = Ledger(16, deadline_ms=100)
    led.register("r", None, 2)
    led.advance(100)
    led.feed({"a": [b"r:1", b"r:1"]})
    (d,) = led.poll()
    assert (d.kind, d.forced) == ("released", False)


def test_abort_quarantines_blocks_c1_f5() -> None:
    led = Ledger(16, quarantine_ms=500)
    blocks = [4, 5]
    led.register("r", blocks, ["p0", "p1"])
    led.feed({"p0": [b"r:2"]})
    d = led.abort("r")
    assert d is not None
    assert (d.kind, d.outstanding, d.blocks) == ("aborted", ["p1"], blocks)
    assert led.abort("r") is None  # decided already
    assert led.advance(499) == []
    (d,) = led.advance(500)
    assert (d.kind, d.forced, d.blocks) == ("released", True, blocks)


def test_abort_then_late_write_releases_unforced() -> None:
    led = Ledger(16)
    led.register("r", None, 1)
    assert led.abort("r") is not None
    led.feed({"a": [b"r:1"]})
    (d,) = led.poll()
    assert (d.kind, d.forced) == ("released", False)


def test_abort_of_unknown_request_raises() -> None:
    led = Ledger(16)
    with pytest.raises(kvdrain.UnknownRequestError) as e:
        led.abort("ghost")
    assert e.value.request_id == "ghost"
    assert isinstance(e.value, kvdrain.KvdrainError)


def test_fence_resolves_named_edges_only() -> None:
    led = Ledger(16)
    led.register("named", [1], ["p0", "p1"])
    led.register("counted", [2], 2)
    led.feed({"p0": [b"named:2", b"counted:2"]})
    assert kinds(led.fence("p1")) == [("failed", "named"), ("released", "named")]
    assert led.fence("p1") == [] and led.fence("never-seen") == []
    assert led.counters()["fenced_edges"] == 1
    assert len(led) == 1  # counting mode untouched


def test_fence_releases_an_aborted_request() -> None:
    led = Ledger(16)
    led.register("r", None, ["p0"])
    led.abort("r")
    (d,) = led.fence("p0")
    assert (d.kind, d.forced) == ("released", False)


def test_full_table_refuses_and_hands_the_registration_back() -> None:
    led = Ledger(2)
    led.register("a", None, 1)
    led.register("b", None, 1)
    blocks = ["mine"]
    with pytest.raises(kvdrain.FullError) as e:
        led.register("c", blocks, 1)
    assert e.value.request_id == "c" and e.value.blocks is blocks
    assert len(led) == 2 and led.counters()["rejected_full"] == 1
    led.feed({"x": [b"a:1"]})
    led.poll()
    led.register("c", blocks, 1)  # a completed request frees its slot at once


def test_double_register_raises() -> None:
    led = Ledger(16)
    led.register("r", None, 1)
    with pytest.raises(kvdrain.DuplicateRequestError) as e:
        led.register("r", None, 1)
    assert e.value.request_id == "r"


@pytest.mark.parametrize(
    "expect", [0, 65, -1, 2**70, [], ["a", "a"], [f"p{i}" for i in range(9)], "p0", [1], 1.5]
)
def test_invalid_expect_raises(expect: object) -> None:
    led = Ledger(16)
    with pytest.raises(kvdrain.InvalidExpectError):
        led.register("r", None, expect)  # type: ignore[arg-type]
    assert len(led) == 0


def test_clock_backwards_raises_and_changes_nothing() -> None:
    led = Ledger(16, deadline_ms=10)
    led.register("r", None, 1)
    led.advance(5)
    with pytest.raises(kvdrain.ClockBackwardsError) as e:
        led.advance(4)
    assert (e.value.last_ms, e.value.now_ms) == (5, 4)
    assert led.now_ms == 5 and len(led) == 1


@pytest.mark.parametrize("capacity", [0, 65_537])
def test_capacity_out_of_range(capacity: int) -> None:
    with pytest.raises(kvdrain.ConfigError):
        Ledger(capacity)


def test_tables_by_capacity_and_65536_requests_on_the_heap() -> None:
    assert [Ledger(c).table_size for c in (1, 1024, 1025, 4096, 16_384, 16_385)] == [
        1024,
        1024,
        4096,
        4096,
        16_384,
        65_536,
    ]
    led = Ledger(65_536)
    for i in range(65_536):
        led.register(f"r{i}", i, 1)
    with pytest.raises(kvdrain.FullError):
        led.register("one-more", None, 1)
    led.feed({"p": [f"r{i}:1".encode() for i in range(65_536)]})
    done = led.poll()
    assert len(done) == 65_536 and {d.blocks for d in done} == set(range(65_536))
    assert len(led) == 0


def test_settings_are_kept() -> None:
    led = Ledger(100, deadline_ms=1, quarantine_ms=2, settle_ms=3, seed=4)
    assert (led.capacity, led.deadline_ms, led.quarantine_ms, led.settle_ms) == (100, 1, 2, 3)
    assert led.max_edges == kvdrain.MAX_EDGES == 8
    assert "capacity=100" in repr(led)


# -- settling (rule 8): a failure notice settles before its blocks are reused ---------- #


def test_failure_notice_settles_before_release() -> None:
    led = Ledger(16, settle_ms=100)
    led.register("r1", [1], ["p0", "p1"])
    led.feed({"p1": [b"PUSH_FAIL:r1:2"]})
    led.advance(5)
    led.feed({"p0": [b"r1:2"]})
    assert kinds(led.poll()) == [("failed", "r1")]
    assert led.advance(99) == []
    (d,) = led.advance(100)
    assert (d.kind, d.forced) == ("released", False)


def test_settling_counts_from_the_last_failure_notice() -> None:
    led = Ledger(16, settle_ms=100)
    led.register("r", None, 2)
    led.feed({"a": [b"PUSH_FAIL:r:1"]})
    led.advance(50)
    led.feed({"b": [b"PUSH_FAIL:r:1"]})
    assert kinds(led.poll()) == [("failed", "r")]
    assert led.advance(149) == []
    assert kinds(led.advance(150)) == [("released", "r")]


def test_a_settling_request_holds_its_slot() -> None:
    led = Ledger(1, settle_ms=100)
    led.register("r", None, 1)
    led.feed({"a": [b"PUSH_FAIL:r:1"]})
    assert kinds(led.poll()) == [("failed", "r")]
    assert len(led) == 1
    with pytest.raises(kvdrain.FullError):
        led.register("s", None, 1)
    assert kinds(led.advance(100)) == [("released", "r")]
    assert len(led) == 0
    led.register("s", None, 1)  # the slot is free once the notice settled


def test_a_settle_end_already_passed_releases_with_the_failure() -> None:
    led = Ledger(16, settle_ms=100)
    led.register("r", None, 2)
    led.feed({"a": [b"PUSH_FAIL:r:1"]})
    led.advance(100)
    led.feed({"b": [b"r:1"]})  # the last edge resolves after the settle end
    assert [(d.kind, d.at_ms, d.forced) for d in led.poll()] == [
        ("failed", 100, False),
        ("released", 100, False),
    ]


def quarantined_with_a_failure_notice(
    *, expire: bool, quarantine_ms: int, settle_ms: int, notice_at: int
) -> Ledger:
    """One request (edge p0) aborted at 0, or expired at its deadline of 0, whose edge a
    failure notice resolves at `notice_at`."""
    led = Ledger(16, quarantine_ms=quarantine_ms, settle_ms=settle_ms)
    if expire:
        led.register("r", [7], ["p0"], deadline_ms=0)
        assert kinds(led.advance(0)) == [("expired", "r")]
    else:
        led.register("r", [7], ["p0"])
        d = led.abort("r")
        assert d is not None and d.kind == "aborted"
    led.advance(notice_at)
    led.feed({"p0": [b"PUSH_FAIL:r:1"]})
    assert led.poll() == []  # the notice settles; the quarantine still runs
    return led


@pytest.mark.parametrize("expire", [False, True], ids=["aborted", "expired"])
def test_settle_end_before_quarantine_end_releases_unforced(expire: bool) -> None:
    led = quarantined_with_a_failure_notice(
        expire=expire, quarantine_ms=500, settle_ms=100, notice_at=10
    )
    assert led.advance(109) == []
    (d,) = led.advance(110)
    assert (d.kind, d.at_ms, d.forced, d.blocks) == ("released", 110, False, [7])
    assert led.advance(500) == []


@pytest.mark.parametrize("expire", [False, True], ids=["aborted", "expired"])
def test_quarantine_end_before_settle_end_forces_the_release(expire: bool) -> None:
    led = quarantined_with_a_failure_notice(
        expire=expire, quarantine_ms=100, settle_ms=100, notice_at=50
    )
    assert led.advance(99) == []
    (d,) = led.advance(100)  # settling does not delay the quarantine's end
    assert (d.kind, d.at_ms, d.forced) == ("released", 100, True)
    assert led.advance(150) == [] and len(led) == 0


@pytest.mark.parametrize("expire", [False, True], ids=["aborted", "expired"])
def test_quarantine_end_tied_with_settle_end_is_not_forced(expire: bool) -> None:
    led = quarantined_with_a_failure_notice(
        expire=expire, quarantine_ms=100, settle_ms=40, notice_at=60
    )
    assert led.next_timer_ms == 100
    assert led.advance(99) == []
    (d,) = led.advance(100)  # both ends at once: one release, by settling
    assert (d.kind, d.at_ms, d.forced) == ("released", 100, False)
    assert led.advance(1000) == []


def test_settle_zero_releases_with_the_decision() -> None:
    """settle_ms=0 is vLLM's failure notice: the release comes with the decision, in
    counting and named-edge mode, and the slot is free at once."""
    led = Ledger(1, settle_ms=0)
    led.register("r", None, 1)
    led.feed({"a": [b"PUSH_FAIL:r:1"]})
    assert [(d.kind, d.at_ms, d.forced) for d in led.poll()] == [
        ("failed", 0, False),
        ("released", 0, False),
    ]
    led.register("s", None, ["p0", "p1"])
    led.feed({"p1": [b"PUSH_FAIL:s:2"], "p0": [b"s:2"]})
    assert kinds(led.poll()) == [("failed", "s"), ("released", "s")]
    assert len(led) == 0 and led.next_timer_ms is None


def test_gone_fails_named_edges_at_once_and_settles_from_the_gone() -> None:
    # Rule 9: a peer seen gone may still have bytes landing: decided now, released
    # settle_ms after the gone; counting mode and unknown agents untouched.
    led = Ledger(16, settle_ms=100)
    led.register("named", [1], ["p0", "p1"])
    led.register("counted", [2], 2)
    led.feed({"p0": [b"named:2", b"counted:2"]})
    led.advance(20)
    assert kinds(led.gone("p1")) == [("failed", "named")]
    assert led.gone("p1") == [] and led.gone("never-seen") == []
    assert led.counters()["gone_edges"] == 1 and led.counters()["fenced_edges"] == 0
    assert led.advance(119) == []
    assert kinds(led.advance(120)) == [("released", "named")]
    assert len(led) == 1  # counting mode untouched


def test_gone_releases_an_aborted_request_once_settled() -> None:
    led = Ledger(16, settle_ms=50)
    led.register("r", None, ["p0"])
    led.abort("r")
    assert led.gone("p0") == []
    (d,) = led.advance(50)
    assert (d.kind, d.forced) == ("released", False)


def test_fence_needs_no_settling() -> None:
    led = Ledger(16, settle_ms=100)
    led.register("r", None, ["p0", "p1"])
    led.feed({"p0": [b"r:2"]})
    assert kinds(led.fence("p1")) == [("failed", "r"), ("released", "r")]


# -- the batch entry points: register_many and poll_split ---------------------------- #


def test_register_many_registers_in_order_and_stops_at_the_first_refusal() -> None:
    led = Ledger(3)
    led.register("b", None, 1)
    blocks = [[1], [2], [3], [4]]
    with pytest.raises(kvdrain.DuplicateRequestError) as e:
        led.register_many(["a", "b", "c"], blocks, 1)
    assert e.value.request_id == "b"
    assert len(led) == 2  # "a" registered, "c" not
    with pytest.raises(kvdrain.FullError) as full:
        led.register_many(["c", "d"], blocks[2:], 1)
    assert (full.value.request_id, full.value.blocks) == ("d", [4])
    led.feed({"p": [b"a:1", b"b:1", b"c:1"]})
    completed, others = led.poll_split()
    assert completed == ["a", "b", "c"]
    assert others == []


def test_register_many_with_named_edges_and_bad_input() -> None:
    led = Ledger(8)
    led.register_many(iter(["x", "y"]), iter([None, None]), ["p0", "p1"], deadline_ms=5)
    assert len(led) == 2
    with pytest.raises(kvdrain.InvalidExpectError):
        led.register_many(["z"], [], 1)  # fewer blocks than ids
    with pytest.raises(kvdrain.InvalidExpectError):
        led.register_many(["z"], [None], 0)
    assert len(led) == 2
    assert {d.request_id for d in led.advance(5)} == {"x", "y"}


def test_poll_split_gives_completed_ids_and_other_decisions() -> None:
    led = Ledger(8, settle_ms=0)
    rid = "".join(["o", "k"])
    led.register(rid, None, 1)
    led.register("bad", [7], 1)
    led.feed({"p": [b"ok:1", b"PUSH_FAIL:bad:1"]})
    completed, others = led.poll_split()
    assert completed == ["ok"] and completed[0] is rid
    assert kinds(others) == [("failed", "bad"), ("released", "bad")]
    assert others[0].blocks == [7]
    assert led.poll_split() == ([], [])


def test_feed_survives_values_that_are_not_lists_of_bytes() -> None:
    def broken() -> Iterator[bytes]:
        yield b"r:1"
        raise RuntimeError("the iterator broke")

    led = Ledger(16)
    led.register("r", None, 2)
    # The broken iterator's exception propagates, after what it gave was fed.
    with pytest.raises(RuntimeError, match="broke"):
        led.feed({"a": None, "b": 5, "c": broken()})  # type: ignore[dict-item]
    assert led.poll() == []
    assert led.counters()["not_bytes"] == 2 and led.counters()["completions"] == 1
    led.feed({"a": [b"r:1"]})
    assert kinds(led.poll()) == [("completed", "r")]


def test_a_cycle_through_the_ledger_is_collected() -> None:
    class Blocks:
        ledger: Ledger | None = None

    led = Ledger(16)
    blocks = Blocks()
    blocks.ledger = led  # the ledger holds blocks, blocks hold the ledger
    led.register("r", blocks, 1)
    gone = weakref.ref(blocks)
    del led, blocks
    gc.collect()
    assert gone() is None
