"""Generated decode-side scenarios and an independent oracle for them.

A :class:`Scenario` is drawn from a seed (``generate``): a topology (P TP against D
world), requests overlapping in time, and per request and per (P rank -> D rank) edge
what the producer does (complete, fail, duplicate, stay silent, ...), plus aborts, a
lost producer, strays, garbage, clock gaps and slow steps. :func:`run` plays it on vLLM
0.33's real ``Scheduler`` and workers (``harness.DecodeEngine``) and checks what the
scheduler did against the ground truth of the writes (:func:`run` returns the
violations by kind). The oracle knows nothing of the plugin: it knows which writes
exist, until when each may still land, and what vLLM's scheduler did with the blocks.

Ground truth of a write (one edge, into one D rank's copy of the request's blocks):

* it exists iff some D rank's ``PUSH_REG`` for the request reached P (P writes every
  rank once one registration arrived);
* a completion notice: the write landed in full by the notice's arrival;
* a ``PUSH_FAIL`` notice: the write may land until the notice's arrival + ``settle_ms``;
* a producer that never reports: until the quarantine (abort or deadline +
  ``quarantine_ms``; a producer's lease is shorter than the quarantine);
* a lost producer (its ``PUSH_REG`` send raised): until the loss + ``settle_ms``;
* every notice is dated at the latest moment it can have arrived: the clock when the
  writer round that fed it ran; the bound of a request is the latest of its edges',
  never past its quarantine's end.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from harness import DecodeEngine, d_request, sources
from vllm.v1.request import RequestStatus

from kvdrain.vllm._settings import Settings

SETTLE_MS = 500
QUARANTINE_MS = 3_000
DEADLINE_MS = 2_000
BIG_CAPACITY = 256
TOPOLOGIES = [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (4, 2)]  # (P TP, D world)

Fate = Literal["complete", "fail", "dup", "silent", "fail_late", "complete_latefail"]
FATES: tuple[Fate, ...] = ("complete", "fail", "dup", "silent", "fail_late", "complete_latefail")
FATE_WEIGHTS = (50, 14, 10, 8, 6, 6)
Kind = Literal["base", "slow", "full"]
StrayKind = Literal["ghost", "garbage", "nocolon", "freed"]

VIOLATIONS = (
    "assert",  # an exception out of a worker or the scheduler (Step.error)
    "early_free",  # blocks back in the pool while a write into them may still land
    "early_complete",  # completed before every expected write landed
    "wrong_outcome",  # failed although every write landed in time (no full table)
    "two_outcomes",  # completed and failed
    "missed_deadline",  # still waiting after the first step at/after its deadline
    "double_report",  # one rank reported the request to the scheduler twice
    "invalid_twice",  # one rank reported the request's blocks invalid twice
    "invalid_missing",  # failed, its blocks never reported invalid
    "hang",  # still held by the scheduler at the end (past every quarantine)
    "leak",  # the pool did not get every block back by the end
)


@dataclass(frozen=True)
class Edge:
    d: int  # D rank
    p: int  # P rank (agent f"P{p}")
    fate: Fate
    at: int  # steps after the registration step: the first notice
    late_at: int  # steps after the registration step: the second notice (dup, *_late*)


@dataclass(frozen=True)
class Req:
    rid: str
    reg_step: int
    edges: tuple[Edge, ...]
    abort_at: int | None  # absolute step before which the client aborts
    lose: int | None  # P rank whose agent is unreachable from this registration on


@dataclass(frozen=True)
class Stray:
    step: int
    d: int
    kind: StrayKind
    agent: str


@dataclass(frozen=True)
class Scenario:
    seed: int
    kind: Kind
    p_tp: int
    d_tp: int
    capacity: int
    reqs: tuple[Req, ...]
    gaps: dict[int, int]  # step -> ms the clock moves before the step (idle engine)
    jumps: dict[int, int]  # step -> ms the clock moves inside it, before the writer round
    strays: tuple[Stray, ...]
    n_steps: int  # steps with events; a tail runs past every quarantine after them

    def describe(self) -> str:
        lines = [
            f"scenario seed={self.seed} kind={self.kind} P_TP={self.p_tp} "
            f"D_world={self.d_tp} capacity={self.capacity} steps={self.n_steps} "
            f"(settle={SETTLE_MS} quarantine={QUARANTINE_MS} deadline={DEADLINE_MS} ms)"
        ]
        for r in self.reqs:
            extra = []
            if r.abort_at is not None:
                extra.append(f"abort before step {r.abort_at}")
            if r.lose is not None:
                extra.append(f"P{r.lose} unreachable from here")
            lines.append(f"  {r.rid}: registers at step {r.reg_step} {'; '.join(extra)}")
            for e in r.edges:
                lines.append(f"    P{e.p}->D{e.d}: {e.fate} at +{e.at} (second +{e.late_at})")
        if self.gaps:
            lines.append(f"  gaps before step: {dict(sorted(self.gaps.items()))}")
        if self.jumps:
            lines.append(f"  slow steps (jump before writer round): {dict(sorted(self.jumps.items()))}")
        for s in self.strays:
            lines.append(f"  stray at step {s.step} to D{s.d} from {s.agent}: {s.kind}")
        return "\n".join(lines)


def _fail_steps(reqs: tuple[Req, ...]) -> set[int]:
    """Steps at which some PUSH_FAIL is planned."""
    out: set[int] = set()
    for r in reqs:
        for e in r.edges:
            if e.fate in ("fail", "fail_late"):
                out.add(r.reg_step + e.at)
            if e.fate == "complete_latefail":
                out.add(r.reg_step + e.late_at)
    return out


def generate(seed: int, kind: Kind) -> Scenario:
    """The scenario of ``seed`` (deterministic). ``base``: clock gaps only before steps
    that feed no failure notice and apply no abort; ``slow``: in addition the clock
    jumps by hundreds of ms inside steps that feed failure notices and before steps that
    apply aborts; ``full``: D world 2 with a capacity of 1 or 2 per rank."""
    rng = random.Random(f"{kind}-{seed}")
    if kind == "full":
        p_tp, d_tp = rng.choice([(1, 2), (2, 2), (4, 2)])
        capacity = rng.choice([1, 1, 2])
    else:
        p_tp, d_tp = TOPOLOGIES[seed % len(TOPOLOGIES)]
        # A full table on a D world of 1 only: with 2 ranks that is the ``full`` set.
        small = d_tp == 1 and rng.random() < 0.3
        capacity = rng.choice([1, 2]) if small else BIG_CAPACITY
    n_req = rng.randint(2, 5)
    reg_steps = sorted(rng.randint(0, 10) for _ in range(n_req))
    reqs: list[Req] = []
    lose_idx = rng.randrange(1, n_req) if rng.random() < 0.2 else None
    for k, reg in enumerate(reg_steps):
        edges = []
        for d in range(d_tp):
            for p in sources(d, d_tp, p_tp):
                fate = rng.choices(FATES, FATE_WEIGHTS)[0]
                at = rng.randint(1, 6)
                edges.append(Edge(d, p, fate, at, at + rng.randint(0 if fate == "dup" else 1, 3)))
        abort_at = reg + rng.randint(1, 8) if rng.random() < 0.25 else None
        lose = rng.randrange(p_tp) if k == lose_idx else None
        reqs.append(Req(f"r{k:02d}", reg, tuple(edges), abort_at, lose))
    n_steps = max(r.reg_step + max(e.late_at for e in r.edges) for r in reqs) + 2
    strays = []
    for _ in range(rng.randint(0, 4)):
        strays.append(
            Stray(
                rng.randrange(n_steps),
                rng.randrange(d_tp),
                rng.choice(["ghost", "garbage", "nocolon", "freed"]),
                f"P{rng.randrange(p_tp)}",
            )
        )
    rt = tuple(reqs)
    quiet_forbidden = _fail_steps(rt) | {r.abort_at for r in rt if r.abort_at is not None}
    gaps: dict[int, int] = {}
    jumps: dict[int, int] = {}
    for step in range(1, n_steps):
        if step not in quiet_forbidden and rng.random() < 0.3:
            gaps[step] = rng.choice([20, 100, 300])
    if kind == "slow":
        for step in sorted(_fail_steps(rt)):
            if rng.random() < 0.7:
                jumps[step] = rng.randint(300, 700)
        for r in rt:
            if r.abort_at is not None and rng.random() < 0.7:
                gaps[r.abort_at] = rng.randint(300, 700)
    return Scenario(seed, kind, p_tp, d_tp, capacity, rt, gaps, jumps, tuple(strays), n_steps)


# -- the run and the oracle --------------------------------------------------------- #


@dataclass
class _ReqState:
    req: Req
    registered: bool = False
    blocks: set[int] = field(default_factory=set)
    pushed: bool = False
    t_reg_first: float = 0.0  # clock at the registration step's start
    t_reg_last: float = 0.0  # clock at its writer rounds (the latest registration)
    t_abort: float | None = None
    aborted_waiting: bool = False
    # edge (d, p) -> arrival of its first truthful notice: (clock, step)
    arrival: dict[tuple[int, int], tuple[float, float]] = field(default_factory=dict)
    lost_at: dict[int, float] = field(default_factory=dict)  # P rank -> loss time
    completed_step: int | None = None
    completed_t: float | None = None
    failed: bool = False
    freed_t: float | None = None
    freed_step: float = 0.0  # i - 0.5: in an abort before step i; i + 0.5: in step i
    invalid_steps: Counter[int] = field(default_factory=Counter)  # rank -> steps
    deadline_flagged: bool = False
    t_sched_failed: float | None = None  # when the scheduler finished it as failed


def _qend(st: _ReqState) -> float:
    start = st.t_reg_first + DEADLINE_MS / 1000
    if st.t_abort is not None and st.aborted_waiting:
        start = min(start, st.t_abort)
    if st.t_sched_failed is not None:
        # The scheduler gave the request up (one rank failed it): for every other rank
        # that is an abort, quarantined from then.
        start = min(start, st.t_sched_failed)
    return start + QUARANTINE_MS / 1000


def _bound(st: _ReqState) -> tuple[float, float]:
    """The latest moment a write into the request's blocks may land: (clock in s,
    step). Ordered as a tuple: a write landing in step 7's writer round lands after a
    free in step 5 even when the clock did not move; a settle or quarantine end is a
    time only (step -1: any step at that time may free)."""
    if not st.pushed:
        return (float("-inf"), -1.0)
    settle = SETTLE_MS / 1000
    worst = (float("-inf"), -1.0)
    for e in st.req.edges:
        key = (e.d, e.p)
        arrived = st.arrival.get(key)
        if arrived is not None:
            b = (arrived[0] + settle, -1.0) if e.fate in ("fail", "fail_late") else arrived
        elif e.p in st.lost_at:
            b = (st.lost_at[e.p] + settle, -1.0)
        else:
            b = (float("inf"), -1.0)  # never reported: until the quarantine
        worst = max(worst, b)
    return min(worst, (_qend(st), -1.0))


@dataclass
class Result:
    scenario: Scenario
    which: str
    violations: Counter[str]
    notes: list[str]


def run(sc: Scenario, which: str) -> Result:
    e = DecodeEngine(
        which,
        tp=sc.d_tp,
        p_tp=sc.p_tp,
        settings=Settings(DEADLINE_MS, QUARANTINE_MS, SETTLE_MS, sc.capacity),
    )
    total = e.free_blocks()
    viol: Counter[str] = Counter()
    notes: list[str] = []
    states = {r.rid: _ReqState(r) for r in sc.reqs}
    lost_since: dict[int, int] = {}  # P rank -> step its agent became unreachable
    t_writer: dict[int, float] = {}
    owner: dict[int, str] = {}  # block -> live request holding it
    step_start: dict[int, float] = {}

    def flag(kind: str, rid: str, why: str) -> None:
        viol[kind] += 1
        notes.append(f"{kind} {rid}: {why}")

    def note_freed(t: float, at_step: float) -> None:
        for rid, st in states.items():
            if st.registered and st.freed_t is None and rid not in e.scheduler.requests:
                st.freed_t = t
                st.freed_step = at_step
                for b in st.blocks:
                    if owner.get(b) == rid:
                        del owner[b]

    tail_until: float | None = None
    i = 0
    while True:
        in_body = i < sc.n_steps
        if in_body:
            e.clock.advance_ms(sc.gaps.get(i, 0))
        else:
            if tail_until is None:
                tail_until = e.clock() + (DEADLINE_MS + QUARANTINE_MS + 2 * SETTLE_MS) / 1000
            if e.clock() >= tail_until and i >= sc.n_steps + 30:
                break
            if e.clock() < tail_until:
                e.clock.advance_ms(250)
        now = e.clock()
        step_start[i] = now
        # aborts
        for st in states.values():
            r = st.req
            if r.abort_at == i and st.registered and r.rid in e.scheduler.requests:
                status = e.status(r.rid)
                if status is not None and RequestStatus.is_finished(status):
                    continue
                st.aborted_waiting = status == RequestStatus.WAITING_FOR_REMOTE_KVS
                st.t_abort = now
                e.abort(r.rid)
        note_freed(now, i - 0.5)
        # registrations
        new = [st for st in states.values() if st.req.reg_step == i]
        for st in new:
            if st.req.lose is not None:
                lost_since.setdefault(st.req.lose, i)
                for w in e.workers:
                    w.nixl_wrapper.unreachable[f"P{st.req.lose}"] = b"PUSH_REG:"
            e.add(d_request(st.req.rid, p_tp=sc.p_tp))
        # deliveries: each rank's batch, per sender agent
        jump = sc.jumps.get(i, 0)
        t_round = now + jump / 1000
        deliver: dict[int, dict[str, list[bytes]]] = {}

        def put(d: int, agent: str, msg: bytes) -> None:
            deliver.setdefault(d, {}).setdefault(agent, []).append(msg)

        for st in states.values():
            r = st.req
            if not st.registered or not st.pushed:
                continue
            for ed in r.edges:
                for which_notice, off in (("first", ed.at), ("second", ed.late_at)):
                    if r.reg_step + off != i:
                        continue
                    if which_notice == "second" and ed.fate not in (
                        "dup",
                        "fail_late",
                        "complete_latefail",
                    ):
                        continue
                    if ed.fate == "silent":
                        continue
                    if ed.p in lost_since and lost_since[ed.p] <= i:
                        continue  # a lost producer sends nothing more
                    if t_round >= _qend(st) - 0.001:
                        continue  # past the producer's lease: it writes nothing more
                    if which_notice == "first":
                        fail = ed.fate in ("fail", "fail_late")
                        st.arrival.setdefault((ed.d, ed.p), (t_round, float(i)))
                    else:
                        fail = ed.fate == "complete_latefail"
                    tag = "PUSH_FAIL:" if fail else ""
                    put(ed.d, f"P{ed.p}", f"{tag}{r.rid}:{sc.p_tp}".encode())
        for s in sc.strays:
            if s.step != i:
                continue
            if s.kind == "ghost":
                put(s.d, s.agent, f"ghost-{i}:{sc.p_tp}".encode())
            elif s.kind == "garbage":
                put(s.d, s.agent, b"\xff\xfe\x00garbage")
            elif s.kind == "nocolon":
                put(s.d, s.agent, b"no-colon-here")
            else:
                gone = [st for st in states.values() if st.freed_t is not None]
                if gone:
                    put(s.d, s.agent, f"{gone[0].req.rid}:{sc.p_tp}".encode())

        def hook(rank: int) -> None:
            if rank == 0 and jump:
                e.clock.advance_ms(jump)
            t_writer[i] = e.clock()

        e.before_writer_round = hook
        step = e.step(deliver or None)
        t_end = e.clock()
        if step.error is not None:
            viol["assert"] += 1
            notes.append(f"assert at step {i}: {type(step.error).__name__}: {step.error}")
            return Result(sc, which, viol, notes)
        # registrations of this step
        for st in new:
            rid = st.req.rid
            st.registered = True
            st.t_reg_first = now
            st.t_reg_last = t_end
            if rid in e.scheduler.requests:
                (ids,) = e.scheduler.kv_cache_manager.get_block_ids(rid)
                st.blocks = set(ids)
                for b in ids:
                    owner[b] = rid
            key = rid.encode()
            st.pushed = any(
                m.startswith(b"PUSH_REG:") and key in m for w in e.workers for _, m in w.nixl_wrapper.sent
            )
        for p, s0 in lost_since.items():
            for st in states.values():
                if st.registered and p not in st.lost_at and st.req.reg_step <= i and s0 <= i:
                    st.lost_at[p] = t_writer[max(s0, st.req.reg_step)]
        # what the scheduler did
        for rank, inv in enumerate(step.per_rank_invalid):
            for rid in {owner[b] for b in inv if b in owner}:
                states[rid].invalid_steps[rank] += 1
        for rid, st in states.items():
            if not st.registered or st.freed_t is not None:
                continue
            status = e.status(rid)
            if status == RequestStatus.RUNNING and st.completed_step is None:
                st.completed_step, st.completed_t = i, t_end
            if status == RequestStatus.FINISHED_ERROR:
                st.failed = True
                if st.t_sched_failed is None:
                    st.t_sched_failed = t_end
        for rid in step.failed_recving:
            if rid in states:
                states[rid].failed = True
        note_freed(t_end, i + 0.5)
        # deadlines: decided by the end of the first step starting at/after it
        for rid, st in states.items():
            if not st.registered or st.freed_t is not None:
                continue
            if now >= st.t_reg_last + DEADLINE_MS / 1000 and e.status(rid) == RequestStatus.WAITING_FOR_REMOTE_KVS:
                if not st.aborted_waiting and not st.deadline_flagged:
                    flag("missed_deadline", rid, f"still waiting at step {i} (t={now:.3f})")
                    st.deadline_flagged = True
        i += 1

    # -- the verdicts ------------------------------------------------------------------ #
    for rid, st in states.items():
        if not st.registered:
            continue
        if rid in e.scheduler.requests:
            flag("hang", rid, f"status {e.status(rid)} at the end")
        bound = _bound(st)
        # Clock values compared to the microsecond (sums of ms steps are not exact).
        bound = (round(bound[0], 6), bound[1])
        if st.freed_t is not None and (round(st.freed_t, 6), st.freed_step) < bound:
            flag(
                "early_free",
                rid,
                f"freed at t={st.freed_t:.3f} (step {st.freed_step}), a write may land "
                f"until t={bound[0]:.3f}" + (f" (step {bound[1]:.0f})" if bound[1] >= 0 else ""),
            )
        if st.completed_t is not None and st.completed_step is not None:
            done = st.completed_step
            missing = [
                (ed.p, ed.d)
                for ed in st.req.edges
                if ed.fate not in ("complete", "dup", "complete_latefail")
                or (ed.d, ed.p) not in st.arrival
                or st.arrival[(ed.d, ed.p)][1] > done
            ]
            if missing:
                flag("early_complete", rid, f"completed at step {st.completed_step}, edges not landed {missing}")
            if st.failed:
                flag("two_outcomes", rid, "completed and failed")
        all_landed = st.pushed and all(
            ed.fate in ("complete", "dup", "complete_latefail")
            and (ed.d, ed.p) in st.arrival
            and st.arrival[(ed.d, ed.p)][0] < st.t_reg_first + DEADLINE_MS / 1000
            for ed in st.req.edges
        )
        if (
            all_landed
            and sc.capacity == BIG_CAPACITY
            and st.completed_t is None
            and not (st.t_abort is not None and st.aborted_waiting)
        ):
            flag("wrong_outcome", rid, "every write landed in time but it did not complete")
        for rank, rep in enumerate(e.reported):
            if rep.count(rid) > 1:
                flag("double_report", rid, f"rank {rank} reported it {rep.count(rid)} times")
        for rank, n in st.invalid_steps.items():
            if n > 1:
                flag("invalid_twice", rid, f"rank {rank} reported its blocks invalid in {n} steps")
        if st.failed and not st.aborted_waiting and not st.invalid_steps and st.blocks:
            flag("invalid_missing", rid, "failed, blocks never reported invalid")
    if e.free_blocks() != total:
        viol["leak"] += 1
        notes.append(f"leak: {total - e.free_blocks()} block(s) not back at the end")
    return Result(sc, which, viol, notes)


class Summary:
    """What the randomized check ran and found, for the terminal summary."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], tuple[int, set[tuple[int, int]], Counter[str]]] = {}

    def record(self, which: str, kind: str, results: tuple[Result, ...]) -> None:
        c: Counter[str] = Counter()
        for r in results:
            c.update(r.violations)
        topo = {(r.scenario.p_tp, r.scenario.d_tp) for r in results}
        self.rows[(which, kind)] = (len(results), topo, c)

    def lines(self) -> list[str]:
        out = []
        scenarios = {kind: n for (_, kind), (n, _, _) in self.rows.items()}
        topo = sorted({pair for (_, pairs, _) in self.rows.values() for pair in pairs})
        out.append(
            f"randomized check: {sum(scenarios.values())} scenarios per connector "
            f"({', '.join(f'{k} {n}' for k, n in sorted(scenarios.items()))}); "
            f"topologies (P TP, D world): {topo}"
        )
        for (which, kind), (n, _, c) in sorted(self.rows.items()):
            body = ", ".join(f"{k}={v}" for k, v in sorted(c.items())) or "none"
            out.append(f"  {which:>8} {kind:<5} {n:>4} scenarios, {sum(c.values())} violations: {body}")
        return out


SUMMARY = Summary()
