"""Producer-side scenarios on vLLM 0.33.0's real push worker class: each WRITE that
cannot be posted or ends in a backend error owes exactly one ``PUSH_FAIL:REQ:TP`` to the
consumer rank it was for; a ``NOT_FOUND`` owes nothing; the source blocks are not
reported free (``finished_sending``) while a write may still read them. Each runs through
the plugin and through vLLM's own worker (the control: it sends nothing and frees early).
"""

from __future__ import annotations

import time

import pytest
from harness import (
    CONTROL,
    PLUGIN,
    DecodeEngine,
    ProducerRank,
    completion,
    d_request,
    nixlBackendError,
    nixlNotFoundError,
    push_fail,
    writer_round,
)
from vllm.v1.request import RequestStatus

from kvdrain.vllm._settings import Settings

BOTH = pytest.mark.parametrize("which", [PLUGIN, CONTROL])


@BOTH
def test_post_failure_sends_the_exact_bytes_to_the_right_rank(which: str) -> None:
    """P TP1 -> D TP2: the WRITE to D rank 0 posts, the one to D rank 1 fails to post.
    One ``PUSH_FAIL:d-r:1`` goes to D rank 1's agent, nothing to rank 0."""
    p = ProducerRank(which, p_tp=1, d_tp=2)
    p.nixl.fail_posts = 0
    # The second post fails: let the first through, then fail.
    real = p.nixl.make_prepped_xfer
    calls = {"n": 0}

    def second_fails(*a: object, **k: object) -> int:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("descriptor error")
        return real(*a, **k)  # type: ignore[arg-type]

    p.nixl.make_prepped_xfer = second_fails  # type: ignore[method-assign]
    handles = p.push("p-r", "d-r")
    assert len(handles) == 1
    if which == CONTROL:
        assert p.nixl.sent == []  # D rank 1 waits for a write that never comes
        return
    assert p.nixl.sent == [("D1", b"PUSH_FAIL:d-r:1")]


@BOTH
def test_post_failure_from_a_tp2_producer_names_consumer_rank_0(which: str) -> None:
    p = ProducerRank(which, p_tp=2, tp_rank=1, d_tp=1)
    p.nixl.fail_posts = 1
    assert p.push("p-r", "d-r") == []
    if which == CONTROL:
        assert p.nixl.sent == []
        return
    assert p.nixl.sent == [("D0", push_fail("d-r", 2))]
    p.results()
    assert p.nixl.sent == [("D0", push_fail("d-r", 2))]  # exactly one


@BOTH
def test_backend_error_after_posting_owes_one_push_fail(which: str) -> None:
    p = ProducerRank(which, p_tp=1, d_tp=1)
    (h,) = p.push("p-r", "d-r")
    assert p.nixl.sent == []
    p.nixl.states[h] = nixlBackendError("remote disconnect")
    p.results()
    p.results()
    if which == CONTROL:
        assert p.nixl.sent == []
        return
    assert p.nixl.sent == [("D0", push_fail("d-r", 1))]


@BOTH
def test_err_state_after_posting_owes_one_push_fail(which: str) -> None:
    p = ProducerRank(which, p_tp=1, d_tp=1)
    (h,) = p.push("p-r", "d-r")
    p.nixl.states[h] = "ERR"
    p.results()
    p.results()
    assert p.nixl.sent == ([] if which == CONTROL else [("D0", push_fail("d-r", 1))])


@BOTH
def test_self_caused_not_found_sends_nothing_and_holds_the_source_blocks(which: str) -> None:
    """The producer dropped the consumer's metadata itself (as its shutdown or eviction
    path does) while a WRITE was in flight: the status read gives NOT_FOUND, the bytes
    may still land. Nothing is owed; the plugin keeps the source blocks out of
    finished_sending until the hold (quarantine) ends; vLLM reports them at the lease."""
    p = ProducerRank(which, p_tp=1, d_tp=1)
    (h,) = p.push("p-r", "d-r", lease_s=0.0)  # the lease is over: vLLM may free
    p.w._cleanup_remote_engine("engine-D")
    p.nixl.states[h] = nixlNotFoundError("handle's remote metadata is gone")
    r = p.results()
    assert p.nixl.sent == []
    if which == CONTROL:
        assert r.finished_sending == {"p-r"}
        return
    assert r.finished_sending == set()
    assert isinstance(p.w.kvdrain_prefill.settings, Settings)
    p.clock.advance_ms(p.w.kvdrain_prefill.settings.quarantine_ms)
    assert p.results().finished_sending == {"p-r"}
    assert p.results().finished_sending == set()  # once


@BOTH
def test_lease_expiry_does_not_free_blocks_under_a_write_in_flight(which: str) -> None:
    """F3: the lease ends while the WRITE is still in progress. vLLM 0.33 reports the
    source blocks free at once; the plugin waits until the write is over."""
    p = ProducerRank(which, p_tp=1, d_tp=1)
    (h,) = p.push("p-r", "d-r", lease_s=0.0)
    time.sleep(0.001)
    r = p.results()
    if which == CONTROL:
        assert r.finished_sending == {"p-r"}  # the NIC still reads these blocks
        return
    assert r.finished_sending == set()
    p.nixl.states[h] = "DONE"
    assert p.results().finished_sending == {"p-r"}
    assert p.results().finished_sending == set()
    assert p.nixl.sent == []


@BOTH
def test_landed_write_reports_once_and_owes_nothing(which: str) -> None:
    p = ProducerRank(which, p_tp=1, d_tp=2)
    hs = p.push("p-r", "d-r")
    assert len(hs) == 2 and [m for _, m in p.nixl.posted] == [completion("d-r", 1)] * 2
    for h in hs:
        p.nixl.states[h] = "DONE"
    assert p.results().finished_sending == {"p-r"}
    assert p.results().finished_sending == set()
    assert p.nixl.sent == []


@BOTH
def test_consumer_side_of_a_plugin_producer(which: str) -> None:
    """Mixed fleet: the plugin producer's PUSH_FAIL bytes reach a decode engine. A plain
    0.33 decode engine (the control) takes them as an unknown id: no exception, no early
    completion, it waits as it would without them. A plugin decode engine fails the
    request."""
    p = ProducerRank(PLUGIN, p_tp=2, tp_rank=0, d_tp=1)
    p.nixl.fail_posts = 1
    p.push("p-r", "r")
    ((_, notice),) = p.nixl.sent
    e = DecodeEngine(which, tp=1, p_tp=2, settings=Settings(30_000, 60_000, 5_000, 64))
    e.add(d_request("r", p_tp=2))
    assert e.step().error is None
    s = e.step({0: {"P0": [notice], "P1": [completion("r", 2)]}})
    assert s.error is None
    assert s.finished_recving == set()
    if which == CONTROL:
        assert e.status("r") == RequestStatus.WAITING_FOR_REMOTE_KVS
        # 0.33 took it for the unknown id "PUSH_FAIL:r": one notification after expiry.
        stats = e.workers[0].xfer_stats.data
        assert stats["num_notifications_after_expiry"] == [1]
        assert e.workers[0].consumer_notification_counts_by_req == {"r": 1}
        return
    assert e.status("r") == RequestStatus.FINISHED_ERROR


def test_a_landed_write_without_telemetry_counts_as_landed() -> None:
    """Where NIXL has no telemetry, ``get_xfer_telemetry`` raises. The write landed: the
    step goes on, nothing is owed, and the source blocks are reported free once."""
    p = ProducerRank(PLUGIN, p_tp=1, d_tp=1)
    (h,) = p.push("p-r", "d-r")

    def no_telemetry(handle: int) -> None:
        raise RuntimeError("NIXL_ERR_NOT_SUPPORTED: telemetry is disabled")

    p.nixl.get_xfer_telemetry = no_telemetry  # type: ignore[method-assign]
    p.nixl.states[h] = "DONE"
    assert p.results().finished_sending == {"p-r"}
    assert p.results().finished_sending == set()
    assert p.nixl.sent == [] and p.nixl.released == [h]


@BOTH
def test_a_deferred_push_drained_after_the_blocks_were_freed_does_not_post(which: str) -> None:
    """F4: the request's source blocks were reported free (its write landed), then a
    deferred push for it is drained (its handshake completed late): vLLM 0.33 posts a
    second WRITE from blocks that may hold another request's KV now, with a success
    notice. The plugin does not post: the request is retired."""
    p = ProducerRank(which, p_tp=1, d_tp=1)
    (h,) = p.push("p-r", "d-r")
    p.nixl.states[h] = "DONE"
    assert p.results().finished_sending == {"p-r"}
    again = p.push("p-r", "d-r")  # the deferred push's _xfer_blocks_for_req
    if which == CONTROL:
        assert len(again) == 1
        return
    assert again == []
    assert p.nixl.sent == []


@BOTH
def test_a_heartbeat_read_by_the_writer_extends_the_lease_at_the_next_step(which: str) -> None:
    """D's ``HB:`` reaches a producer through vLLM's writer thread and its queue to the
    engine thread: the next step extends the named lease, as vLLM's own worker does. The
    plugin's step skips vLLM's drain of that queue only when it is empty."""
    p = ProducerRank(which, p_tp=1, d_tp=1)
    p.w._reqs_to_send["p-r"] = time.perf_counter() + 1.0
    p.w._reqs_to_process.add("p-r")
    p.results()  # nothing forwarded: the lease stands
    before = p.w._reqs_to_send["p-r"]
    assert before < time.perf_counter() + 2.0
    p.nixl.deliver({"D0": [b"HB:p-r,other"]})
    writer_round(p.w)
    assert p.w._pending_completion_notifs.qsize() == 1
    assert p.w._lease_extension > 1  # two thirds of vLLM's lease, in whole seconds
    t0 = time.perf_counter()
    p.results()
    assert p.w._pending_completion_notifs.empty()
    assert p.w._reqs_to_send["p-r"] >= t0 + p.w._lease_extension > before
