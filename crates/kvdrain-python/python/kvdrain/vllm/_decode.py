"""The decode side of the plugin, for one rank: the ledger and the one mapping of its
decisions to what vLLM is told. No vLLM import: the worker (:mod:`kvdrain.vllm.connector`)
hands it vLLM's inputs and applies the :class:`DecodeReport` it returns.

What vLLM is told, and when::

    completed  -> report.completed: vLLM's own done path (finished_recving)
    failed     -> report.invalid (the blocks, once, one KV cache group): the scheduler
    expired       fails or recomputes the request now; its blocks stay held
    aborted    -> nothing: the scheduler finished it already (and held its blocks)
    released   -> report.released: finished_recving (and failed_recving) exactly once on
                  this rank, so the scheduler frees the blocks when every rank has

Time. One clock per rank (:class:`~kvdrain.vllm._clock.RankClock`), brought forward
once per engine step, at its start (:meth:`DecodeSide.catch_up`, from ``start_load_kv``):
deadlines and settle and quarantine ends fire there, before the step's heartbeats leave.
Only a producer found lost inside the step moves it again, at the step's end. Every
input is dated at the moment it happened on that clock: the writer thread's batches at
their arrival (``Ledger.feed(..., now_ms=)``), registrations and aborts at their step's
start, a lost producer at the first clock move after it was reported. A
failure notice read during a slow step therefore settles from when it was read, not from
the step before.

Producers. A receive registered with its producer (``producer=(engine, P request id)``)
gets a lifetime (``Settings.lifetime_ms``, counted from its registration here): the
worker's ``PUSH_REG`` carries what is left of it when it leaves
(:meth:`DecodeSide.lifetime_left_ms`), and none leaves for a receive decided already.
Once a receive is given up (``aborted``, ``expired``, or failed by vLLM itself while
another rank registered) the report names its producer engine in ``cancelled`` (each of
its agents gets ``PUSH_CANCEL:``); once it is decided at all, the step's heartbeats leave
it out (:meth:`DecodeSide.beats`): a heartbeat sent after the decision would extend the
producer's lease past the start of the quarantine.

Refusals. A rank that cannot register a receive (its table is full, or the id or the
expectation is refused) sends no ``PUSH_REG`` for it. With one rank that is the end of
it: nothing can be written, and vLLM fails the receive at once. With two or more ranks
another rank's ``PUSH_REG`` makes the producers write into this rank's blocks too, so the
refused receive is failed for the client at once but its blocks are held for the whole
quarantine, timed by the ledger's clock (``Ledger.hold_refused``). The scheduler side admits no more receives than a rank's capacity
(:mod:`kvdrain.vllm._scheduler`), so a full table is the exception, not the rule. The
same holds for a failure vLLM raises itself on one rank (a handshake, no remote agents):
with two or more ranks the ledger keeps tracking the receive, aborted, until its writes
resolve or the quarantine ends.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from kvdrain._errors import (
    DuplicateRequestError,
    KvdrainError,
    UnknownRequestError,
)
from kvdrain._kvdrain import Decision, Ledger, Record
from kvdrain.vllm._clock import RankClock
from kvdrain.vllm._closed_ids import ClosedIds
from kvdrain.vllm._recorder import FlightRecorder, RecordingLedger, refused_at
from kvdrain.vllm._settings import Settings
from kvdrain.vllm._topology import block_groups

__all__ = ["COUNT_KEYS", "DecodeReport", "DecodeSide", "Phase", "Registered", "VllmReceives"]

logger = logging.getLogger("vllm.kvdrain")


def record_fields(record: Record | None) -> dict[str, object]:
    """What the ledger's record of a request adds to its log line: each named edge by
    producer agent and how it stood (``landed``, ``failure_notice``, ``gone``,
    ``fenced``, ``failed`` or ``outstanding``, with ``at_ms`` where the ledger knows it),
    or in counting mode the notices ``expected`` and still ``owed``; the first failure's
    cause and time; the settle end. Nothing without a record."""
    if record is None:
        return {}
    fields: dict[str, object] = {}
    if record.counting:
        fields.update(expected=record.expected, owed=record.owed)
    else:
        edges: list[dict[str, object]] = []
        for agent, how, at in record.edges:
            edge: dict[str, object] = {"agent": agent, "how": how}
            if at is not None:
                edge["at_ms"] = at
            edges.append(edge)
        fields["edges"] = edges
    if record.first_failure is not None:
        fields.update(first_failure=record.first_failure, first_failure_ms=record.first_failure_ms)
    if record.settle_end_ms is not None:
        fields["settle_end_ms"] = record.settle_end_ms
    return fields

Phase = Literal["waiting", "failed", "aborted", "held"]
"""Where a receive this rank has not reported yet stands: ``waiting`` for its writes,
``failed`` (or expired) for the client with its blocks held, ``aborted`` by the
scheduler with its blocks held, ``held`` after a refusal or a failure of vLLM's own
while another rank may have let the producers write."""

Registered = Literal["tracked", "duplicate", "refused", "held"]
"""What :meth:`DecodeSide.register` did: tracked by the ledger; tracked already (re-staged
after a preemption); refused with nothing written (one rank: fail it now); refused but
held for the quarantine (two or more ranks)."""

# Receives no longer waiting, remembered so no PUSH_REG leaves for them late: for at
# least this many closes after their own, far more than wait at once.
_CLOSED_KEPT = 65_536

# Ledger counters that vLLM's own metric "notifications after expiry" stands for.
_AFTER_EXPIRY = ("unknown", "late")
# Ledger counters reported as metrics: ignored notices by reason, failed edges by cause.
_IGNORED = ("unknown", "late", "duplicate", "unexpected_sender", "malformed", "not_bytes")
_FAILED_EDGES = {"failure_notice": "failure_notices", "gone": "gone_edges", "fenced": "fenced_edges"}

COUNT_KEYS = (
    *(f"decisions_{k}" for k in ("completed", "failed", "expired", "aborted", "refused")),
    *(f"releases_{k}" for k in ("settled", "resolved", "forced")),
    *(f"failed_edges_{k}" for k in _FAILED_EDGES),
    *(f"ignored_{k}" for k in _IGNORED),
)
"""The keys of :attr:`DecodeReport.counts` (``kvdrain.vllm._metrics`` names the series)."""


class _Puts(Protocol):
    def put(self, item: Any, /) -> None: ...


class _Stats(Protocol):
    def record_failed_transfer(self) -> None: ...
    def record_kv_expired_req(self) -> None: ...
    def record_notification_after_expiry(self) -> None: ...
    def record_counts(self, report: DecodeReport) -> None: ...


class _Results(Protocol):
    finished_recving: set[str]
    failed_recving: set[str]


R = TypeVar("R", bound=_Results)


@dataclass(frozen=True, slots=True)
class VllmReceives:
    """vLLM's own structures for one worker's receives, as plain references: what
    :meth:`DecodeSide.tell` puts into them is what vLLM is told."""

    pending: Mapping[str, object]
    """The receives vLLM still tracks (its ``_recving_metadata``)."""
    done: dict[str, list[Any]]
    """Its done path (``_recving_transfers``): a receive with no transfers left is
    reported finished."""
    failed: _Puts
    """Its failure path (``_failed_recv_reqs``): reported finished and failed."""
    invalid: _Puts
    """Blocks reported invalid (``_invalid_block_ids``)."""
    stats: _Stats
    """Its NIXL stats (``xfer_stats``, a :class:`~kvdrain.vllm._metrics.KvdrainStats`)."""


@dataclass
class DecodeReport:
    """What one engine step tells vLLM (see the module's table)."""

    completed: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    invalid: list[set[int]] = field(default_factory=list)
    failed: int = 0
    expired: int = 0
    after_expiry: int = 0
    """Notices for ids no longer tracked (vLLM's "notification after expiry")."""
    refused: list[str] = field(default_factory=list)
    """Receives refused at registration with nothing written (one rank): vLLM fails them
    now."""
    cancelled: list[tuple[str, str]] = field(default_factory=list)
    """``(producer engine, request)`` for each receive given up in this step: each agent
    of that engine is owed ``PUSH_CANCEL:`` + the request id."""
    counts: dict[str, int] = field(default_factory=dict, compare=False)
    """What happened in this step, by metric key (:data:`COUNT_KEYS`); for the metrics,
    not part of the report's equality."""

    def count(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n


T = TypeVar("T")


def _span(items: list[T], start: int, stop: int) -> list[T]:
    """``items[start:stop]``, or ``items`` itself when that is all of it (a step's batch
    registered whole, the common case, is not copied)."""
    return items if start == 0 and stop == len(items) else items[start:stop]


@dataclass(slots=True)
class _Receive:
    """All this side holds of one receive it has not reported to vLLM yet; changed by
    :meth:`DecodeSide._set_phase` alone where the phase and the gauges move together."""

    phase: Phase
    groups: list[list[int]]
    """Its blocks, by KV cache group (the ledger holds the same lists)."""
    tracked_ms: int
    """When it was registered (or refused) here."""
    producer: tuple[str, str] | None = None
    """``(engine, P request id)`` it was registered with, while it waits."""
    lifetime_end_ms: int | None = None
    """When its registration's lifetime ends, while its ``PUSH_REG`` may still leave
    (read by any thread)."""
    outcome: dict[str, object] | None = None
    """What was decided, for its one log line at the release."""
    invalid: set[int] | None = None
    """The blocks reported invalid at its failure or refusal, until its release."""
    refused_groups: list[list[int]] | None = None
    """Refused but held (two or more ranks): its blocks, released when the ledger's hold
    of them ends (``Ledger.hold_refused``, a quarantine after ``tracked_ms``)."""

    def blocks(self) -> int:
        """How many blocks it has, every group (the held-blocks gauge counts them): read
        when it stops waiting, not at its registration, which most receives never do."""
        groups = self.groups
        return len(groups[0]) if len(groups) == 1 else sum(len(g) for g in groups)


class DecodeSide:
    """The decode side of one rank. ``feed`` and ``gone`` may be called from any
    thread; every other method belongs to the engine thread."""

    def __init__(
        self,
        settings: Settings,
        *,
        world_size: int,
        clock: RankClock | Callable[[], float] = time.monotonic,
        name: str = "rank0",
    ) -> None:
        self.settings = settings
        self.world_size = world_size
        self.name = name
        ledger = Ledger(
            settings.capacity,
            deadline_ms=settings.deadline_ms,
            quarantine_ms=settings.quarantine_ms,
            settle_ms=settings.settle_ms,
        )
        self.ledger: Ledger | RecordingLedger = ledger
        self.recorder: FlightRecorder | None = None
        if settings.record_dir is not None:
            self.recorder = FlightRecorder(
                Path(settings.record_dir) / f"kvdrain-{name}.trace",
                RecordingLedger.config_line(ledger),
                max_bytes=settings.record_max_bytes,
                files=settings.record_files,
            )
            self.ledger = RecordingLedger(ledger, self.recorder)
            logger.info("kvdrain: flight recorder on, writing %s", self.recorder.path)
        self.clock = clock if isinstance(clock, RankClock) else RankClock(clock)
        self._now = 0  # the engine thread's clock at its last catch-up or step (ms)
        self._caught_up = False  # the clock moved since the last step
        self._recount = False  # the ledger's counters may have moved outside a report
        self._receives: dict[str, _Receive] = {}
        # The receives still waiting, oldest registration first (the gauge's oldest age).
        self._waiting: dict[str, None] = {}
        self._held_blocks = 0  # blocks of the receives not waiting
        # Blocks vLLM's own failure path reports at a release: the scheduler has finished
        # the request by then (failed, aborted or expired); they are not reported again.
        self._released_blocks: set[int] = set()
        # Refused receives the ledger holds (`hold_refused`) and has not handed back.
        self._refused_holds = 0
        # Producers reported lost, from any thread (deque's append and popleft are atomic).
        self._lost: deque[tuple[str, str]] = deque()
        self._seen = dict.fromkeys((*_IGNORED, *_FAILED_EDGES.values()), 0)
        self._fed = threading.Event()
        # Receives whose registration's lifetime ended early, so no PUSH_REG leaves for
        # them late (read by any thread).
        self._closed = ClosedIds(_CLOSED_KEPT)
        # P request ids of the receives given up, whose heartbeats stop: id -> engine.
        self._silenced: dict[str, str] = {}
        # Cancels owed by a give-up made outside a step's report, for the next one.
        self._cancels: list[tuple[str, str]] = []

    def now_ms(self) -> int:
        """This rank's clock, in ms since it was built."""
        return self.clock.now_ms()

    def phase(self, rid: str) -> Phase | None:
        """Where ``rid`` stands, ``None`` once reported (or never tracked)."""
        rec = self._receives.get(rid)
        return None if rec is None else rec.phase

    def gauges(self) -> tuple[int, int, float]:
        """``(the clock at the last step in ms, blocks held now, age in s of the oldest
        receive still waiting)``."""
        now = self._now
        oldest = next(iter(self._waiting), None)
        age = 0.0 if oldest is None else (now - self._receives[oldest].tracked_ms) / 1000
        return now, self._held_blocks, age

    # -- writer thread ---------------------------------------------------------------- #

    def feed(self, batch: Mapping[str, Iterable[bytes]]) -> dict[str, list[bytes]]:
        """One ``get_new_notifs()`` batch, dated now: the notices go to the ledger, and the
        producer-bound messages (``PUSH_REG:``, ``HB:``) come back by sender for vLLM."""
        if not batch:
            return {}
        back = self.ledger.feed(batch, now_ms=self.now_ms())
        self._fed.set()
        out: dict[str, list[bytes]] = {}
        for agent, message in back:
            out.setdefault(agent, []).append(message)
        return out

    # -- any thread ------------------------------------------------------------------- #

    def gone(self, agent: str, why: str) -> None:
        """The transport lost producer agent ``agent`` (``why``: what failed); the next
        step reports it to the ledger (``gone``), dated then."""
        self._lost.append((agent, why))

    # -- engine thread ---------------------------------------------------------------- #

    def catch_up(self, report: DecodeReport | None = None) -> DecodeReport:
        """Brings the clock to now, once per engine step: the worker calls it at the start
        of every ``start_load_kv``, so registrations and aborts are dated now, not at the
        last step, and a deadline that passed fires before the step's heartbeats leave.
        Deadlines, settle and quarantine ends fire dated now, then the producers reported
        lost since are applied, dated now too. What that decides goes in ``report`` (a new
        one when ``None``), returned; the step's :meth:`step` then leaves the clock be."""
        if report is None:
            report = DecodeReport()
        self._advance(report)
        self._caught_up = True
        return report

    def register(
        self,
        rid: str,
        groups: list[list[int]],
        expect: int | list[str],
        report: DecodeReport,
        producer: tuple[str, str] | None = None,
    ) -> Registered:
        """Tracks a receive before its ``PUSH_REG`` goes out (see the module's
        *Refusals*); a held refusal puts its blocks in ``report.invalid``. Dated at the
        last :meth:`catch_up` (the worker catches up at the start of every
        ``start_load_kv``). ``producer``: ``(engine, P request id)`` the receive is
        registered with (see the module's *Producers*)."""
        known = rid in self._receives
        if self.register_many([rid], [groups], [producer], expect, report):
            return "refused" if self.world_size == 1 else "held"
        return "tracked" if not known and rid in self._receives else "duplicate"

    def register_many(
        self,
        rids: list[str],
        blocks: list[list[list[int]]],
        producers: list[tuple[str, str] | None],
        expect: int | list[str],
        report: DecodeReport,
    ) -> list[str]:
        """:meth:`register` of each receive ``rids[i]`` with its ``blocks[i]`` and
        ``producers[i]``, all with ``expect`` (a step's receives from one producer engine),
        in one call into the ledger until one is refused. The block lists are held as
        they are (the plugin's own). Returns the ids refused or held, in order: no
        ``PUSH_REG`` may leave for those."""
        lifetime_end = self._now + self.settings.lifetime_ms
        refused: list[str] = []
        start, end = 0, len(rids)
        while start < end:
            rest = _span(blocks, start, end)  # its own line: typed from blocks, not the call
            try:
                self.ledger.register_many(_span(rids, start, end), rest, expect)
                stop, error = end, None
            except KvdrainError as e:
                stop, error = refused_at(rids, e, start), e
            self._track_waiting(
                _span(rids, start, stop),
                _span(blocks, start, stop),
                _span(producers, start, stop),
                lifetime_end,
            )
            if error is not None:
                rid = rids[stop]
                if self._refused(rid, blocks[stop], error, report) != "duplicate":
                    refused.append(rid)
            start = stop + 1
        return refused

    def _refused(
        self, rid: str, groups: list[list[int]], e: KvdrainError, report: DecodeReport
    ) -> Registered:
        if isinstance(e, DuplicateRequestError):
            return "duplicate"
        if self.world_size == 1:
            logger.error("kvdrain: receive of %s refused (%s); failing it", rid, e)
            report.count("decisions_refused")
            report.refused.append(rid)
            self._story(rid, None, {"outcome": "refused", "cause": str(e), "at_ms": self._now})
            return "refused"
        logger.error(
            "kvdrain: receive of %s refused (%s); failing it, its blocks held for the "
            "quarantine (%d ms): another rank may have let the producers write",
            rid,
            e,
            self.settings.quarantine_ms,
        )
        report.count("decisions_refused")
        rec = self._track_held(rid, groups)
        rec.outcome = {"outcome": "refused", "cause": str(e), "decided_ms": self._now}
        rec.refused_groups = groups
        self.ledger.hold_refused(rid, groups)  # the ledger's clock ends the hold
        self._refused_holds += 1
        self._report_invalid(rid, groups, report)
        return "held"

    def lifetime_left_ms(self, rid: str) -> int | None:
        """What is left of the lifetime of ``rid``'s registration, for the ``PUSH_REG``
        leaving now (any thread): ``0`` when the receive was given up or decided (send
        none), ``None`` when this side does not track it (vLLM's own ``PUSH_REG``)."""
        rec = self._receives.get(rid)
        end = None if rec is None else rec.lifetime_end_ms
        if end is None:
            # _close marks it closed before it clears the end: never both unseen.
            return 0 if rid in self._closed else None
        return max(0, end - self.now_ms())

    def beats(self, engine: str, p_ids: Iterable[str]) -> list[str]:
        """The P request ids of one heartbeat to producer ``engine``, less those of the
        receives given up; an id given up that the heartbeat no longer names is
        forgotten."""
        ids = list(p_ids)
        kept = [p for p in ids if p not in self._silenced]
        named = set(ids)
        for p, e in list(self._silenced.items()):
            if e == engine and p not in named:
                del self._silenced[p]
        return kept

    def abort(self, rid: str, report: DecodeReport) -> None:
        """The scheduler finished ``rid`` before its receive was reported (abort, or the
        load failure policy): its blocks stay held until the ledger releases them."""
        if self.phase(rid) != "waiting":
            return
        try:
            decision = self.ledger.abort(rid)
        except UnknownRequestError:
            return
        if decision is not None:
            self._apply(decision, report)
        # None: decided already; the decision waits for the next poll.

    def vllm_failed(self, rid: str) -> bool:
        """vLLM failed ``rid`` itself on this rank (a handshake, no remote agents: its
        ``PUSH_REG`` never left this rank). Returns ``True`` when that report must wait
        for the ledger's release (a write may still land: another rank registered, or
        this one's writes were under way); ``False`` when nothing can land."""
        rec = self._receives.get(rid)
        if rec is None:
            return False
        if rec.phase == "waiting" and self.world_size == 1:
            self._set_phase(rid, None)
            try:
                self.ledger.abort(rid)  # forgotten: nothing was written
            except UnknownRequestError:
                pass
            return False
        if rec.phase == "waiting":
            try:
                self.ledger.abort(rid)  # its decision, if any, is this side's to ignore
            except UnknownRequestError:
                self._set_phase(rid, None)
                return False
            # The scheduler keeps it waiting (and heartbeating) until the release: given
            # up here, its producer is told at the next step.
            self._give_up(rid, self._cancels)
        self._set_phase(rid, "held")
        if rec.outcome is None:
            rec.outcome = {"outcome": "failed_by_vllm", "decided_ms": self._now}
        return True

    def step(self, report: DecodeReport | None = None) -> DecodeReport:
        """One engine step's decisions: those the writer thread's notices made ready,
        then the clock and the producers reported lost (as in :meth:`catch_up`), unless
        the catch-up moved the clock in this step already and no producer was reported
        lost since (a send in this step that found one: its receives fail in this step,
        dated after the loss, never before it). ``report``: this step's so far (its
        catch-up and registrations), continued; a new one when ``None``."""
        if report is None:
            report = DecodeReport()
        if self._cancels:
            report.cancelled.extend(self._cancels)
            self._cancels = []
        completed, others = self.ledger.poll_split()
        for rid in completed:
            self._completed(rid, report)
        for d in others:
            self._apply(d, report)
        if not self._caught_up or self._lost:
            self._advance(report)
        self._caught_up = False
        if self._fed.is_set() or self._recount or report.completed or report.released or report.counts:
            self._fed.clear()
            self._recount = False
            self._count(report)
        return report

    def drop_reported(self, invalid: set[int]) -> set[int]:
        """vLLM's invalid blocks for this step, less those of the requests this side
        released now: vLLM's failure path reports them at the release, when the
        scheduler has finished the request already (its failure was reported once, when
        it failed)."""
        out = invalid - self._released_blocks
        self._released_blocks.clear()
        return out

    def tell(self, report: DecodeReport, vllm: VllmReceives, results: Callable[[], R]) -> R:
        """Tells vLLM one step's report, the one place that does: each completed receive
        goes to vLLM's done path (``vllm.done``), each released one to its failure path
        (``vllm.failed``) while vLLM still tracks it, each refused one there too; invalid
        blocks and vLLM's own stats follow. Then ``results()`` (vLLM's
        ``get_transfer_results``) runs and is amended: a released receive that vLLM had
        closed already is reported finished and failed there, once; one that vLLM failed
        itself waits for this side's release (:meth:`vllm_failed`)."""
        late: set[str] = set()
        for rid in report.completed:
            vllm.done.setdefault(rid, [])
        for rid in report.released:
            if rid in vllm.pending:
                vllm.failed.put(rid)
            else:
                late.add(rid)
        for rid in report.refused:
            vllm.failed.put(rid)
        for blocks in report.invalid:
            vllm.invalid.put(blocks)
        if report.counts or report.failed or report.expired or report.after_expiry:
            stats = vllm.stats
            for _ in range(report.failed):
                stats.record_failed_transfer()
            for _ in range(report.expired):
                stats.record_kv_expired_req()
            for _ in range(report.after_expiry):
                stats.record_notification_after_expiry()
            if report.counts:
                stats.record_counts(report)
        out = results()
        if out.failed_recving:
            for rid in out.failed_recving - late:
                if self.vllm_failed(rid):
                    out.finished_recving.discard(rid)
                    out.failed_recving.discard(rid)
        if late:
            out.finished_recving |= late
            out.failed_recving |= late
        return out

    def close(self) -> None:
        """Closes the flight recorder's file, if recording (the connector's shutdown)."""
        if self.recorder is not None:
            self.recorder.close()

    def counters(self) -> dict[str, int]:
        """The ledger's counters (every ingest and decision count, by name)."""
        return dict(self.ledger.counters())

    # -- internals -------------------------------------------------------------------- #

    def _advance(self, report: DecodeReport) -> None:
        """The clock to now: what the ledger's clock fires, then the producers lost, then
        the refused receives whose hold ended."""
        now = self._now = self.clock.now_ms()
        for d in self.ledger.advance(now):
            self._apply(d, report)
        if self._lost and self._take_lost(report):
            self._recount = True
        if not self._refused_holds:
            return  # the common step: no call into the ledger for holds
        for rid, groups in self.ledger.poll_refused_releases():
            self._refused_holds -= 1
            rec = self._receives.get(rid)
            held = None if rec is None else rec.refused_groups
            if held is not None and held is groups:  # not tracked again since
                self._released(rid, held, report, "forced")

    def _apply(self, d: Decision, report: DecodeReport) -> None:
        rid = d.request_id
        rec = self._receives.get(rid)
        if rec is None:
            return  # reported already (vLLM failed it itself, with nothing written)
        phase = rec.phase
        kind = d.kind
        if kind == "completed":
            self._completed(rid, report)
        elif kind in ("failed", "expired"):
            report.count(f"decisions_{kind}")
            self._decided(rec, d)
            if phase == "waiting":
                self._give_up(rid, report.cancelled if kind == "expired" else None)
                self._set_phase(rid, "failed")
            if kind == "failed":
                report.failed += 1
            else:
                report.expired += 1
            logger.warning(
                "kvdrain: receive of %s %s; its blocks stay held until released", rid, kind
            )
            self._report_invalid(rid, block_groups(d.blocks), report)
        elif kind == "aborted":
            report.count("decisions_aborted")
            self._decided(rec, d)
            if phase == "waiting":
                self._give_up(rid, report.cancelled)
                self._set_phase(rid, "aborted")
        elif kind == "released":
            how = "forced" if d.forced else "settled" if phase == "failed" else "resolved"
            self._released(rid, block_groups(d.blocks), report, how, d.record)

    def _give_up(self, rid: str, cancels: list[tuple[str, str]] | None) -> None:
        """``rid`` stops waiting: no ``PUSH_REG`` leaves for it from now on, no heartbeat
        names it. ``cancels``: it was given up (aborted, expired, failed by vLLM), so its
        producer is owed a cancel, put there (a failure needs none: every write
        resolved)."""
        rec = self._receives[rid]
        self._close(rid, rec)
        producer, rec.producer = rec.producer, None
        if producer is not None:
            self._silenced[producer[1]] = producer[0]
            if cancels is not None:
                cancels.append((producer[0], rid))

    def _close(self, rid: str, rec: _Receive) -> None:
        """No ``PUSH_REG`` leaves for ``rid`` from now on, if one was to carry a lifetime:
        marked closed first, then its end cleared (:meth:`lifetime_left_ms` reads them in
        the other order, from any thread)."""
        if rec.lifetime_end_ms is not None:
            self._closed.close(rid)
            rec.lifetime_end_ms = None

    def _completed(self, rid: str, report: DecodeReport) -> None:
        # The path most receives take, once each: one lookup, the count kept inline.
        rec = self._receives.get(rid)
        if rec is None:
            return
        if rec.phase == "held":
            # vLLM failed it on this rank; every write has landed now: release it.
            self._released(rid, [], report, "resolved")
            return
        self._set_phase(rid, None, rec)
        counts = report.counts
        counts["decisions_completed"] = counts.get("decisions_completed", 0) + 1
        report.completed.append(rid)

    def _decided(self, rec: _Receive, d: Decision) -> None:
        if rec.outcome is not None:
            return
        outcome: dict[str, object] = {"outcome": d.kind, "decided_ms": d.at_ms}
        if d.outstanding is not None:
            outcome["outstanding"] = d.outstanding
        outcome.update(record_fields(d.record))
        rec.outcome = outcome

    def _story(self, rid: str, registered: int | None, fields: dict[str, object]) -> None:
        """The one structured line of a receive that did not complete (JSON fields)."""
        line: dict[str, object] = {"req": rid, "rank": self.name}
        if registered is not None:
            line["registered_ms"] = registered
            line["deadline_ms"] = registered + self.settings.deadline_ms
        line.update(fields)
        # A client's cancel is routine; a failure, an expiry or a forced release is not.
        routine = line.get("outcome") == "aborted" and line.get("release") != "forced"
        logger.log(
            logging.INFO if routine else logging.WARNING,
            "kvdrain: receive not completed %s",
            json.dumps(line, separators=(",", ":")),
        )

    def _released(
        self,
        rid: str,
        groups: list[list[int]],
        report: DecodeReport,
        how: str,
        record: Record | None = None,
    ) -> None:
        rec = self._receives[rid]
        story = rec.outcome or {"outcome": "failed_by_vllm"}
        # The release's record is the last word: edges that landed after the failure or
        # the expiry, and the settle end.
        story.update(record_fields(record))
        story.update(released_ms=self._now, release=how, blocks=rec.blocks())
        self._story(rid, rec.tracked_ms, story)
        self._set_phase(rid, None)
        report.count(f"releases_{how}")
        mine = rec.invalid
        if mine is not None and any(b is mine for b in report.invalid):
            # Failed and released in one step: vLLM's failure path reports them now.
            report.invalid = [b for b in report.invalid if b is not mine]
        elif len(groups) == 1:
            self._released_blocks.update(groups[0])
        report.released.append(rid)

    def _track_waiting(
        self,
        rids: list[str],
        blocks: list[list[list[int]]],
        producers: list[tuple[str, str] | None],
        lifetime_end: int,
    ) -> None:
        """Tracks receives the ledger registered: they wait (no gauge moves)."""
        tracked, waiting, now = self._receives, self._waiting, self._now
        for rid, groups, producer in zip(rids, blocks, producers):
            end = None if producer is None else lifetime_end
            tracked[rid] = _Receive("waiting", groups, now, producer, end)
            waiting[rid] = None

    def _track_held(self, rid: str, groups: list[list[int]]) -> _Receive:
        """Tracks a receive the ledger refused, held for the quarantine."""
        rec = _Receive("held", groups, self._now)
        self._receives[rid] = rec
        self._held_blocks += rec.blocks()
        return rec

    def _set_phase(self, rid: str, phase: Phase | None, rec: _Receive | None = None) -> None:
        """The one place a tracked receive changes phase, or (``None``) is reported and
        forgotten: the waiting order and the held-blocks gauge follow. ``rec``: its
        record, when the caller holds it already."""
        if rec is None:
            rec = self._receives[rid]
        if rec.phase == "waiting":
            if phase == "waiting":
                return
            del self._waiting[rid]
            if phase is not None:
                self._held_blocks += rec.blocks()
        elif phase is None:
            self._held_blocks -= rec.blocks()
        if phase is None:
            if rec.lifetime_end_ms is not None:
                self._close(rid, rec)
            del self._receives[rid]
        else:
            rec.phase = phase

    def _report_invalid(self, rid: str, groups: list[list[int]], report: DecodeReport) -> None:
        # The scheduler maps block ids to requests for one KV cache group only; with more,
        # failed_recving at the release carries the failure.
        rec = self._receives[rid]
        if len(groups) == 1 and rec.invalid is None:
            rec.invalid = set(groups[0])
            report.invalid.append(rec.invalid)

    def _take_lost(self, report: DecodeReport) -> bool:
        if not self._lost:
            return False
        lost: dict[str, str] = {}
        while self._lost:
            agent, why = self._lost.popleft()
            lost.setdefault(agent, why)
        for agent, why in lost.items():
            decisions = self.ledger.gone(agent)
            if decisions:
                logger.warning(
                    "kvdrain: producer agent %s lost (%s); %d receive(s) from it fail now "
                    "and their blocks settle",
                    agent,
                    why,
                    sum(1 for d in decisions if d.kind == "failed"),
                )
            for d in decisions:
                self._apply(d, report)
        return True

    def _count(self, report: DecodeReport) -> None:
        """The ledger's counters since the last count: ignored notices by reason, failed
        edges by cause, and vLLM's "notifications after expiry"."""
        counters = self.ledger.counters()
        delta = {k: counters[k] - seen for k, seen in self._seen.items()}
        for k in _IGNORED:
            if delta[k]:
                report.count(f"ignored_{k}", delta[k])
        for cause, k in _FAILED_EDGES.items():
            if delta[k]:
                report.count(f"failed_edges_{cause}", delta[k])
        report.after_expiry = sum(delta[k] for k in _AFTER_EXPIRY)
        if delta["malformed"]:
            logger.warning("kvdrain: %d malformed notification(s) ignored", delta["malformed"])
        for k in self._seen:
            self._seen[k] = counters[k]
