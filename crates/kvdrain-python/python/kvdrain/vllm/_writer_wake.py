"""vLLM's writer thread, never parked for longer than :data:`IDLE_DRAIN_MS`.

vLLM's writer thread (``_push_writer_loop``, 0.33 and 0.34) is event-driven: with no
finished blocks waiting for a registration it parks on ``_push_writer_wake`` until an
engine step (``get_transfer_results``) or a handshake sets it, so an idle engine drains
NIXL's notifications never. The prefill side dates a ``PUSH_REG`` at the start of the
drain before the one that read it (:meth:`kvdrain.vllm._prefill.PrefillSide.drain_begins`):
the latest moment it is known not to have been there. After an idle spell that moment is
the spell's start, so the first registration to reach an idle producer looked as old as
the spell, was taken for ended, and its receive failed with a ``PUSH_FAIL`` although D
had just registered it.

:class:`BoundedWake` stands in for the event: a wait without a timeout returns after
:data:`IDLE_DRAIN_MS` at most, and vLLM's loop then drains once and parks again. A
registration is then dated at most that much (and one pass of the loop) before it
arrived, whatever the engine does. The loop is vLLM's own; nothing of it is copied.
A wake the loop's own ``wait(); clear()`` pair loses is also found within that bound.
"""

from __future__ import annotations

import threading

__all__ = ["IDLE_DRAIN_MS", "BoundedWake"]

IDLE_DRAIN_MS = 50
"""The longest an idle writer thread waits before it drains NIXL's notifications once:
what a registration's date may be early by, at the cost of twenty empty drains a second
on an engine with nothing to do."""


class BoundedWake:
    """A ``threading.Event`` whose untimed :meth:`wait` returns after ``bound_s`` at most
    (see the module's doc). The flag is the wrapped event's: a ``set`` before the wrap is
    kept."""

    __slots__ = ("_bound_s", "event")

    def __init__(self, event: threading.Event, bound_s: float = IDLE_DRAIN_MS / 1000) -> None:
        self.event = event
        self._bound_s = bound_s

    @classmethod
    def around(cls, event: threading.Event | BoundedWake) -> BoundedWake:
        """``event`` bounded; one already bounded (a worker attached again) as it is."""
        return event if isinstance(event, BoundedWake) else cls(event)

    def wait(self, timeout: float | None = None) -> bool:
        return self.event.wait(self._bound_s if timeout is None else timeout)

    def set(self) -> None:
        self.event.set()

    def clear(self) -> None:
        self.event.clear()

    def is_set(self) -> bool:
        return self.event.is_set()
