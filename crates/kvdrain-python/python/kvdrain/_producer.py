"""The failure notices a producer rank owes, from each write's outcome."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from kvdrain._errors import PlanError
from kvdrain._kvdrain import PushPlan

Outcome = Literal[
    "landed",
    "backend_error",
    "status_unknown",
    "landed_after_unknown",
    "post_failed",
    "unreachable",
    "failed",
]
"""What became of one WRITE. Only ``Success`` proves a posted write is over and only a
backend error bounds it, so the outcomes of a posted write are kept apart:

* ``"landed"``: posted, and the initiator saw it succeed; nothing is owed;
* ``"backend_error"``: posted, then a backend error (its own, or another transfer's to the
  same consumer agent): nothing more of it lands; one ``PUSH_FAIL`` is owed (it may have
  written part: the consumer settles its blocks);
* ``"status_unknown"``: posted, and its status can no longer be read (NIXL ``NOT_FOUND``
  the producer did not cause): it may still be landing. **Nothing is owed** and the edge
  is not terminal: the source blocks stay fenced and the consumer's deadline decides;
* ``"landed_after_unknown"``: its status was unknown, then it reported success; nothing is
  owed;
* ``"post_failed"``: never posted (descriptor or post error; nothing was sent): a
  ``PUSH_FAIL`` is owed at once;
* ``"unreachable"``: the consumer rank cannot be named; no notice can be sent;
* ``"failed"``: the older name of ``"backend_error"``.

A target missing from the outcomes was never attempted (the loop unwound or the request
ended): the plan is retired and it is owed a ``PUSH_FAIL`` at once.
"""


def plan_outcomes(
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
) -> PushPlan:
    """The retired :class:`PushPlan` of producer rank ``(pp_stage, tp_rank)`` for
    ``request_id`` after the outcome of the WRITE to each consumer rank it targets
    (``outcomes[d_rank]``): its ``owed_notices()`` are the notices owed, its
    ``is_terminal`` says whether the source blocks may be released (not while a write's
    status is unknown), its ``edges`` where each write stands.

    Raises :class:`~kvdrain.TopologyError` for an unusable topology and
    :class:`~kvdrain.PlanError` for an outcome given for a rank this producer does not
    write, or one that is not an :data:`Outcome`.
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
        if outcome == "post_failed":
            plan.post_failed(d_rank)
            continue
        if outcome == "unreachable":
            plan.unreachable(d_rank)
            continue
        if outcome not in ("landed", "backend_error", "failed", "status_unknown",
                           "landed_after_unknown"):
            raise PlanError(f"unknown outcome {outcome!r}")
        plan.posted(d_rank)
        if outcome == "landed":
            plan.landed(d_rank)
        elif outcome in ("backend_error", "failed"):
            plan.backend_error(d_rank)
        elif outcome == "status_unknown":
            plan.status_unknown(d_rank)
        else:
            plan.status_unknown(d_rank)
            plan.landed_after_unknown(d_rank)
    plan.retire()
    return plan


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
    each consumer rank it targets (``outcomes[d_rank]``): one per backend error, never-posted
    or never-attempted edge whose agent is known; none for a write whose status is unknown.
    Use :func:`plan_outcomes` to also learn whether the source blocks may be released.

    Raises as :func:`plan_outcomes`.
    """
    plan = plan_outcomes(
        request_id,
        outcomes,
        p_tp=p_tp,
        d_tp=d_tp,
        d_agents=d_agents,
        tp_rank=tp_rank,
        p_pp=p_pp,
        pp_stage=pp_stage,
        mla=mla,
    )
    return plan.take_owed_notices()
