"""Shared helpers: a fake monotonic clock for the vLLM adapter."""

from __future__ import annotations


class FakeClock:
    """Monotonic seconds that move only when told."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance_ms(self, ms: int) -> None:
        self.t += ms / 1000
