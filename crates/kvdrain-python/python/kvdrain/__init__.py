"""kvdrain: exact completion, failure and block-release decisions for KV-cache blocks
that prefill producers push into a decode node over NIXL (vLLM push mode).

The consumer side is :class:`Ledger`; the producer side is :class:`PushPlan` (and
:func:`failure_notices`, :func:`plan_outcomes`); :mod:`kvdrain.vllm.connector` is the vLLM 0.33
connector plugin built on both (``KvdrainPushConnector``).

::

    ledger = kvdrain.Ledger(capacity=4096)
    ledger.register("cmpl-1-0", blocks=[7, 8], expect=2)      # engine thread
    back = ledger.feed(nixl.get_new_notifs())                  # writer thread
    for d in ledger.poll() + ledger.advance(now_ms):           # engine thread
        ...  # d.kind, d.request_id, d.blocks
"""

from __future__ import annotations

from kvdrain._errors import (
    AllocError,
    ClockBackwardsError,
    ConfigError,
    DuplicateRequestError,
    FullError,
    InvalidArgumentError,
    InvalidExpectError,
    InvalidRequestIdError,
    KvdrainError,
    PlanError,
    TopologyError,
    UnknownRequestError,
)
from kvdrain._kvdrain import (
    MAX_EDGES,
    TABLE_SIZES,
    Decision,
    Ledger,
    PushPlan,
    Record,
    __version__,
    encode_cancel,
    parse_cancel,
    producers_of,
)
from kvdrain._producer import Outcome, failure_notices, plan_outcomes

__all__ = [
    "MAX_EDGES",
    "TABLE_SIZES",
    "AllocError",
    "ClockBackwardsError",
    "ConfigError",
    "Decision",
    "DuplicateRequestError",
    "FullError",
    "InvalidArgumentError",
    "InvalidExpectError",
    "InvalidRequestIdError",
    "KvdrainError",
    "Ledger",
    "Outcome",
    "PlanError",
    "PushPlan",
    "Record",
    "TopologyError",
    "UnknownRequestError",
    "encode_cancel",
    "failure_notices",
    "parse_cancel",
    "plan_outcomes",
    "producers_of",
    "__version__",
]
