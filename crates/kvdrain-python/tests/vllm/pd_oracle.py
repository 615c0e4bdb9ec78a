"""Generated prefill+decode scenarios and an oracle for them that knows nothing of the plugin.

A :class:`Scenario` is drawn from a seed (:func:`generate`): a topology (P TP 1/2/4 into
D world 1/2), the lease, deadline, quarantine and settle times, and per request when
the decode engine gets it, when the prefill engine gets it (its queueing delay), how
long its ``PUSH_REG`` travels, and per WRITE (P rank -> D rank) whether it lands, fails
to post, or fails after posting; plus aborts on either side, a slow P -> D handshake,
an eviction of the decode engine by the producer, pauses in either engine's steps and
slow steps. :func:`run` plays it on :mod:`pd_world` (vLLM 0.33's real schedulers and
workers on both sides, over a fake NIXL) and returns the violations by kind.

The oracle's ground truth is the fake NIXL's: which block of which WRITE landed when,
what NIXL answered the producer for each WRITE, which notices were sent; and the two
block pools: when each block went back. Its checks:

* ``late_land``: a block landed for a decode request after the decode engine's block
  pool took that block back (or ``stray_land``: into a block the request never held);
* ``source_freed_early`` (F3): the prefill engine's block pool took a source block back
  while a WRITE still read it;
* ``post_after_retire`` (F4): a WRITE posted for a request whose source blocks the
  prefill engine had already taken back;
* ``notice_missing`` / ``notice_extra``: a WRITE that failed to post or ended in a
  backend error owes exactly one ``PUSH_FAIL:REQ:TP`` from its P agent to its D agent;
  one that landed or answered ``NOT_FOUND`` owes none; an edge never posted may get at
  most one;
* ``told_twice``: a rank reported a request finished (sending or receiving) twice;
* ``error``: an exception out of a step (an assert of vLLM's, a fault of the world);
* ``hang``: a request still held by a scheduler at the end (past every lease,
  deadline, quarantine and settle); ``leak``: a block pool not full at the end.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from harness import Clock, sources
from pd_world import (
    Engine,
    Land,
    Net,
    Timing,
    WritePlan,
    build_decode,
    build_prefill,
    d_request,
    p_request,
    virtual_time,
    writer_pass,
)

from kvdrain import ConfigError

TICK_MS = 50
TAIL_TICK_MS = 250
LATENCY_MS = 5  # a notice's transit, unless the scenario delays a PUSH_REG
TOPOLOGIES = [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (4, 2)]  # (P TP, D world)
Kind = Literal["base", "late"]
FATES = ("ok", "post_fail", "error", "err_state", "slow")
FATE_WEIGHTS = (60, 10, 10, 6, 14)

VIOLATIONS = (
    "late_land",
    "stray_land",
    "source_freed_early",
    "post_after_retire",
    "notice_missing",
    "notice_extra",
    "told_twice",
    "error",
    "hang",
    "leak",
)


@dataclass(frozen=True)
class Edge:
    p: int
    d: int
    plan: WritePlan


@dataclass(frozen=True)
class Req:
    rid: str
    d_at: int  # ms: the decode engine gets the request
    p_at: int  # ms: the prefill engine gets it (it prefills in its next step)
    reg_delay_ms: int  # transit of its PUSH_REG notices
    edges: tuple[Edge, ...]
    d_abort_at: int | None = None
    p_abort_at: int | None = None


@dataclass(frozen=True)
class Scenario:
    seed: int
    kind: Kind
    p_tp: int
    d_tp: int
    timing: Timing
    reqs: tuple[Req, ...]
    handshake_ms: int = 0  # P -> D handshake: completes this long after first needed
    evict_at: int | None = None  # ms: the producer evicts the decode engine
    d_pauses: tuple[tuple[int, int], ...] = ()  # (from, to) ms: no decode step inside
    p_pauses: tuple[tuple[int, int], ...] = ()
    d_slow: tuple[tuple[int, int], ...] = ()  # (at ms, ms the step takes)
    p_slow: tuple[tuple[int, int], ...] = ()
    extra_d: tuple[tuple[str, int], ...] = ()  # decode requests with no producer (reuse)

    def last_event_ms(self) -> int:
        times = [0, self.handshake_ms + max((r.p_at for r in self.reqs), default=0)]
        for r in self.reqs:
            times += [r.d_at, r.p_at + r.reg_delay_ms, r.d_at + r.reg_delay_ms]
            times += [t for t in (r.d_abort_at, r.p_abort_at) if t is not None]
        times += [b for _, b in self.d_pauses + self.p_pauses]
        times += [t for _, t in self.extra_d]
        if self.evict_at is not None:
            times.append(self.evict_at)
        return max(times)

    def horizon_ms(self) -> int:
        t = self.timing
        return (
            self.last_event_ms()
            + 2000
            + t.deadline_ms
            + t.quarantine_ms
            + 3 * t.lease_s * 1000
            + 2 * t.settle_ms
        )

    def describe(self) -> str:
        t = self.timing
        lines = [
            f"scenario seed={self.seed} kind={self.kind} P_TP={self.p_tp} D_world={self.d_tp} "
            f"lease={t.lease_s}s deadline={t.deadline_ms} quarantine={t.quarantine_ms} "
            f"settle={t.settle_ms} ms; P->D handshake +{self.handshake_ms} ms"
            + (f"; P evicts D at {self.evict_at}" if self.evict_at is not None else "")
        ]
        for r in self.reqs:
            extra = [f"D gets it at {r.d_at}", f"P at {r.p_at}", f"PUSH_REG takes {r.reg_delay_ms}"]
            if r.d_abort_at is not None:
                extra.append(f"D aborts at {r.d_abort_at}")
            if r.p_abort_at is not None:
                extra.append(f"P aborts at {r.p_abort_at}")
            lines.append(f"  {r.rid}: " + ", ".join(extra))
            for e in r.edges:
                lines.append(
                    f"    P{e.p}->D{e.d}: {e.plan.fate} over {e.plan.duration_ms} ms"
                    + (f", fails at +{e.plan.fail_ms}" if e.plan.fate in ("error", "err_state") else "")
                )
        for name, v in (
            ("D pauses", self.d_pauses),
            ("P pauses", self.p_pauses),
            ("D slow steps", self.d_slow),
            ("P slow steps", self.p_slow),
            ("D requests with no producer", self.extra_d),
        ):
            if v:
                lines.append(f"  {name}: {list(v)}")
        return "\n".join(lines)


def _ms(rng: random.Random, lo: int, hi: int) -> int:
    """A time in [lo, hi] ms, on the tick."""
    return TICK_MS * rng.randint(lo // TICK_MS, hi // TICK_MS)


def _plan(rng: random.Random, fate: str) -> WritePlan:
    if fate == "slow":
        return WritePlan("ok", rng.randint(300, 900))
    duration = rng.randint(20, 200)
    if fate in ("error", "err_state"):
        return WritePlan(fate, duration, rng.randint(1, duration))
    return WritePlan(fate, duration)


def generate(seed: int, kind: Kind) -> Scenario:
    """The scenario of ``seed`` (deterministic).

    ``base``: the producer gets each request before the decode engine's deadline,
    handshakes complete within the deadline, and no pause in the decode engine's steps
    spans a deadline. ``late``: prefill queueing delays up to past the deadline plus
    the quarantine, handshakes as slow, pauses in the decode engine's steps around the
    deadline: what reaches a producer posting after the decode engine gave up."""
    rng = random.Random(f"pd-{kind}-{seed}")
    p_tp, d_tp = TOPOLOGIES[seed % len(TOPOLOGIES)]
    deadline = rng.choice([500, 1000, 2000])
    # A stall: the decode engine stops stepping across the first request's deadline
    # while the producer, done early, waits for its handshake with the decode engine;
    # with a quarantine under 5/3 of the lease, a heartbeat sent when the engine steps
    # again can carry the producer's lease past the quarantine.
    stall = kind == "late" and rng.random() < 0.35
    # vLLM's heartbeat extends a lease by two thirds of it, in whole seconds: nothing
    # for a lease of 1 s.
    lease_s = 3 if stall else rng.choice([1, 3])
    # Every quarantine the plugin accepts at load (at least the lease plus the margin),
    # from the smallest up: a window the load-time check left open would show here.
    margin = 1_000
    spare = rng.choice([0, 300, 500] if stall else [0, 500, 1000, 2000])
    quarantine = lease_s * 1000 + margin + spare
    timing = Timing(lease_s, deadline, quarantine, rng.choice([100, 300]), margin)
    n_req = rng.randint(1, 3)
    reqs = []
    for k in range(n_req):
        d_at = _ms(rng, 0, 1000)
        if stall and k == 0:
            p_at = max(0, d_at + _ms(rng, -200, 100))
        elif kind == "late" and rng.random() < 0.6:
            p_at = d_at + _ms(rng, deadline, deadline + quarantine + 1000)
        else:
            p_at = max(0, d_at + _ms(rng, -300, max(0, deadline - 400)))
        reg_delay = LATENCY_MS
        if rng.random() < 0.15:
            reg_delay = rng.randint(50, deadline // 2)
        edges = []
        for d in range(d_tp):
            for p in sources(d, d_tp, p_tp):
                edges.append(Edge(p, d, _plan(rng, rng.choices(FATES, FATE_WEIGHTS)[0])))
        d_abort = d_at + _ms(rng, 50, deadline + 500) if rng.random() < 0.2 else None
        p_abort = p_at - _ms(rng, 0, 200) if rng.random() < 0.1 and p_at >= 200 else None
        reqs.append(Req(f"r{k:02d}", d_at, p_at, reg_delay, tuple(edges), d_abort, p_abort))
    first_deadline = min(r.d_at for r in reqs) + deadline
    handshake = 0
    d_pauses: list[tuple[int, int]] = []
    if stall:
        r0 = reqs[0]
        lease_ms, extension_ms = lease_s * 1000, lease_s * 2 // 3 * 1000
        gap_end = r0.d_at + deadline + _ms(rng, max(0, quarantine - extension_ms), lease_ms)
        d_pauses.append((r0.d_at + deadline - _ms(rng, 50, 300), gap_end))
        window = max(0, gap_end + extension_ms - r0.d_at - deadline - quarantine)
        ready = r0.d_at + deadline + quarantine + _ms(rng, 0, window)
        handshake = max(50, ready - r0.p_at)
    elif rng.random() < 0.3:
        top = deadline + quarantine + 1500 if kind == "late" else max(50, deadline - 400)
        handshake = _ms(rng, 50, top)
    evict_at = _ms(rng, 100, 2500) if rng.random() < 0.15 else None
    if not stall and kind == "late" and rng.random() < 0.5:
        start = max(0, first_deadline - _ms(rng, 50, 300))
        d_pauses.append((start, first_deadline + _ms(rng, 100, lease_s * 1000)))
    elif not stall and rng.random() < 0.3:
        start = _ms(rng, 0, 3000)
        if not any(start <= r.d_at + deadline <= start + 400 for r in reqs):
            d_pauses.append((start, start + _ms(rng, 50, 300)))
    p_pauses: list[tuple[int, int]] = []
    if rng.random() < 0.3:
        start = _ms(rng, 0, 3000)
        p_pauses.append((start, start + _ms(rng, 50, 1000)))
    d_slow = tuple((_ms(rng, 0, 3000), rng.randint(50, 400)) for _ in range(rng.randint(0, 2)))
    p_slow = tuple((_ms(rng, 0, 3000), rng.randint(50, 400)) for _ in range(rng.randint(0, 2)))
    extra_d = tuple((f"x{k}", _ms(rng, 500, 6000)) for k in range(rng.randint(0, 2)))
    return Scenario(
        seed,
        kind,
        p_tp,
        d_tp,
        timing,
        tuple(reqs),
        handshake,
        evict_at,
        tuple(d_pauses),
        tuple(p_pauses),
        d_slow,
        p_slow,
        extra_d,
    )


# -- the run and the verdicts -------------------------------------------------------- #


@dataclass
class Result:
    scenario: Scenario
    which: str
    violations: Counter[str]
    notes: list[str]
    late_rids: set[str] = field(default_factory=set)  # requests with a block landed late
    refused: bool = False  # the connector refused the scenario's settings at load
    writes: int = 0  # WRITEs posted: a run that posts none judges the producer on nothing


@dataclass
class _Books:
    """The oracle's own record of the two block pools."""

    d_owner: dict[int, str] = field(default_factory=dict)  # block -> decode request
    d_held: dict[str, set[int]] = field(default_factory=dict)  # request -> its blocks
    d_gone: dict[tuple[str, int], float] = field(default_factory=dict)  # (rid, block) -> freed
    p_owner: dict[int, str] = field(default_factory=dict)
    p_held: dict[str, set[int]] = field(default_factory=dict)
    p_retired: dict[str, float] = field(default_factory=dict)  # first source block back


def _paused(pauses: tuple[tuple[int, int], ...], t: int) -> bool:
    return any(a < t < b for a, b in pauses)


def run(sc: Scenario, which: str) -> Result:
    clock = Clock()
    t0 = clock()
    viol: Counter[str] = Counter()
    notes: list[str] = []
    books = _Books()
    late_rids: set[str] = set()
    by_rid = {r.rid: r for r in sc.reqs}

    def flag(kind: str, why: str) -> None:
        viol[kind] += 1
        if len(notes) < 12:
            notes.append(f"{kind}: {why}")

    def latency(src: str, dst: str, msg: bytes) -> int:
        if msg.startswith(b"PUSH_REG:"):
            for r in sc.reqs:
                if r.rid.encode() in msg:
                    return r.reg_delay_ms
        return LATENCY_MS

    def write_plan(rid: str, p: int, d: int, nth: int) -> WritePlan:
        req = by_rid.get(rid)
        if req is not None:
            for e in req.edges:
                if (e.p, e.d) == (p, d):
                    return e.plan
        return WritePlan("ok", 50)

    def at(ms: float) -> str:
        return f"{(ms - t0) * 1000:.0f}"

    with virtual_time(clock):
        net = Net(clock, latency_ms=latency, write_plan=write_plan)
        try:
            dec = build_decode(which, d_tp=sc.d_tp, p_tp=sc.p_tp, timing=sc.timing, net=net, clock=clock)
            pre, handshakes = build_prefill(
                which, p_tp=sc.p_tp, d_tp=sc.d_tp, timing=sc.timing, net=net, clock=clock, handshake_ms=sc.handshake_ms
            )
        except ConfigError as refusal:
            # The connector refuses these settings at load: nothing runs, nothing to judge.
            return Result(sc, which, Counter(), [f"refused at load: {refusal}"], refused=True)

        def on_land(land: Land) -> None:
            w, b = land.write, land.block
            if b not in books.d_held.get(w.rid, set()):
                flag("stray_land", f"{w.rid} P{w.p_rank}->D{w.d_rank} block {b} at {at(land.t)}")
                return
            gone = books.d_gone.get((w.rid, b))
            if gone is not None and gone < land.t:
                late_rids.add(w.rid)
                flag(
                    "late_land",
                    f"{w.rid} P{w.p_rank}->D{w.d_rank} block {b} landed at {at(land.t)} ms, "
                    f"handed back at {at(gone)} ms (posted at {at(w.t_post)})",
                )

        def on_d_free(t: float, b: int) -> None:
            rid = books.d_owner.pop(b, None)
            if rid is not None:
                books.d_gone.setdefault((rid, b), t)

        def on_p_free(t: float, b: int) -> None:
            rid = books.p_owner.pop(b, None)
            if rid is None:
                return
            books.p_retired.setdefault(rid, t)
            for w in net.writes.values():
                if w.rid == rid and b in w.p_blocks and w.last_read > t:
                    flag(
                        "source_freed_early",
                        f"{rid} source block {b} back at {at(t)} ms, P{w.p_rank}->D{w.d_rank} "
                        f"reads it until {at(w.last_read)}",
                    )

        net.on_land = on_land
        dec.on_free = on_d_free
        pre.on_free = on_p_free

        def note_blocks(e: Engine, owner: dict[int, str], held: dict[str, set[int]]) -> None:
            for rid in e.scheduler.requests:
                if rid not in held:
                    ids = e.block_ids(rid)
                    if ids:
                        held[rid] = set(ids)
                        for b in ids:
                            owner[b] = rid

        d_slow = dict(sc.d_slow)
        p_slow = dict(sc.p_slow)
        horizon = sc.horizon_ms()
        busy_until = sc.last_event_ms() + 2000
        t = 0
        while t <= horizon:
            # A slow step may have carried the clock past this tick: it never goes back.
            if clock() < t0 + t / 1000:
                net.advance(t0 + t / 1000)
                clock.t = t0 + t / 1000
            for r in sc.reqs:
                if r.d_at == t:
                    dec.scheduler.add_request(d_request(r.rid, p_tp=sc.p_tp))
                if r.p_at == t and not (r.p_abort_at is not None and r.p_abort_at < t):
                    pre.scheduler.add_request(p_request(r.rid))
                if r.d_abort_at == t and dec.status(r.rid) is not None:
                    dec.abort(r.rid)
                if r.p_abort_at == t and pre.status(r.rid) is not None:
                    pre.abort(r.rid)
            for rid, when in sc.extra_d:
                if when == t:
                    dec.scheduler.add_request(d_request(rid, p_tp=sc.p_tp))
            if sc.evict_at == t:
                for w in pre.workers:
                    if "engine-D" in w._remote_agents:
                        w._cleanup_remote_engine("engine-D")
            for hs, w in zip(handshakes, pre.workers, strict=True):
                if hs.complete_due():
                    writer_pass(w)  # the handshake's callback wakes the writer
            pre.poll_writers()

            def jump_by(ms: int) -> None:
                net.advance(clock() + ms / 1000)
                clock.advance_ms(ms)

            if dec.busy() and not _paused(sc.d_pauses, t):
                slow = d_slow.get(t, 0)
                dec.step((lambda: jump_by(slow)) if slow else None)
                note_blocks(dec, books.d_owner, books.d_held)
            if pre.busy() and not _paused(sc.p_pauses, t):
                slow = p_slow.get(t, 0)
                pre.step((lambda: jump_by(slow)) if slow else None)
                note_blocks(pre, books.p_owner, books.p_held)
            t += TICK_MS if t < busy_until else TAIL_TICK_MS
        net.advance(t0 + t / 1000)

    # -- verdicts ------------------------------------------------------------------- #
    for e in (dec, pre):
        for err in e.errors[:3]:
            flag("error", err)
        if len(e.errors) > 3:
            viol["error"] += len(e.errors) - 3
    for w in net.writes.values():
        retired = books.p_retired.get(w.rid)
        if retired is not None and w.t_post >= retired:
            flag("post_after_retire", f"{w.rid} P{w.p_rank}->D{w.d_rank} posted at {at(w.t_post)}, retired {at(retired)}")
    for tf, rid, p, d in net.post_failures:
        retired = books.p_retired.get(rid)
        if retired is not None and tf >= retired:
            flag("post_after_retire", f"{rid} P{p}->D{d} tried to post at {at(tf)}, retired {at(retired)}")
    attempted: set[tuple[str, int, int]] = set()
    owed: Counter[tuple[str, int, int]] = Counter()
    for w in net.writes.values():
        attempted.add((w.rid, w.p_rank, w.d_rank))
        if w.first_answer in ("error", "err_state"):
            owed[(w.rid, w.p_rank, w.d_rank)] = 1
    for _, rid, p, d in net.post_failures:
        attempted.add((rid, p, d))
        owed[(rid, p, d)] = 1
    got: Counter[tuple[str, int, int]] = Counter()
    for _, src, dst, msg in net.sent:
        if msg.startswith(b"PUSH_FAIL:"):
            body = msg[len(b"PUSH_FAIL:") :].decode()
            rid, tp = body.rsplit(":", 1)
            if tp != str(sc.p_tp) or not src.startswith("P") or not dst.startswith("D"):
                flag("notice_extra", f"malformed or misdirected {msg!r} {src}->{dst}")
                continue
            got[(rid, int(src[1:]), int(dst[1:]))] += 1
    for key in attempted | set(got):
        want, have = owed[key], got[key]
        if key in attempted and have < want:
            flag("notice_missing", f"{key[0]} P{key[1]}->D{key[2]} owes {want} PUSH_FAIL, sent {have}")
        elif have > (want if key in attempted else 1):
            flag("notice_extra", f"{key[0]} P{key[1]}->D{key[2]} owes {want} PUSH_FAIL, sent {have}")
    for e in (dec, pre):
        for told in (e.told.finished_recving, e.told.finished_sending):
            for rank, rids in enumerate(told):
                for rid, n in Counter(rids).items():
                    if n > 1:
                        flag("told_twice", f"{e.name} rank {rank} reported {rid} {n} times")
    for e in (dec, pre):
        for rid in e.scheduler.requests:
            flag("hang", f"{e.name} still holds {rid} ({e.status(rid)}) at the end")
        if e.free_blocks() != e.total_blocks:
            flag("leak", f"{e.name}: {e.total_blocks - e.free_blocks()} block(s) not back at the end")
    return Result(sc, which, viol, notes, late_rids, writes=len(net.writes))


class Summary:
    """What the P+D check ran and found, for the terminal summary."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], tuple[int, Counter[str]]] = {}
        self.refused: dict[tuple[str, str], int] = {}

    def record(self, which: str, kind: str, results: tuple[Result, ...]) -> None:
        c: Counter[str] = Counter()
        for r in results:
            c.update(r.violations)
        self.rows[(which, kind)] = (len(results), c)
        self.refused[(which, kind)] = sum(r.refused for r in results)

    def lines(self) -> list[str]:
        if not self.rows:
            return []
        scenarios = {kind: n for (_, kind), (n, _) in self.rows.items()}
        out = [
            f"P+D randomized check: {sum(scenarios.values())} scenarios per connector "
            f"({', '.join(f'{k} {n}' for k, n in sorted(scenarios.items()))}); "
            f"topologies (P TP, D world): {TOPOLOGIES}"
        ]
        for (which, kind), (n, c) in sorted(self.rows.items()):
            body = ", ".join(f"{k}={v}" for k, v in sorted(c.items())) or "none"
            refused = self.refused.get((which, kind), 0)
            note = f" ({refused} refused at load)" if refused else ""
            out.append(f"  {which:>8} {kind:<5} {n:>4} scenarios{note}, {sum(c.values())} violations: {body}")
        return out


SUMMARY = Summary()
