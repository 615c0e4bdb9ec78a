"""The decode side's word to its producers (:class:`kvdrain.vllm.DecodeSide`, no vLLM):
what is left of a registration's lifetime when its ``PUSH_REG`` leaves, the cancel owed
when a receive is given up, and the heartbeats it no longer names."""

from __future__ import annotations

from kvdrain.vllm import DecodeReport, DecodeSide, Settings

from conftest import FakeClock

P = ("engine-P", "p-r")  # the producer engine and its request id
SETTINGS = Settings(1_000, 3_000, 100, 64, lease_ms=1_000, margin_ms=500)  # lifetime 1 000


def side(world_size: int = 1) -> tuple[DecodeSide, FakeClock]:
    clock = FakeClock()
    return DecodeSide(SETTINGS, world_size=world_size, clock=clock), clock


def registered(s: DecodeSide, rid: str = "r", producer: tuple[str, str] | None = P) -> None:
    report = s.catch_up()
    assert s.register(rid, [[1, 2]], 1, report, producer) == "tracked"


def test_the_lifetime_left_counts_down_on_this_sides_clock() -> None:
    s, clock = side()
    assert SETTINGS.lifetime_ms == 1_000
    registered(s)
    assert s.lifetime_left_ms("r") == 1_000
    clock.advance_ms(300)  # the writer thread sends the PUSH_REG 300 ms later
    assert s.lifetime_left_ms("r") == 700
    clock.advance_ms(900)
    assert s.lifetime_left_ms("r") == 0
    assert s.lifetime_left_ms("never-registered") is None


def test_a_receive_without_producer_sends_vllms_own_push_reg() -> None:
    s, _ = side()
    registered(s, producer=None)
    assert s.lifetime_left_ms("r") is None


def test_an_abort_owes_a_cancel_stops_the_push_reg_and_the_heartbeats() -> None:
    s, _ = side()
    registered(s)
    report = DecodeReport()
    s.abort("r", report)
    assert report.cancelled == [("engine-P", "r")]
    assert s.lifetime_left_ms("r") == 0  # a PUSH_REG still queued does not leave
    assert s.beats("engine-P", ["p-r", "p-other"]) == ["p-other"]
    assert s.beats("engine-P", ["p-other"]) == ["p-other"]  # no longer named: forgotten
    assert s.beats("engine-P", ["p-r"]) == ["p-r"]


def test_the_deadline_owes_a_cancel_in_the_step_that_fires_it() -> None:
    s, clock = side()
    registered(s)
    clock.advance_ms(2_500)  # no step between registration and well past the deadline
    report = s.catch_up()
    assert report.expired == 1
    assert report.cancelled == [("engine-P", "r")]
    assert s.beats("engine-P", ["p-r"]) == []
    assert s.step().cancelled == []  # once


def test_a_failure_owes_no_cancel_but_ends_the_heartbeats() -> None:
    s, _ = side()
    registered(s)
    s.feed({"P0": [b"PUSH_FAIL:r:1"]})
    report = s.step()
    assert report.failed == 1 and report.cancelled == []
    assert s.beats("engine-P", ["p-r"]) == []
    assert s.lifetime_left_ms("r") == 0


def test_a_completion_sends_no_late_push_reg_and_no_cancel() -> None:
    s, _ = side()
    registered(s)
    s.feed({"P0": [b"r:1"]})
    report = s.step()
    assert report.completed == ["r"] and report.cancelled == []
    assert s.lifetime_left_ms("r") == 0


def test_a_failure_of_vllms_own_on_two_ranks_owes_a_cancel_at_the_next_step() -> None:
    """vLLM failed the receive on this rank (its handshake), another rank registered: the
    report waits for the release, so the scheduler keeps heartbeating it meanwhile. The
    plugin leaves it out of them and cancels the registration."""
    s, _ = side(world_size=2)
    registered(s)
    assert s.vllm_failed("r")
    assert s.beats("engine-P", ["p-r"]) == []
    assert s.step().cancelled == [("engine-P", "r")]
    assert s.step().cancelled == []
