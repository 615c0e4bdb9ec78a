"""vLLM's own test cases of the push-mode consumer path, as data (vLLM 0.33.0
``test_push_*`` and PR #50754), through :class:`kvdrain.vllm.PushConsumer`: D world size 1
unless said, expected = pp × max(1, TP // world_size)."""

from __future__ import annotations

import pytest

import kvdrain
from kvdrain.vllm import PushConsumer, expected_notifications

from conftest import FakeClock


def consumer(world_size: int = 1) -> PushConsumer:
    return PushConsumer(world_size=world_size, capacity=64, clock=FakeClock())


def test_expected_count_formula() -> None:
    assert expected_notifications(1) == 1
    assert expected_notifications(1, pp_size=2) == 2
    assert expected_notifications(2) == 2
    assert expected_notifications(4, pp_size=2, world_size=2) == 4
    assert expected_notifications(1, world_size=4) == 1  # max(1, 1 // 4)


def test_single_completion_completes() -> None:
    c = consumer()
    c.start_load_kv("req-recv-1", [1, 2], tp_size=1, pp_size=1)
    assert c.writer_batch({"P0": [b"req-recv-1:1"]}) == []
    assert c.get_new_notifs() == {"req-recv-1"}
    assert c.get_transfer_results() == ({"req-recv-1"}, set())
    assert c.get_transfer_results() == (set(), set())  # reported once
    assert len(c.ledger) == 0  # metadata dropped


def test_pipeline_parallel_waits_for_every_stage() -> None:
    c = consumer()
    c.start_load_kv("req-pp-2", [3], tp_size=1, pp_size=2)
    c.writer_batch({"P-pp0": [b"req-pp-2:1"]})
    assert c.get_new_notifs() == set()
    assert c.get_transfer_results() == (set(), set())
    c.writer_batch({"P-pp1": [b"req-pp-2:1"]})
    assert c.get_new_notifs() == {"req-pp-2"}
    assert c.get_transfer_results() == ({"req-pp-2"}, set())


def test_unknown_request_creates_no_state() -> None:
    c = consumer()
    c.writer_batch({"P0": [b"never-heard-of-you:1"]})
    assert c.get_new_notifs() == set()
    assert c.get_transfer_results() == (set(), set())
    assert len(c.ledger) == 0
    assert c.ledger.counters()["unknown"] == 1
    # Registering it afterwards: the early notice does not count for it.
    c.start_load_kv("never-heard-of-you", [1], tp_size=1)
    assert c.get_new_notifs() == set()


def d_req(c: PushConsumer) -> None:
    c.start_load_kv("d-req", [100, 101], tp_size=2)  # expects 2 (P TP2 -> D TP1)


def test_failure_then_completion_fails_once_with_invalid_blocks() -> None:
    c = consumer()
    d_req(c)
    c.writer_batch({"P0": [b"PUSH_FAIL:d-req:2"]})
    assert c.get_new_notifs() == set()
    assert c.get_transfer_results() == (set(), set())  # the failure waits for its sibling
    c.writer_batch({"P1": [b"d-req:2"]})
    c.get_new_notifs()
    assert c.get_transfer_results() == (set(), {"d-req"})
    assert c.get_block_ids_with_load_errors() == {100, 101}
    c.writer_batch({"P1": [b"d-req:2"]})  # late duplicate: nothing more
    c.get_new_notifs()
    assert c.get_transfer_results() == (set(), set())
    assert c.get_block_ids_with_load_errors() == set()


def test_completion_then_failure_fails() -> None:
    c = consumer()
    d_req(c)
    c.writer_batch({"P0": [b"d-req:2"]})
    c.writer_batch({"P1": [b"PUSH_FAIL:d-req:2"]})
    c.get_new_notifs()
    assert c.get_transfer_results() == (set(), {"d-req"})
    assert c.get_block_ids_with_load_errors() == {100, 101}


def test_two_failure_notices_fail_once() -> None:
    c = consumer()
    d_req(c)
    c.writer_batch({"P0": [b"PUSH_FAIL:d-req:2"], "P1": [b"PUSH_FAIL:d-req:2"]})
    c.get_new_notifs()
    assert c.get_transfer_results() == (set(), {"d-req"})
    assert c.ledger.counters()["failed"] == 1


def test_two_completions_complete() -> None:
    c = consumer()
    d_req(c)
    c.writer_batch({"P0": [b"d-req:2", b"d-req:2"]})
    assert c.get_new_notifs() == {"d-req"}
    assert c.get_transfer_results() == ({"d-req"}, set())
    assert c.get_block_ids_with_load_errors() == set()


def test_failure_notice_for_unknown_id_touches_nothing() -> None:
    c = consumer()
    d_req(c)
    c.writer_batch({"P0": [b"PUSH_FAIL:gone:1"]})
    c.get_new_notifs()
    assert c.get_transfer_results() == (set(), set())
    assert c.ledger.counters()["unknown"] == 1
    assert len(c.ledger) == 1  # d-req untouched
    c.writer_batch({"P0": [b"d-req:2", b"d-req:2"]})
    assert c.get_new_notifs() == {"d-req"}


def test_producer_tp2_that_failed_both_posts_fails_the_consumer_after_the_second() -> None:
    """P TP 2 -> D TP 1: each producer rank plans its edge to D rank 0, fails to post it,
    and owes one PUSH_FAIL to D's agent; D fails after the second."""
    c = consumer()
    d_req(c)
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
    c.writer_batch({notices[0][0]: [notices[0][1]]})
    c.get_new_notifs()
    assert c.get_transfer_results() == (set(), set())
    c.writer_batch({notices[1][0]: [notices[1][1]]})
    c.get_new_notifs()
    assert c.get_transfer_results() == (set(), {"d-req"})


def test_world_size_divides_the_producer_tp() -> None:
    c = consumer(world_size=2)
    c.start_load_kv("r", [1], tp_size=4)  # 1 × max(1, 4 // 2) = 2
    c.writer_batch({"P0": [b"r:4"]})
    assert c.get_new_notifs() == set()
    c.writer_batch({"P1": [b"r:4"]})
    assert c.get_new_notifs() == {"r"}


def test_producer_bound_messages_come_back_untouched() -> None:
    c = consumer()
    reg = b"PUSH_REG:\x82\xa1a\x01"
    hb = b"HB:req-1,req-2"
    back = c.writer_batch({"P0": [reg, b"x:1"], "P1": [hb]})
    assert back == [("P0", reg), ("P1", hb)]
    assert back[0][1] is reg and back[1][1] is hb


def test_deadline_fails_the_request_and_quarantines_its_blocks() -> None:
    clock = FakeClock()
    c = PushConsumer(capacity=8, deadline_ms=1000, quarantine_ms=5000, clock=clock)
    c.start_load_kv("slow", [7, 8], tp_size=2)
    c.writer_batch({"P0": [b"slow:2"]})
    clock.advance_ms(1000)
    c.get_new_notifs()
    assert c.get_transfer_results() == (set(), {"slow"})
    assert c.get_block_ids_with_load_errors() == {7, 8}
    assert c.request_finished("slow") is True  # a write may still land: delay the free
    assert c.get_released() == set()
    c.writer_batch({"P1": [b"slow:2"]})  # the last write lands late
    c.get_new_notifs()
    assert c.get_released() == {"slow"}


def test_abort_quarantines_until_the_quarantine_runs_out() -> None:
    clock = FakeClock()
    c = PushConsumer(capacity=8, quarantine_ms=5000, clock=clock)
    c.start_load_kv("gone", [5], tp_size=1)
    assert c.request_finished("gone") is True
    clock.advance_ms(4999)
    c.get_new_notifs()
    assert c.get_released() == set()
    clock.advance_ms(1)
    c.get_new_notifs()
    assert c.get_released() == {"gone"}
    assert c.get_transfer_results() == (set(), set())  # aborted: not a transfer result


def test_request_finished_after_completion_frees_at_once() -> None:
    c = consumer()
    c.start_load_kv("ok", [1], tp_size=1)
    c.writer_batch({"P0": [b"ok:1"]})
    c.get_new_notifs()
    assert c.request_finished("ok") is False
    assert c.request_finished("never-registered") is False


def test_named_edges_catch_a_duplicate_sender() -> None:
    """F7: an ambiguous NIXL error then a PUSH_FAIL from the same producer cannot
    complete the count early when the producers are named."""
    c = consumer()
    c.start_load_kv("n", [1, 2], tp_size=2, producer_agents=["P0", "P1"])
    c.writer_batch({"P0": [b"n:2", b"PUSH_FAIL:n:2"]})
    assert c.get_new_notifs() == set()
    assert c.ledger.counters()["duplicate"] == 1
    c.writer_batch({"P1": [b"n:2"]})
    assert c.get_new_notifs() == {"n"}


def test_gone_fails_the_named_edges_of_a_lost_producer_and_settles() -> None:
    clock = FakeClock()
    c = PushConsumer(capacity=8, settle_ms=100, clock=clock)
    c.start_load_kv("g", [9], tp_size=2, producer_agents=["P0", "P1"])
    c.writer_batch({"P0": [b"g:2"]})
    c.get_new_notifs()
    c.gone_agent("P1")
    assert c.get_transfer_results() == (set(), {"g"})
    assert c.get_block_ids_with_load_errors() == {9}
    assert c.request_finished("g") is True  # P1's bytes may still be landing
    clock.advance_ms(99)
    c.get_new_notifs()
    assert c.get_released() == set()
    clock.advance_ms(1)
    c.get_new_notifs()
    assert c.get_released() == {"g"}


def test_kv_groups_report_every_block() -> None:
    c = consumer()
    c.start_load_kv("hma", ([1, 2], [30, 31]), tp_size=1)
    c.writer_batch({"P0": [b"PUSH_FAIL:hma:1"]})
    c.get_new_notifs()
    assert c.get_block_ids_with_load_errors() == {1, 2, 30, 31}


def test_failed_request_blocks_settle_before_they_are_freed() -> None:
    clock = FakeClock()
    c = PushConsumer(capacity=8, settle_ms=100, clock=clock)
    c.start_load_kv("s", [1], tp_size=1)
    c.writer_batch({"P0": [b"PUSH_FAIL:s:1"]})
    c.get_new_notifs()
    assert c.get_transfer_results() == (set(), {"s"})
    assert c.request_finished("s") is True  # the failed write may still be landing
    clock.advance_ms(99)
    c.get_new_notifs()
    assert c.get_released() == set()
    clock.advance_ms(1)
    c.get_new_notifs()
    assert c.get_released() == {"s"}


def test_failed_blocks_are_reported_at_once_and_freed_after_settling() -> None:
    """A failed request's blocks are invalid for the request as soon as it fails
    (``get_block_ids_with_load_errors``), but free only after its last failure notice has
    settled: the engine delays the free and gets the id back from ``get_released``."""
    clock = FakeClock()
    c = PushConsumer(capacity=8, settle_ms=100, clock=clock)
    c.start_load_kv("d-req", [100, 101], tp_size=2)
    c.writer_batch({"P0": [b"PUSH_FAIL:d-req:2"]})
    c.get_new_notifs()
    clock.advance_ms(30)
    c.get_new_notifs()  # an engine step: the notices that follow are stamped 30
    c.writer_batch({"P1": [b"PUSH_FAIL:d-req:2"]})  # the last notice: settles until 130
    c.get_new_notifs()
    assert c.get_transfer_results() == (set(), {"d-req"})
    assert c.get_block_ids_with_load_errors() == {100, 101}
    assert c.request_finished("d-req") is True
    clock.advance_ms(99)
    c.get_new_notifs()
    assert c.get_released() == set()
    clock.advance_ms(1)
    c.get_new_notifs()
    assert c.get_released() == {"d-req"}
    assert c.get_block_ids_with_load_errors() == set()  # reported once, not again
    assert len(c.ledger) == 0


def test_failed_request_finished_after_settling_frees_at_once() -> None:
    clock = FakeClock()
    c = PushConsumer(capacity=8, settle_ms=100, clock=clock)
    c.start_load_kv("s", [1], tp_size=1)
    c.writer_batch({"P0": [b"PUSH_FAIL:s:1"]})
    clock.advance_ms(100)
    c.get_new_notifs()  # failed, and the settle end already passed: released too
    assert c.get_transfer_results() == (set(), {"s"})
    assert c.request_finished("s") is False
    assert c.get_released() == set()


def test_settle_zero_is_vllm_failure_handling() -> None:
    c = PushConsumer(capacity=8, settle_ms=0, clock=FakeClock())
    c.start_load_kv("d-req", [100, 101], tp_size=2)
    c.writer_batch({"P0": [b"PUSH_FAIL:d-req:2"], "P1": [b"d-req:2"]})
    c.get_new_notifs()
    assert c.get_transfer_results() == (set(), {"d-req"})
    assert c.get_block_ids_with_load_errors() == {100, 101}
    assert c.request_finished("d-req") is False  # free now, as vLLM does
