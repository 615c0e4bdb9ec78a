"""The exceptions kvdrain raises: misuse of the API, never message content.

Every one derives from :class:`KvdrainError`. The extension module raises them with the
arguments documented on each ``__init__``.
"""

from __future__ import annotations

__all__ = [
    "KvdrainError",
    "ConfigError",
    "FullError",
    "DuplicateRequestError",
    "InvalidExpectError",
    "InvalidArgumentError",
    "InvalidRequestIdError",
    "AllocError",
    "UnknownRequestError",
    "ClockBackwardsError",
    "TopologyError",
    "PlanError",
]


class KvdrainError(Exception):
    """Base of every kvdrain exception."""


class ConfigError(KvdrainError, ValueError):
    """A ledger setting is out of range (capacity 0 or above the largest table)."""


class FullError(KvdrainError):
    """The table holds ``capacity`` requests: the registration is refused, nothing is
    evicted. The refused registration comes back: ``request_id`` and ``blocks``."""

    def __init__(self, message: str, request_id: str, blocks: object) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.blocks = blocks


class DuplicateRequestError(KvdrainError):
    """A request with this id is tracked already."""

    def __init__(self, message: str, request_id: str) -> None:
        super().__init__(message)
        self.request_id = request_id


class InvalidExpectError(KvdrainError, ValueError):
    """``expect`` is not a count in 1..=64 nor 1..=max_edges distinct agent names."""

    def __init__(self, message: str, request_id: str) -> None:
        super().__init__(message)
        self.request_id = request_id


class InvalidArgumentError(KvdrainError, ValueError):
    """An argument kvdrain cannot use: an int out of range for its parameter (a negative
    or too large time, deadline or rank), or a name that is not valid UTF-8 (a ``str``
    holding a lone surrogate)."""


class InvalidRequestIdError(InvalidArgumentError):
    """A request id that can never complete, refused before anything changed: empty, not
    valid UTF-8 (a lone surrogate), or one whose completion ``REQ:TP`` would read as
    another message (``HB``, ``HB:...``, ``PUSH_REG:...``, ``PUSH_FAIL:...``,
    ``PUSH_CANCEL:...``)."""

    def __init__(self, message: str, request_id: str) -> None:
        super().__init__(message)
        self.request_id = request_id


class AllocError(KvdrainError, MemoryError):
    """The memory of a new ledger (its tables, or the stack of the thread that builds
    it) could not be had. Nothing was built."""


class UnknownRequestError(KvdrainError):
    """No such request is tracked or remembered."""

    def __init__(self, message: str, request_id: str) -> None:
        super().__init__(message)
        self.request_id = request_id


class ClockBackwardsError(KvdrainError):
    """``advance`` was given a time earlier than the clock; nothing changed."""

    def __init__(self, message: str, last_ms: int, now_ms: int) -> None:
        super().__init__(message)
        self.last_ms = last_ms
        self.now_ms = now_ms


class TopologyError(KvdrainError, ValueError):
    """A producer/consumer topology or rank is unusable."""


class PlanError(KvdrainError):
    """A :class:`~kvdrain.PushPlan` step that the edge's state does not allow."""
