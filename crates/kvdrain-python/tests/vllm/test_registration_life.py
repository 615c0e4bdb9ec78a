"""Nothing lands in a decode block after D gave it back, from the producer's side: a
registration P acts on too late, and a heartbeat D sends after a receive's deadline.

A real decode engine (vLLM 0.33's scheduler and a push worker) and a real producer
worker rank, both with the plugin (unless a test says otherwise), over the suites' fake
NIXL. Every message D sends P, and P sends D, is carried by the test, at the times of the
timeline. Each side has its own clock (P's is offset by minutes: no clock is shared);
vLLM's producer lease reads P's clock. The oracle: P posts no WRITE for a request whose
blocks D may have given back, that is, after D's quarantine for it began.
"""

from __future__ import annotations

import threading
import time as real_time
import types
from concurrent.futures import Future
from typing import Any

import msgspec
import pytest
from harness import (
    CONTROL,
    D_ENGINE,
    P_ENGINE,
    PLUGIN,
    DecodeEngine,
    ProducerRank,
    Step,
    completion,
    fake_nixl,
    writer_round,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker, push_worker
from vllm.sampling_params import SamplingParams
from vllm.v1.request import Request, RequestStatus

from kvdrain import encode_cancel
from kvdrain.vllm._settings import Settings

D_RID = "cmpl-7-0-d0d0d0d0"  # D's and P's ids share the base, as a router's do
P_RID = "cmpl-7-0-a1a1a1a1"
P_BLOCKS = ([1, 2, 3],)
P_OFFSET_MS = 777_000  # P's clock reads this much more than D's


def pd_request(num_tokens: int = 3 * 32) -> Request:
    params = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": P_ENGINE,
        "remote_request_id": P_RID,
        "remote_host": "127.0.0.1",
        "remote_port": 5600,
        "remote_block_ids": [],
        "tp_size": 1,
        "pp_size": 1,
        "transfer_mode": "push",
    }
    return Request(
        request_id=D_RID,
        prompt_token_ids=list(range(10, 10 + num_tokens)),
        sampling_params=SamplingParams(max_tokens=4, extra_args={"kv_transfer_params": params}),
        pooling_params=None,
    )


def producer_writer_round(w: Any) -> None:
    """One round of a producer's writer thread, inline: vLLM 0.33's loop in its order
    (deferred pushes whose handshake finished; finished blocks matched against the
    registrations; evictions; then the registrations to send and one NIXL drain)."""
    while not w._deferred_push_inbox.empty():
        rid, blocks, reg = w._deferred_push_inbox.get_nowait()
        w._do_start_push_kv(rid, blocks, reg)
    while not w._finished_blocks_inbox.empty():
        rid, blocks = w._finished_blocks_inbox.get_nowait()
        matched = w._pop_matching_registration(rid)
        if matched is not None:
            w._do_start_push_kv(rid, blocks, matched)
        else:
            w._push_finished_blocks[rid] = blocks
    while not w._evict_finished_inbox.empty():
        rid = w._evict_finished_inbox.get_nowait()
        w._push_finished_blocks.pop(rid, None)
        w._pending_d_registrations.pop(rid, None)
    writer_round(w)


class Pair:
    """D (one rank) and P (one rank) on a shared timeline, in ms from D's registration."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        settings: Settings,
        *,
        lease_s: int,
        producer: str = PLUGIN,
    ) -> None:
        self.d = DecodeEngine(
            PLUGIN, tp=1, p_tp=1, settings=settings, extra={"kv_lease_duration": lease_s}
        )
        self.p = ProducerRank(producer, p_tp=1, d_tp=1)
        self.p.w._lease_extension = lease_s * 2 // 3  # vLLM's, from kv_lease_duration
        self.p.clock.advance_ms(P_OFFSET_MS)
        # vLLM's producer lease (perf_counter) on P's clock.
        shim = types.SimpleNamespace(
            **{n: getattr(real_time, n) for n in dir(real_time) if not n.startswith("_")}
        )
        shim.perf_counter = self.p.clock
        monkeypatch.setattr(base_worker, "time", shim)
        monkeypatch.setattr(push_worker, "time", shim)
        self.now = 0
        self._d_base, self._p_base = self.d.clock.t, self.p.clock.t
        self._d_seen = 0
        self._p_seen = 0
        self.to_p: list[tuple[int, bytes]] = []  # (time sent, message), D -> P
        self.to_d: list[tuple[int, bytes]] = []  # P -> D
        self.posted_at: list[int] = []
        self.freed_at: int | None = None
        self.finished_sending_at: int | None = None

    def to(self, t: int) -> None:
        """Both clocks to ``t`` (from their bases, so no rounding adds up)."""
        assert t >= self.now
        self.d.clock.t = self._d_base + t / 1000
        self.p.clock.t = self._p_base + t / 1000
        self.now = t

    def d_step(self, deliver: list[bytes] | None = None) -> Step:
        s = self.d.step({0: {"P0": deliver}} if deliver else None)
        assert s.error is None, s.error
        if self.freed_at is None and D_RID in self.d.freed_at:
            self.freed_at = self.now
        sent = fake_nixl(self.d.workers[0]).sent
        self.to_p += [(self.now, m) for a, m in sent[self._d_seen :] if a == "P0"]
        self._d_seen = len(sent)
        return s

    def d_sent(self, prefix: bytes) -> list[tuple[int, bytes]]:
        return [(t, m) for t, m in self.to_p if m.startswith(prefix)]

    def p_round(self, deliver: list[bytes] | None = None) -> None:
        """P's writer round, with ``deliver`` in its NIXL drain, then its engine step."""
        if deliver:
            self.p.nixl.deliver({"D0": deliver})
        before = len(self.p.nixl.posted)
        producer_writer_round(self.p.w)
        self.posted_at += [self.now] * (len(self.p.nixl.posted) - before)
        if P_RID in self.p.results().finished_sending and self.finished_sending_at is None:
            self.finished_sending_at = self.now
        self.to_d += [(self.now, m) for a, m in self.p.nixl.sent[self._p_seen :] if a == "D0"]
        self._p_seen = len(self.p.nixl.sent)

    def prefill_done(self, lease_s: int) -> None:
        """P's prefill of the request ends now: its lease starts, its blocks are offered
        to the writer (vLLM's scheduler sends both in one step's metadata)."""
        self.p.w._reqs_to_send[P_RID] = self.p.clock() + lease_s
        self.p.w._reqs_to_process.add(P_RID)
        self.p.w._finished_blocks_inbox.put((P_RID, P_BLOCKS))

    def registered(self) -> bytes:
        """D registers the request at 0 and sends its PUSH_REG in that step."""
        self.d.add(pd_request())
        self.d_step()
        assert self.d.status(D_RID) == RequestStatus.WAITING_FOR_REMOTE_KVS
        ((_, reg),) = self.d_sent(b"PUSH_REG:")
        return reg


def lifetime_of(reg: bytes) -> object:
    return msgspec.msgpack.decode(reg[len(b"PUSH_REG:") :]).get("kvdrain_lifetime_ms")


# -- hole 1: a registration that never expires on P ------------------------------------ #

# Lease 1 s, deadline 500 ms, quarantine 1 500 ms (margin 500 ms: these load).
HOLE_1 = Settings(500, 1_500, 100, 64, lease_ms=1_000, margin_ms=500)


@pytest.mark.parametrize("gives_up", ["deadline", "abort"])
@pytest.mark.parametrize("cancel", ["delivered", "lost"])
def test_a_producer_that_finishes_after_the_quarantine_does_not_post(
    monkeypatch: pytest.MonkeyPatch, gives_up: str, cancel: str
) -> None:
    """D registers R at 0 and gives it up (its deadline at 500, or a client abort at
    100); the quarantine ends (2 000 or 1 600) and D's scheduler frees the blocks; P's
    prefill of R ends at 3 000, with its cache full until then. Today's plugin posts the
    WRITE at 3 000, into blocks D gave back. Now P drops the registration: D's
    ``PUSH_CANCEL`` ended it, or (the cancel lost) its lifetime of 500 ms did. P owes the
    ``PUSH_FAIL`` of a WRITE not posted, which D takes as late."""
    pair = Pair(monkeypatch, HOLE_1, lease_s=1)
    pair.p_round()  # P's writer drained at 0 with nothing there
    reg = pair.registered()
    pair.to(50)
    pair.p_round([reg])
    assert pair.p.w._pending_d_registrations.keys() == {D_RID}
    given_up_at = 500
    if gives_up == "abort":
        given_up_at = 100
        pair.to(100)
        pair.d.abort(D_RID)
        pair.d_step()
        if cancel == "delivered":
            pair.p_round([m for s, m in pair.d_sent(b"PUSH_CANCEL:") if s == 100])
    t = 100
    while pair.freed_at is None:
        t += 100
        pair.to(t)
        pair.d_step()
        if cancel == "delivered":
            pair.p_round([m for s, m in pair.d_sent(b"PUSH_CANCEL:") if s == t])
        assert t < 10_000
    pair.to(3_000)
    pair.prefill_done(lease_s=1)
    pair.p_round()
    assert pair.freed_at == given_up_at + HOLE_1.quarantine_ms
    assert pair.posted_at == []  # nothing lands in the blocks D freed at freed_at
    assert lifetime_of(reg) == 500
    assert pair.d_sent(b"PUSH_CANCEL:") == [(given_up_at, encode_cancel(D_RID))]
    assert pair.to_d == [(3_000, f"PUSH_FAIL:{D_RID}:1".encode())]
    pair.to(3_100)
    pair.d_step([m for _, m in pair.to_d])
    counters = pair.d.workers[0].kvdrain_counters()
    assert counters["late"] + counters["unknown"] == 1


def test_a_registration_read_late_by_p_is_dated_at_the_drain_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """P's writer thread drained at 0, then not until 450 (a slow step): the PUSH_REG
    sent at 0 is dated at 0, not at 450, so it ends at 500 on P's clock, as on D's."""
    pair = Pair(monkeypatch, HOLE_1, lease_s=1)
    pair.p_round()
    reg = pair.registered()
    pair.to(450)
    pair.p_round([reg])
    prefill = pair.p.w.kvdrain_prefill
    assert prefill.alive(D_RID)
    pair.to(500)
    assert not prefill.alive(D_RID)
    pair.to(520)  # before D's quarantine ends (2 000), after the lifetime
    pair.prefill_done(lease_s=1)
    pair.p_round()
    assert pair.posted_at == []


def test_a_registration_reaching_an_idle_producer_is_dated_when_it_arrived(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM's own writer thread (a real thread, running vLLM's loop) drains at 0, then P
    sits idle for 10 s: no engine step wakes the writer. D registers at 10 000 and its
    PUSH_REG reaches P before P's next step. Parked until that step, the writer dated
    it at its last drain (0), took it for ended at 500 and failed a receive D had just
    registered. Now an idle writer drains every ``IDLE_DRAIN_MS`` on its own, so the
    registration is dated within that of its arrival, and P's prefill posts."""
    pair = Pair(monkeypatch, HOLE_1, lease_s=1)
    w, nixl = pair.p.w, pair.p.nixl
    drains = threading.Semaphore(0)
    real_drain = nixl.get_new_notifs

    def counted() -> dict[str, list[bytes]]:
        batch = real_drain()
        drains.release()
        return batch

    nixl.get_new_notifs = counted  # type: ignore[method-assign]
    writer = threading.Thread(target=w._push_writer_loop, daemon=True)
    writer.start()
    try:
        assert drains.acquire(timeout=10)  # the loop drains at 0
        pair.to(10_000)
        # Two drains at 10 000 with nothing to wake the writer: the second began after
        # the clock moved. (vLLM's own writer stays parked: none comes.)
        idle_drains = drains.acquire(timeout=5) and drains.acquire(timeout=5)
        reg = pair.registered()
        assert lifetime_of(reg) == 500
        nixl.deliver({"D0": [reg]})
        pair.to(10_100)
        pair.prefill_done(lease_s=1)
        w._push_writer_wake.set()  # P's first engine step after the idle spell
        until = real_time.monotonic() + 10
        while not nixl.posted and not nixl.sent and real_time.monotonic() < until:
            real_time.sleep(0.001)
        assert nixl.sent == [], "the registration was taken for ended: PUSH_FAIL sent"
        assert w.kvdrain_prefill.alive(D_RID) and len(nixl.posted) == 1  # the WRITE
        assert idle_drains
    finally:
        w._push_writer_stop.set()
        w._push_writer_wake.set()
        writer.join(timeout=10)
    assert not writer.is_alive()


def test_a_live_registration_posts_and_a_cancel_after_the_post_lets_it_finish(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Within its lifetime the push goes as before. D aborts after P posted: the cancel
    reaches P, the WRITE runs to its end, P reports it as usual and owes nothing; D
    counts the completion and releases the blocks when it lands."""
    pair = Pair(monkeypatch, HOLE_1, lease_s=1)
    pair.p_round()
    reg = pair.registered()
    pair.to(100)
    pair.prefill_done(lease_s=1)
    pair.p_round([reg])
    assert pair.posted_at == [100]
    ((handle, notif),) = pair.p.nixl.posted
    assert notif == completion(D_RID, 1)
    pair.to(200)
    pair.d.abort(D_RID)
    pair.d_step()
    ((_, cancel),) = pair.d_sent(b"PUSH_CANCEL:")
    pair.p_round([cancel])
    assert pair.to_d == []
    pair.to(300)
    pair.p.nixl.states[handle] = "DONE"
    pair.p_round()
    assert pair.finished_sending_at == 300 and pair.to_d == []
    pair.to(400)
    pair.d_step([notif])  # the WRITE landed: its completion resolves the last edge
    assert pair.freed_at == 400


def test_a_plain_vllm_producer_still_posts_late(monkeypatch: pytest.MonkeyPatch) -> None:
    """The limit (docs/limits.md): vLLM 0.33's own producer ignores the lifetime and
    the cancel, and posts at 3 000 into blocks the plugin's D freed at 2 000."""
    pair = Pair(monkeypatch, HOLE_1, lease_s=1, producer=CONTROL)
    reg = pair.registered()
    pair.to(50)
    pair.p_round([reg])
    t = 50
    while pair.freed_at is None:
        t += 50
        pair.to(t)
        pair.d_step()
        pair.p_round([m for s, m in pair.to_p if s == t])  # cancels included: dropped
    pair.to(3_000)
    pair.prefill_done(lease_s=1)
    pair.p_round()
    assert pair.freed_at == 2_000 and pair.posted_at == [3_000]
    # The cancel reached vLLM's producer as the unknown id "PUSH_CANCEL", and was dropped.
    assert pair.d_sent(b"PUSH_CANCEL:")
    assert pair.p.w.xfer_stats.data["num_notifications_after_expiry"] == [1]


# -- hole 2: the heartbeat sent in the deadline's step ---------------------------------- #

# Lease 3 s, deadline 1 000 ms, quarantine 3 001 ms: the settings the issue was found
# with. They no longer load (settings_from_extra_config refuses the window); built here
# directly, to show the heartbeat itself is gone.
HOLE_2 = Settings(1_000, 3_001, 100, 64, lease_ms=3_000, margin_ms=1)


def test_no_heartbeat_leaves_for_a_receive_whose_deadline_fired(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """P finished R at 0 (lease to 3 000) but its handshake with D is pending, so vLLM
    defers the WRITE. D steps every 100 ms to 900, then not until 2 500, when R's
    deadline (1 000) fires. Today's plugin sends R's heartbeat in that step: P's lease
    moves to 4 500, past D's quarantine end (4 001); D frees the blocks at 4 100; P's
    handshake completes at 4 200 and P posts into them. Now the step sends no
    heartbeat for R: P's lease ends at 3 000, P reports the request done and retires
    it, and the deferred push posts nothing."""
    pair = Pair(monkeypatch, HOLE_2, lease_s=3)
    w = pair.p.w
    del w._remote_agents[D_ENGINE]
    handshake: Future[tuple[dict[tuple[int, int], str], float]] = Future()
    w._handshake_futures[D_ENGINE] = handshake
    pair.prefill_done(lease_s=3)
    pair.p_round()
    reg = pair.registered()
    pair.p_round([reg])  # matched; the WRITE waits for the handshake
    assert pair.posted_at == [] and w._handshake_futures[D_ENGINE] is handshake
    for t in range(100, 1_000, 100):
        pair.to(t)
        pair.d_step()
        pair.p_round([m for s, m in pair.to_p if s == t])
    steps = [2_500, *range(2_600, 4_200, 100)]
    for t in steps:
        pair.to(t)
        pair.d_step()
        pair.p_round([m for s, m in pair.to_p if s == t])
    pair.to(4_200)
    w._remote_agents[D_ENGINE] = {(0, 0): "D0"}
    handshake.set_result(({(0, 0): "D0"}, 0.0))
    pair.p_round()
    assert pair.freed_at == 4_100
    assert pair.posted_at == []  # nothing lands in the blocks D freed at 4 100
    beats = pair.d_sent(b"HB:")
    assert beats and all(s < 1_000 for s, _ in beats), beats  # none after the deadline
    assert pair.finished_sending_at == 3_000  # P's lease was not extended


# -- the producer side's registrations, alone --------------------------------------------- #


def prefill_side() -> tuple[Any, list[int]]:
    from kvdrain.vllm._prefill import PrefillSide

    now = [0]
    return PrefillSide(HOLE_1, lambda: now[0]), now


def push_reg(rid: str, **fields: object) -> bytes:
    return b"PUSH_REG:" + msgspec.msgpack.encode({"request_id": rid, **fields})


def test_registrations_are_dated_at_the_drain_before_and_cancels_taken_out() -> None:
    side, now = prefill_side()
    now[0] = 100
    assert side.drain_begins() == 0
    now[0] = 5_000  # the writer thread drains again only now
    since = side.drain_begins()
    assert since == 100
    regs = [push_reg("a", kvdrain_lifetime_ms=400), push_reg("b"), b"HB:p-a"]
    back = side.feed({"D0": [*regs, encode_cancel("c")], "D1": [encode_cancel("d")]}, since)
    assert back == {"D0": regs}  # the cancels are the plugin's; vLLM gets the rest
    assert not side.alive("a")  # 100 + 400 <= 5 000
    assert side.alive("b")  # vLLM's own decode side: no lifetime
    assert not side.alive("c") and not side.alive("d")
    assert side.alive("never-registered")


def test_the_earliest_end_of_a_registrations_copies_holds() -> None:
    side, now = prefill_side()
    side.feed({"D0": [push_reg("a", kvdrain_lifetime_ms=900)]}, 0)
    side.feed({"D1": [push_reg("a", kvdrain_lifetime_ms=300)]}, 100)  # D rank 1's copy
    side.feed({"D0": [push_reg("a", kvdrain_lifetime_ms=5_000)]}, 200)
    now[0] = 399
    assert side.alive("a")
    now[0] = 400
    assert not side.alive("a")


def test_a_cancel_before_its_registration_still_ends_it() -> None:
    side, _ = prefill_side()
    side.feed({"D0": [encode_cancel("a")]}, 0)
    side.feed({"D0": [push_reg("a", kvdrain_lifetime_ms=60_000)]}, 0)
    assert not side.alive("a")


def test_registrations_that_do_not_parse_give_no_lifetime_and_go_on_to_vllm() -> None:
    side, now = prefill_side()
    odd = [
        b"PUSH_REG:\xc1",  # not msgpack
        b"PUSH_REG:" + msgspec.msgpack.encode([1, 2]),
        push_reg("a", kvdrain_lifetime_ms="soon"),
        push_reg("b", kvdrain_lifetime_ms=True),
    ]
    assert side.feed({"D0": odd}, 0) == {"D0": odd}
    now[0] = 10**9
    assert side.alive("a") and side.alive("b")
