"""vLLM's ``get_transfer_results`` answered by the plugin on a step with nothing for it
(``kvdrain.vllm._idle_step``), on the real vLLM of this environment: its path is one the
plugin read; on the idle worker vLLM's own step returns nothing and changes nothing but
the writer's wake, so the plugin's answer is the same; any one input not empty runs
vLLM's step; and a vLLM whose step changed runs its own step every step."""

from __future__ import annotations

import copy
import inspect
import logging
from collections.abc import Callable
from typing import Any

import pytest
from harness import Clock, one_rank_worker
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import (
    NixlPushConnectorWorker,
)
from vllm_cpu import PLUGIN

from kvdrain.vllm import _idle_step
from kvdrain.vllm._settings import Settings
from kvdrain.vllm.connector import KvdrainPushWorker


def plugin_worker() -> KvdrainPushWorker:
    w = one_rank_worker(PLUGIN)
    assert isinstance(w, KvdrainPushWorker)
    return w


# What vLLM's step reads or writes on a worker, beside the writer's wake.
STATE = (
    "_pending_completion_notifs",
    "_recving_transfers",
    "_recving_metadata",
    "_failed_recv_reqs",
    "_recv_failures",
    "_replicated_pcp_done_sending",
    "_reqs_to_send",
    "_reqs_to_process",
    "_sending_transfers",
    "_send_failures",
    "_evict_finished_inbox",
    "_invalid_block_ids",
    "_pending_recv_notifs",
    "consumer_notification_counts_by_req",
)


def state(w: Any) -> dict[str, object]:
    out: dict[str, object] = {}
    for name in STATE:
        v = getattr(w, name)
        out[name] = list(v.queue) if hasattr(v, "queue") else copy.copy(v)
    return out


def empty(results: KVConnectorTransferResults) -> bool:
    return not (results.finished_sending or results.finished_recving or results.failed_recving)


def test_this_release_s_step_is_one_read_for_the_idle_answer() -> None:
    assert _idle_step.unread(NixlPushConnectorWorker) is None
    assert _idle_step.digest(KvdrainPushWorker) == _idle_step.digest(NixlPushConnectorWorker)
    assert plugin_worker()._kvdrain_idle is not None


def test_on_an_idle_worker_vllm_s_step_returns_nothing_and_changes_nothing() -> None:
    """The claim the answer rests on, checked against vLLM's own code: with every input
    empty (and 256 receives waiting, as in a serving engine), vLLM's step returns three
    empty sets, leaves every structure it touches as it was, and sets the writer's
    wake. The plugin's answer does the same."""
    w = plugin_worker()
    for i in range(256):
        w._recving_metadata[f"r{i}"] = object()
    idle = w._kvdrain_idle
    assert idle is not None and idle.idle()
    before = state(w)
    w._push_writer_wake.clear()
    vllm_says = NixlPushConnectorWorker.get_transfer_results(w)
    assert empty(vllm_says) and w._push_writer_wake.is_set()
    assert state(w) == before
    w._push_writer_wake.clear()
    plugin_says = w._kvdrain_vllm_step()
    assert plugin_says == vllm_says and w._push_writer_wake.is_set()
    assert state(w) == before


FILL: dict[str, Callable[[Any], None]] = {
    "forwarded": lambda w: w._pending_completion_notifs.put(b"HB:p-1"),
    "receives_done": lambda w: w._recving_transfers.setdefault("r1", []),
    "receives_failed": lambda w: w._failed_recv_reqs.put("r1"),
    "receive_failures": lambda w: w._recv_failures.add("r1"),
    "pcp_done_sending": lambda w: w._replicated_pcp_done_sending.add("p-1"),
    "leases": lambda w: w._reqs_to_send.__setitem__("p-1", 1e18),
    "pushes": lambda w: w._sending_transfers["p-1"].append(3),
}


@pytest.mark.parametrize("which", FILL)
def test_any_one_input_not_empty_runs_vllm_s_step(
    which: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = plugin_worker()
    calls: list[object] = []

    def spy(self: Any) -> KVConnectorTransferResults:
        calls.append(self)
        return KVConnectorTransferResults()

    monkeypatch.setattr(NixlPushConnectorWorker, "get_transfer_results", spy)
    w._kvdrain_vllm_step()
    assert calls == []  # idle: answered
    FILL[which](w)
    w._kvdrain_vllm_step()
    assert calls == [w]


def test_every_input_has_its_case_above() -> None:
    params = inspect.signature(_idle_step.IdleStep).parameters
    assert set(params) == set(FILL)


def test_a_vllm_whose_step_changed_runs_its_own_step_every_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A class along the worker's MRO that is not the plugin's redefines a function of
    the path: its digest is not one read, the worker logs why, and every step runs
    vLLM's."""

    ran: list[object] = []

    class Changed(KvdrainPushWorker):  # this module's, so along the path read
        def _reap_expired_send_leases(self, done_sending: set[str]) -> None:
            ran.append(self)
            super()._reap_expired_send_leases(done_sending)

    why = _idle_step.unread(Changed)
    assert why is not None and "is not one read" in why
    w = plugin_worker()
    w.__class__ = Changed
    caplog.set_level(logging.INFO, logger="vllm.kvdrain")
    w.kvdrain_attach(Settings(60_000, 60_000, 5_000, 256), clock=Clock())
    assert w._kvdrain_idle is None
    assert any(
        "get_transfer_results runs every step" in r.getMessage() for r in caplog.records
    )
    w.get_transfer_results()
    w.get_transfer_results()
    assert ran == [w, w]
