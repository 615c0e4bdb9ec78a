"""A prefill rank (P TP 2 -> D TP 1) working out the PUSH_FAIL notices it owes."""

from __future__ import annotations

import kvdrain

plan = kvdrain.PushPlan("cmpl-1-0", p_tp=2, d_tp=1, d_agents=["decode-0"], tp_rank=1)
for d_rank in plan.targets:
    if plan.may_post(d_rank):
        plan.posted(d_rank)
        plan.failed(d_rank)  # the backend reported an error after posting
for agent, notice in plan.take_owed_notices():
    print(f"send_notif({agent!r}, {notice!r})")
assert plan.is_terminal  # the source blocks may be released now

# The same from a table of outcomes:
print(
    kvdrain.failure_notices(
        "cmpl-1-0", {0: "post_failed"}, p_tp=2, d_tp=1, d_agents=["decode-0"], tp_rank=0
    )
)
