"""Push-mode consumer bookkeeping (decode side) for one rank, engine-neutral.

:class:`PushConsumer` is the decode side of vLLM's push protocol as one object with no
vLLM import: registration, a writer-thread batch, an engine-thread step, the transfer
results, the invalid blocks and the release of fenced blocks. vLLM 0.33 itself does not
call it: the connector plugin :mod:`kvdrain.vllm.connector` (``KvdrainPushConnector``)
drives a :class:`kvdrain.Ledger` from vLLM's own worker and scheduler classes. This
object serves engines with one process per rank and a request-finished hook on the same
side, tests, and the examples.

Where each method's counterpart sits in vLLM 0.33's push worker and scheduler:

==============================================  =============================================
vLLM 0.33 place                                 :class:`PushConsumer` method
==============================================  =============================================
``start_load_kv``: store ``_recving_metadata``  :meth:`~PushConsumer.start_load_kv`
writer thread: ``get_new_notifs()`` batch,      :meth:`~PushConsumer.writer_batch` (returns the
``PUSH_REG:`` routing, queue the rest           ``PUSH_REG:``/``HB:`` messages to route)
engine thread: ``_get_new_notifs`` (count up    :meth:`~PushConsumer.get_new_notifs`
to ``pp_size × max(1, TP // world_size)``)
``get_transfer_results`` (``finished_recving``, :meth:`~PushConsumer.get_transfer_results`
failed requests; metadata dropped)
``_handle_failed_transfer`` → invalid block     :meth:`~PushConsumer.get_block_ids_with_load_errors`
ids (``get_block_ids_with_load_errors``)
request finished / aborted                      :meth:`~PushConsumer.request_finished`
(blocks freed only when no write can land)      :meth:`~PushConsumer.get_released`
a producer agent lost (dead, connection reset,  :meth:`~PushConsumer.gone_agent`
metadata invalidated)
a producer agent proven unable to write         :meth:`~PushConsumer.fence_agent`
==============================================  =============================================

What it decides: the expected count is fixed at registration (``pp × max(1, TP //
world_size)`` from the producer's ``tp_size``/``pp_size``) instead of re-read from every
message; ``PUSH_FAIL:`` notices count and fail the request; duplicates of a decided
request, unknown ids and garbage bytes never raise and create no state; a request that
waits past its deadline fails (``expired``); and the blocks of an aborted, expired or
failed request stay fenced until no write can still land (or ``quarantine_ms`` runs out)
— they come back through :meth:`~PushConsumer.get_released`.

Failed requests and settling (rule 8 of the replay spec). A ``PUSH_FAIL:`` may report a
write that errored after it was posted, and NIXL cannot cancel a posted write: its bytes
can still land for a while. So a failed request's blocks take two steps:

1. when it fails, :meth:`~PushConsumer.get_transfer_results` names it and
   :meth:`~PushConsumer.get_block_ids_with_load_errors` reports all its blocks (every KV
   group): they do not hold its KV;
2. they are **not free yet**: :meth:`~PushConsumer.request_finished` returns ``True``
   (delay the free) until ``settle_ms`` after the request's last failure notice, and then
   :meth:`~PushConsumer.get_released` names the request — the blocks may be reused.

A producer seen gone (a failed send or heartbeat, a reset connection, a dead process,
invalidated metadata) is reported with :meth:`~PushConsumer.gone_agent`, never with
:meth:`~PushConsumer.fence_agent`: the bytes it had already handed to its transport keep
landing (measured over UCX TCP: up to 173 ms after a reset), so its outstanding edges fail
at once, as failure notices from it would, and their blocks settle for ``settle_ms``.
:meth:`~PushConsumer.fence_agent` is only for a transport that can prove nothing more of
the producer's can land.

A request that failed only by fences or deadlines needs no settling beyond its quarantine;
``settle_ms=0`` is vLLM's behaviour (the blocks are free with the failure). A failure
notice's time is the clock of the engine thread's last :meth:`~PushConsumer.get_new_notifs`
(the writer thread reads no clock), so leave one engine step of margin in ``settle_ms``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from kvdrain._errors import UnknownRequestError
from kvdrain._kvdrain import Decision, Ledger

__all__ = ["PushConsumer", "expected_notifications"]

BlockIds = Sequence[int] | Sequence[Sequence[int]]
"""A request's local block ids: one list, or one list per KV cache group."""


def expected_notifications(tp_size: int, pp_size: int = 1, world_size: int = 1) -> int:
    """vLLM's expected count on one decode rank: ``pp_size × max(1, tp_size // world_size)``."""
    return pp_size * max(1, tp_size // world_size)


def _flat(block_ids: BlockIds) -> list[int]:
    out: list[int] = []
    for item in block_ids:
        if isinstance(item, int):
            out.append(item)
        else:
            out.extend(item)
    return out


class PushConsumer:
    """The decode-side state of one push worker (one D TP rank).

    ``world_size`` is this node's TP world size; ``deadline_ms`` defaults to vLLM's
    ``push_registration_timeout`` (480 s); ``clock`` returns monotonic seconds (tests pass
    a fake one). ``writer_batch`` is the writer thread's; every other method is the engine
    thread's. Both may run at once.
    """

    def __init__(
        self,
        *,
        world_size: int = 1,
        capacity: int = 4096,
        deadline_ms: int = 480_000,
        quarantine_ms: int = 60_000,
        settle_ms: int = 5_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.world_size = world_size
        self.ledger = Ledger(
            capacity,
            deadline_ms=deadline_ms,
            quarantine_ms=quarantine_ms,
            settle_ms=settle_ms,
        )
        self._clock = clock
        self._epoch = clock()
        self._finished_recving: set[str] = set()
        self._failed_recving: set[str] = set()
        self._invalid_block_ids: set[int] = set()
        self._released: set[str] = set()
        # Requests decided for the client whose blocks are still fenced.
        self._fenced: set[str] = set()
        # Of those, the ones whose block free the engine delayed (request_finished: True).
        self._delayed: set[str] = set()

    # -- start_load_kv --------------------------------------------------------------- #

    def start_load_kv(
        self,
        req_id: str,
        local_block_ids: BlockIds,
        *,
        tp_size: int,
        pp_size: int = 1,
        producer_agents: Iterable[str] | None = None,
        deadline_ms: int | None = None,
    ) -> None:
        """Registers a request before its ``PUSH_REG`` goes out (vLLM stores
        ``_recving_metadata[req_id]`` here). ``tp_size``/``pp_size`` are the producer's,
        from ``kv_transfer_params``. With ``producer_agents`` (the NIXL agent names of the
        producer ranks that write this rank) each must send exactly one notice (named
        edges); without, ``expected_notifications(tp_size, pp_size, world_size)`` notices
        from anyone (vLLM's counting).

        Raises :class:`~kvdrain.DuplicateRequestError`, :class:`~kvdrain.FullError`,
        :class:`~kvdrain.InvalidExpectError`.
        """
        expect: int | list[str]
        if producer_agents is not None:
            expect = list(producer_agents)
        else:
            expect = expected_notifications(tp_size, pp_size, self.world_size)
        self.ledger.register(req_id, local_block_ids, expect, deadline_ms=deadline_ms)

    # -- writer thread ---------------------------------------------------------------- #

    def writer_batch(self, notifs: Mapping[str, Iterable[bytes]]) -> list[tuple[str, bytes]]:
        """The writer thread's ``nixl_wrapper.get_new_notifs()`` batch, whole. Returns the
        producer-bound messages (``PUSH_REG:``, ``HB:``) with their sender, untouched, for
        vLLM's own handlers; everything else is counted here (no queue to the engine)."""
        return self.ledger.feed(notifs)

    # -- engine thread ------------------------------------------------------------------ #

    def now_ms(self) -> int:
        """The clock in ms since this object was made."""
        return round((self._clock() - self._epoch) * 1000)

    def get_new_notifs(self) -> set[str]:
        """The engine thread's step (vLLM's ``_get_new_notifs``): takes the decisions the
        writer thread's notices made ready and those that the clock brings (deadlines,
        quarantine and settle ends). Returns the ids that finished receiving now."""
        completed, others = self.ledger.poll_split()
        done = set(completed)
        self._finished_recving.update(completed)
        for d in others + self.ledger.advance(self.now_ms()):
            self._apply(d, done)
        return done

    def _apply(self, d: Decision, done: set[str]) -> None:
        rid = d.request_id
        if d.kind == "completed":
            done.add(rid)
            self._finished_recving.add(rid)
        elif d.kind in ("failed", "expired"):
            self._failed_recving.add(rid)
            self._invalid_block_ids.update(_flat(_as_block_ids(d.blocks)))
            self._fenced.add(rid)
        elif d.kind == "aborted":
            self._fenced.add(rid)
        elif d.kind == "released":
            self._fenced.discard(rid)
            if rid in self._delayed:
                self._delayed.discard(rid)
                self._released.add(rid)

    def get_transfer_results(self) -> tuple[set[str], set[str]]:
        """``(finished_recving, failed_recving)`` since the last call. A finished request's
        blocks hold its whole KV and belong to it; a failed (or expired) one's do not."""
        finished, failed = self._finished_recving, self._failed_recving
        self._finished_recving, self._failed_recving = set(), set()
        return finished, failed

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Every block of every request that failed or expired since the last call (all KV
        groups: a partial load is never reported as good). Reported when the request
        fails, once; the blocks are free only when :meth:`get_released` names the request
        (after its failure notices settled), or at once if :meth:`request_finished`
        returns ``False``."""
        invalid, self._invalid_block_ids = self._invalid_block_ids, set()
        return invalid

    def request_finished(self, req_id: str) -> bool:
        """The request finished or was aborted on the engine. Returns ``True`` when its
        blocks must not be freed yet (``delay_free_blocks``): a write may still land (an
        aborted or expired request with writes outstanding, or a failed one whose failure
        notices are still settling); the id comes back from :meth:`get_released` when
        they are free."""
        if req_id in self._fenced:
            self._delayed.add(req_id)
            return True
        try:
            aborted = self.ledger.abort(req_id)
        except UnknownRequestError:
            return False
        if aborted is None:
            return False  # decided already: completed (blocks in use) or released
        self._fenced.add(req_id)
        self._delayed.add(req_id)
        return True

    def get_released(self) -> set[str]:
        """Requests whose delayed blocks are free now (since the last call)."""
        released, self._released = self._released, set()
        return released

    def gone_agent(self, agent: str) -> None:
        """The transport lost ``agent`` (a failed send or heartbeat, a reset connection,
        a dead process, invalidated metadata): its outstanding named edges fail now, as
        failure notices from it would, and their blocks settle for ``settle_ms``, because
        its bytes already on the way may still land. The settling counts from now (the
        clock is advanced first), not from the last :meth:`get_new_notifs`."""
        done: set[str] = set()
        for d in self.ledger.advance(self.now_ms()) + self.ledger.gone(agent):
            self._apply(d, done)

    def fence_agent(self, agent: str) -> None:
        """The transport proves ``agent`` can no longer write here: nothing of it is in
        flight and none of it can land. Its outstanding named edges resolve as failed,
        with no settling. A peer merely seen gone (dead, reset, metadata invalidated) is
        :meth:`gone_agent`."""
        done: set[str] = set()
        for d in self.ledger.fence(agent):
            self._apply(d, done)


def _as_block_ids(blocks: object) -> BlockIds:
    if isinstance(blocks, (list, tuple)):
        return blocks
    return []
