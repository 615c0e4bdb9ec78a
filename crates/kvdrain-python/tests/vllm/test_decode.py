"""Decode-side scenarios on vLLM 0.33.0's real scheduler and push worker classes.

Every scenario runs twice (``which``): through the plugin (``KvdrainPushConnector``,
loaded by vLLM's connector factory from ``kvdrain.vllm.connector``) and through vLLM's
own ``NixlPushConnector`` as a negative control, which asserts 0.33's failure in the same
scenario (a hang, a leak, an early completion, an exception). What is asserted is what
the scheduler sees: ``finished_recving``, ``failed_recving``, the invalid block ids, the
request's status and when its blocks return to the scheduler's block pool.
"""

from __future__ import annotations

import pytest
from harness import (
    CONTROL,
    PLUGIN,
    P_ENGINE,
    DecodeEngine,
    Step,
    all_completions,
    completion,
    d_request,
    push_fail,
)
from vllm.v1.request import RequestStatus

from kvdrain.vllm._settings import Settings

BOTH = pytest.mark.parametrize("which", [PLUGIN, CONTROL])
BLOCKS = 3  # a request of 3 * BLOCK_SIZE prompt tokens holds 3 blocks
SETTLE_MS = 5_000
QUARANTINE_MS = 60_000
DEADLINE_MS = 30_000
SETTINGS = Settings(DEADLINE_MS, QUARANTINE_MS, SETTLE_MS, 256)


def engine(which: str, **kw: object) -> DecodeEngine:
    kw.setdefault("settings", SETTINGS)
    return DecodeEngine(which, **kw)  # type: ignore[arg-type]


def registered(e: DecodeEngine, rid: str, *, p_tp: int, pp: int = 1) -> int:
    """Adds ``rid`` and runs the step that allocates its blocks and sends its PUSH_REG.
    Returns the pool's free blocks with the request holding its blocks."""
    total = e.free_blocks()
    e.add(d_request(rid, p_tp=p_tp, pp=pp))
    s = e.step()
    assert s.error is None
    assert e.status(rid) == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert e.free_blocks() == total - BLOCKS
    return total


def no_double_reports(e: DecodeEngine) -> None:
    """No rank reported a request twice (vLLM's scheduler asserts on that)."""
    for rank in e.reported:
        assert len(rank) == len(set(rank)), rank


def request_blocks(e: DecodeEngine, rid: str) -> set[int]:
    (ids,) = e.scheduler.kv_cache_manager.get_block_ids(rid)
    return set(ids)


def wait_steps(e: DecodeEngine, n: int = 4) -> list[Step]:
    out = e.run(n)
    for s in out:
        assert s.error is None, s.error
    return out


# -- completion ------------------------------------------------------------------------ #

TOPOLOGIES = [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (4, 2)]


@BOTH
@pytest.mark.parametrize(("p_tp", "d_tp"), TOPOLOGIES)
def test_completion(which: str, p_tp: int, d_tp: int) -> None:
    e = engine(which, tp=d_tp, p_tp=p_tp)
    registered(e, "r", p_tp=p_tp)
    notices = all_completions("r", d_tp=d_tp, p_tp=p_tp)
    if p_tp > d_tp:  # every rank still misses one of its producers: nothing yet
        partial = {d: dict(list(b.items())[:-1]) for d, b in notices.items()}
        rest = {d: dict(list(b.items())[-1:]) for d, b in notices.items()}
        s = e.step(partial)
        assert s.error is None and s.finished_recving == set()
        assert e.status("r") == RequestStatus.WAITING_FOR_REMOTE_KVS
        notices = rest
    s = e.step(notices)
    assert s.error is None
    assert s.finished_recving == {"r"} and s.failed_recving == set()
    assert s.invalid_block_ids == set()
    wait_steps(e, 2)
    assert e.status("r") == RequestStatus.RUNNING
    no_double_reports(e)


@BOTH
def test_completion_pipeline_parallel_waits_for_every_stage(which: str) -> None:
    e = engine(which, tp=1, p_tp=1, p_agents={(0, 0): "P0.0", (1, 0): "P1.0"})
    registered(e, "r", p_tp=1, pp=2)
    s = e.step({0: {"P0.0": [completion("r", 1)]}})
    assert s.error is None and s.finished_recving == set()
    s = e.step({0: {"P1.0": [completion("r", 1)]}})
    assert s.finished_recving == {"r"}
    no_double_reports(e)


# -- PUSH_FAIL (C2, F1) ---------------------------------------------------------------- #


@BOTH
@pytest.mark.parametrize("order", ["fail_first", "fail_last"])
def test_push_fail_and_a_sibling(which: str, order: str) -> None:
    """P TP2 -> D TP1: producer rank 0 could not post its WRITE and sends PUSH_FAIL,
    rank 1's write lands. The plugin fails the request once both edges are in (never
    on the first); vLLM 0.33 reads ``PUSH_FAIL:r`` as an unknown id and waits forever."""
    e = engine(which, tp=1, p_tp=2)
    total = registered(e, "r", p_tp=2)
    blocks = request_blocks(e, "r")
    first, second = (
        ({"P0": [push_fail("r", 2)]}, {"P1": [completion("r", 2)]})
        if order == "fail_first"
        else ({"P1": [completion("r", 2)]}, {"P0": [push_fail("r", 2)]})
    )
    s = e.step({0: first})
    assert s.error is None and s.finished_recving == set() and s.invalid_block_ids == set()
    s = e.step({0: second})
    assert s.error is None
    if which == CONTROL:
        wait_steps(e, 6)
        e.clock.advance_ms(10 * QUARANTINE_MS)
        wait_steps(e, 2)
        assert e.status("r") == RequestStatus.WAITING_FOR_REMOTE_KVS  # hangs
        assert e.free_blocks() == total - BLOCKS
        return
    # The failure reaches the scheduler at once (kv_load_failure_policy=fail)...
    assert s.invalid_block_ids == blocks
    assert s.finished_recving == set()
    assert e.status("r") == RequestStatus.FINISHED_ERROR
    # ...but the blocks stay out of the pool until the failure notice settled.
    e.clock.advance_ms(SETTLE_MS - 1)
    wait_steps(e, 2)
    assert e.free_blocks() == total - BLOCKS
    e.clock.advance_ms(1)
    s = e.step()
    assert s.finished_recving == {"r"} and s.failed_recving == {"r"}
    assert e.free_blocks() == total
    assert "r" not in e.scheduler.requests
    wait_steps(e, 2)
    no_double_reports(e)


@BOTH
def test_push_fail_recompute_policy_reschedules_after_settling(which: str) -> None:
    """With ``kv_load_failure_policy=recompute`` the failed request is prefilled locally,
    but only after its blocks settled: no write can land on the recomputed KV."""
    e = engine(which, tp=1, p_tp=1, policy="recompute")
    registered(e, "r", p_tp=1)
    s = e.step({0: {"P0": [push_fail("r", 1)]}})
    assert s.error is None
    wait_steps(e, 2)
    assert e.status("r") == RequestStatus.WAITING_FOR_REMOTE_KVS
    if which == CONTROL:
        e.clock.advance_ms(SETTLE_MS)
        wait_steps(e, 3)
        assert e.status("r") == RequestStatus.WAITING_FOR_REMOTE_KVS  # never retried
        return
    e.clock.advance_ms(SETTLE_MS)
    s = e.step()
    assert s.finished_recving == {"r"} and s.failed_recving == {"r"}
    wait_steps(e, 1)
    assert e.status("r") == RequestStatus.RUNNING  # recomputed locally
    no_double_reports(e)


# -- duplicates and strays ------------------------------------------------------------- #


@BOTH
def test_duplicate_completion_cannot_complete_early(which: str) -> None:
    """P TP2 -> D TP1 with the producers' agents known (named edges): producer rank 0's
    completion arrives twice (a NIXL error can follow a delivered notification) while
    rank 1 still writes. vLLM counts 2 of 2 and starts decoding on half the KV; the
    plugin waits for rank 1."""
    e = engine(which, tp=1, p_tp=2)
    registered(e, "r", p_tp=2)
    s = e.step({0: {"P0": [completion("r", 2), completion("r", 2)]}})
    assert s.error is None
    if which == CONTROL:
        assert s.finished_recving == {"r"}  # early: P1's write is still landing
        return
    assert s.finished_recving == set()
    assert e.workers[0].kvdrain_counters()["duplicate"] == 1
    s = e.step({0: {"P1": [completion("r", 2)]}})
    assert s.finished_recving == {"r"}
    no_double_reports(e)


@BOTH
def test_stray_completion_for_a_request_the_scheduler_freed(which: str) -> None:
    """A request aborted before its blocks were allocated: vLLM 0.33 still stages an
    empty receive for it on the workers (the scheduler freed it at once). A stray
    completion for it then reaches the scheduler as ``finished_recving`` for an id it no
    longer knows, and its assert kills the engine; the plugin tracks no such receive."""
    e = engine(which, tp=1, p_tp=1)
    e.add(d_request("gone-early", p_tp=1))
    e.abort("gone-early")
    assert "gone-early" not in e.scheduler.requests
    s = e.step()
    assert s.error is None
    s = e.step({0: {"P0": [completion("gone-early", 1)]}})
    if which == CONTROL:
        assert isinstance(s.error, AssertionError)
        return
    assert s.error is None and s.finished_recving == set()
    assert e.workers[0].kvdrain_counters()["unknown"] == 1


@BOTH
def test_stray_and_late_notices_change_nothing(which: str) -> None:
    e = engine(which, tp=1, p_tp=1)
    registered(e, "r", p_tp=1)
    s = e.step({0: {"P0": [completion("r", 1)], "P9": [completion("never-registered", 1)]}})
    assert s.error is None and s.finished_recving == {"r"}
    s = e.step({0: {"P0": [completion("r", 1), push_fail("r", 1)]}})  # late
    assert s.error is None and s.finished_recving == set() and s.failed_recving == set()
    wait_steps(e, 2)
    assert e.status("r") == RequestStatus.RUNNING
    no_double_reports(e)


@BOTH
def test_bad_bytes_are_counted_not_raised(which: str) -> None:
    """Non-UTF-8 and colon-less bytes in the same batch as a real completion: vLLM 0.33
    raises out of ``get_transfer_results`` (the engine step fails); the plugin counts
    them as malformed and completes the request."""
    e = engine(which, tp=1, p_tp=1)
    registered(e, "r", p_tp=1)
    batch = {"P0": [b"\xff\xfe\x00garbage", b"no-colon-here", completion("r", 1)]}
    s = e.step({0: batch})
    if which == CONTROL:
        assert isinstance(s.error, (UnicodeDecodeError, ValueError))
        return
    assert s.error is None and s.finished_recving == {"r"}
    assert e.workers[0].kvdrain_counters()["malformed"] == 2


@BOTH
def test_colon_less_bytes_alone(which: str) -> None:
    e = engine(which, tp=1, p_tp=1)
    registered(e, "r", p_tp=1)
    s = e.step({0: {"P0": [b"no-colon-here"]}})
    if which == CONTROL:
        assert isinstance(s.error, ValueError)
        return
    assert s.error is None
    s = e.step({0: {"P0": [completion("r", 1)]}})
    assert s.finished_recving == {"r"}


# -- abort while receiving (C1, vLLM #46283) --------------------------------------------- #


@BOTH
def test_abort_while_receiving_frees_when_the_last_write_lands(which: str) -> None:
    """P TP2 -> D TP2 (one producer per rank): the client aborts after PUSH_REG went
    out. The blocks stay out of the pool while a write may land; the request's last
    write landing frees them (both connectors)."""
    e = engine(which, tp=2, p_tp=2)
    total = registered(e, "r", p_tp=2)
    e.abort("r")
    assert e.status("r") == RequestStatus.FINISHED_ABORTED
    s = e.step({0: {"P0": [completion("r", 2)]}})  # rank 0's write landed
    assert s.error is None
    assert e.free_blocks() == total - BLOCKS  # rank 1's write may still land
    s = e.step({1: {"P1": [completion("r", 2)]}})
    assert s.error is None
    assert e.free_blocks() == total
    assert "r" not in e.scheduler.requests
    wait_steps(e, 2)
    no_double_reports(e)


@BOTH
def test_abort_while_receiving_when_the_producer_never_reports(which: str) -> None:
    """The producer also gave up and never writes (vLLM #46283): vLLM 0.33 holds the blocks
    for ever; the plugin frees them when the quarantine (above the producer's lease)
    ends, and not before."""
    e = engine(which, tp=1, p_tp=1)
    total = registered(e, "r", p_tp=1)
    e.abort("r")
    wait_steps(e, 2)
    e.clock.advance_ms(QUARANTINE_MS - 1)
    wait_steps(e, 2)
    assert e.free_blocks() == total - BLOCKS
    e.clock.advance_ms(1)
    s = e.step()
    assert s.error is None
    if which == CONTROL:
        e.clock.advance_ms(100 * QUARANTINE_MS)
        wait_steps(e, 3)
        assert e.free_blocks() == total - BLOCKS  # leaked
        assert "r" in e.scheduler.requests
        return
    assert s.finished_recving == {"r"}
    assert e.free_blocks() == total
    wait_steps(e, 2)
    no_double_reports(e)


@BOTH
def test_late_write_after_abort_and_release_is_ignored(which: str) -> None:
    e = engine(which, tp=1, p_tp=1)
    total = registered(e, "r", p_tp=1)
    e.abort("r")
    wait_steps(e, 1)  # the workers see the abort: its quarantine counts from here
    e.clock.advance_ms(QUARANTINE_MS)
    wait_steps(e, 2)
    if which == PLUGIN:
        assert e.free_blocks() == total
    s = e.step({0: {"P0": [completion("r", 1)]}})  # lands after the release
    if which == CONTROL:
        # vLLM frees only now, on the write it waited for.
        assert s.error is None and e.free_blocks() == total
        return
    assert s.error is None and s.finished_recving == set()
    assert e.workers[0].kvdrain_counters()["late"] == 1
    no_double_reports(e)


# -- expiry (L1) ----------------------------------------------------------------------- #


@BOTH
def test_expiry_fails_the_request_and_quarantines_its_blocks(which: str) -> None:
    """The producer never writes and the client waits. vLLM 0.33's watchdog (here set
    to 0 s) only drops the registration: the request waits for ever. The plugin fails
    it at its deadline (the client gets an error) and frees the blocks at the end of
    the quarantine."""
    e = engine(which, tp=1, p_tp=1)
    total = registered(e, "r", p_tp=1)
    blocks = request_blocks(e, "r")
    e.scheduler.connector.connector_scheduler._push_registration_timeout = 0.0
    e.clock.advance_ms(DEADLINE_MS)
    s = e.step()
    assert s.error is None
    if which == CONTROL:
        e.clock.advance_ms(100 * QUARANTINE_MS)
        wait_steps(e, 3)
        assert e.status("r") == RequestStatus.WAITING_FOR_REMOTE_KVS
        assert e.free_blocks() == total - BLOCKS
        return
    assert s.invalid_block_ids == blocks
    assert e.status("r") == RequestStatus.FINISHED_ERROR
    e.clock.advance_ms(QUARANTINE_MS - 1)
    wait_steps(e, 2)
    assert e.free_blocks() == total - BLOCKS
    e.clock.advance_ms(1)
    s = e.step()
    assert s.finished_recving == {"r"} and s.failed_recving == {"r"}
    assert e.free_blocks() == total
    no_double_reports(e)


# -- settling -------------------------------------------------------------------------- #


@BOTH
def test_failed_blocks_settle_after_the_last_failure_notice(which: str) -> None:
    """P TP2 -> D TP1, both producer ranks fail their writes after posting: the blocks
    stay fenced for settle_ms after the *last* PUSH_FAIL."""
    e = engine(which, tp=1, p_tp=2)
    total = registered(e, "r", p_tp=2)
    s = e.step({0: {"P0": [push_fail("r", 2)]}})
    e.clock.advance_ms(2_000)
    wait_steps(e, 1)
    s = e.step({0: {"P1": [push_fail("r", 2)]}})
    assert s.error is None
    if which == CONTROL:
        e.clock.advance_ms(10 * SETTLE_MS)
        wait_steps(e, 3)
        assert e.status("r") == RequestStatus.WAITING_FOR_REMOTE_KVS
        return
    assert e.status("r") == RequestStatus.FINISHED_ERROR
    e.clock.advance_ms(SETTLE_MS - 1)
    wait_steps(e, 2)
    assert e.free_blocks() == total - BLOCKS
    e.clock.advance_ms(1)
    s = e.step()
    assert s.finished_recving == {"r"}
    assert e.free_blocks() == total
    no_double_reports(e)


# -- a producer lost mid-write (rule 9) ------------------------------------------------ #


@BOTH
def test_producer_lost_mid_write_settles_then_frees(which: str) -> None:
    """P TP2 -> D TP1: rank 0's write landed, then vLLM evicts the producer engine
    (``_cleanup_remote_engine``). The plugin reports the lost producer to the ledger
    (``gone``): the request fails and its blocks settle like after a failure notice;
    vLLM 0.33 forgets the engine and the request waits for ever."""
    e = engine(which, tp=1, p_tp=2)
    total = registered(e, "r", p_tp=2)
    s = e.step({0: {"P0": [completion("r", 2)]}})
    assert s.error is None and s.finished_recving == set()
    e.workers[0]._cleanup_remote_engine(P_ENGINE)
    s = e.step()
    assert s.error is None
    if which == CONTROL:
        e.clock.advance_ms(10 * SETTLE_MS)
        wait_steps(e, 3)
        assert e.status("r") == RequestStatus.WAITING_FOR_REMOTE_KVS
        assert e.free_blocks() == total - BLOCKS
        return
    assert e.status("r") == RequestStatus.FINISHED_ERROR
    assert e.free_blocks() == total - BLOCKS  # the lost producer's bytes may land
    e.clock.advance_ms(SETTLE_MS)
    s = e.step()
    assert s.finished_recving == {"r"} and s.failed_recving == {"r"}
    assert e.free_blocks() == total
    no_double_reports(e)


@BOTH
def test_heartbeat_to_a_lost_producer_fails_then_settles(which: str) -> None:
    """P TP2 -> D TP1: rank 0's write landed, then P rank 1's agent cannot be reached:
    the heartbeat D sends it (vLLM's ``HB:``, every step with a 2 s lease) raises in
    ``send_notif``. The plugin reports the agent gone: the request fails in that step
    and its blocks settle like after a failure notice, then come back once. vLLM 0.33
    logs the failed heartbeat and the request waits for ever."""
    e = engine(which, tp=1, p_tp=2, extra={"kv_lease_duration": 2})
    total = registered(e, "r", p_tp=2)
    nixl = e.workers[0].nixl_wrapper
    assert any(m.startswith(b"HB:") for _, m in nixl.sent)  # heartbeats go out
    s = e.step({0: {"P0": [completion("r", 2)]}})
    assert s.error is None and s.finished_recving == set()
    nixl.unreachable["P1"] = b"HB:"
    s = e.step()
    assert s.error is None
    assert any(a == "P1" and m.startswith(b"HB:") for a, m in nixl.refused)
    if which == CONTROL:
        e.clock.advance_ms(10 * SETTLE_MS)
        wait_steps(e, 3)
        assert e.status("r") == RequestStatus.WAITING_FOR_REMOTE_KVS
        assert e.free_blocks() == total - BLOCKS
        return
    assert e.status("r") == RequestStatus.FINISHED_ERROR
    assert e.workers[0].kvdrain_counters()["gone_edges"] == 1
    e.clock.advance_ms(SETTLE_MS - 1)
    wait_steps(e, 2)
    assert e.free_blocks() == total - BLOCKS  # bytes P1 had sent may still land
    e.clock.advance_ms(1)
    s = e.step()
    assert s.finished_recving == {"r"} and s.failed_recving == {"r"}
    assert e.free_blocks() == total
    no_double_reports(e)


@BOTH
def test_push_reg_to_a_lost_producer_fails_then_settles(which: str) -> None:
    """The PUSH_REG cannot be sent to P's agent (``send_notif`` raises on the writer
    thread). The plugin reports the agent gone: the request fails in the step that
    tried, and its blocks settle, then come back. vLLM 0.33 logs the failure and keeps
    the receive waiting (an earlier registration might still bring writes)."""
    e = engine(which, tp=1, p_tp=1)
    total = e.free_blocks()
    nixl = e.workers[0].nixl_wrapper
    nixl.unreachable["P0"] = b"PUSH_REG:"
    e.add(d_request("r", p_tp=1))
    s = e.step()
    assert s.error is None
    assert [a for a, m in nixl.refused if m.startswith(b"PUSH_REG:")] == ["P0"]
    if which == CONTROL:
        e.clock.advance_ms(10 * SETTLE_MS)
        wait_steps(e, 3)
        assert e.status("r") == RequestStatus.WAITING_FOR_REMOTE_KVS
        assert e.free_blocks() == total - BLOCKS
        return
    assert e.status("r") == RequestStatus.FINISHED_ERROR
    assert e.free_blocks() == total - BLOCKS
    e.clock.advance_ms(SETTLE_MS)
    s = e.step()
    assert s.finished_recving == {"r"} and s.failed_recving == {"r"}
    assert e.free_blocks() == total
    no_double_reports(e)


# -- mixed fleet: plugin D, plain 0.33 P ------------------------------------------------ #


@BOTH
def test_plain_producer_that_fails_silently_meets_the_deadline(which: str) -> None:
    """A plain 0.33 producer sends no PUSH_FAIL: one of its two writes never comes. The
    plugin's deadline decides (failed, then quarantined); vLLM waits for ever."""
    e = engine(which, tp=1, p_tp=2)
    total = registered(e, "r", p_tp=2)
    e.step({0: {"P0": [completion("r", 2)]}})
    e.clock.advance_ms(DEADLINE_MS)
    s = e.step()
    assert s.error is None
    if which == CONTROL:
        wait_steps(e, 3)
        assert e.status("r") == RequestStatus.WAITING_FOR_REMOTE_KVS
        return
    assert e.status("r") == RequestStatus.FINISHED_ERROR
    e.clock.advance_ms(QUARANTINE_MS)
    s = e.step()
    assert s.finished_recving == {"r"} and e.free_blocks() == total


@BOTH
def test_vllm_own_failure_is_reported_once(which: str) -> None:
    """vLLM fails a receive itself when its PUSH_REG cannot be sent (handshake failure,
    no producer agents): it puts the id on ``_failed_recv_reqs``. Reported once, freed at
    once (nothing can land); the plugin's ledger forgets it and reports nothing later."""
    e = engine(which, tp=1, p_tp=1)
    total = registered(e, "r", p_tp=1)
    e.workers[0]._failed_recv_reqs.put("r")  # what vLLM's handshake callback does
    s = e.step()
    assert s.error is None
    assert s.finished_recving == {"r"} and s.failed_recving == {"r"}
    assert e.free_blocks() == total
    e.clock.advance_ms(QUARANTINE_MS + DEADLINE_MS)
    s = e.step({0: {"P0": [completion("r", 1)]}})
    assert s.error is None and s.finished_recving == set()
    wait_steps(e, 2)
    no_double_reports(e)


def test_the_plugin_is_what_vllm_loaded() -> None:
    from kvdrain.vllm.connector import KvdrainPushConnector, KvdrainPushScheduler

    e = engine(PLUGIN)
    assert type(e.scheduler.connector) is KvdrainPushConnector
    assert type(e.scheduler.connector.connector_scheduler) is KvdrainPushScheduler


# -- time of arrival: a slow step ------------------------------------------------------- #


def slow_settings(**kw: int) -> Settings:
    values = dict(deadline_ms=DEADLINE_MS, quarantine_ms=1_500, settle_ms=500, capacity=256)
    values.update(kw)
    return Settings(
        deadline_ms=values["deadline_ms"],
        quarantine_ms=values["quarantine_ms"],
        settle_ms=values["settle_ms"],
        capacity=values["capacity"],
    )


def test_failure_notice_read_in_a_slow_step_settles_from_its_arrival() -> None:
    """Steps at 0 and 10 ms, then a step that takes 590 ms before its writer thread reads
    a ``PUSH_FAIL``: the notice arrived at 600, so the blocks are held until 1100 (settle
    500), not released at 600 as a notice dated at the step before (10) would be."""
    e = engine(PLUGIN, tp=1, p_tp=1, settings=slow_settings())
    total = registered(e, "r", p_tp=1)  # t = 0
    e.clock.advance_ms(10)
    wait_steps(e, 1)  # t = 10
    s = e.step({0: {"P0": [push_fail("r", 1)]}}, slow_ms=590)  # read at t = 600
    assert s.error is None
    assert e.status("r") == RequestStatus.FINISHED_ERROR
    assert e.free_blocks() == total - BLOCKS
    e.clock.advance_ms(499)  # t = 1099
    wait_steps(e, 2)
    assert e.free_blocks() == total - BLOCKS
    e.clock.advance_ms(1)  # t = 1100
    s = e.step()
    assert s.finished_recving == {"r"} and s.failed_recving == {"r"}
    assert e.free_blocks() == total
    no_double_reports(e)


def test_abort_seen_after_an_idle_gap_is_quarantined_from_then() -> None:
    """Steps at 0 and 10 ms, then nothing until an abort at 600: the blocks stay fenced
    for the whole quarantine from 600 (until 2100), not from the step before (1510)."""
    e = engine(PLUGIN, tp=1, p_tp=1, settings=slow_settings())
    total = registered(e, "r", p_tp=1)  # t = 0
    e.clock.advance_ms(10)
    wait_steps(e, 1)  # t = 10
    e.clock.advance_ms(590)
    e.abort("r")  # t = 600
    wait_steps(e, 1)
    e.clock.advance_ms(1_499)  # t = 2099
    wait_steps(e, 2)
    assert e.free_blocks() == total - BLOCKS
    e.clock.advance_ms(1)  # t = 2100
    wait_steps(e, 1)
    assert e.free_blocks() == total
    no_double_reports(e)


# -- a rank that cannot track a receive ------------------------------------------------- #


def test_receives_wait_while_every_slot_is_taken_on_some_rank() -> None:
    """Capacity 1, D TP2, P TP2. Request ``a`` failed on rank 0 (settled, released there)
    but still waits on rank 1. Request ``b`` must not start: rank 0 would register it and
    send its PUSH_REG, P would write into both ranks' blocks, and a full rank 1 could not
    track the write into its blocks. The scheduler holds ``b`` in the queue until every
    rank has reported ``a``; then ``b`` is tracked on both ranks."""
    settings = slow_settings(capacity=1, settle_ms=100)
    e = engine(PLUGIN, tp=2, p_tp=2, settings=settings, extra={"kvdrain_capacity": 1})
    total = registered(e, "a", p_tp=2)
    e.step({0: {"P0": [push_fail("a", 2)]}})
    e.clock.advance_ms(100)
    wait_steps(e, 1)  # rank 0 released a; rank 1 still waits for P1's write
    e.add(d_request("b", p_tp=2))
    wait_steps(e, 2)
    assert e.status("b") == RequestStatus.WAITING  # not admitted: no PUSH_REG went out
    assert all(w.kvdrain_counters()["rejected_full"] == 0 for w in e.workers)
    e.step({1: {"P1": [completion("a", 2)]}})
    e.clock.advance_ms(100)
    wait_steps(e, 2)
    assert e.status("b") == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert e.free_blocks() == total - BLOCKS
    s = e.step({0: {"P0": [completion("b", 2)]}})
    assert s.finished_recving == set()
    s = e.step({1: {"P1": [completion("b", 2)]}})
    assert s.finished_recving == {"b"} and s.failed_recving == set()
    no_double_reports(e)


def test_a_rank_that_refuses_while_another_accepts_holds_its_blocks() -> None:
    """D TP2 whose rank 1 holds fewer receives than the scheduler admits: rank 1 refuses
    ``b`` while rank 0 registers it, and rank 0's PUSH_REG lets P write into rank 1's
    blocks too. The request fails for the client at once (its blocks reported invalid,
    once), but the blocks come back only after the quarantine, not while P1's write into
    rank 1 may still land."""
    e = engine(PLUGIN, tp=2, p_tp=2, settings=slow_settings(capacity=1))
    e.workers[0].kvdrain_attach(slow_settings(capacity=2), clock=e.clock)
    total = registered(e, "a", p_tp=2)
    e.add(d_request("b", p_tp=2))
    s = e.step()
    assert s.error is None
    held = request_blocks(e, "b")
    assert held <= s.invalid_block_ids  # failed for the client now
    assert e.status("b") == RequestStatus.FINISHED_ERROR
    e.step({0: {"P0": [completion("b", 2)]}})
    e.clock.advance_ms(1_499)
    steps = wait_steps(e, 2)
    assert all(not (held & st.invalid_block_ids) for st in steps)  # reported once
    assert e.free_blocks() == total - 2 * BLOCKS  # b's blocks still held
    e.clock.advance_ms(1)
    steps = wait_steps(e, 1)
    assert e.free_blocks() == total - BLOCKS
    assert all(not (held & st.invalid_block_ids) for st in steps)
    no_double_reports(e)


# -- a failed request's blocks are reported invalid once ------------------------------- #


def test_failed_blocks_are_reported_invalid_once() -> None:
    e = engine(PLUGIN, tp=1, p_tp=1)
    total = registered(e, "r", p_tp=1)
    blocks = request_blocks(e, "r")
    steps = [e.step({0: {"P0": [push_fail("r", 1)]}})]
    e.clock.advance_ms(SETTLE_MS)
    steps += wait_steps(e, 3)
    assert e.free_blocks() == total
    assert sum(1 for st in steps if blocks & st.invalid_block_ids) == 1
    assert all(st.invalid_block_ids in (set(), blocks) for st in steps)


def test_vllm_own_failure_on_one_of_two_ranks_holds_until_its_writes_resolve() -> None:
    """D TP2, P TP2: vLLM fails the receive itself on rank 1 (its handshake failed), but
    rank 0's PUSH_REG went out, so P writes into both ranks' blocks. Rank 1 does not
    report the receive until P1's write into its blocks has landed (or the quarantine
    ends); the request fails for the client once, and the scheduler frees the blocks
    only then."""
    e = engine(PLUGIN, tp=2, p_tp=2)
    total = registered(e, "r", p_tp=2)
    e.workers[1]._failed_recv_reqs.put("r")  # what vLLM's handshake callback does
    s = e.step({0: {"P0": [completion("r", 2)]}})
    assert s.error is None and s.finished_recving == set()
    e.clock.advance_ms(QUARANTINE_MS - 1)
    wait_steps(e, 2)
    assert e.free_blocks() == total - BLOCKS  # P1's write into rank 1 may still land
    s = e.step({1: {"P1": [completion("r", 2)]}})
    assert s.error is None
    assert s.finished_recving == {"r"} and s.failed_recving == {"r"}
    assert e.free_blocks() == total
    no_double_reports(e)
