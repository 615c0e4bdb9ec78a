"""What a worker tells vLLM, in one place (:meth:`kvdrain.vllm.DecodeSide.tell`, no
vLLM): vLLM's structures are plain stand-ins here, and vLLM's own results a callable."""

from __future__ import annotations

import queue
from dataclasses import dataclass, field
from typing import Any

from kvdrain.vllm import DecodeReport, DecodeSide, Settings, VllmReceives

from conftest import FakeClock

SETTINGS = Settings(1_000, 3_000, 100, 64)


@dataclass
class Results:
    """vLLM's ``KVConnectorTransferResults``, the two fields the plugin edits."""

    finished_recving: set[str] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)


class Stats:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def record_failed_transfer(self) -> None:
        self.calls.append("failed")

    def record_kv_expired_req(self) -> None:
        self.calls.append("expired")

    def record_notification_after_expiry(self) -> None:
        self.calls.append("after_expiry")

    def record_counts(self, report: DecodeReport) -> None:
        self.calls.append("counts")


class Vllm:
    """vLLM's worker state for receives, and its ``get_transfer_results``: a receive in
    the failure queue is reported finished and failed; one with no transfers left is
    reported finished."""

    def __init__(self) -> None:
        self.pending: dict[str, Any] = {}
        self.done: dict[str, list[Any]] = {}
        self.failed: queue.Queue[str] = queue.Queue()
        self.invalid: queue.Queue[set[int]] = queue.Queue()
        self.stats = Stats()

    def receives(self) -> VllmReceives:
        return VllmReceives(self.pending, self.done, self.failed, self.invalid, self.stats)

    def results(self) -> Results:
        out = Results()
        while not self.failed.empty():
            rid = self.failed.get()
            self.pending.pop(rid, None)
            out.finished_recving.add(rid)
            out.failed_recving.add(rid)
        for rid in [r for r, left in self.done.items() if not left]:
            del self.done[rid]
            self.pending.pop(rid, None)
            out.finished_recving.add(rid)
        return out

    def invalid_blocks(self) -> list[set[int]]:
        return [self.invalid.get() for _ in range(self.invalid.qsize())]


def step(d: DecodeSide, v: Vllm, report: DecodeReport | None = None) -> Results:
    return d.tell(d.step(report), v.receives(), v.results)


def test_a_completion_goes_to_vllms_done_path() -> None:
    d, v = DecodeSide(SETTINGS, world_size=1, clock=FakeClock()), Vllm()
    report = d.catch_up()
    assert d.register("r", [[1, 2]], 1, report) == "tracked"
    v.pending["r"] = object()
    d.feed({"P0": [b"r:1"]})
    assert step(d, v, report) == Results(finished_recving={"r"})
    assert v.invalid_blocks() == [] and v.stats.calls == ["counts"]


def test_a_failure_is_told_once_and_released_through_vllms_failure_path() -> None:
    clock = FakeClock()
    d, v = DecodeSide(SETTINGS, world_size=1, clock=clock), Vllm()
    report = d.catch_up()
    d.register("r", [[1, 2]], 1, report)
    v.pending["r"] = object()
    d.feed({"P0": [b"PUSH_FAIL:r:1"]})
    assert step(d, v, report) == Results()  # failed: blocks invalid, still held
    assert v.invalid_blocks() == [{1, 2}]
    assert v.stats.calls == ["failed", "counts"]
    clock.advance_ms(SETTINGS.settle_ms)
    assert step(d, v) == Results(finished_recving={"r"}, failed_recving={"r"})
    assert step(d, v) == Results()


def test_a_release_after_vllm_closed_the_receive_is_reported_by_the_amendment() -> None:
    clock = FakeClock()
    d, v = DecodeSide(SETTINGS, world_size=1, clock=clock), Vllm()
    report = d.catch_up()
    d.register("r", [[1, 2]], 1, report)
    d.abort("r", report)  # the scheduler finished it; vLLM tracks it no more
    assert step(d, v, report) == Results()
    clock.advance_ms(SETTINGS.quarantine_ms)
    assert step(d, v) == Results(finished_recving={"r"}, failed_recving={"r"})
    assert v.failed.empty()


def test_a_refusal_is_failed_through_vllms_failure_path_in_the_same_step() -> None:
    d, v = DecodeSide(Settings(1_000, 3_000, 100, 1), world_size=1, clock=FakeClock()), Vllm()
    report = d.catch_up()
    assert d.register("a", [[1]], 1, report) == "tracked"
    assert d.register("b", [[2]], 1, report) == "refused"  # the table holds one
    v.pending.update(a=object(), b=object())
    assert step(d, v, report) == Results(finished_recving={"b"}, failed_recving={"b"})


def test_a_receive_vllm_failed_itself_waits_for_the_release() -> None:
    clock = FakeClock()
    d, v = DecodeSide(SETTINGS, world_size=2, clock=clock), Vllm()
    report = d.catch_up()
    d.register("r", [[1, 2]], 1, report)
    v.pending["r"] = object()
    v.failed.put("r")  # vLLM's own failure (a handshake) on this rank
    assert step(d, v, report) == Results()  # another rank may have let P write
    clock.advance_ms(SETTINGS.quarantine_ms)
    assert step(d, v) == Results(finished_recving={"r"}, failed_recving={"r"})


def test_a_steps_receives_registered_at_once_as_one_by_one() -> None:
    """``register_many`` past a duplicate and a full table: the same receives tracked,
    refused (one rank) or held (two), and the same told, as ``register`` one by one."""
    for world_size in (1, 2):
        told = []
        for many in (False, True):
            clock = FakeClock()
            d = DecodeSide(Settings(1_000, 3_000, 100, 4), world_size=world_size, clock=clock)
            v = Vllm()
            report = d.catch_up()
            assert d.register("dup", [[9]], 1, report) == "tracked"
            receives: list[tuple[str, list[list[int]], tuple[str, str] | None]]
            receives = [(rid, [[i]], ("P", f"p-{rid}")) for i, rid in enumerate("ab")]
            receives += [("dup", [[8]], None), ("c", [[3]], None), ("d", [[4, 5]], None)]
            receives += [("e", [[6]], ("P", "p-e"))]
            if many:
                rids, blocks, producers = (list(x) for x in zip(*receives))
                refused = d.register_many(rids, blocks, producers, 1, report)
            else:
                done = {rid: d.register(rid, g, 1, report, p) for rid, g, p in receives}
                refused = [rid for rid, x in done.items() if x in ("refused", "held")]
            assert refused == ["d", "e"]  # the table holds four: dup, a, b, c
            held = [None, None] if world_size == 1 else ["held", "held"]
            assert [d.phase(r) for r in "abcde"] == ["waiting"] * 3 + held
            assert d.lifetime_left_ms("a") == d.settings.lifetime_ms
            assert d.lifetime_left_ms("dup") is None
            v.pending.update({r: object() for r in "abcde"})
            d.feed({"P0": [b"a:1", b"dup:1"]})
            results = [step(d, v, report)]
            clock.advance_ms(3_000)
            results.append(step(d, v))
            told.append((results, v.invalid_blocks(), d.counters()))
        assert told[0] == told[1]
