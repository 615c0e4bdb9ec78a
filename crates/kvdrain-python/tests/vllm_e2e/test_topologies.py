"""End to end over real NIXL with every rank its own process: heterogeneous TP, MLA, PP.

Each engine is a :class:`topo.HostedEngine`: ``tp × pp`` processes in one gloo group, each rank
with its own NIXL agent and DRAM cache, rank 0 also the engine's scheduler (it serves
every rank's handshake metadata on the side channel and aggregates the ranks' reports
with vLLM's ``KVOutputAggregator``). One fleet per connector starts once (eight engines,
fifteen ranks) and serves every topology, the plugin's first, then vLLM 0.33.0's own
``NixlPushConnector`` (the control) on the same scenarios:

=============  ==========================  ============================================
topology       engines                     edges (P rank → D rank) per request
=============  ==========================  ============================================
tp2-tp1        P TP=2 → D TP=1             P0→D0, P1→D0 (the seed's)
tp1-tp2        P TP=1 → D TP=2             P0→D0, P0→D1
tp2-tp2        P TP=2 → D TP=2             P0→D0, P1→D1
tp4-tp2        P TP=4 → D TP=2             P0→D0, P1→D0, P2→D1, P3→D1
mla-tp2-tp1    MLA, P TP=2 → D TP=1        P0→D0, P1→D0 (replicated latent)
pp2-tp1        P PP=2 → D TP=1             stage 0→D0, stage 1→D0 (a layer each)
=============  ==========================  ============================================

The seed's scenarios, ``RUNS`` times each: ``ok`` (every edge writes); ``fail_first``
(the chosen producer rank, or edge, fails, the others' WRITEs are posted and held
until D has the failure, then land); ``fail_last`` (the others land first, then the
chosen one fails). The failure alternates between a post failure and a backend error
after posting, and between producer ranks (or, with one producer rank, between its
edges). After every failed request a follow-up request on the same pair must complete
with its own stamps. Then an abort on D while every edge writes (one lands after the
abort, one ends in a backend error) and, last, a producer rank killed with its WRITE
posted (the other rank's landed).

Every run writes one JSON line to ``target/vllm-e2e/topologies.jsonl``; the table per
topology × scenario × connector is printed in pytest's terminal summary.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e import run_until
from report import SchedulerReport, TopologyLine, line_json, report_of, told_once
from topo import SUMMARY, Host, HostedEngine

ROOT = Path(__file__).resolve().parents[4]
REPORT = Path(
    os.environ.get("KVDRAIN_E2E_TOPO_REPORT", ROOT / "target" / "vllm-e2e" / "topologies.jsonl")
)
TRANSPORT = os.environ.get("KVDRAIN_E2E_TRANSPORT", "tcp")

DEADLINE_MS = 6000
QUARANTINE_MS = 4000
SETTLE_MS = 300
EXTRA: dict[str, Any] = {
    "kv_lease_duration": 2,
    "kvdrain_deadline_ms": DEADLINE_MS,
    "kvdrain_quarantine_ms": QUARANTINE_MS,
    "kvdrain_settle_ms": SETTLE_MS,
}
BOUND_S = (DEADLINE_MS + QUARANTINE_MS) / 1000 + 8  # what a plugin wait may take at most
WATCH_S = 1.0  # each control run is watched this long past its last write, then
HANG_S = (DEADLINE_MS + QUARANTINE_MS) / 1000 + 2  # every hang at least this long, at the end
N_BLOCKS = 2

# Process groups (one per role and shape; a process hosts rank r of each of its
# engines, for both connectors): name -> (role, tp, pp, engines on it).
HOSTS: dict[str, tuple[str, int, int, list[tuple[str, bool]]]] = {
    "P-tp4": ("P", 4, 1, [("P4", False)]),
    "P-tp2": ("P", 2, 1, [("P2", False), ("Pmla", True)]),
    "P-tp1": ("P", 1, 1, [("P1", False)]),
    "P-pp2": ("P", 1, 2, [("Ppp", False)]),
    "D-tp1": ("D", 1, 1, [("D1", False), ("Dmla", True)]),
    "D-tp2": ("D", 2, 1, [("D2", False)]),
}
CONNECTORS = ("plugin", "control")
# topology -> (P engine, D engine, runs per seed scenario)
TOPOLOGIES: dict[str, tuple[str, str, int]] = {
    "tp2-tp1": ("P2", "D1", 10),
    "tp1-tp2": ("P1", "D2", 3),
    "tp2-tp2": ("P2", "D2", 3),
    "tp4-tp2": ("P4", "D2", 3),
    "mla-tp2-tp1": ("Pmla", "Dmla", 3),
    "pp2-tp1": ("Ppp", "D1", 3),
}
KINDS = ("post_fail", "backend_error")


def producer_ranks(d_rank: int, d_tp: int, p_tp: int) -> list[int]:
    """The P TP ranks whose WRITEs land on D rank ``d_rank`` (vLLM's mapping, one stage)."""
    if p_tp >= d_tp:
        k = p_tp // d_tp
        return list(range(d_rank * k, d_rank * k + k))
    return [d_rank * p_tp // d_tp]


def edges_of(P: HostedEngine, D: HostedEngine) -> list[tuple[int, int]]:
    """(P global rank, D rank) of every WRITE of one request."""
    return [
        (stage * P.tp + p, d)
        for d in range(D.tp)
        for stage in range(P.pp)
        for p in producer_ranks(d, D.tp, P.tp)
    ]


class Hosts:
    """Every rank process, started together: twelve processes, each with the workers of
    its engines for both connectors (four NIXL agents at most)."""

    def __init__(self, workdir: Path) -> None:
        self.hosts: dict[str, Host] = {}
        try:
            for name, (role, tp, pp, engines) in HOSTS.items():
                specs = [
                    {"which": which, "engine_id": f"{e}-{which}", "mla": mla}
                    for e, mla in engines
                    for which in CONNECTORS
                ]
                self.hosts[name] = Host(
                    role, specs, workdir, tp=tp, pp=pp, transport=TRANSPORT, extra=EXTRA
                )
            for h in self.hosts.values():
                h.wait_ready()
        except BaseException:
            self.close()
            raise
        self.fleets = {which: Fleet(self, which) for which in CONNECTORS}

    def close(self) -> None:
        for h in self.hosts.values():
            h.close()


class Fleet:
    """One connector's engines (``P2`` ... ``Dmla``) on the shared hosts."""

    def __init__(self, hosts: Hosts, which: str) -> None:
        self.which = which
        self.groups: dict[str, HostedEngine] = {}
        for h in hosts.hosts.values():
            for eid, e in h.engines.items():
                name, _, conn = eid.rpartition("-")
                if conn == which:
                    self.groups[name] = e
        self.hung: list[tuple[str, str, float]] = []  # (D engine, rid, last write)
        self._index = 1000 if which == "control" else 0

    def index(self) -> int:
        self._index += 1
        return self._index

    def alive(self) -> list[HostedEngine]:
        return [g for g in self.groups.values() if g.alive()]


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    start = time.monotonic()
    workdir = REPORT.parent / "topologies"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text("")
    h = Hosts(workdir)
    _write({"event": "hosts_ready", "seconds": round(time.monotonic() - start, 1)})
    SUMMARY.startup_s = time.monotonic() - start
    try:
        yield h
    finally:
        h.close()


def _write(event: dict[str, Any]) -> None:
    """One of the suite's own lines (its hosts' start)."""
    _write_line(json.dumps(event, sort_keys=True))


def _write_line(text: str) -> None:
    with REPORT.open("a") as out:
        out.write(text + "\n")




class Run:
    """One request (and its follow-up) on one topology."""

    def __init__(self, fleet: Fleet, topology: str, scenario: str, run: int) -> None:
        p, d, _ = TOPOLOGIES[topology]
        self.fleet = fleet
        self.P, self.D = fleet.groups[p], fleet.groups[d]
        self.topology, self.scenario, self.run = topology, scenario, run
        self.edges = edges_of(self.P, self.D)
        self.index = fleet.index()
        self.rid = f"{topology}-{scenario}-{fleet.which}-{self.index}"
        self.before = report_of(self.D, rids=[])
        self._faults: list[dict[str, Any]] = []
        self.t0 = time.monotonic()

    def edge_key(self, d_rank: int) -> str:
        return f"{self.rid}@{self.D.agents[d_rank]}"

    def start(self) -> None:
        self.D.call(
            "recv",
            rid=self.rid,
            index=self.index,
            n_blocks=N_BLOCKS,
            p_engine=self.P.engine_id,
            p_port=self.P.port,
            p_tp=self.P.tp,
            p_pp=self.P.pp,
        )
        self.P.call("send", rid=self.rid, index=self.index, n_blocks=N_BLOCKS)

    def until(self, cond: Callable[[], bool], bound_s: float = BOUND_S) -> bool:
        ok, _ = run_until([g for g in (self.P, self.D) if g.alive()], cond, bound_s)
        return ok

    def d(self) -> SchedulerReport:
        return report_of(self.D, rids=[self.rid])

    def told(self) -> list[str]:
        return self.d().told_of(self.rid)

    def resolved(self) -> bool:
        return self.d().resolved(self.rid)

    def released(self) -> bool:
        return not self.d().holds(self.rid)

    def p_faults(self) -> list[dict[str, Any]]:
        """Each P rank's fault record (the last one read, once P is dead)."""
        if self.P.alive():
            self._faults = [r["faults"] for r in self.P.call("ranks", rid=self.rid)]
        return self._faults

    def d_notices(self) -> list[list[tuple[float, str, str]]]:
        return [[tuple(n) for n in r["notices"]] for r in self.D.call("ranks", rid=self.rid)]

    def posted(self, edges: list[tuple[int, int]]) -> bool:
        """Every WRITE of ``edges`` is posted (one read of every P rank's record)."""
        f = self.p_faults()
        return all(f[p]["posted"].get(self.rid, 0) > 0 for p, _ in edges)

    def failed(self, edges: list[tuple[int, int]]) -> bool:
        """P saw the injected failure of every WRITE of ``edges``."""
        f = self.p_faults()
        return all(self.edge_key(q) in f[p]["failed_at"] for p, q in edges)

    def noticed(self, edges: list[tuple[int, int]], failure: bool) -> bool:
        """D has each edge's notice (its completion, or with ``failure`` its
        ``PUSH_FAIL``) from the edge's P agent (one read of every D rank's log)."""
        body = f"{self.rid}:{self.P.tp}"
        want = f"PUSH_FAIL:{body}" if failure else body
        seen = self.d_notices()
        return all(
            any(a == self.P.agents[p] and m == want for _, a, m in seen[q]) for p, q in edges
        )

    def _ends(self) -> dict[tuple[int, int], float]:
        """When each edge's WRITE ended on its P rank: NIXL's DONE, or the injected
        failure (post or backend error)."""
        faults = self.p_faults()
        ends: dict[tuple[int, int], float] = {}
        for p, q in self.edges:
            times = [t for k in ("done_at", "failed_at") for t in faults[p][k].get(self.edge_key(q), [])]
            if times:
                ends[(p, q)] = min(times)
        return ends

    def ended(self) -> bool:
        return len(self._ends()) == len(self.edges)

    def last_write(self) -> float | None:
        """When the request's last WRITE ended (None while one has not)."""
        ends = self._ends()
        return max(ends.values()) if len(ends) == len(self.edges) else None

    def followup(self) -> dict[str, Any]:
        """The next request on the same pair completes with its own stamps."""
        nxt = Run(self.fleet, self.topology, "followup", self.run)
        nxt.start()
        ok = nxt.until(lambda: nxt.d().states.get(nxt.rid) == "completed", 60)
        return {
            "rid": nxt.rid,
            "completed": ok,
            "told": nxt.told(),
            "seconds": round(time.monotonic() - nxt.t0, 2),
        }

    def finish(
        self,
        *,
        failing: list[tuple[int, int]],
        kind: str | None,
        last: float | None = None,
        **extra: Any,
    ) -> TopologyLine:
        d = report_of(self.D, final=True, rids=[self.rid])
        since = d.since(self.before)
        told = d.told_of(self.rid)
        told_at = d.told_at.get(self.rid, [])
        last = self.last_write() if last is None else last
        label = {a: f"P{r}" for r, a in enumerate(self.P.agents)}
        notices = [
            {
                "from": label.get(a, a),
                "to": f"D{rank}",
                "kind": "PUSH_FAIL" if m.startswith("PUSH_FAIL:") else "completion",
            }
            for rank, r in enumerate(d.ranks)
            for _, a, m in r["notices"]
            if m.rsplit(":", 1)[0].removeprefix("PUSH_FAIL:") == self.rid
        ]
        edges_mode: list[str | None] = []
        for r in d.ranks:
            e = r["expects"].get(self.rid)
            edges_mode.append(
                None if e is None else "counted" if isinstance(e, int) else "named"
            )
        reports = d.rank_reports.get(self.rid, [])
        state = d.states.get(self.rid)
        held = d.holds(self.rid)
        line = TopologyLine(
            topology=self.topology,
            scenario=self.scenario,
            connector=self.fleet.which,
            run=self.run,
            rid=self.rid,
            kind=kind,
            failing_edges=[f"P{p}->D{q}" for p, q in failing],
            state=state,
            decided=state if state in ("completed", "failed") else "none",
            told=told,
            told_once=told_once(told),
            each_rank_once=sorted(reports) == list(range(self.D.tp * self.D.pp))
            if reports
            else None,
            blocks_held=held,
            decision_s=None if not told_at or last is None else round(told_at[0] - last, 3),
            release_s=None
            if not told_at or last is None or held
            else round(told_at[-1] - last, 3),
            notices=notices,
            edges=edges_mode,
            bytes_checked=since.bytes_checked,
            late_bytes=since.late_bytes,
            violations=since.violations,
            engine_errors=since.errors,
            seconds=round(time.monotonic() - self.t0, 2),
            extra=extra,
        )
        _write_line(line_json(line))
        SUMMARY.add(line)
        return line

    def clear(self) -> None:
        if self.P.alive():
            self.P.call("fault", post_fail=[], backend_error=[], stall=[], hold=[])


def check_notices(run: Run, line: TopologyLine, failing: list[tuple[int, int]]) -> None:
    """Every edge sent exactly one notice, from the agent of its P rank; a failing edge
    a PUSH_FAIL (plugin) or nothing (vLLM 0.33 sends none)."""
    got = sorted((n["from"], n["to"], n["kind"]) for n in line.notices)
    want = []
    for p, q in run.edges:
        if (p, q) in failing:
            if run.fleet.which == "plugin":
                want.append((f"P{p}", f"D{q}", "PUSH_FAIL"))
        else:
            want.append((f"P{p}", f"D{q}", "completion"))
    assert got == sorted(want), line


def check_edges(run: Run, line: TopologyLine) -> None:
    """Named edges wherever the layout allows (every non-MLA layout here); vLLM's count
    for MLA (the plugin's documented limit)."""
    if run.fleet.which != "plugin":
        return
    want = "counted" if run.topology.startswith("mla") else "named"
    assert line.edges == [want] * run.D.tp, line


def plugin_ok(line: TopologyLine) -> None:
    assert line.violations == [] and line.engine_errors == [], line
    assert line.told_once and line.each_rank_once, line
    assert not line.blocks_held, line


_WARM: set[str] = set()


@pytest.fixture(params=CONNECTORS)
def warm(hosts: Hosts, request: pytest.FixtureRequest) -> Fleet:
    """The connector's fleet; first one request per topology, so every handshake (D to
    each P rank for the PUSH_REG, each P rank to D for the WRITEs) is done before
    anything is timed."""
    fleet = hosts.fleets[request.param]
    if fleet.which not in _WARM:
        _WARM.add(fleet.which)
        for topology in TOPOLOGIES:
            run = Run(fleet, topology, "warm_up", 0)
            run.start()
            run.until(run.resolved)  # the control may hang here: it is not judged
            run.finish(failing=[], kind=None)
    return fleet


def test_ok(warm: Fleet, topology: str) -> None:
    """Every edge writes: D completes once, every head of every layer of every block
    holds its producer's stamp. vLLM's connector gets this right too."""
    fleet = warm
    for i in range(TOPOLOGIES[topology][2]):
        run = Run(fleet, topology, "ok", i)
        run.start()
        assert run.until(lambda: run.d().states.get(run.rid) == "completed")
        line = run.finish(failing=[], kind=None)
        assert line.told == ["finished_recving"], line
        check_notices(run, line, [])
        check_edges(run, line)
        plugin_ok(line) if fleet.which == "plugin" else None
        assert line.violations == [], line


def _failing(run: Run, i: int) -> tuple[list[tuple[int, int]], str]:
    """The failing edges of run ``i`` and the failure kind, alternating."""
    kind = KINDS[i % 2]
    n_p = run.P.tp * run.P.pp
    if n_p > 1:
        f = (i // 2) % n_p
        return [e for e in run.edges if e[0] == f], kind
    q = (i // 2) % run.D.tp
    return [e for e in run.edges if e[1] == q], kind


def _set(run: Run, edges: list[tuple[int, int]], **faults: bool) -> None:
    """Sets the named faults on exactly ``edges`` (per P rank, per D agent)."""
    per_rank: dict[int, list[str]] = {}
    for p, q in edges:
        per_rank.setdefault(p, []).append(run.edge_key(q))
    for p, keys in per_rank.items():
        kw: dict[str, Any] = {k: keys for k, on in faults.items() if on}
        run.P.call("fault", ranks=[p], **kw)


def _seed(fleet: Fleet, topology: str, order: str) -> None:
    for i in range(TOPOLOGIES[topology][2]):
        run = Run(fleet, topology, f"fail_{order}", i)
        failing, kind = _failing(run, i)
        others = [e for e in run.edges if e not in failing]
        single_p = run.P.tp * run.P.pp == 1
        if order == "last" and single_p:
            kind = "backend_error"  # a held post would hold the one writer thread
        if order == "first":
            _set(run, others, stall=True)
            _set(run, failing, **{kind: True})
            run.start()
            # P saw the failure, the others' WRITEs are posted (their bytes may land,
            # their notices are held); the plugin's PUSH_FAIL reached D.
            assert run.until(
                lambda: run.failed(failing)
                and run.posted(others)
                and (fleet.which != "plugin" or run.noticed(failing, True))
            )
            run.until(lambda: False, 0.2)
            early = run.told()
            if run.D.tp == 1:
                # One consumer rank: it waits for the held WRITEs before deciding.
                assert early == [], early
            assert not run.released()
            for p in {p for p, _ in others}:
                run.P.call("fault", ranks=[p], stall=[])
        else:
            if kind == "post_fail":
                _set(run, failing, hold=True)
            else:
                _set(run, failing, stall=True)
            run.start()
            # The others land first (their completions are at D) ...
            assert run.until(lambda: run.noticed(others, False))
            run.until(lambda: False, 0.2)
            assert run.told() == [] and not run.released()
            # ... then the chosen one fails.
            for p in {p for p, _ in failing}:
                keys = [run.edge_key(q) for pp, q in failing if pp == p]
                if kind == "post_fail":
                    run.P.call("fault", ranks=[p], post_fail=keys, hold=[])
                else:
                    run.P.call("fault", ranks=[p], backend_error=keys, stall=[])
        if fleet.which == "plugin":
            assert run.until(run.resolved)
            line = run.finish(failing=failing, kind=kind, followup=run.followup())
            assert line.state == "failed", line
            assert line.told == ["invalid_blocks", "failed_recving"], line
            # Released only after the last WRITE ended; with one consumer rank, decided then too.
            assert line.release_s is not None and line.release_s > 0, line
            if run.D.tp == 1:
                assert line.decision_s is not None and line.decision_s > 0, line
            plugin_ok(line)
        else:
            # Every WRITE ended; the hang is watched at the end (test_fleet_end), with
            # every engine stepped, at least HANG_S past this one's last write.
            assert run.until(run.ended)
            line = run.finish(failing=failing, kind=kind, followup=run.followup())
            assert line.told == [] and line.blocks_held, line
            fleet.hung.append((run.D.engine_id, run.rid, run.last_write() or time.monotonic()))
        assert line.extra["followup"]["completed"] and line.extra["followup"]["told"] == ["finished_recving"]
        check_notices(run, line, failing)
        check_edges(run, line)
        run.clear()


def test_fail_first(warm: Fleet, topology: str) -> None:
    """The chosen P rank (or edge) fails first, the others land after. The plugin D waits
    for the others' WRITEs, then fails the request once and frees its blocks after
    settling; vLLM's D waits for a notice that never comes."""
    _seed(warm, topology, "first")


def test_fail_last(warm: Fleet, topology: str) -> None:
    """The others land first, then the chosen P rank (or edge) fails. The plugin D waits
    for the failure notice, then fails; vLLM's D waits for ever."""
    _seed(warm, topology, "last")


def test_abort_while_writing(warm: Fleet, topology: str) -> None:
    """D aborts while every edge's WRITE is posted (notices held); then one lands and
    the other ends in a backend error. The plugin frees the blocks once, after the
    failure notice settled; vLLM's D never gets the report (vLLM #46283)."""
    fleet = warm
    run = Run(fleet, topology, "abort", 0)
    _set(run, run.edges, stall=True)
    run.start()
    assert run.until(
        lambda: run.posted(run.edges)
    )
    run.D.call("abort", rid=run.rid)
    run.until(lambda: False, 0.3)
    assert not run.released() and run.told() == []
    lands, fails = run.edges[0], run.edges[-1]
    _set(run, [fails], backend_error=True)  # before the stall lifts: its notice never goes
    for p in {p for p, _ in run.edges}:
        run.P.call("fault", ranks=[p], stall=[])
    if fleet.which == "plugin":
        assert run.until(run.released)
        line = run.finish(failing=[fails], kind="backend_error")
        assert line.told in (["finished_recving"], ["failed_recving"]), line
        assert line.release_s is not None and line.release_s > 0, line
        assert line.violations == [] and line.told_once, line
    else:
        assert not run.until(run.released, WATCH_S + 1)
        line = run.finish(failing=[fails], kind="backend_error")
        assert line.blocks_held and line.told == [], line
        fleet.hung.append((run.D.engine_id, run.rid, run.last_write() or time.monotonic()))
    del lands
    run.clear()


LEDGER_COUNTS = ("failed", "expired", "gone_edges")


def _ledger(run: Run) -> dict[str, int]:
    """The plugin D's ledger counters of :data:`LEDGER_COUNTS`, over every rank."""
    ranks = run.D.call("ranks", rid=run.rid)
    return {k: sum(int(r["counters"].get(k, 0)) for r in ranks) for k in LEDGER_COUNTS}


@pytest.mark.parametrize("topology", ["tp2-tp1", "pp2-tp1"])
def test_producer_rank_killed_mid_write(hosts: Hosts, topology: str) -> None:
    """P rank 1 posts its WRITE (bytes landed, notice held) and is killed; rank 0's
    landed. The plugin D finds the lost agent on its next heartbeat (over UCX on TCP the
    send raises NIXL's ``NIXL_ERR_REMOTE_DISCONNECT``), fails the request and frees the
    blocks after settling, well before its deadline; vLLM's D waits.
    Both connectors in one run: rank 1's process holds both connectors' rank 1 (and
    every other engine of its host), so this comes last for those engines.

    A lost agent fails only the edges named after it: a receive registered before D's
    handshake with its producer engine was done is counted (vLLM's count, no names),
    and then only the deadline ends it (docs/limits.md). So the pair is warmed first
    here, whatever ran before, and the killed request must have been given named edges."""
    for which in CONNECTORS:
        warm = Run(hosts.fleets[which], topology, "warm_up", 0)
        warm.start()
        warm.until(warm.resolved, 120)
        warm.finish(failing=[], kind=None)
    runs = {which: Run(hosts.fleets[which], topology, "p_rank_killed", 0) for which in CONNECTORS}
    for run in runs.values():
        failing = [e for e in run.edges if e[0] == 1]
        _set(run, failing, stall=True)
        run.start()
    for run in runs.values():
        others = [e for e in run.edges if e[0] != 1]
        assert run.until(
            lambda: run.posted([e for e in run.edges if e[0] == 1])
            and run.noticed(others, False)
        )
    for run in runs.values():
        run.p_faults()  # the last record before the kill
    plugin, control = runs["plugin"], runs["control"]
    before = _ledger(plugin)
    killed_at = time.monotonic()
    plugin.P.kill_rank(1)
    failing = [e for e in plugin.edges if e[0] == 1]
    both = [plugin.D, control.D]
    run_until(both, lambda: plugin.resolved(), BOUND_S)
    told_at = plugin.d().told_at.get(plugin.rid, [killed_at])
    line = plugin.finish(
        failing=failing,
        kind="killed",
        last=killed_at,
        decision_after_kill_s=round(told_at[0] - killed_at, 3),
        release_after_kill_s=round(told_at[-1] - killed_at, 3),
        ledger={k: v - before[k] for k, v in _ledger(plugin).items()},
        exit_after_kill_s=None
        if (exited := plugin.P.host.exited_at.get(1)) is None
        else round(exited - killed_at, 3),
    )
    check_edges(plugin, line)  # named: the precondition of a decision by the lost agent
    assert line.told == ["invalid_blocks", "failed_recving"], line
    # The lost agent shows only once the kernel has torn the killed process down and
    # closed its sockets (1.8-8.4 s on a loaded 2-core host). Reaped a second or more
    # before the receive's deadline (at least DEADLINE_MS after the run began), the
    # request fails by the lost agent's edges; reaped later, either may decide first.
    exited = plugin.P.host.exited_at.get(1)
    if exited is not None and exited < plugin.t0 + DEADLINE_MS / 1000 - 1:
        want = {"failed": plugin.D.tp, "expired": 0, "gone_edges": len(failing)}
        assert line.extra["ledger"] == want, line
    else:
        assert line.extra["ledger"]["failed"] + line.extra["ledger"]["expired"] == plugin.D.tp, line
    plugin_ok(line)
    run_until(both, lambda: bool(control.told()) or time.monotonic() > killed_at + WATCH_S, BOUND_S)
    cline = control.finish(failing=failing, kind="killed", last=killed_at)
    assert cline.told == [] and cline.blocks_held, cline
    control.fleet.hung.append((control.D.engine_id, control.rid, killed_at))


def test_fleet_end(warm: Fleet) -> None:
    """The plugin: every request resolved, no block held, the free pools clean. The
    control: every hang above is still a hang at least ``HANG_S`` after its last write
    (told nothing, blocks held), every engine stepped meanwhile."""
    fleet = warm
    if fleet.which == "control" and fleet.hung:
        until = max(t for _, _, t in fleet.hung) + HANG_S
        run_until(fleet.alive(), lambda: time.monotonic() > until, HANG_S + 5)
    for name, g in fleet.groups.items():
        if g.role != "D":
            continue
        d = report_of(g, final=True)
        assert d.violations == [], (name, d.violations)
        hung = {rid for e, rid, _ in fleet.hung if e == g.engine_id}
        for rid in hung:
            assert d.told_of(rid) == [] and d.holds(rid), (name, rid)
        if fleet.which == "plugin":
            assert d.held == {}, (name, d.held)
    SUMMARY.hangs[fleet.which] = {
        "hung_requests": len(fleet.hung),
        "watched_s": HANG_S,
    }


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "topology" in metafunc.fixturenames and not any(
        m.name == "parametrize" for m in metafunc.definition.iter_markers()
    ):
        metafunc.parametrize("topology", list(TOPOLOGIES))
