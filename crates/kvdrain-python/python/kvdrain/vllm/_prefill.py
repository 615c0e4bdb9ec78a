"""The prefill side of the plugin, for one rank: one :class:`kvdrain.PushPlan` per request.
No vLLM import: the worker (:mod:`kvdrain.vllm.connector`) reports each WRITE it posts and
each state NIXL gives for it (through :class:`kvdrain.vllm._nixl_tap.NixlTap`), and asks
what to send and which source blocks are free.

* A WRITE that cannot be posted, or that ends in a backend error, owes one
  ``PUSH_FAIL:REQ:TP`` to the consumer rank it was for; a ``NOT_FOUND`` status owes
  nothing (the write may still land).
* A state counts once NIXL has let go of the handle (``release_xfer_handle`` returned):
  until then the backend may still be reading the source blocks.
* A request's source blocks are not reported free (``finished_sending``) while any of its
  writes is in flight or of unknown state, at most ``quarantine_ms``; once reported, the
  request is retired and never posts again (catalogue F4: a deferred push drained after
  the blocks were freed would write another request's KV with a success status).
* The producer does not evict a consumer engine it still writes to.
* A consumer's registration lives for the ``kvdrain_lifetime_ms`` its ``PUSH_REG``
  carries, from when it arrived: dated at the start of the previous drain of NIXL's
  notifications (:meth:`PrefillSide.drain_begins`), since it was not there yet when that
  drain began, so a writer thread that drains late never makes a registration look
  younger than it is. A ``PUSH_CANCEL:`` from the consumer ends it at once. A WRITE
  for a registration that ended is not posted (:meth:`PrefillSide.alive`, asked when
  the registration is matched and again before each post); a WRITE posted already runs
  to its end and is reported as usual. Each consumer rank it would have written owes
  the ``PUSH_FAIL`` of a WRITE not posted: a consumer that still waits fails now
  instead of at its deadline, one that gave up may release its blocks before its
  quarantine ends, and one that forgot the request drops it as late. A ``PUSH_REG``
  without the key (vLLM's own decode side) has no lifetime.

Threads: the writer thread posts (:meth:`PrefillSide.begin`, :meth:`PrefillSide.posted`)
and drains (:meth:`PrefillSide.drain_begins`, :meth:`PrefillSide.feed`);
the engine thread polls (:meth:`PrefillSide.observed`, :meth:`PrefillSide.handle_released`,
:meth:`PrefillSide.release_sources`). One lock guards the state; nothing is sent under it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Literal

import msgspec

from kvdrain._kvdrain import PushPlan, parse_cancel
from kvdrain.vllm._settings import Settings

__all__ = ["LIFETIME_KEY", "Outcome", "PrefillSide"]

LIFETIME_KEY = "kvdrain_lifetime_ms"
"""The ``PUSH_REG`` map key with what is left of the registration's lifetime (ms) when
the consumer sent it. vLLM decodes the map into a plain ``dict`` and reads only the keys
it knows, so a vLLM producer ignores it."""

_PUSH_REG = b"PUSH_REG:"

Outcome = Literal["landed", "error", "unknown"]
"""A WRITE's end as NIXL tells it: ``DONE``; a backend error (nothing more of it lands);
``NOT_FOUND`` (it may still land)."""

Owed = list[tuple[str, bytes]]
"""``PUSH_FAIL`` notices to send: (consumer agent, message)."""

# Retired requests (and registrations' ends) remembered, oldest forgotten first: far more
# than are in flight.
_RETIRED_KEPT = 65_536


def _remember(table: OrderedDict[str, int], key: str, value: int) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > _RETIRED_KEPT:
        table.popitem(last=False)


class PrefillSide:
    """The prefill side of one rank (see the module's doc)."""

    def __init__(self, settings: Settings, now_ms: Callable[[], int]) -> None:
        self.settings = settings
        self._now_ms = now_ms
        self._lock = threading.Lock()
        self._plans: dict[str, PushPlan] = {}
        self._engine_of: dict[str, str] = {}  # request -> consumer engine
        self._edges: dict[int, tuple[str, int]] = {}  # handle -> (request, consumer rank)
        self._pending: dict[int, Outcome] = {}  # handle -> state seen, not yet released
        self._held: dict[str, int] = {}  # request -> latest release time (ms)
        self._retired: OrderedDict[str, None] = OrderedDict()
        self._owed: Owed = []
        # Consumer request -> when its registration ends (ms); -1: cancelled.
        self._ends: OrderedDict[str, int] = OrderedDict()
        self._drain_began = 0  # the start of the latest drain of NIXL's notifications

    # -- writer thread: registrations --------------------------------------------------- #

    def drain_begins(self) -> int:
        """The writer thread is about to drain NIXL's notifications; returns when the
        drain before it began (what :meth:`feed` dates this drain's messages at)."""
        now = self._now_ms()
        with self._lock:
            before, self._drain_began = self._drain_began, now
        return before

    def feed(
        self, batch: Mapping[str, list[bytes]], arrived_after_ms: int
    ) -> dict[str, list[bytes]]:
        """The producer-bound messages of one drain, which arrived after
        ``arrived_after_ms``: each ``PUSH_REG`` with a lifetime is dated then, each
        ``PUSH_CANCEL:`` ends its registration and is taken out; the rest go on to
        vLLM."""
        out: dict[str, list[bytes]] = {}
        for agent, messages in batch.items():
            kept: list[bytes] = []
            for message in messages:
                rid = parse_cancel(message)
                if rid is not None:
                    with self._lock:
                        _remember(self._ends, rid, -1)
                    continue
                if message.startswith(_PUSH_REG):
                    self._date(message, arrived_after_ms)
                kept.append(message)
            if kept:
                out[agent] = kept
        return out

    def alive(self, d_rid: str) -> bool:
        """Whether a WRITE into consumer request ``d_rid`` may still be posted: not
        cancelled, and within its registration's lifetime (if it has one)."""
        now = self._now_ms()
        with self._lock:
            end = self._ends.get(d_rid)
        return end is None or now < end

    def dropped(self, plan: PushPlan) -> Owed:
        """A registration that ended before its WRITEs were posted: ``plan``'s ranks are
        owed the ``PUSH_FAIL`` of a WRITE not posted."""
        plan.retire()
        return plan.take_owed_notices()

    def _date(self, message: bytes, arrived_after_ms: int) -> None:
        try:
            fields = msgspec.msgpack.decode(message[len(_PUSH_REG) :])
        except msgspec.DecodeError:
            return  # vLLM logs and drops it
        if not isinstance(fields, dict):
            return
        rid, left = fields.get("request_id"), fields.get(LIFETIME_KEY)
        if not isinstance(rid, str) or isinstance(left, bool) or not isinstance(left, int):
            return
        end = arrived_after_ms + max(0, left)
        with self._lock:
            # Each consumer rank registers; the earliest end holds for all.
            before = self._ends.get(rid)
            if before is None or (before != -1 and end < before):
                _remember(self._ends, rid, end)

    # -- writer thread ---------------------------------------------------------------- #

    def begin(self, rid: str, engine: str, plan: PushPlan) -> bool:
        """The writes of ``rid`` to consumer ``engine`` are about to be posted with
        ``plan``. ``False``: the request is retired (its source blocks were reported
        free); nothing may be posted."""
        with self._lock:
            if rid in self._retired:
                return False
            self._plans[rid] = plan
            self._engine_of[rid] = engine
            return True

    def posted(self, rid: str, d_rank: int, handle: int | None) -> Owed:
        """vLLM posted (``handle``) or failed to post (``None``) the WRITE of ``rid`` to
        consumer rank ``d_rank``; returns what a failed post owes."""
        with self._lock:
            plan = self._plans.get(rid)
            if plan is None or d_rank not in plan.targets or not plan.may_post(d_rank):
                return []
            if handle is None:
                plan.post_failed(d_rank)  # nothing was sent: one PUSH_FAIL is owed
                return plan.take_owed_notices()
            plan.posted(d_rank)
            self._edges[handle] = (rid, d_rank)
            return []

    def unwound(self, rid: str) -> Owed:
        """vLLM's posting loop for ``rid`` raised: the ranks it never reached are owed a
        notice too."""
        with self._lock:
            plan = self._plans.get(rid)
            if plan is None:
                return []
            plan.retire()
            return plan.take_owed_notices()

    # -- engine thread: NIXL's answers --------------------------------------------------- #

    def observed(self, handle: int, outcome: Outcome) -> None:
        """NIXL gave ``outcome`` for ``handle``; it counts once the handle is released."""
        with self._lock:
            if handle in self._edges:
                self._pending[handle] = outcome

    def handle_released(self, handle: int) -> None:
        """NIXL let go of ``handle``: the outcome seen for it is final."""
        with self._lock:
            outcome = self._pending.pop(handle, None)
            edge = self._edges.pop(handle, None)
            if edge is None:
                return
            plan = self._plans.get(edge[0])
            if plan is None:
                return
            d_rank = edge[1]
            if outcome == "landed":
                plan.landed(d_rank)
            elif outcome == "unknown" or outcome is None:
                plan.status_unknown(d_rank)
            else:
                plan.backend_error(d_rank)
                self._owed.extend(plan.take_owed_notices())

    def take_owed(self) -> Owed:
        """The notices the polls owe, to send once vLLM's locks are released."""
        if not self._owed:
            return []  # one owed meanwhile is taken at the next step's
        with self._lock:
            owed, self._owed = self._owed, []
            return owed

    def release_sources(self, finished_sending: set[str]) -> None:
        """Keeps a request out of ``finished_sending`` (its source blocks in use) while any
        of its writes may still read them, at most ``quarantine_ms``; reports it once they
        are all over, and retires it."""
        if not finished_sending and not self._held:
            return  # _held is this thread's alone
        now = self._now_ms()
        with self._lock:
            for rid in list(finished_sending):
                plan = self._plans.get(rid)
                if plan is not None and not plan.is_terminal:
                    finished_sending.discard(rid)
                    self._held.setdefault(rid, now + self.settings.quarantine_ms)
            for rid, until in list(self._held.items()):
                plan = self._plans.get(rid)
                if plan is None or plan.is_terminal or now >= until:
                    del self._held[rid]
                    finished_sending.add(rid)
            for rid in finished_sending:
                self._retire(rid)

    def busy_engines(self) -> set[str]:
        """Consumer engines this rank still writes to (not to be evicted)."""
        with self._lock:
            return {
                self._engine_of[rid]
                for rid, plan in self._plans.items()
                if not plan.is_terminal and rid in self._engine_of
            }

    def _retire(self, rid: str) -> None:
        plan = self._plans.pop(rid, None)
        if plan is not None:
            plan.retire()
        self._engine_of.pop(rid, None)
        self._retired[rid] = None
        self._retired.move_to_end(rid)
        while len(self._retired) > _RETIRED_KEPT:
            self._retired.popitem(last=False)
