"""The worker's NIXL agent with kvdrain listening: the one place the plugin meets NIXL.

vLLM's own loops (the writer thread, the heartbeats, the registration send, the transfer
polls) run unchanged over :class:`NixlTap`; each call the plugin needs to see is passed
to the real agent and reported on the way:

* ``get_new_notifs``: the batch goes to the ledger, dated now; the producer-bound
  messages go to the prefill side, dated at the previous drain's start; vLLM gets back
  those it handles itself (``PUSH_REG:``, ``HB:``);
* ``send_notif``: a send that raises reports its agent lost (``gone``), then raises on to
  vLLM's own handling;
* ``check_xfer_state`` and ``release_xfer_handle``: each WRITE's state, final once the
  handle is released;
* ``get_xfer_telemetry``: where NIXL has no telemetry it raises; that is not a failed
  transfer, so the tap answers ``None`` (vLLM records nothing for it).

Every other attribute is the agent's own, and every call, those above included, goes
through the tap's :class:`~kvdrain.vllm._nixl_watch.CallWatch`: timed, and reported by its
watchdog if it stalls.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kvdrain.vllm._nixl_watch import CallWatch
from kvdrain.vllm._topology import agent_name

if TYPE_CHECKING:
    # Annotations only: the prefill side needs msgspec, which only vLLM's venv has.
    from kvdrain.vllm._decode import DecodeSide
    from kvdrain.vllm._prefill import PrefillSide

__all__ = ["NixlTap"]

logger = logging.getLogger("vllm.kvdrain")


class NixlTap:
    """``nixl_wrapper`` as vLLM sees it, with the decode and prefill sides listening and
    every call timed by ``watch`` (default: a watch that times nothing)."""

    watch: CallWatch  # a class default too: __getattr__ must not recurse before __init__
    watch = CallWatch(0)
    _agent: Any = None

    def __init__(
        self,
        agent: Any,
        decode: DecodeSide,
        prefill: PrefillSide,
        watch: CallWatch | None = None,
    ) -> None:
        self._decode = decode
        self._prefill = prefill
        if watch is not None:
            self.watch = watch
        self._cached: list[str] = []
        self.agent = agent

    @property
    def agent(self) -> Any:
        """The NIXL agent every call goes to."""
        return self._agent

    @agent.setter
    def agent(self, agent: Any) -> None:
        # Every timed call is bound to the agent it was built for: a new agent (a test's
        # fake, a fault injector) gets its own, and the ones __getattr__ kept are dropped.
        self._agent = agent
        for name in self._cached:
            self.__dict__.pop(name, None)
        self._cached = []
        self._get_new_notifs = self.watch.timed(agent, "get_new_notifs")
        self._send_notif = self.watch.timed(agent, "send_notif")
        self._check_xfer_state = self.watch.timed(agent, "check_xfer_state")
        self._release_xfer_handle = self.watch.timed(agent, "release_xfer_handle")
        self._get_xfer_telemetry = self.watch.timed(agent, "get_xfer_telemetry")

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._agent, name)
        if not callable(value) or not self.watch.enabled:
            return value
        # The timed method stays on the tap: the next access is a plain attribute read.
        timed = self.__dict__[name] = self.watch.timed(self._agent, name)
        self._cached.append(name)
        return timed

    def get_new_notifs(self) -> dict[str, list[bytes]]:
        arrived_after = self._prefill.drain_begins()
        back = self._decode.feed(self._get_new_notifs())
        return self._prefill.feed(back, arrived_after)

    def send_notif(self, remote_agent_name: str | bytes, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._send_notif(remote_agent_name, *args, **kwargs)
        except Exception as e:
            self._decode.gone(agent_name(remote_agent_name), f"send failed: {e}")
            raise

    def check_xfer_state(self, handle: int) -> str:
        try:
            state: str = self._check_xfer_state(handle)
        except Exception as e:
            unknown = type(e).__name__ == "nixlNotFoundError"
            self._prefill.observed(handle, "unknown" if unknown else "error")
            raise
        if state == "DONE":
            self._prefill.observed(handle, "landed")
        elif state != "PROC":
            self._prefill.observed(handle, "error")
        return state

    def release_xfer_handle(self, handle: int) -> Any:
        released = self._release_xfer_handle(handle)
        self._prefill.handle_released(handle)
        return released

    def get_xfer_telemetry(self, handle: int) -> Any:
        try:
            return self._get_xfer_telemetry(handle)
        except Exception:
            logger.debug("kvdrain: no NIXL telemetry for handle %s", handle, exc_info=True)
            return None
