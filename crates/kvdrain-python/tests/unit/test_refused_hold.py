"""``Ledger.hold_refused``: the blocks of a receive the ledger refused, held by the
ledger's clock for a quarantine (a decode engine of several ranks, one of them full), and
handed back by ``poll_refused_releases`` in the order they were held."""

from __future__ import annotations

import gc
import weakref

import pytest

from kvdrain import FullError, Ledger


def test_a_refused_receive_comes_back_a_quarantine_later_with_its_blocks() -> None:
    led = Ledger(1, quarantine_ms=1_000)
    led.register("a", None, 1)
    blocks = [[1, 2, 3]]
    with pytest.raises(FullError):
        led.register("b", blocks, 1)
    led.advance(10)
    assert led.hold_refused("b", blocks) == 1_020  # 1 010, up to a multiple of 17 ms
    assert led.next_timer_ms == 1_020
    assert led.poll_refused_releases() == []
    led.advance(1_019)
    assert led.poll_refused_releases() == []
    assert led.advance(1_020) == []  # no decision: nothing tracked changed
    ((rid, back),) = led.poll_refused_releases()
    assert rid == "b" and back is blocks
    assert led.poll_refused_releases() == []  # handed back once
    assert led.next_timer_ms is not None  # a's deadline, only


def test_holds_end_in_the_order_they_were_taken() -> None:
    led = Ledger(4, quarantine_ms=61)  # granule 1 ms: exact ends
    ends = []
    for t, rid in [(0, "x"), (0, "y"), (5, "z")]:
        led.advance(t)
        ends.append(led.hold_refused(rid, rid.upper()))
    assert ends == [61, 61, 66]
    led.advance(70)
    assert led.poll_refused_releases() == [("x", "X"), ("y", "Y"), ("z", "Z")]


def test_a_hold_changes_no_request_and_no_counter() -> None:
    led = Ledger(2, quarantine_ms=100)
    led.register("r", None, 1)
    before = led.counters()
    led.hold_refused("r", None)  # even an id the ledger tracks: it is the caller's to say
    assert led.counters() == before and len(led) == 1
    led.feed({"p": [b"r:1"]})
    assert [(d.kind, d.request_id) for d in led.poll()] == [("completed", "r")]
    led.advance(100)
    assert led.poll_refused_releases() == [("r", None)]


def test_a_quarantine_of_zero_ends_the_hold_at_once() -> None:
    led = Ledger(1, quarantine_ms=0)
    led.advance(7)
    assert led.hold_refused("r", 1) == 7
    assert led.poll_refused_releases() == [("r", 1)]


def test_misuse_raises_type_errors_and_holds_nothing() -> None:
    led = Ledger(1)
    with pytest.raises(TypeError):
        led.hold_refused(b"r", None)  # type: ignore[arg-type]
    led.advance(10**9)
    assert led.poll_refused_releases() == []


def test_a_ledger_in_a_cycle_with_what_it_holds_is_collected() -> None:
    class Blocks:
        pass

    led = Ledger(1, quarantine_ms=1_000)
    blocks = Blocks()
    blocks.ledger = led  # type: ignore[attr-defined]
    led.hold_refused("r", blocks)
    gone = weakref.ref(blocks)
    del led, blocks
    gc.collect()
    assert gone() is None
