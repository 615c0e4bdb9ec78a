"""vLLM's ``get_transfer_results`` on an engine step that has nothing for it, answered
without running it.

Most engine steps bring vLLM's push worker nothing: no receive done or failed, nothing
its writer thread forwarded, no push of its own to finish, no lease to reap. Its
``get_transfer_results`` then wakes the writer thread and returns three empty sets, after
reading each of its queues to find them empty (a lock and a raised ``queue.Empty`` among
them): about 8 µs on a 2-core AMD EPYC, more than the plugin's own work in the step. The
plugin wakes the writer thread and returns the same empty result itself when:

* every structure that function reads is empty (:attr:`IdleStep.inputs`, read once per
  step, after the plugin has told vLLM the step's report). A message another thread puts
  there meanwhile waits for the next step, as it would had vLLM's drain run first;
* the source of every function vLLM runs on that path is one read for this module
  (:data:`READ`, by digest), so that a vLLM whose step does more runs its own step,
  every step (:func:`unread`).

No vLLM import: the worker hands its class and its containers in.
"""

from __future__ import annotations

import hashlib
import inspect
import queue
from collections.abc import Sized

__all__ = ["PATH", "READ", "IdleStep", "digest", "unread"]

PATH = (
    "get_transfer_results",
    "_get_new_notifs",
    "_pop_done_transfers",
    "_reap_expired_send_leases",
    "_cleanup_remote_engines",
    "_sync_device_after_direct_recv",
)
"""The functions vLLM's ``get_transfer_results`` runs on a step with nothing to do, by
name; every definition of each along the worker's MRO is read (the push worker's step
calls its base's)."""

READ = {
    "4e40aac3048b0b73": "0.33.0",
    "bda6d5adb91db99b": "0.34.0",
}
"""The digests (:func:`digest`) of :data:`PATH` as read for this module, and the vLLM
release each is from. In both, with every input empty, the path reads and changes
nothing but the writer thread's wake, and returns three empty sets:
``_get_new_notifs`` drains an empty queue, ``_pop_done_transfers`` walks empty maps (the
receives' and the pushes'), the failed-receive queue, the failure set and the PCP
replicas' done set are empty, so no receive is done or failed and the post-processing
loops run zero times, the lease reaper returns at an empty map,
``_cleanup_remote_engines`` returns at once in push mode, and with nothing done sending
no eviction is queued."""


def digest(cls: type) -> str:
    """The sha256 (hex, first 16 digits) of the source of every definition of
    :data:`PATH` along ``cls``'s MRO that is not the plugin's own, in MRO order; ``""``
    when a source cannot be read."""
    h = hashlib.sha256()
    for name in PATH:
        for klass in cls.__mro__:
            fn = klass.__dict__.get(name)
            if fn is None or klass.__module__.startswith("kvdrain."):
                continue
            try:
                source = inspect.getsource(fn)
            except (OSError, TypeError):
                return ""
            h.update(f"{klass.__qualname__}.{name}\n{source}\n".encode())
    return h.hexdigest()[:16]


def unread(cls: type) -> str | None:
    """Why the plugin must run ``cls``'s own step every step, ``None`` when it need not
    (the source of its path is one of :data:`READ`, and it pushes)."""
    if getattr(cls, "_TRANSFER_MODE", None) != "push":
        return "the worker is not in push mode"
    found = digest(cls)
    if found not in READ:
        shown = found or "unreadable"
        return f"the source of its get_transfer_results path ({shown}) is not one read"
    return None


class IdleStep:
    """One worker's inputs to vLLM's step, bound once (vLLM binds each in its
    constructor and changes it in place): a step finds all of them empty or runs vLLM's
    own."""

    __slots__ = ("inputs",)

    def __init__(
        self,
        *,
        forwarded: object,
        receives_done: Sized,
        receives_failed: object,
        receive_failures: Sized,
        pcp_done_sending: Sized,
        leases: Sized,
        pushes: Sized,
    ) -> None:
        if not isinstance(forwarded, queue.Queue) or not isinstance(receives_failed, queue.Queue):
            raise TypeError("vLLM's forwarded and failed-receive queues are not queue.Queue")
        self.inputs: tuple[Sized, ...] = (
            forwarded.queue,  # the writer thread's forwarded messages
            receives_done,  # _recving_transfers: the receives vLLM reports done
            receives_failed.queue,  # _failed_recv_reqs
            receive_failures,  # _recv_failures
            pcp_done_sending,  # _replicated_pcp_done_sending
            leases,  # _reqs_to_send: the pushes' leases, reaped by time
            pushes,  # _sending_transfers: this rank's WRITEs in flight
        )

    def idle(self) -> bool:
        """Every input empty: vLLM's step would only wake the writer thread."""
        return not any(self.inputs)
