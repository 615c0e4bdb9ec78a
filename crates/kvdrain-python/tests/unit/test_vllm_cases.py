"""vLLM's own test cases of the push-mode consumer path, as data (vLLM 0.33.0
``test_push_*`` and PR #50754), through :class:`kvdrain.vllm.DecodeSide`: D world size 1
unless said, expected = pp × max(1, TP // world_size).

What vLLM is told is the :class:`~kvdrain.vllm.DecodeReport` of each step: ``completed``
(its done path), ``invalid`` (a failed or expired receive's blocks, once: the scheduler
fails or recomputes it, its blocks held) and ``released`` (``finished_recving``/
``failed_recving``: the scheduler frees the blocks). There is no ``request_finished``
hook: the scheduler finishing a receive early is :meth:`~kvdrain.vllm.DecodeSide.abort`,
and the blocks are free when ``released`` names the request."""

from __future__ import annotations

import kvdrain
from kvdrain.vllm import DecodeReport, DecodeSide, Settings

from conftest import FakeClock

NOTHING = DecodeReport()
"""A step that tells vLLM nothing."""


def expect(tp_size: int, pp_size: int = 1, world_size: int = 1) -> int:
    """vLLM's expected count on one decode rank: ``pp × max(1, TP // world_size)``."""
    return pp_size * max(1, tp_size // world_size)


def side(
    *,
    world_size: int = 1,
    deadline_ms: int = 480_000,
    quarantine_ms: int = 60_000,
    settle_ms: int = 5_000,
    capacity: int = 64,
    clock: FakeClock | None = None,
) -> DecodeSide:
    settings = Settings(deadline_ms, quarantine_ms, settle_ms, capacity)
    return DecodeSide(settings, world_size=world_size, clock=clock or FakeClock())


def start_load_kv(
    d: DecodeSide, rid: str, groups: list[list[int]], want: int | list[str]
) -> DecodeReport:
    """vLLM's ``start_load_kv``, as the worker does it: the clock to now, then the
    registration before the ``PUSH_REG`` goes out."""
    report = d.catch_up()
    assert d.register(rid, groups, want, report) == "tracked"
    return report


def failed(blocks: set[int], *, expired: bool = False) -> DecodeReport:
    """A step that fails (or expires) one receive: its blocks invalid, still held."""
    if expired:
        return DecodeReport(invalid=[blocks], expired=1)
    return DecodeReport(invalid=[blocks], failed=1)


def test_expected_count_formula() -> None:
    assert expect(1) == 1
    assert expect(1, pp_size=2) == 2
    assert expect(2) == 2
    assert expect(4, pp_size=2, world_size=2) == 4
    assert expect(1, world_size=4) == 1  # max(1, 1 // 4)


def test_single_completion_completes() -> None:
    d = side()
    start_load_kv(d, "req-recv-1", [[1, 2]], expect(1))
    assert d.feed({"P0": [b"req-recv-1:1"]}) == {}
    assert d.step() == DecodeReport(completed=["req-recv-1"])
    assert d.step() == NOTHING  # reported once
    assert len(d.ledger) == 0  # metadata dropped
    assert d.phase("req-recv-1") is None


def test_pipeline_parallel_waits_for_every_stage() -> None:
    d = side()
    start_load_kv(d, "req-pp-2", [[3]], expect(1, pp_size=2))
    d.feed({"P-pp0": [b"req-pp-2:1"]})
    assert d.step() == NOTHING
    d.feed({"P-pp1": [b"req-pp-2:1"]})
    assert d.step() == DecodeReport(completed=["req-pp-2"])


def test_unknown_request_creates_no_state() -> None:
    """Nothing for the request; one "notification after expiry" for vLLM's metric."""
    d = side()
    d.feed({"P0": [b"never-heard-of-you:1"]})
    assert d.step() == DecodeReport(after_expiry=1)
    assert len(d.ledger) == 0
    assert d.ledger.counters()["unknown"] == 1
    # Registering it afterwards: the early notice does not count for it.
    start_load_kv(d, "never-heard-of-you", [[1]], expect(1))
    assert d.step() == NOTHING
    assert d.phase("never-heard-of-you") == "waiting"


def d_req(d: DecodeSide) -> None:
    start_load_kv(d, "d-req", [[100, 101]], expect(2))  # P TP2 -> D TP1


def test_failure_then_completion_fails_once_with_invalid_blocks() -> None:
    d = side()
    d_req(d)
    d.feed({"P0": [b"PUSH_FAIL:d-req:2"]})
    assert d.step() == NOTHING  # the failure waits for its sibling
    d.feed({"P1": [b"d-req:2"]})
    assert d.step() == failed({100, 101})
    assert d.phase("d-req") == "failed"
    d.feed({"P1": [b"d-req:2"]})  # late duplicate: nothing more for the request
    assert d.step() == DecodeReport(after_expiry=1)  # vLLM's metric only
    assert d.ledger.counters()["late"] == 1


def test_completion_then_failure_fails() -> None:
    d = side()
    d_req(d)
    d.feed({"P0": [b"d-req:2"]})
    d.feed({"P1": [b"PUSH_FAIL:d-req:2"]})
    assert d.step() == failed({100, 101})


def test_two_failure_notices_fail_once() -> None:
    d = side()
    d_req(d)
    d.feed({"P0": [b"PUSH_FAIL:d-req:2"], "P1": [b"PUSH_FAIL:d-req:2"]})
    assert d.step() == failed({100, 101})
    assert d.ledger.counters()["failed"] == 1


def test_two_completions_complete() -> None:
    d = side()
    d_req(d)
    d.feed({"P0": [b"d-req:2", b"d-req:2"]})
    assert d.step() == DecodeReport(completed=["d-req"])  # no invalid blocks


def test_failure_notice_for_unknown_id_touches_nothing() -> None:
    d = side()
    d_req(d)
    d.feed({"P0": [b"PUSH_FAIL:gone:1"]})
    assert d.step() == DecodeReport(after_expiry=1)
    assert d.ledger.counters()["unknown"] == 1
    assert len(d.ledger) == 1  # d-req untouched
    assert d.phase("d-req") == "waiting"
    d.feed({"P0": [b"d-req:2", b"d-req:2"]})
    assert d.step() == DecodeReport(completed=["d-req"])


def test_garbage_is_ignored() -> None:
    """Bytes that are no notice: nothing for vLLM, counted as malformed."""
    d = side()
    d_req(d)
    d.feed({"P0": [b"", b"\xff\xfe", b"d-req", b"d-req:x", b"PUSH_FAIL:"]})
    assert d.step() == NOTHING
    assert d.phase("d-req") == "waiting"
    assert d.ledger.counters()["malformed"] == 5


def test_producer_tp2_that_failed_both_posts_fails_the_consumer_after_the_second() -> None:
    """P TP 2 -> D TP 1: each producer rank plans its edge to D rank 0, fails to post it,
    and owes one PUSH_FAIL to D's agent; D fails after the second."""
    d = side()
    d_req(d)
    notices = []
    for tp_rank in (0, 1):
        plan = kvdrain.PushPlan("d-req", p_tp=2, d_tp=1, d_agents=["D0"], tp_rank=tp_rank)
        assert plan.targets == [0]
        plan.post_failed(0)
        owed = plan.take_owed_notices()
        assert owed == [("D0", b"PUSH_FAIL:d-req:2")]
        assert plan.owed_notices() == []  # sent once
        assert plan.is_terminal
        notices.append((f"P{tp_rank}", owed[0][1]))
    d.feed({notices[0][0]: [notices[0][1]]})
    assert d.step() == NOTHING
    d.feed({notices[1][0]: [notices[1][1]]})
    assert d.step() == failed({100, 101})


def test_world_size_divides_the_producer_tp() -> None:
    d = side(world_size=2)
    start_load_kv(d, "r", [[1]], expect(4, world_size=2))  # 1 × max(1, 4 // 2) = 2
    d.feed({"P0": [b"r:4"]})
    assert d.step() == NOTHING
    d.feed({"P1": [b"r:4"]})
    assert d.step() == DecodeReport(completed=["r"])


def test_producer_bound_messages_come_back_untouched() -> None:
    d = side()
    reg = b"PUSH_REG:\x82\xa1a\x01"
    hb = b"HB:req-1,req-2"
    back = d.feed({"P0": [reg, b"x:1"], "P1": [hb]})
    assert back == {"P0": [reg], "P1": [hb]}
    assert back["P0"][0] is reg and back["P1"][0] is hb


def test_deadline_fails_the_request_and_quarantines_its_blocks() -> None:
    """Expired: its blocks invalid at once, and held (no release) while a write may
    still land; released when the last one does."""
    clock = FakeClock()
    d = side(capacity=8, deadline_ms=1000, quarantine_ms=5000, clock=clock)
    start_load_kv(d, "slow", [[7, 8]], expect(2))
    d.feed({"P0": [b"slow:2"]})
    clock.advance_ms(1000)
    # The clock moves once per step, at its start_load_kv: the deadline fires next step.
    assert d.step() == NOTHING
    assert d.step() == failed({7, 8}, expired=True)
    assert d.phase("slow") == "failed"
    report = d.catch_up()
    d.abort("slow", report)  # the scheduler finishing it now changes nothing
    assert report == NOTHING
    assert d.step() == NOTHING  # a write may still land: the blocks stay held
    d.feed({"P1": [b"slow:2"]})  # the last write lands late
    report = d.step()
    assert report.released == ["slow"]
    assert (report.completed, report.invalid) == ([], [])
    assert d.drop_reported({7, 8}) == set()  # vLLM's failure path: not reported again


def test_abort_quarantines_until_the_quarantine_runs_out() -> None:
    """The scheduler finishes a receive early (``abort``): nothing is told then, and
    its blocks are released when the quarantine runs out."""
    clock = FakeClock()
    d = side(capacity=8, quarantine_ms=5000, clock=clock)
    start_load_kv(d, "gone", [[5]], expect(1))
    report = d.catch_up()
    d.abort("gone", report)
    assert report == NOTHING
    assert d.phase("gone") == "aborted"
    clock.advance_ms(4999)
    assert d.step() == NOTHING
    clock.advance_ms(1)
    assert d.step() == DecodeReport(released=["gone"])  # no completion, no invalid blocks
    assert d.phase("gone") is None


def test_request_finished_after_completion_frees_at_once() -> None:
    """``abort`` after the completion (or of an id never registered) holds nothing."""
    d = side()
    start_load_kv(d, "ok", [[1]], expect(1))
    d.feed({"P0": [b"ok:1"]})
    assert d.step() == DecodeReport(completed=["ok"])
    report = d.catch_up()
    d.abort("ok", report)
    d.abort("never-registered", report)
    assert report == NOTHING
    assert len(d.ledger) == 0
    assert d.step() == NOTHING


def test_named_edges_catch_a_duplicate_sender() -> None:
    """F7: an ambiguous NIXL error then a PUSH_FAIL from the same producer cannot
    complete the count early when the producers are named."""
    d = side()
    start_load_kv(d, "n", [[1, 2]], ["P0", "P1"])
    d.feed({"P0": [b"n:2", b"PUSH_FAIL:n:2"]})
    assert d.step() == NOTHING
    assert d.ledger.counters()["duplicate"] == 1
    d.feed({"P1": [b"n:2"]})
    assert d.step() == DecodeReport(completed=["n"])


def test_gone_fails_the_named_edges_of_a_lost_producer_and_settles() -> None:
    """A lost producer (``gone``, reported at the next step) fails its named
    edges at once; the blocks are released after settling (its bytes may still land)."""
    clock = FakeClock()
    d = side(capacity=8, settle_ms=100, clock=clock)
    start_load_kv(d, "g", [[9]], ["P0", "P1"])
    d.feed({"P0": [b"g:2"]})
    assert d.step() == NOTHING
    d.gone("P1", "connection reset")
    assert d.step() == failed({9})
    clock.advance_ms(99)
    assert d.step() == NOTHING  # P1's bytes may still be landing
    clock.advance_ms(1)
    assert d.step() == DecodeReport(released=["g"])


def test_kv_groups_report_the_failure_at_the_release() -> None:
    """Two KV cache groups: vLLM's scheduler cannot map block ids back to requests with
    more than one group (it refuses ``invalid_block_ids`` then), so no invalid blocks are
    reported; ``failed_recving`` at the release carries the failure, for every group."""
    clock = FakeClock()
    d = side(settle_ms=100, clock=clock)
    start_load_kv(d, "hma", [[1, 2], [30, 31]], expect(1))
    d.feed({"P0": [b"PUSH_FAIL:hma:1"]})
    assert d.step() == DecodeReport(failed=1)
    assert d.phase("hma") == "failed"
    clock.advance_ms(100)
    assert d.step() == DecodeReport(released=["hma"])
    assert d.drop_reported({1, 2, 30, 31}) == {1, 2, 30, 31}  # none dropped: per group


def test_failed_request_blocks_settle_before_they_are_freed() -> None:
    clock = FakeClock()
    d = side(capacity=8, settle_ms=100, clock=clock)
    start_load_kv(d, "s", [[1]], expect(1))
    d.feed({"P0": [b"PUSH_FAIL:s:1"]})
    assert d.step() == failed({1})
    clock.advance_ms(99)
    assert d.step() == NOTHING  # the failed write may still be landing
    clock.advance_ms(1)
    assert d.step() == DecodeReport(released=["s"])


def test_failed_blocks_are_reported_at_once_and_freed_after_settling() -> None:
    """A failed request's blocks are invalid for the request as soon as it fails
    (``report.invalid``), but free only after its last failure notice has settled
    (``report.released``); the blocks vLLM's failure path reports at the release are
    not reported again (``drop_reported``)."""
    clock = FakeClock()
    d = side(capacity=8, settle_ms=100, clock=clock)
    d_req(d)
    d.feed({"P0": [b"PUSH_FAIL:d-req:2"]})
    assert d.step() == NOTHING
    clock.advance_ms(30)
    assert d.step() == NOTHING  # an engine step at 30
    d.feed({"P1": [b"PUSH_FAIL:d-req:2"]})  # the last notice, read at 30: settles to 130
    assert d.step() == failed({100, 101})
    clock.advance_ms(70)
    assert d.step() == NOTHING  # 100: the first notice's settle end, not the last's
    clock.advance_ms(30)
    assert d.step() == DecodeReport(released=["d-req"])  # reported once, not again
    assert d.drop_reported({100, 101, 7}) == {7}
    assert len(d.ledger) == 0


def test_failed_request_finished_after_settling_frees_at_once() -> None:
    """The first step after the settle end: failed and released in one report. The blocks
    are reported invalid once, by vLLM's own failure path with the release."""
    clock = FakeClock()
    d = side(capacity=8, settle_ms=100, clock=clock)
    start_load_kv(d, "s", [[1]], expect(1))
    d.step()  # the registration's step
    d.feed({"P0": [b"PUSH_FAIL:s:1"]})
    clock.advance_ms(100)
    assert d.step() == DecodeReport(released=["s"], failed=1)
    assert d.drop_reported({1}) == {1}  # vLLM's failure path: the one report
    assert d.phase("s") is None
    assert d.step() == NOTHING


def test_settle_zero_is_vllm_failure_handling() -> None:
    """``settle_ms=0``: the blocks are free with the failure, as vLLM does."""
    d = side(capacity=8, settle_ms=0)
    d_req(d)
    d.feed({"P0": [b"PUSH_FAIL:d-req:2"], "P1": [b"d-req:2"]})
    assert d.step() == DecodeReport(released=["d-req"], failed=1)
    assert d.drop_reported({100, 101}) == {100, 101}  # vLLM's failure path reports them
