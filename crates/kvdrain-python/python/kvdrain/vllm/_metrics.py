"""The plugin's metrics in vLLM's own: its counters beside vLLM's NIXL ones in ``/metrics``.

vLLM 0.33 collects a connector's numbers through three hooks: each worker's
``get_kv_connector_stats()`` hands a ``KVConnectorStats`` (plain lists, serialisable) to
the scheduler, which aggregates the ranks' and steps' and gives the data to the
connector class's ``build_prom_metrics()`` object to observe. :class:`KvdrainStats`
extends vLLM's ``NixlKVConnectorStats`` with the keys below and :class:`KvdrainPromMetrics`
extends ``NixlPromMetrics`` with their Prometheus series, so every vLLM NIXL metric stays
as it is.

==========================================  =========  ====================================
series (``_total`` for counters)            kind       what
==========================================  =========  ====================================
``vllm:kvdrain_decisions{kind}``            counter    receives decided, by kind:
                                                       completed, failed, expired, aborted,
                                                       refused
``vllm:kvdrain_releases{how}``              counter    held blocks given back: ``settled``
                                                       (after a failure's settling),
                                                       ``resolved`` (every write resolved),
                                                       ``forced`` (the quarantine ran out)
``vllm:kvdrain_failed_edges{cause}``        counter    expected writes that failed, by
                                                       cause: ``failure_notice``, ``gone``
                                                       (a lost producer), ``fenced``
``vllm:kvdrain_ignored_notices{reason}``    counter    notices that changed nothing: unknown,
                                                       late, duplicate, unexpected_sender,
                                                       malformed, not_bytes
``vllm:kvdrain_push_fail_sent``             counter    ``PUSH_FAIL`` notices a producer sent
``vllm:kvdrain_nixl_stalls``                counter    NIXL calls in flight past
                                                       ``kvdrain_nixl_stall_ms``, each once
``vllm:kvdrain_held_blocks``                gauge      blocks held while a write may land
                                                       (failed, aborted, expired, refused);
                                                       also as ``vllm:kvdrain_fenced_blocks``,
                                                       its old name, deprecated, gone in
                                                       the next release
``vllm:kvdrain_oldest_receive_age_seconds`` gauge      age of the oldest receive still
                                                       waiting for its writes: a wedged
                                                       transfer shows here while ``/health``
                                                       stays green
``vllm:kvdrain_nixl_oldest_call_seconds``   gauge      age of the oldest NIXL call in
                                                       flight on any of the worker's
                                                       threads (0 below 0.1 s)
==========================================  =========  ====================================

A gauge is the largest of the ranks' latest samples. Samples travel with the engine step:
while a rank's engine thread is itself stuck in a NIXL call, its step sends nothing and
``/metrics`` keeps its last values; the watchdog's log line still reports the stall
(:mod:`kvdrain.vllm._nixl_watch`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import (
    NixlKVConnectorStats,
    NixlPromMetrics,
)

from kvdrain.vllm._decode import COUNT_KEYS, DecodeReport

__all__ = [
    "COUNTERS",
    "DEPRECATED_GAUGES",
    "GAUGES",
    "GAUGE_PERIOD_MS",
    "KvdrainPromMetrics",
    "KvdrainStats",
]

# Counter series -> (label, {label value: data key}); a data key is "kvdrain_" and the
# DecodeReport.counts key.
COUNTERS: dict[str, tuple[str, dict[str, str]]] = {
    series: (
        label,
        {key[len(prefix) :]: f"kvdrain_{key}" for key in COUNT_KEYS if key.startswith(prefix)},
    )
    for series, label, prefix in (
        ("decisions", "kind", "decisions_"),
        ("releases", "how", "releases_"),
        ("failed_edges", "cause", "failed_edges_"),
        ("ignored_notices", "reason", "ignored_"),
    )
}
PUSH_FAIL_SENT = "kvdrain_push_fail_sent"
NIXL_STALLS = "kvdrain_nixl_stalls"
GAUGES = {
    "held_blocks": "kvdrain_held_blocks",
    "oldest_receive_age_seconds": "kvdrain_oldest_receive_age_seconds",
    "nixl_oldest_call_seconds": "kvdrain_nixl_oldest_call_seconds",
}
GAUGE_PERIOD_MS = 100
"""How often a busy rank samples its gauges when only the ages moved (ms of its clock)."""
# Deprecated series -> the gauge whose data it repeats (one release, then removed).
DEPRECATED_GAUGES = {"fenced_blocks": "held_blocks"}
_KEYS = (
    [key for _, keys in COUNTERS.values() for key in keys.values()]
    + [PUSH_FAIL_SENT, NIXL_STALLS]
    + list(GAUGES.values())
)


@dataclass
class KvdrainStats(NixlKVConnectorStats):
    """vLLM's NIXL stats plus kvdrain's (the module's table)."""

    def reset(self) -> None:
        super().reset()
        for key in _KEYS:
            self.data[key] = []

    def record_counts(self, report: DecodeReport) -> None:
        """What a decode report counted."""
        for key, n in report.counts.items():
            self.data["kvdrain_" + key].append(n)

    def record_gauges(
        self,
        rank: int,
        now_ms: int,
        held_blocks: int,
        oldest_age_s: float,
        oldest_call_s: float = 0.0,
    ) -> None:
        """Rank ``rank``'s gauges at its step's clock ``now_ms``: sampled while any is
        above zero, at once when the held blocks change or an age leaves or reaches zero,
        else every :data:`GAUGE_PERIOD_MS` (the ages grow with every step); and once
        more when all fall back to zero (a quiet engine sends no stats). A sample is
        ``[rank, value]``."""
        waiting, calling = oldest_age_s > 0, oldest_call_s > 0
        busy = bool(held_blocks or waiting or calling)
        # (held blocks, a receive waiting, a call in flight, at ms) of the last sample
        # while any gauge was above zero; None once they all were.
        last: tuple[int, bool, bool, int] | None = getattr(self, "_kvdrain_sampled", None)
        if last is None:
            if not busy:
                return
        elif (
            last[0] == held_blocks
            and last[1] is waiting
            and last[2] is calling
            and now_ms < last[3] + GAUGE_PERIOD_MS
        ):
            return
        self.data[GAUGES["held_blocks"]].append([rank, held_blocks])
        self.data[GAUGES["oldest_receive_age_seconds"]].append([rank, oldest_age_s])
        self.data[GAUGES["nixl_oldest_call_seconds"]].append([rank, oldest_call_s])
        self._kvdrain_sampled = (held_blocks, waiting, calling, now_ms) if busy else None

    def record_nixl_stalls(self, stalls: int) -> None:
        """NIXL calls newly past the stall bound (each stalled call once)."""
        if stalls:
            self.data[NIXL_STALLS].append(stalls)

    def record_push_fail_sent(self) -> None:
        self.data[PUSH_FAIL_SENT].append(1)

    def is_empty(self) -> bool:
        return super().is_empty() and not any(self.data.get(key) for key in _KEYS)

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for key in _KEYS:
            self.data.setdefault(key, [])
            other.data.setdefault(key, [])
        return super().aggregate(other)

    def reduce(self) -> dict[str, int | float]:
        out = super().reduce()
        decisions = COUNTERS["decisions"][1]
        for kind in ("failed", "expired", "refused"):
            out[f"kvdrain {kind}"] = sum(self.data.get(decisions[kind], []))
        out["kvdrain held blocks"] = latest(self.data.get(GAUGES["held_blocks"], []))
        return out


class KvdrainPromMetrics(NixlPromMetrics):
    """vLLM's NIXL Prometheus metrics plus kvdrain's series (the module's table)."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[Any, Any],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._kvdrain_counters: dict[str, dict[int, Any]] = {}
        for series, (label, keys) in COUNTERS.items():
            metric = self._counter_cls(
                name=f"vllm:kvdrain_{series}",
                documentation=f"kvdrain: {series.replace('_', ' ')} by {label}.",
                labelnames=[*labelnames, label],
            )
            for value, key in keys.items():
                self._kvdrain_counters[key] = {
                    idx: metric.labels(*labels, value)
                    for idx, labels in per_engine_labelvalues.items()
                }
        sent = self._counter_cls(
            name="vllm:kvdrain_push_fail_sent",
            documentation="kvdrain: PUSH_FAIL notices this producer sent.",
            labelnames=labelnames,
        )
        self._kvdrain_counters[PUSH_FAIL_SENT] = {
            idx: sent.labels(*labels) for idx, labels in per_engine_labelvalues.items()
        }
        stalls = self._counter_cls(
            name="vllm:kvdrain_nixl_stalls",
            documentation="kvdrain: NIXL calls in flight past kvdrain_nixl_stall_ms.",
            labelnames=labelnames,
        )
        self._kvdrain_counters[NIXL_STALLS] = {
            idx: stalls.labels(*labels) for idx, labels in per_engine_labelvalues.items()
        }
        # Each data key's gauges: its series, and a deprecated name of it.
        self._kvdrain_gauges: dict[str, list[dict[int, Any]]] = {}
        aliases = {new: old for old, new in DEPRECATED_GAUGES.items()}
        for series, key in GAUGES.items():
            names = [(series, f"kvdrain: {series.replace('_', ' ')} (largest rank).")]
            if series in aliases:
                names.append((aliases[series], f"kvdrain: deprecated, see kvdrain_{series}."))
            for name, documentation in names:
                gauge = self._gauge_cls(
                    name=f"vllm:kvdrain_{name}",
                    documentation=documentation,
                    labelnames=labelnames,
                    multiprocess_mode="max",
                )
                self._kvdrain_gauges.setdefault(key, []).append(
                    {idx: gauge.labels(*labels) for idx, labels in per_engine_labelvalues.items()}
                )

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        super().observe(transfer_stats_data, engine_idx)
        for key, per_engine in self._kvdrain_counters.items():
            total = sum(transfer_stats_data.get(key, ()))
            if total:
                per_engine[engine_idx].inc(total)
        for key, gauges in self._kvdrain_gauges.items():
            samples = transfer_stats_data.get(key)
            if samples:
                for per_engine in gauges:
                    per_engine[engine_idx].set(latest(samples))


def latest(samples: list[Any]) -> float:
    """A gauge from ``[rank, value]`` samples in time order: each rank's latest, the
    largest of those."""
    last: dict[int, float] = {}
    for rank, value in samples:
        last[rank] = value
    return max(last.values(), default=0)
