"""The prefill and the decode side together, under generated scenarios and an oracle.

vLLM's real prefill engine (scheduler and push workers) and real decode engine,
wired by a fake NIXL whose WRITEs land block by block after a delay
(:mod:`pd_world`); the scenarios and the oracle are :mod:`pd_oracle`'s. Every scenario
runs through the plugin on both sides and through vLLM's own connector on both sides
(the control). Reproduce one with ``pd_oracle.generate(seed, kind).describe()`` and
``pd_oracle.run(scenario, which)``.

Two sets, each judged on the plugin with 0 violations of every kind: ``base`` (the
producer gets each request before the decode engine's deadline, no pause in the decode
engine's steps spans a deadline) and ``late``, which reaches the two ways a producer
wrote into blocks the decode engine gave back before the registration had a lifetime
and the decode side stopped sending heartbeats for decided receives (a registration
the producer keeps with no age limit; a heartbeat sent in the step where the deadline
fires). The two smallest scenarios of each hole are kept below, directed. Every
scenario runs with settings the plugin accepts at load: a refused one would judge
nothing.
"""

from __future__ import annotations

from collections import Counter
from functools import cache

import pd_oracle as o
import pytest
from harness import CONTROL, PLUGIN
from pd_world import Timing, WritePlan

BASE_SEEDS = range(60)
LATE_SEEDS = range(36)
SEEDS: dict[o.Kind, range] = {"base": BASE_SEEDS, "late": LATE_SEEDS}


@cache
def results(which: str, kind: o.Kind) -> tuple[o.Result, ...]:
    out = tuple(o.run(o.generate(seed, kind), which) for seed in SEEDS[kind])
    o.SUMMARY.record(which, kind, out)
    refused = [r.notes[0] for r in out if r.refused]
    assert not refused, f"{which} {kind}: {len(refused)} scenarios refused at load: {refused[0]}"
    # A world whose WRITEs never reach the fake NIXL would judge nothing: most base
    # scenarios post, and some late ones (most of those post nothing, rightly).
    posting = sum(r.writes > 0 for r in out)
    assert posting >= (len(out) // 2 if kind == "base" else 3), (which, kind, posting)
    return out


def total(rs: tuple[o.Result, ...]) -> Counter[str]:
    c: Counter[str] = Counter()
    for r in rs:
        c.update(r.violations)
    return c


def report(rs: tuple[o.Result, ...]) -> str:
    bad = [r for r in rs if r.violations]
    return "\n\n".join(r.scenario.describe() + "\n  -> " + "\n  -> ".join(r.notes) for r in bad[:3])


def test_generation_is_deterministic_and_covers_the_space() -> None:
    for kind, seeds in SEEDS.items():
        for seed in list(seeds)[:5]:
            assert o.generate(seed, kind) == o.generate(seed, kind)
    base = [o.generate(s, "base") for s in BASE_SEEDS]
    late = [o.generate(s, "late") for s in LATE_SEEDS]
    both = base + late
    assert {(sc.p_tp, sc.d_tp) for sc in base} == set(o.TOPOLOGIES)
    plans = {e.plan.fate for sc in both for r in sc.reqs for e in r.edges}
    assert plans == {"ok", "post_fail", "error", "err_state"}
    assert any(e.plan.duration_ms >= 300 for sc in both for r in sc.reqs for e in r.edges)
    assert any(r.d_abort_at is not None for sc in both for r in sc.reqs)
    assert any(r.p_abort_at is not None for sc in both for r in sc.reqs)
    assert any(r.reg_delay_ms > o.LATENCY_MS for sc in both for r in sc.reqs)
    assert any(sc.evict_at is not None for sc in both)
    assert any(sc.handshake_ms for sc in both)
    assert any(sc.p_pauses for sc in both) and any(sc.d_pauses for sc in both)
    assert any(sc.d_slow for sc in both) and any(sc.p_slow for sc in both)
    assert {sc.timing.lease_s for sc in both} == {1, 3}
    # What reaches hole 1: a prefill queued past the decode engine's deadline plus its
    # quarantine. What reaches hole 2: a pause in the decode engine's steps across the
    # deadline, with a handshake that completes after the quarantine.
    assert any(
        r.p_at - r.d_at > sc.timing.deadline_ms + sc.timing.quarantine_ms for sc in late for r in sc.reqs
    )
    assert any(
        any(a < r.d_at + sc.timing.deadline_ms < b for a, b in sc.d_pauses)
        and sc.handshake_ms > sc.timing.deadline_ms + sc.timing.quarantine_ms - r.p_at
        for sc in late
        for r in sc.reqs
    )


def test_plugin_has_no_violations() -> None:
    rs = results(PLUGIN, "base")
    assert total(rs) == Counter(), report(rs)


def test_plugin_has_no_violations_when_the_producer_is_late() -> None:
    rs = results(PLUGIN, "late")
    assert total(rs) == Counter(), report(rs)


def hole_of(sc: o.Scenario, rid: str) -> int:
    """Which hole a request's late lands come through: 1 if the producer got it after
    the decode engine's deadline (a registration kept since before), 2 if its own lease
    ended before the quarantine did (only a heartbeat can have kept it posting), else 0."""
    t = sc.timing
    r = next(r for r in sc.reqs if r.rid == rid)
    if r.p_at > r.d_at + t.deadline_ms:
        return 1
    if r.p_at + t.lease_s * 1000 < r.d_at + t.deadline_ms + t.quarantine_ms:
        return 2
    return 0


def test_plugin_late_set_lands_nothing_late_through_either_hole() -> None:
    """No block of the late set lands late, through either hole, and the set reaches
    both: requests the producer gets past the deadline (hole 1) and producers whose own
    lease ends before the quarantine (hole 2, only a heartbeat could keep them posting)."""
    rs = results(PLUGIN, "late")
    holes = Counter(hole_of(r.scenario, rid) for r in rs for rid in r.late_rids)
    assert total(rs)["late_land"] == 0 and not holes, report(rs)
    reached = Counter(hole_of(r.scenario, q.rid) for r in rs for q in r.scenario.reqs)
    assert reached[1] > 0 and reached[2] > 0, reached


def test_control_hangs_and_leaks() -> None:
    """vLLM's own connector on both sides, same scenarios: it hangs (a decode request
    waits forever for a WRITE that failed or never came), it leaks (blocks never go
    back), it frees source blocks under a WRITE still reading them and sends no
    PUSH_FAIL: the oracle can fail, so the plugin's 0 means something."""
    c = total(results(CONTROL, "base")) + total(results(CONTROL, "late"))
    for kind in ("hang", "leak", "source_freed_early", "notice_missing"):
        assert c[kind] > 0, (kind, c)
    # vLLM 0.33 keeps a receive's blocks until its KV arrives, aborted or not: it never
    # gives a block back that a WRITE can still reach, so nothing lands late.
    assert c["late_land"] == 0, c


# -- the two holes, directed ------------------------------------------------------ #

OK = WritePlan("ok", 100)

# Hole 1: lease 1 s, deadline 500 ms, quarantine 2 000 ms (the smallest the plugin
# accepts: the lease plus the 1 000 ms margin). The decode engine registers r00 at 0;
# its deadline fires at 500; the quarantine ends at 2 500 and the block pool takes the
# blocks back; another request (x0) takes blocks at 2 600. The prefill engine gets r00
# at 2 950 (its queue was full) and prefills it; with the registration it kept since 0
# it would post at 3 000, the blocks landing by 3 100. The registration's lifetime
# (500 ms) ended long before: nothing is posted, the PUSH_FAIL is owed.
HOLE_1 = o.Scenario(
    -1,
    "late",
    1,
    1,
    Timing(1, 500, 2000, 300),
    (o.Req("r00", 0, 2950, o.LATENCY_MS, (o.Edge(0, 0, OK),)),),
    extra_d=(("x0", 2600),),
)
# The same with the prefill done before the deadline: nothing late.
HOLE_1_IN_TIME = o.Scenario(
    -1,
    "base",
    1,
    1,
    Timing(1, 500, 2000, 300),
    (o.Req("r00", 0, 200, o.LATENCY_MS, (o.Edge(0, 0, OK),)),),
    extra_d=(("x0", 2600),),
)

# Hole 2: lease 3 s, deadline 1 000 ms, quarantine 4 001 ms (the lease plus the margin,
# under 5/3 of the lease). The prefill engine finishes r00 at 0 (its lease runs to
# 3 000), but its handshake with the decode engine completes only at 5 200 (vLLM defers
# the WRITE). The decode engine does not step between 900 and 3 500; its step at 3 500
# fires the deadline, and a heartbeat sent for r00 in that step would move the
# producer's lease to 5 500. The quarantine ends at 5 001, the blocks go back at 5 050,
# and at 5 200 that producer would post into them. No heartbeat goes for a decided
# receive (and the registration's lifetime ended at 1 000): nothing is posted.
HOLE_2 = o.Scenario(
    -2,
    "late",
    1,
    1,
    Timing(3, 1000, 4001, 300),
    (o.Req("r00", 0, 0, o.LATENCY_MS, (o.Edge(0, 0, OK),)),),
    handshake_ms=5150,
    d_pauses=((900, 3500),),
)
# The same with no gap in the decode engine's steps: nothing late.
HOLE_2_NO_GAP = o.Scenario(
    -2,
    "base",
    1,
    1,
    Timing(3, 1000, 4001, 300),
    (o.Req("r00", 0, 0, o.LATENCY_MS, (o.Edge(0, 0, OK),)),),
    handshake_ms=5150,
)

HOLES = [pytest.param(HOLE_1, id="hole1_registration_kept"), pytest.param(HOLE_2, id="hole2_heartbeat_at_deadline")]


@pytest.mark.parametrize("sc", HOLES)
def test_hole(sc: o.Scenario) -> None:
    """Nothing lands late: the producer posts nothing at all, where vLLM's own
    connector on both sides posts the WRITE (and keeps the blocks, never giving them
    back)."""
    r = o.run(sc, PLUGIN)
    assert not r.refused, r.notes
    assert r.violations == Counter(), sc.describe() + "\n" + "\n".join(r.notes)
    assert r.writes == 0
    assert o.run(sc, CONTROL).writes == 1


@pytest.mark.parametrize(
    ("sc", "writes"),
    [
        # Prefilled in time: the WRITE is posted and lands before the deadline.
        pytest.param(HOLE_1_IN_TIME, 1, id="hole1_in_time"),
        # The handshake completes after the registration's lifetime: nothing is posted.
        pytest.param(HOLE_2_NO_GAP, 0, id="hole2_no_gap"),
    ],
)
def test_hole_scenarios_without_the_trigger_pass(sc: o.Scenario, writes: int) -> None:
    r = o.run(sc, PLUGIN)
    assert r.violations == Counter(), sc.describe() + "\n" + "\n".join(r.notes)
    assert r.writes == writes
