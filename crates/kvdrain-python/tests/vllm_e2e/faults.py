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

It also sends any bytes on the wire: from this engine's own agent (``send_raw``), or
from a second NIXL agent in this process that no handshake named (``stray_send``).
"""

from __future__ import annotations

import base64
import threading
from typing import Any


class nixlBackendError(RuntimeError):  # noqa: N801 - NIXL's own exception name
    """What NIXL's status call raises for a backend failure."""


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
        return {"posted": dict(self.posted), "polls": dict(self.polls)}

    def make_prepped_xfer(self, op: str, *args: Any, notif_msg: bytes = b"", **kw: Any) -> Any:
        rid = _request_of(notif_msg)
        with self._lifted:
            self._lifted.wait_for(lambda: rid not in self.hold, timeout=120)
        if rid in self.post_fail:
            raise RuntimeError(f"injected: cannot post the WRITE of {rid}")
        withhold = rid in self.backend_error or rid in self.stall
        handle = self._real.make_prepped_xfer(
            op, *args, notif_msg=b"" if withhold else notif_msg, **kw
        )
        self._rid_of[id(handle)] = rid
        if withhold:
            self._withheld[id(handle)] = (self.agent_of[rid], notif_msg)
        self.posted[rid] = self.posted.get(rid, 0) + 1
        return handle

    def check_xfer_state(self, handle: Any) -> str:
        rid = self._rid_of.get(id(handle), "")
        self.polls[rid] = self.polls.get(rid, 0) + 1
        if rid in self.backend_error:
            raise nixlBackendError(f"injected: backend error on the WRITE of {rid}")
        if rid in self.stall:
            return "PROC"
        state: str = self._real.check_xfer_state(handle)
        if state == "DONE" and id(handle) in self._withheld:
            agent, message = self._withheld.pop(id(handle))
            self._real.send_notif(agent, notif_msg=message)
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
