"""What is dated when: a failure notice at the time its batch arrived (`feed(..., now_ms=)`),
an abort, a `gone` or a `fence` at the time given with it (`now_ms=` advances the clock
first), instead of the engine's last `advance`, which a vLLM engine leaves one step behind
(rule 8: the blocks are held `settle_ms` after the notice arrived)."""

from __future__ import annotations

import pytest

import kvdrain
from kvdrain import Decision, Ledger


def kinds(decisions: list[Decision]) -> list[tuple[str, str]]:
    return [(d.kind, d.request_id) for d in decisions]


def slow_step_ledger() -> Ledger:
    """The issue's example: settle 500, quarantine 1500, steps at 0 and 10."""
    led = Ledger(16, settle_ms=500, quarantine_ms=1500, deadline_ms=1_000_000)
    assert led.advance(0) == []
    led.register("r", None, ["p0", "p1"])
    assert led.advance(10) == []
    return led


def test_a_failure_notice_settles_from_its_arrival_not_the_last_advance() -> None:
    led = slow_step_ledger()
    led.feed({"p0": [b"r:2"]})
    # The writer thread takes the failure notice at 600, during a slow step.
    led.feed({"p1": [b"PUSH_FAIL:r:2"]}, now_ms=600)
    assert kinds(led.poll()) == [("failed", "r")]
    assert led.advance(600) == [], "released in the very step it is seen"
    assert led.advance(1099) == []
    (released,) = led.advance(1100)
    assert (released.kind, released.forced, released.at_ms) == ("released", False, 1100)


def test_without_now_ms_a_notice_is_dated_at_the_last_advance() -> None:
    led = slow_step_ledger()
    led.feed({"p0": [b"r:2"], "p1": [b"PUSH_FAIL:r:2"]})
    assert kinds(led.poll()) == [("failed", "r")]
    assert led.advance(509) == []
    assert kinds(led.advance(510)) == [("released", "r")]


def test_now_ms_behind_the_clock_dates_at_the_clock() -> None:
    led = slow_step_ledger()
    assert led.advance(300) == []
    led.feed({"p0": [b"r:2"], "p1": [b"PUSH_FAIL:r:2"]}, now_ms=5)
    assert kinds(led.poll()) == [("failed", "r")]
    assert led.advance(799) == []
    assert kinds(led.advance(800)) == [("released", "r")]


def test_an_earlier_now_ms_than_one_given_keeps_the_later() -> None:
    led = slow_step_ledger()
    led.feed({}, now_ms=600)
    led.feed({"p0": [b"r:2"], "p1": [b"PUSH_FAIL:r:2"]}, now_ms=300)
    assert kinds(led.poll()) == [("failed", "r")]
    assert led.advance(1099) == []
    assert kinds(led.advance(1100)) == [("released", "r")]


def test_the_large_batch_path_dates_its_notices_too() -> None:
    # 600 messages: read element by element and fed with the GIL released.
    led = slow_step_ledger()
    batch = {"p0": [b"r:2"] + [b"garbage"] * 600, "p1": [b"PUSH_FAIL:r:2"]}
    led.feed(batch, now_ms=600)
    assert kinds(led.poll()) == [("failed", "r")]
    assert led.advance(1099) == []
    assert kinds(led.advance(1100)) == [("released", "r")]


def test_an_abort_with_now_ms_is_quarantined_from_then() -> None:
    led = slow_step_ledger()
    aborted = led.abort("r", now_ms=600)
    assert aborted is not None
    assert (aborted.kind, aborted.at_ms) == ("aborted", 600)
    assert led.now_ms == 600
    assert led.advance(2099) == []
    (released,) = led.advance(2100)
    assert (released.kind, released.forced) == ("released", True)


def test_an_abort_without_now_ms_is_dated_at_the_last_advance() -> None:
    led = slow_step_ledger()
    assert led.abort("r") is not None
    assert kinds(led.advance(1510)) == [("released", "r")]


def test_the_decisions_an_aborts_clock_move_takes_wait_for_poll() -> None:
    led = slow_step_ledger()
    led.register("short", None, 1, deadline_ms=100)  # deadline 110
    aborted = led.abort("r", now_ms=200)
    assert aborted is not None and aborted.kind == "aborted"
    assert kinds(led.poll()) == [("expired", "short")]


def test_an_abort_whose_clock_move_expired_it_is_late() -> None:
    led = Ledger(16, deadline_ms=100)
    led.register("r", None, 1)
    assert led.abort("r", now_ms=100) is None
    assert kinds(led.poll()) == [("expired", "r")]


def test_gone_with_now_ms_settles_from_then() -> None:
    led = slow_step_ledger()
    led.feed({"p0": [b"r:2"]})
    assert kinds(led.gone("p1", now_ms=600)) == [("failed", "r")]
    assert led.advance(1099) == []
    assert kinds(led.advance(1100)) == [("released", "r")]


def test_gone_and_fence_return_their_clock_moves_decisions_first() -> None:
    led = slow_step_ledger()
    led.register("short", None, 1, deadline_ms=100)  # deadline 110
    assert kinds(led.gone("p1", now_ms=200)) == [("expired", "short")]
    led2 = slow_step_ledger()
    led2.register("short", None, 1, deadline_ms=100)
    led2.feed({"p0": [b"r:2"]})
    out = led2.fence("p1", now_ms=200)
    assert kinds(out) == [("expired", "short"), ("failed", "r"), ("released", "r")]
    assert all(d.at_ms == 200 for d in out)


def test_a_stranger_with_now_ms_still_moves_the_clock() -> None:
    led = slow_step_ledger()
    led.register("short", None, 1, deadline_ms=100)
    assert kinds(led.gone("nobody", now_ms=200)) == [("expired", "short")]
    assert led.now_ms == 200
    assert led.fence("nobody") == []


@pytest.mark.parametrize("call", ["abort", "gone", "fence"])
def test_now_ms_earlier_than_the_clock_raises_and_changes_nothing(call: str) -> None:
    led = slow_step_ledger()
    with pytest.raises(kvdrain.ClockBackwardsError):
        if call == "abort":
            led.abort("r", now_ms=5)
        elif call == "gone":
            led.gone("p1", now_ms=5)
        else:
            led.fence("p1", now_ms=5)
    assert led.now_ms == 10
    assert len(led) == 1
    assert led.abort("r") is not None


@pytest.mark.parametrize("bad", [-1, 2**64, True, 1.5, "600"])
def test_a_bad_now_ms_is_an_argument_error(bad: object) -> None:
    led = slow_step_ledger()
    with pytest.raises(kvdrain.InvalidArgumentError, match="now_ms"):
        led.feed({"p1": [b"PUSH_FAIL:r:2"]}, now_ms=bad)  # type: ignore[arg-type]
    with pytest.raises(kvdrain.InvalidArgumentError, match="now_ms"):
        led.abort("r", now_ms=bad)  # type: ignore[arg-type]
    with pytest.raises(kvdrain.InvalidArgumentError, match="now_ms"):
        led.gone("p1", now_ms=bad)  # type: ignore[arg-type]
    with pytest.raises(kvdrain.InvalidArgumentError, match="now_ms"):
        led.fence("p1", now_ms=bad)  # type: ignore[arg-type]
    # Nothing was fed or ended.
    assert led.counters()["failure_notices"] == 0
    assert len(led) == 1
