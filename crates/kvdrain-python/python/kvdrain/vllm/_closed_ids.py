"""The receives closed on the engine thread, for the writer thread to ask about.

A ``PUSH_REG`` must not leave for a receive decided already
(:meth:`kvdrain.vllm._decode.DecodeSide.lifetime_left_ms`), so every receive registered
with a lifetime is remembered when it closes: most of them when they complete, once per
receive, on the engine step's path. The question is asked far more rarely: only for a
``PUSH_REG`` whose receive this side no longer tracks.

So :meth:`ClosedIds.close` only appends to a bounded deque (no hashing), and the asking
thread moves what the deque holds into its own sets before it looks. A hashed insert per
completion on the engine thread (an ``OrderedDict`` before) cost a tenth of the
notification path (``make bench-vllm``).

What is remembered, and for how long: every id closed, for at least ``kept`` closes
after its own. The deque holds the newest ``kept + 1`` closes; in the sets additions go
into the newer one, which becomes the older one when it holds more than ``kept``, the
older one before it dropped whole (so they hold ``2 * kept + 2`` at most, and an id goes
at the ``kept + 1``-th addition after it at the soonest). An id may be kept longer than
that, never for less: a close is never wrongly said.

Threads: one thread closes (``deque.append``, atomic), any thread asks. The askers
take a lock among themselves (``popleft`` and the sets are theirs). An id closed before
the question began is in the deque, or already in the sets, when the asker looks.
"""

from __future__ import annotations

import threading
from collections import deque

__all__ = ["ClosedIds"]


class ClosedIds:
    """Ids closed by one thread, asked about by others, each kept for at least ``kept``
    later closes."""

    __slots__ = ("kept", "_log", "_lock", "_newer", "_older")

    def __init__(self, kept: int) -> None:
        if kept < 1:
            raise ValueError("kept must be at least 1")
        self.kept = kept
        self._log: deque[str] = deque(maxlen=kept + 1)  # itself and `kept` after it
        self._lock = threading.Lock()
        self._newer: set[str] = set()
        self._older: set[str] = set()

    def close(self, rid: str) -> None:
        """Remembers ``rid`` (the closing thread only): one append."""
        self._log.append(rid)

    def __contains__(self, rid: object) -> bool:
        with self._lock:
            log, kept = self._log, self.kept
            while log:
                newer = self._newer
                newer.add(log.popleft())
                if len(newer) > kept:
                    self._older = newer
                    self._newer = set()
            return rid in self._newer or rid in self._older

    def __len__(self) -> int:
        """How many ids are remembered now (some may be twice: closed again)."""
        with self._lock:
            return len(self._log) + len(self._newer) + len(self._older)
