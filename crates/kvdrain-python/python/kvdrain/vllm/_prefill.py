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

Threads: the writer thread posts (:meth:`PrefillSide.begin`, :meth:`PrefillSide.posted`);
the engine thread polls (:meth:`PrefillSide.observed`, :meth:`PrefillSide.handle_released`,
:meth:`PrefillSide.release_sources`). One lock guards the state; nothing is sent under it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Literal

from kvdrain._kvdrain import PushPlan
from kvdrain.vllm._settings import Settings

__all__ = ["Outcome", "PrefillSide"]

Outcome = Literal["landed", "error", "unknown"]
"""A WRITE's end as NIXL tells it: ``DONE``; a backend error (nothing more of it lands);
``NOT_FOUND`` (it may still land)."""

Owed = list[tuple[str, bytes]]
"""``PUSH_FAIL`` notices to send: (consumer agent, message)."""

# Retired requests remembered, oldest forgotten first: far more than are in flight.
_RETIRED_KEPT = 65_536


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
        with self._lock:
            owed, self._owed = self._owed, []
            return owed

    def release_sources(self, finished_sending: set[str]) -> None:
        """Keeps a request out of ``finished_sending`` (its source blocks in use) while any
        of its writes may still read them, at most ``quarantine_ms``; reports it once they
        are all over, and retires it."""
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
