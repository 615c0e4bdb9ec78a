"""The producer side: the failure notices owed, from the topology and each write's outcome."""

from __future__ import annotations

import pytest

import kvdrain
from kvdrain import PushPlan, failure_notices, plan_outcomes, producers_of


def test_equal_tp_each_rank_writes_its_own() -> None:
    plan = PushPlan("r", p_tp=2, d_tp=2, d_agents=["D0", "D1"], tp_rank=1)
    assert plan.targets == [1]
    assert plan.edges == [(1, "planned")]


def test_smaller_producer_tp_writes_head_slices_to_several_ranks() -> None:
    plan = PushPlan("r", p_tp=1, d_tp=4, d_agents=["D0", "D1", "D2", "D3"], tp_rank=0)
    assert plan.targets == [0, 1, 2, 3]


def test_posted_write_with_backend_error_owes_push_fail() -> None:
    owed = failure_notices(
        "cmpl-1",
        {0: "landed", 1: "backend_error"},
        p_tp=1,
        d_tp=2,
        d_agents=["D0", "D1"],
        tp_rank=0,
    )
    assert owed == [("D1", b"PUSH_FAIL:cmpl-1:1")]
    # "failed" is the older name of the same outcome.
    assert owed == failure_notices(
        "cmpl-1", {0: "landed", 1: "failed"}, p_tp=1, d_tp=2, d_agents=["D0", "D1"], tp_rank=0
    )
    plan = plan_outcomes(
        "cmpl-1", {0: "landed", 1: "backend_error"}, p_tp=1, d_tp=2, d_agents=["D0", "D1"],
        tp_rank=0,
    )
    assert plan.edges == [(0, "landed"), (1, "failed_posted")]
    assert plan.is_terminal  # the error bounds the write: the sources may be released


def test_posted_write_with_unknown_status_owes_nothing_and_is_not_terminal() -> None:
    kw: dict[str, object] = dict(p_tp=1, d_tp=2, d_agents=["D0", "D1"], tp_rank=0)
    outcomes: dict[int, kvdrain.Outcome] = {0: "landed", 1: "status_unknown"}
    assert failure_notices("r", outcomes, **kw) == []  # type: ignore[arg-type]
    plan = plan_outcomes("r", outcomes, **kw)  # type: ignore[arg-type]
    assert plan.edges == [(0, "landed"), (1, "unknown")]
    assert not plan.is_terminal and not plan.all_landed  # sources stay fenced
    assert plan.owed_notices() == []
    assert not plan.may_post(1)  # retired, and already posted


def test_unknown_status_then_backend_error_owes_one_notice() -> None:
    plan = PushPlan("r", p_tp=1, d_tp=1, d_agents=["D0"], tp_rank=0)
    plan.posted(0)
    plan.status_unknown(0)
    plan.status_unknown(0)  # repeated: no-op
    assert plan.owed_notices() == [] and not plan.is_terminal
    plan.backend_error(0)  # another transfer to D0 failed: this write is bounded too
    assert plan.edges == [(0, "failed_posted")] and plan.is_terminal
    assert plan.take_owed_notices() == [("D0", b"PUSH_FAIL:r:1")]
    assert plan.owed_notices() == []


def test_landed_after_unknown_owes_nothing_and_is_terminal() -> None:
    plan = plan_outcomes(
        "r", {0: "landed_after_unknown"}, p_tp=2, d_tp=1, d_agents=["D0"], tp_rank=1
    )
    assert plan.edges == [(0, "landed")]
    assert plan.is_terminal and plan.all_landed and plan.owed_notices() == []
    direct = PushPlan("r", p_tp=1, d_tp=1, d_agents=["D0"], tp_rank=0)
    direct.posted(0)
    direct.status_unknown(0)
    with pytest.raises(kvdrain.PlanError):
        direct.landed(0)  # only landed_after_unknown accepts an unknown write
    direct.landed_after_unknown(0)
    assert direct.all_landed
    with pytest.raises(kvdrain.PlanError):
        direct.backend_error(0)  # landed is final


def test_never_posted_edges_owe_at_once_next_to_an_unknown_write() -> None:
    """A never-posted edge is owed its notice now, even while a sibling write's status
    is unknown (the plan is not terminal, but the notices need not wait)."""
    plan = plan_outcomes(
        "r",
        {0: "status_unknown", 1: "post_failed"},  # rank 2, 3: never attempted
        p_tp=1,
        d_tp=4,
        d_agents=["D0", "D1", "D2", "D3"],
        tp_rank=0,
    )
    assert not plan.is_terminal
    assert [a for a, _ in plan.take_owed_notices()] == ["D1", "D2", "D3"]
    assert plan.edges == [(0, "unknown"), (1, "noticed"), (2, "noticed"), (3, "noticed")]


def test_unposted_and_unattempted_writes_owe_push_fail() -> None:
    owed = failure_notices(
        "r:with:colons",
        {0: "post_failed"},  # ranks 1..3 never attempted: the loop unwound
        p_tp=1,
        d_tp=4,
        d_agents=["D0", "D1", "D2", "D3"],
        tp_rank=0,
    )
    assert [a for a, _ in owed] == ["D0", "D1", "D2", "D3"]
    assert {m for _, m in owed} == {b"PUSH_FAIL:r:with:colons:1"}


def test_unreachable_consumer_is_owed_nothing() -> None:
    owed = failure_notices(
        "r", {0: "unreachable", 1: "failed"}, p_tp=1, d_tp=2, d_agents=[None, "D1"], tp_rank=0
    )
    assert owed == [("D1", b"PUSH_FAIL:r:1")]


def test_all_landed_owes_nothing_and_is_terminal() -> None:
    plan = PushPlan("r", p_tp=2, d_tp=1, d_agents=["D0"], tp_rank=0, p_pp=2, pp_stage=1)
    assert plan.may_post(0)
    plan.posted(0)
    assert not plan.is_terminal and not plan.may_post(0)
    plan.landed(0)
    assert plan.is_terminal and plan.all_landed and plan.take_owed_notices() == []


def test_retired_plan_refuses_posts_f4() -> None:
    plan = PushPlan("r", p_tp=1, d_tp=1, d_agents=["D0"], tp_rank=0)
    plan.retire()
    assert not plan.may_post(0)
    with pytest.raises(kvdrain.PlanError):
        plan.posted(0)
    assert plan.take_owed_notices() == [("D0", b"PUSH_FAIL:r:1")]
    assert plan.edges == [(0, "noticed")]
    with pytest.raises(kvdrain.PlanError):
        plan.noticed(0)  # never two notices for one edge


def test_each_notice_is_owed_once() -> None:
    plan = PushPlan("r", p_tp=1, d_tp=1, d_agents=["D0"], tp_rank=0)
    plan.posted(0)
    plan.failed(0)
    assert plan.edges == [(0, "failed_posted")]
    assert plan.owed_notices() == plan.owed_notices() == [("D0", b"PUSH_FAIL:r:1")]
    plan.noticed(0)
    assert plan.owed_notices() == []


@pytest.mark.parametrize(
    ("d_rank", "kwargs", "producers"),
    [
        (1, dict(p_tp=2, d_tp=2), [(0, 1)]),
        (0, dict(p_tp=2, d_tp=1), [(0, 0), (0, 1)]),
        (1, dict(p_tp=4, d_tp=2), [(0, 2), (0, 3)]),
        (1, dict(p_tp=1, d_tp=2), [(0, 0)]),
        (3, dict(p_tp=2, d_tp=4), [(0, 1)]),
        (0, dict(p_tp=2, d_tp=1, p_pp=2), [(0, 0), (0, 1), (1, 0), (1, 1)]),
        (0, dict(p_tp=2, d_tp=1, mla=True), [(0, 0), (0, 1)]),
    ],
)
def test_producers_of_a_consumer_rank(
    d_rank: int, kwargs: dict[str, object], producers: list[tuple[int, int]]
) -> None:
    assert producers_of(d_rank, **kwargs) == producers  # type: ignore[arg-type]


@pytest.mark.parametrize(("p_tp", "d_tp", "p_pp"), [(1, 1, 1), (2, 1, 2), (1, 4, 1), (4, 2, 1), (2, 8, 3)])
def test_producers_of_is_the_inverse_of_each_plans_targets(p_tp: int, d_tp: int, p_pp: int) -> None:
    agents: list[str | None] = [f"D{d}" for d in range(d_tp)]
    writes = {
        (stage, p, d)
        for stage in range(p_pp)
        for p in range(p_tp)
        for d in PushPlan(
            "r", p_tp=p_tp, d_tp=d_tp, d_agents=agents, tp_rank=p, p_pp=p_pp, pp_stage=stage
        ).targets
    }
    assert writes == {
        (stage, p, d)
        for d in range(d_tp)
        for stage, p in producers_of(d, p_tp=p_tp, d_tp=d_tp, p_pp=p_pp)
    }


@pytest.mark.parametrize(
    ("d_rank", "kwargs"),
    [
        (0, dict(p_tp=0, d_tp=1)),
        (0, dict(p_tp=3, d_tp=2)),
        (2, dict(p_tp=2, d_tp=2)),
        (-1, dict(p_tp=1, d_tp=1)),
        (True, dict(p_tp=1, d_tp=1)),
        (0, dict(p_tp=1, d_tp=1, p_pp=0)),
    ],
)
def test_producers_of_refuses_bad_topologies(d_rank: int, kwargs: dict[str, object]) -> None:
    with pytest.raises(kvdrain.TopologyError):
        producers_of(d_rank, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(p_tp=0, d_tp=1, d_agents=["D0"], tp_rank=0),
        dict(p_tp=3, d_tp=2, d_agents=["D0", "D1"], tp_rank=0),
        dict(p_tp=2, d_tp=1, d_agents=["D0"], tp_rank=2),
        dict(p_tp=1, d_tp=1, d_agents=["D0"], tp_rank=0, pp_stage=1),
        dict(p_tp=1, d_tp=2, d_agents=["D0"], tp_rank=0),
    ],
)
def test_bad_topologies_raise(kwargs: dict[str, object]) -> None:
    with pytest.raises(kvdrain.TopologyError):
        PushPlan("r", **kwargs)  # type: ignore[arg-type]


def test_misuse_raises_plan_error() -> None:
    plan = PushPlan("r", p_tp=1, d_tp=1, d_agents=["D0"], tp_rank=0)
    with pytest.raises(kvdrain.PlanError):
        plan.landed(0)  # not posted
    with pytest.raises(kvdrain.PlanError):
        plan.posted(5)  # no such edge
    with pytest.raises(kvdrain.PlanError):
        plan.posted(-1)
    with pytest.raises(kvdrain.PlanError):
        failure_notices("r", {3: "landed"}, p_tp=1, d_tp=1, d_agents=["D0"], tp_rank=0)
    with pytest.raises(kvdrain.InvalidRequestIdError):
        PushPlan("", p_tp=1, d_tp=1, d_agents=["D0"], tp_rank=0)
    with pytest.raises(kvdrain.PlanError):
        failure_notices(
            "r", {0: "vanished"}, p_tp=1, d_tp=1, d_agents=["D0"], tp_rank=0  # type: ignore[dict-item]
        )
    with pytest.raises(kvdrain.PlanError):
        plan.status_unknown(0)  # not posted
    with pytest.raises(kvdrain.PlanError):
        plan.backend_error(0)  # not posted
