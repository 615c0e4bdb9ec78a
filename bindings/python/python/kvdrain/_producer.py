"""The failure notices a producer rank owes, from each write's outcome."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from kvdrain._errors import PlanError
from kvdrain._kvdrain import PushPlan

Outcome = Literal["landed", "failed", "post_failed", "unreachable"]
"""What became of one WRITE:

* ``"landed"``: posted, and the initiator saw it succeed;
* ``"failed"``: posted, then a backend error (it may have written part; a ``PUSH_FAIL`` is
  owed);
* ``"post_failed"``: never posted (descriptor or post error; nothing was sent);
* ``"unreachable"``: the consumer rank cannot be named; no notice can be sent.

A target missing from the outcomes was never attempted (the loop unwound): the plan is
retired and it is owed a notice. Further outcomes (an ``"unknown"`` one, for a write whose
fate the transport cannot tell) are added to this literal when the core plans them.
"""


def failure_notices(
    request_id: str,
    outcomes: Mapping[int, Outcome],
    *,
    p_tp: int,
    d_tp: int,
    d_agents: Sequence[str | None],
    tp_rank: int,
    p_pp: int = 1,
    pp_stage: int = 0,
    mla: bool = False,
) -> list[tuple[str, bytes]]:
    """The ``(consumer agent, b"PUSH_FAIL:REQ:TP")`` notices producer rank
    ``(pp_stage, tp_rank)`` owes for ``request_id``, given what became of the WRITE to
    each consumer rank it targets (``outcomes[d_rank]``).

    Raises :class:`~kvdrain.TopologyError` for an unusable topology and
    :class:`~kvdrain.PlanError` for an outcome given for a rank this producer does not
    write.
    """
    plan = PushPlan(
        request_id,
        p_tp=p_tp,
        d_tp=d_tp,
        d_agents=list(d_agents),
        tp_rank=tp_rank,
        p_pp=p_pp,
        pp_stage=pp_stage,
        mla=mla,
    )
    targets = set(plan.targets)
    for d_rank, outcome in outcomes.items():
        if d_rank not in targets:
            plan.posted(d_rank)  # raises PlanError naming the unknown edge
        if outcome == "landed":
            plan.posted(d_rank)
            plan.landed(d_rank)
        elif outcome == "failed":
            plan.posted(d_rank)
            plan.failed(d_rank)
        elif outcome == "post_failed":
            plan.post_failed(d_rank)
        elif outcome == "unreachable":
            plan.unreachable(d_rank)
        else:
            raise PlanError(f"unknown outcome {outcome!r}")
    plan.retire()
    return plan.take_owed_notices()
