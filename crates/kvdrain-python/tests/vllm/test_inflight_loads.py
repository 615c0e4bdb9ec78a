"""The plugin with vLLM 0.34's ``--max-num-inflight-kv-loads``, on 0.34's real scheduler.

vLLM 0.34 admits an asynchronous KV load only while fewer than the cap are in flight: those
receiving, those received and not yet running, and those aborted while their blocks are
held (``_aborted_kv_loads``), until their ``finished_recving`` arrives. With kvdrain that
report comes when the ledger releases the blocks: at once for a receive whose writes all
resolved, after the settle time for one that failed with its writes answered, after the
quarantine for one whose writes may still land. What these tests pin down, at every step:

* an aborted or expired load holds its admission slot exactly as long as its blocks are
  held: the slot comes back in the step the blocks go back to the pool, never later, and
  never later than the quarantine after the abort or the expiry;
* nothing else holds a slot: once every aborted load is released the cap admits again,
  and every waiting request is admitted as slots free.

Skipped on a release without the setting (0.33).
"""

from __future__ import annotations

import pytest
from harness import PLUGIN, DecodeEngine, completion, d_request, push_fail
from vllm.config import SchedulerConfig
from vllm.v1.request import RequestStatus

from kvdrain.vllm._settings import Settings

pytestmark = pytest.mark.skipif(
    "max_num_inflight_kv_loads" not in SchedulerConfig.__dataclass_fields__,
    reason="this vLLM has no --max-num-inflight-kv-loads",
)

BLOCKS = 3  # a request of 3 * BLOCK_SIZE prompt tokens holds 3 blocks
SETTLE_MS = 5_000
QUARANTINE_MS = 60_000
DEADLINE_MS = 30_000
SETTINGS = Settings(DEADLINE_MS, QUARANTINE_MS, SETTLE_MS, 256)


class Loads:
    """A decode engine with the plugin and ``cap`` in-flight KV loads, whose every step
    checks that the scheduler holds a slot for an aborted load exactly while it holds the
    load's blocks."""

    def __init__(self, cap: int, settings: Settings = SETTINGS) -> None:
        self.e = DecodeEngine(PLUGIN, tp=1, p_tp=1, settings=settings, max_inflight_kv_loads=cap)
        self.total = self.e.free_blocks()
        self.finished: set[str] = set()  # aborted or failed by the scheduler

    def held_slots(self) -> set[str]:
        held: set[str] = self.e.scheduler._aborted_kv_loads
        return set(held)

    def step(self, deliver: dict[int, dict[str, list[bytes]]] | None = None) -> set[str]:
        """One step; its ``finished_recving``."""
        s = self.e.step(deliver)
        assert s.error is None, s.error
        for rid, req in self.e.scheduler.requests.items():
            if req.is_finished():
                self.finished.add(rid)
        holding_blocks = {rid for rid in self.finished if rid in self.e.scheduler.requests}
        assert self.held_slots() == holding_blocks  # a slot held exactly with its blocks
        return s.finished_recving

    def add(self, rid: str) -> None:
        self.e.add(d_request(rid, p_tp=1))

    def abort(self, rid: str) -> None:
        self.e.abort(rid)
        self.finished.add(rid)
        assert rid in self.held_slots()  # vLLM counts it against the cap from now

    def status(self, rid: str) -> RequestStatus | None:
        return self.e.status(rid)

    def admits(self) -> bool:
        admits: bool = self.e.scheduler._admits_inflight_kv_load()
        return admits


def test_an_aborted_load_holds_its_slot_until_the_quarantine_releases_its_blocks() -> None:
    """Cap 2: ``a`` and ``b`` load, ``c`` waits. ``a`` is aborted and nothing more comes
    from its producer: its blocks are quarantined, and its slot with them; ``c`` waits
    the whole quarantine, then starts in the step after the one that frees ``a``. (The
    deadline is longer than the quarantine here, so that ``b`` keeps loading.)"""
    t = Loads(cap=2, settings=Settings(3 * QUARANTINE_MS, QUARANTINE_MS, SETTLE_MS, 256))
    for rid in ("a", "b"):
        t.add(rid)
        t.step()
        assert t.status(rid) == RequestStatus.WAITING_FOR_REMOTE_KVS
    t.add("c")
    t.step()
    assert t.status("c") == RequestStatus.WAITING and not t.admits()
    t.abort("a")
    t.step()
    t.e.clock.advance_ms(QUARANTINE_MS - 1)
    for _ in range(3):
        assert t.step() == set()
        assert t.status("c") == RequestStatus.WAITING
    assert t.e.free_blocks() == t.total - 2 * BLOCKS  # a's and b's
    t.e.clock.advance_ms(1)
    assert t.step() == {"a"}  # released at the quarantine's end: blocks and slot
    assert "a" not in t.e.scheduler.requests and t.held_slots() == set()
    t.step()
    assert t.status("c") == RequestStatus.WAITING_FOR_REMOTE_KVS  # admitted at once
    assert t.e.free_blocks() == t.total - 2 * BLOCKS  # b's and c's


def test_an_expired_load_holds_its_slot_until_the_quarantine_after_the_deadline() -> None:
    """Cap 1: ``a`` never receives a write. At its deadline the plugin fails it (the
    client hears now); vLLM's scheduler finishes it with its blocks held and counts it
    against the cap. ``b`` waits until the quarantine after the expiry releases them."""
    t = Loads(cap=1)
    t.add("a")
    t.step()
    t.add("b")
    t.step()
    assert t.status("b") == RequestStatus.WAITING
    t.e.clock.advance_ms(DEADLINE_MS)
    t.step()
    assert t.status("a") == RequestStatus.FINISHED_ERROR  # the client hears at the deadline
    t.finished.add("a")
    assert t.held_slots() == {"a"}
    t.e.clock.advance_ms(QUARANTINE_MS - 1)
    for _ in range(3):
        assert t.step() == set()
        assert t.status("b") == RequestStatus.WAITING
    t.e.clock.advance_ms(1)
    assert t.step() == {"a"}
    assert t.held_slots() == set()
    t.step()
    assert t.status("b") == RequestStatus.WAITING_FOR_REMOTE_KVS


def test_a_load_aborted_after_its_write_failed_frees_its_slot_after_the_settle() -> None:
    """The producer's failure notice answers every write: the abort's blocks settle, and
    the slot comes back with them after ``settle_ms``, long before the quarantine."""
    t = Loads(cap=1)
    t.add("a")
    t.step()
    t.add("b")
    t.abort("a")
    t.step({0: {"P0": [push_fail("a", 1)]}})
    t.e.clock.advance_ms(SETTLE_MS - 1)
    assert t.step() == set()
    assert t.status("b") == RequestStatus.WAITING
    t.e.clock.advance_ms(1)
    assert t.step() == {"a"}
    t.step()
    assert t.status("b") == RequestStatus.WAITING_FOR_REMOTE_KVS


def test_admission_flows_while_loads_complete_and_some_are_aborted() -> None:
    """Cap 2, eight requests. Completed loads free their slot when they run; one aborted
    after its write landed (reported, not yet running) frees its slot and blocks at once;
    one aborted while waiting holds its slot for the quarantine, and the others flow
    through the slot left, none waiting for that quarantine. In the end no slot stays
    held."""
    t = Loads(cap=2)
    for i in range(8):
        t.add(f"r{i}")
    t.step()
    assert [t.status(f"r{i}") for i in range(3)] == [
        RequestStatus.WAITING_FOR_REMOTE_KVS,
        RequestStatus.WAITING_FOR_REMOTE_KVS,
        RequestStatus.WAITING,
    ]
    assert t.step({0: {"P0": [completion("r0", 1)]}}) == {"r0"}
    t.e.abort("r0")  # its KV is in: nothing to fence
    assert "r0" not in t.e.scheduler.requests and t.held_slots() == set()
    t.abort("r1")  # aborted while waiting: quarantined
    started = {"r0", "r1"}
    for _ in range(40):
        loading = [
            rid
            for rid in (f"r{i}" for i in range(8))
            if t.status(rid) == RequestStatus.WAITING_FOR_REMOTE_KVS and rid != "r1"
        ]
        started.update(loading)
        deliver = {0: {"P0": [completion(rid, 1) for rid in loading]}} if loading else None
        t.step(deliver)
        if len(started) == 8:
            break
    assert started == {f"r{i}" for i in range(8)}  # nobody waited on r1's quarantine
    t.e.clock.advance_ms(QUARANTINE_MS)
    for _ in range(3):
        t.step()
    assert t.held_slots() == set() and t.admits()
    assert "r1" not in t.e.scheduler.requests
