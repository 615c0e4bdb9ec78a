"""One rank's clock: what both sides of the plugin date their inputs with."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["RankClock"]


class RankClock:
    """Milliseconds since the rank's plugin state was built, read from a monotonic clock
    in seconds (``time.monotonic``; tests pass a fake). The decode side, the prefill side
    and the writer thread all read this one clock, so a time one of them hands another is
    on the same scale. Safe to read from any thread."""

    __slots__ = ("_epoch", "_seconds")

    def __init__(self, seconds: Callable[[], float] = time.monotonic) -> None:
        self._seconds = seconds
        self._epoch = seconds()

    def now_ms(self) -> int:
        """This rank's time now, in ms."""
        return round((self._seconds() - self._epoch) * 1000)
