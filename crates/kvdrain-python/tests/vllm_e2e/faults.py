"""Fault injection around vLLM's real NIXL wrapper (test set-up, in the engine process).

:class:`FaultyNixl` forwards every call to the real ``nixl_agent`` the worker built, so the
WRITEs, the notifications and the handshake are NIXL's. For the requests a test names
(by the decode request id every WRITE's notification carries) it can:

* ``post_fail``: refuse the post (``make_prepped_xfer`` raises, nothing is sent);
* ``backend_error``: post the real WRITE without its completion notice (the bytes land)
  and report a backend error from the status call: what NIXL does when a transfer fails
  after posting (its pending notice is dropped; part or all of the data may be in place);
* ``stall``: post the real WRITE without its notice, answer ``PROC`` without polling NIXL
  until the test lifts the stall, then poll NIXL and, once it says ``DONE``, send the
  notice to the decode agent the test named (so a small WRITE that NIXL completes inside
  the post still keeps its notice back, as a large one does);
* ``hold``: keep the writer thread from posting until the test lifts the hold (nothing
  has landed yet).

A fault names a request (every WRITE of it on this rank) or one edge of it,
``REQ@AGENT``: the WRITE of request ``REQ`` into the decode agent ``AGENT`` (the
multi-rank suite, where one producer rank writes several consumer ranks). A withheld
notice goes to the agent the WRITE targets (known from ``prep_xfer_dlist``), or else to
the ``agent`` the test named. When each WRITE was attempted and when NIXL said ``DONE``
are kept (``time.monotonic()``, one clock for every process on the host).

It also sends any bytes on the wire: from this engine's own agent (``send_raw``), or
from a second NIXL agent in this process that no handshake named (``stray_send``).
"""

from __future__ import annotations

import base64
import threading
import time
from typing import Any


class nixlBackendError(RuntimeError):  # noqa: N801 - NIXL's own exception name
    """What NIXL's status call raises for a backend failure."""


def _hkey(handle: Any) -> Any:
    """A transfer handle as a key: NIXL's handles are ints, and ``id()`` of an int is
    reused once it is freed (a later handle would inherit an earlier one's record)."""
    return handle if isinstance(handle, int) else id(handle)


def _hit(faults: set[str], rid: str, edge: str) -> bool:
    """Whether a fault is set on request ``rid`` (every edge) or on ``edge``."""
    return rid in faults or edge in faults


def _request_of(notif_msg: bytes) -> str:
    return notif_msg.decode("utf-8", "replace").rsplit(":", 1)[0]


class FaultyNixl:
    def __init__(self, real: Any) -> None:
        self._real = real
        self.post_fail: set[str] = set()
        self.backend_error: set[str] = set()
        self.stall: set[str] = set()
        self.hold: set[str] = set()
        self._lifted = threading.Condition()
        self._stray: Any = None
        self._rid_of: dict[int, str] = {}
        # Handles posted without their notice: handle id -> (decode agent, message).
        self._withheld: dict[int, tuple[str, bytes]] = {}
        self.agent_of: dict[str, str] = {}
        self.posted: dict[str, int] = {}
        self.polls: dict[str, int] = {}
        # prepped remote descriptor list -> the agent it targets
        self._dlist_agent: dict[Any, str] = {}
        self._key_of: dict[int, str] = {}  # handle -> "REQ@AGENT"
        self.attempted_at: dict[str, list[float]] = {}
        self.done_at: dict[str, list[float]] = {}
        self.failed_at: dict[str, list[float]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def set(
        self,
        post_fail: list[str] | None = None,
        backend_error: list[str] | None = None,
        stall: list[str] | None = None,
        hold: list[str] | None = None,
        agent: str | None = None,
    ) -> dict[str, Any]:
        for rid in (backend_error or []) + (stall or []):
            if agent is not None:
                self.agent_of[rid] = agent
        if post_fail is not None:
            self.post_fail = set(post_fail)
        if backend_error is not None:
            self.backend_error = set(backend_error)
        if stall is not None:
            self.stall = set(stall)
        if hold is not None:
            with self._lifted:
                self.hold = set(hold)
                self._lifted.notify_all()
        return {
            "posted": dict(self.posted),
            "polls": dict(self.polls),
            "attempted_at": dict(self.attempted_at),
            "done_at": dict(self.done_at),
            "failed_at": dict(self.failed_at),
        }

    def prep_xfer_dlist(self, agent_name: str | bytes, *args: Any, **kw: Any) -> Any:
        handle = self._real.prep_xfer_dlist(agent_name, *args, **kw)
        name = agent_name.decode() if isinstance(agent_name, bytes) else str(agent_name)
        if name != "NIXL_INIT_AGENT":
            self._dlist_agent[handle] = name
        return handle

    def _note(self, times: dict[str, list[float]], rid: str, edge: str) -> None:
        now = time.monotonic()
        times.setdefault(rid, []).append(now)
        if edge != rid:
            times.setdefault(edge, []).append(now)

    def make_prepped_xfer(self, op: str, *args: Any, notif_msg: bytes = b"", **kw: Any) -> Any:
        rid = _request_of(notif_msg)
        remote = args[2] if len(args) > 2 else kw.get("remote_xfer_side_handle")
        target = self._dlist_agent.get(remote) if remote is not None else None
        edge = rid if target is None else f"{rid}@{target}"
        self._note(self.attempted_at, rid, edge)
        with self._lifted:
            self._lifted.wait_for(lambda: not _hit(self.hold, rid, edge), timeout=120)
        if _hit(self.post_fail, rid, edge):
            self._note(self.failed_at, rid, edge)
            raise RuntimeError(f"injected: cannot post the WRITE of {rid}")
        withhold = _hit(self.backend_error | self.stall, rid, edge)
        handle = self._real.make_prepped_xfer(
            op, *args, notif_msg=b"" if withhold else notif_msg, **kw
        )
        self._rid_of[_hkey(handle)] = rid
        self._key_of[_hkey(handle)] = edge
        self._withheld.pop(_hkey(handle), None)  # a handle value NIXL reuses: a new WRITE
        if withhold:
            agent = target if target is not None else self.agent_of[rid]
            self._withheld[_hkey(handle)] = (agent, notif_msg)
        self.posted[rid] = self.posted.get(rid, 0) + 1
        return handle

    def check_xfer_state(self, handle: Any) -> str:
        rid = self._rid_of.get(_hkey(handle), "")
        edge = self._key_of.get(_hkey(handle), rid)
        self.polls[rid] = self.polls.get(rid, 0) + 1
        if _hit(self.backend_error, rid, edge):
            self._note(self.failed_at, rid, edge)
            self._withheld.pop(_hkey(handle), None)  # a failed transfer sends no notice
            raise nixlBackendError(f"injected: backend error on the WRITE of {rid}")
        if _hit(self.stall, rid, edge):
            return "PROC"
        state: str = self._real.check_xfer_state(handle)
        if state == "DONE" and _hkey(handle) in self._withheld:
            agent, message = self._withheld.pop(_hkey(handle))
            self._real.send_notif(agent, notif_msg=message)
        if state == "DONE":
            self._note(self.done_at, rid, edge)
        return state

    def send_raw(self, agent: str, message_b64: str) -> None:
        """Sends any bytes to ``agent`` as a standalone NIXL notification."""
        self._real.send_notif(agent, notif_msg=base64.b64decode(message_b64))

    def stray_send(self, md_b64: str, message_b64: str) -> str:
        """Sends bytes from a NIXL agent no handshake announced, to the agent whose
        metadata is ``md_b64``; returns the stray agent's name."""
        from nixl._api import nixl_agent

        if self._stray is None:
            self._stray = nixl_agent(f"kvdrain-e2e-stray-{id(self)}")
        name = self._stray.add_remote_agent(base64.b64decode(md_b64))
        self._stray.send_notif(name, notif_msg=base64.b64decode(message_b64))
        return str(self._stray.name)
