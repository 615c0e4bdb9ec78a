"""What the end-to-end suites read and write, typed: a scheduler's answer to ``report``
(:class:`SchedulerReport`), and each run's line in the suite's JSON report
(:class:`ScenarioLine` in the two-engine suite, :class:`TopologyLine` in the topology
suite).

The engines answer over JSON, so a report is read once, here, into fields with names
and types; a test asserts on ``line.told[rid]``, and a field that is renamed or missing
fails where the report is read, not as a ``KeyError`` in an assertion. The lines are
written as they were (one JSON object per run, keys sorted), so the report's readers
(``docs/vllm.md``) are unchanged.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Protocol

FINAL = ("finished_recving", "failed_recving")
"""What a receive may be told only once: finished (completed or failed)."""


def told_once(told: list[str]) -> bool:
    """The scheduler was told that a receive finished at most once."""
    return sum(1 for t in told if t in FINAL) <= 1


@dataclass(frozen=True, slots=True)
class SchedulerReport:
    """One engine scheduler's answer to ``report`` (``scheduler.Scheduler.report``): what
    it saw of its requests, and what the block checks found. Lists of what happened
    (``violations``, ``errors``) grow for the engine's life: a run reads its own as the
    part past what the report before it held (:meth:`since`)."""

    states: dict[str, str]
    """Each request's state in the scheduler (``waiting``, ``completed``, ``failed``,
    ``aborted``)."""
    held: dict[str, Any]
    """The requests whose blocks the scheduler has not freed yet: id -> their blocks."""
    told: dict[str, list[str]]
    """What the connector told the scheduler of each request, in order."""
    told_at: dict[str, list[float]]
    """When (monotonic seconds), one per ``told`` entry."""
    rank_reports: dict[str, list[int]]
    """The ranks whose report of each request the scheduler aggregated."""
    violations: list[str]
    """Every stamp check that failed: a write where it must not be, or a block that does
    not hold its request's stamps when decoding would start."""
    bytes_checked: int
    late_bytes: int
    """Bytes of a request's stamps found after its blocks were freed."""
    errors: list[str]
    """What the engine raised (its step went on)."""
    free_blocks: int
    ranks: list[dict[str, Any]]
    """Each rank's ``info`` (agent, counters, fault record, notices, expectations), in a
    ``final`` report only."""
    counters: dict[str, int]
    """The plugin ledger's counters (two-engine suite; empty for vLLM's own connector)."""

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> SchedulerReport:
        return cls(
            states=dict(raw["states"]),
            held=dict(raw["held"]),
            told={rid: list(t) for rid, t in raw["told"].items()},
            told_at={rid: [float(x) for x in t] for rid, t in raw["told_at"].items()},
            rank_reports={rid: list(r) for rid, r in raw["rank_reports"].items()},
            violations=list(raw["violations"]),
            bytes_checked=int(raw["bytes_checked"]),
            late_bytes=int(raw["late_bytes"]),
            errors=list(raw["errors"]),
            free_blocks=int(raw["free_blocks"]),
            ranks=list(raw["ranks"]),
            counters={k: int(v) for k, v in raw.get("counters", {}).items()},
        )

    def told_of(self, rid: str) -> list[str]:
        return self.told.get(rid, [])

    def holds(self, rid: str) -> bool:
        return rid in self.held

    def resolved(self, rid: str) -> bool:
        """Decided (completed or failed) and its blocks freed."""
        return self.states.get(rid) in ("completed", "failed") and rid not in self.held

    def since(self, before: SchedulerReport) -> Since:
        """What happened between ``before`` and this report."""
        return Since(
            violations=self.violations[len(before.violations) :],
            errors=self.errors[len(before.errors) :],
            bytes_checked=self.bytes_checked - before.bytes_checked,
            late_bytes=self.late_bytes - before.late_bytes,
            counters={
                k: n - before.counters.get(k, 0)
                for k, n in self.counters.items()
                if n != before.counters.get(k, 0)
            },
        )


class Reporting(Protocol):
    """An engine the test drives (``e2e.EngineProc``, ``topo.Engine``)."""

    def call(self, op: str, timeout_s: float = 60.0, **kw: Any) -> Any: ...


def report_of(
    engine: Reporting, *, final: bool = False, rids: list[str] | None = None
) -> SchedulerReport:
    """``engine``'s scheduler report, typed (of ``rids`` only, when given)."""
    return SchedulerReport.parse(engine.call("report", final=final, rids=rids))


@dataclass(frozen=True, slots=True)
class Since:
    """The part of a scheduler's report one run added (:meth:`SchedulerReport.since`)."""

    violations: list[str]
    errors: list[str]
    bytes_checked: int
    late_bytes: int
    counters: dict[str, int]
    """Counters that moved, by how much."""

    def count(self, name: str) -> int:
        return self.counters.get(name, 0)


def line_json(line: ScenarioLine | TopologyLine) -> str:
    """A run's line in the suite's JSON report: its fields, ``extra``'s at the top level,
    keys sorted."""
    fields = dataclasses.asdict(line)
    extra = fields.pop("extra")
    return json.dumps({**fields, **extra}, sort_keys=True)


@dataclass(frozen=True)
class ScenarioLine:
    """One scenario on one pair of engines (two-engine suite, ``test_e2e.py``)."""

    scenario: str
    p: str
    d: str
    transport: str
    requests: int
    completed: int
    failed: int
    expired: int
    gone_edges: int
    """Edges the plugin's ledger failed because their producer was seen gone."""
    decided_by: list[str]
    """What made the plugin D's failure decisions (``PUSH_FAIL``, ``deadline``,
    ``gone``); empty for vLLM's D, which decides none."""
    unresolved: list[str]
    blocks_held: list[str]
    bytes_checked: int
    late_bytes: int
    violations: list[str]
    """The run's violations, D's then P's."""
    engine_errors: list[str]
    told: dict[str, list[str]]
    told_once: bool
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)
    """The scenario's own figures (``resolved_s``, ``decision_s``, ...)."""


@dataclass(frozen=True)
class TopologyLine:
    """One request on one topology (topology suite, ``test_topologies.py``)."""

    topology: str
    scenario: str
    connector: str
    run: int
    rid: str
    kind: str | None
    """The injected failure (``post``, ``backend_error``, ``killed``), or none."""
    failing_edges: list[str]
    state: str | None
    decided: str
    """``completed``, ``failed``, or ``none``."""
    told: list[str]
    told_once: bool
    each_rank_once: bool | None
    """Every D rank's report of it was aggregated once (``None``: none was)."""
    blocks_held: bool
    decision_s: float | None
    """From the last WRITE's end to the first thing the scheduler was told."""
    release_s: float | None
    """From the last WRITE's end to the blocks' release (``None`` while held)."""
    notices: list[dict[str, str]]
    edges: list[str | None]
    """Per D rank: how its ledger waited (``counted``, ``named``), or ``None``."""
    bytes_checked: int
    late_bytes: int
    violations: list[str]
    engine_errors: list[str]
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)
    """The scenario's own figures (``followup``, ``ledger``, ...)."""
