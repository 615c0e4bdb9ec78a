"""The plugin's metrics through vLLM 0.33's own mechanism: each worker's
``get_kv_connector_stats()``, aggregated as the scheduler aggregates them, observed by the
connector class's ``build_prom_metrics()`` object with prometheus_client's real classes,
then read back as the text a ``/metrics`` scrape returns."""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

import pytest
from harness import (
    PLUGIN,
    DecodeEngine,
    ProducerRank,
    completion,
    d_request,
    fake_nixl,
    push_fail,
)
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from vllm.v1.request import RequestStatus

from kvdrain.vllm._metrics import GAUGE_PERIOD_MS, GAUGES, KvdrainStats
from kvdrain.vllm._settings import Settings
from kvdrain.vllm.connector import KvdrainPushConnector

SETTLE_MS = 500
LABELS = ["model_name", "engine"]


def scrape(e: DecodeEngine) -> str:
    """Every worker's stats since the last call, aggregated and observed; the text."""
    stats = KvdrainPushConnector.build_kv_connector_stats()
    for w in e.workers:
        rank = w.get_kv_connector_stats()
        if rank is not None:  # vLLM ships nothing for a quiet rank
            # What crosses the process boundary is the data dict.
            stats = stats.aggregate(KvdrainPushConnector.build_kv_connector_stats(data=rank.data))
    registry = CollectorRegistry()

    def bound(cls: Any) -> Any:
        return lambda *a, **k: cls(*a, registry=registry, **k)

    metric_types = {Gauge: bound(Gauge), Counter: bound(Counter), Histogram: bound(Histogram)}
    prom = KvdrainPushConnector.build_prom_metrics(
        e.scheduler.vllm_config, metric_types, LABELS, {0: ["m", "0"]}
    )
    prom.observe(stats.data, 0)
    return generate_latest(registry).decode()


def value(text: str, series: str, **labels: str) -> float:
    want = dict(labels, model_name="m", engine="0")
    for line in text.splitlines():
        m = re.fullmatch(r"([^{ ]+)\{([^}]*)\} (\S+)", line)
        if m is None or m.group(1) != series:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if got == want:
            return float(m.group(3))
    raise AssertionError(f"{series}{labels} not in the scrape")


def test_decisions_releases_ignored_notices_and_gauges_reach_the_scrape() -> None:
    """D TP2, P TP2: ``ok`` completes; ``bad`` fails by a PUSH_FAIL from P0 on rank 0 and
    settles; a garbage notice and an unknown id are ignored on rank 1. The scrape shows
    vLLM's own NIXL series and kvdrain's, with the values this implies (counted per rank:
    each rank decides and reports each receive)."""
    e = DecodeEngine(PLUGIN, tp=2, p_tp=2, settings=Settings(30_000, 60_000, SETTLE_MS, 64))
    e.add(d_request("ok", p_tp=2))
    e.add(d_request("bad", p_tp=2))
    assert e.step().error is None
    e.clock.advance_ms(1_000)
    s = e.step(
        {
            0: {"P0": [completion("ok", 2), push_fail("bad", 2)]},
            1: {"P1": [completion("ok", 2), b"\xff\xfe", completion("nobody", 2)]},
        }
    )
    assert s.error is None and s.finished_recving == {"ok"}
    assert e.status("bad") == RequestStatus.FINISHED_ERROR
    text = scrape(e)
    assert "vllm:nixl_num_failed_transfers_total" in text  # vLLM's own series stay
    assert value(text, "vllm:kvdrain_decisions_total", kind="completed") == 2
    assert value(text, "vllm:kvdrain_decisions_total", kind="failed") == 1
    assert value(text, "vllm:kvdrain_failed_edges_total", cause="failure_notice") == 1
    assert value(text, "vllm:kvdrain_ignored_notices_total", reason="malformed") == 1
    assert value(text, "vllm:kvdrain_ignored_notices_total", reason="unknown") == 1
    # bad's 3 blocks are held on rank 0; rank 1 still waits 1 s for P1's write into it.
    assert value(text, "vllm:kvdrain_held_blocks") == 3
    assert value(text, "vllm:kvdrain_fenced_blocks") == 3  # the deprecated name, the same
    assert value(text, "vllm:kvdrain_oldest_receive_age_seconds") == 1.0
    e.clock.advance_ms(SETTLE_MS)
    s = e.step()  # rank 0 releases bad (settled); rank 1 learns bad was failed: aborted
    assert s.error is None and s.finished_recving == set()
    text = scrape(e)
    assert value(text, "vllm:kvdrain_releases_total", how="settled") == 1
    assert value(text, "vllm:kvdrain_decisions_total", kind="aborted") == 1
    assert value(text, "vllm:kvdrain_held_blocks") == 3  # rank 1's now
    s = e.step({1: {"P1": [completion("bad", 2)]}})  # P1's write landed after all
    assert s.finished_recving == {"bad"}
    text = scrape(e)
    assert value(text, "vllm:kvdrain_releases_total", how="resolved") == 1
    assert value(text, "vllm:kvdrain_held_blocks") == 0
    assert value(text, "vllm:kvdrain_fenced_blocks") == 0
    assert value(text, "vllm:kvdrain_oldest_receive_age_seconds") == 0
    e.run(2)
    assert all(w.get_kv_connector_stats() is None for w in e.workers)  # quiet: no stats


def test_a_wedged_receive_shows_in_the_oldest_age_gauge() -> None:
    """A receive whose producer never writes: nothing is decided for 20 s, and the gauge
    says how long the oldest receive has waited (the health signal ``/health`` lacks)."""
    e = DecodeEngine(PLUGIN, tp=1, p_tp=1, settings=Settings(30_000, 60_000, SETTLE_MS, 64))
    e.add(d_request("stuck", p_tp=1))
    assert e.step().error is None
    e.clock.advance_ms(20_000)
    assert e.step().error is None
    assert value(scrape(e), "vllm:kvdrain_oldest_receive_age_seconds") == 20.0


def test_a_busy_rank_samples_its_gauges_on_a_change_and_every_period() -> None:
    """A rank's gauges are sampled at the step where the held blocks change or an age
    leaves or reaches zero, else every ``GAUGE_PERIOD_MS`` while any is above zero (only
    the ages moved), and once more when all fall to zero; a quiet rank samples nothing."""
    s = KvdrainStats()
    held, age, call = (
        GAUGES[k] for k in ("held_blocks", "oldest_receive_age_seconds", "nixl_oldest_call_seconds")
    )
    p = GAUGE_PERIOD_MS
    s.record_gauges(0, 0, 0, 0.0)  # quiet
    s.record_gauges(0, 10, 0, 0.01)  # a receive waits: at once
    s.record_gauges(0, 20, 0, 0.02)  # its age grew, within the period
    s.record_gauges(0, 30, 4, 0.03)  # blocks held: at once
    s.record_gauges(0, 29 + p, 4, (29 + p) / 1000)  # within the period
    s.record_gauges(0, 30 + p, 4, (30 + p) / 1000)  # the period: sampled
    s.record_gauges(0, 31 + p, 4, (31 + p) / 1000, 0.2)  # a call in flight: at once
    s.record_gauges(0, 32 + p, 4, (32 + p) / 1000, 0.3)  # its age grew, within the period
    s.record_gauges(0, 33 + p, 0, 0.0)  # all zero: once
    s.record_gauges(0, 40 * p, 0, 0.0)  # quiet
    assert s.data[held] == [[0, 0], [0, 4], [0, 4], [0, 4], [0, 0]]
    assert s.data[age] == [[0, 0.01], [0, 0.03], [0, (30 + p) / 1000], [0, (31 + p) / 1000], [0, 0.0]]
    assert s.data[call] == [[0, 0.0], [0, 0.0], [0, 0.0], [0, 0.2], [0, 0.0]]


def test_failure_notices_a_producer_sent_are_counted() -> None:
    p = ProducerRank(PLUGIN, p_tp=2, tp_rank=0, d_tp=1)
    p.nixl.fail_posts = 1
    p.push("p-r", "d-r")
    stats = p.w.get_kv_connector_stats()
    assert stats is not None and stats.data["kvdrain_push_fail_sent"] == [1]


def test_a_held_nixl_call_counts_one_stall_and_shows_its_age(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Rank 1's handshake thread sits in ``add_remote_agent`` (a call the tap does not
    override) past ``kvdrain_nixl_stall_ms`` while the engine steps: the scrape shows the
    call's age while it is held, the stall once over every scrape, and 0 after it
    returns."""
    caplog.set_level(logging.WARNING, logger="vllm.kvdrain")
    bound_ms = 200
    # No stack tools: gdb would pause this process for many seconds (torch's symbols);
    # the dump itself is the unit suite's to test.
    settings = Settings(30_000, 60_000, SETTLE_MS, 64, nixl_stall_ms=bound_ms, nixl_stack_tools=())
    e = DecodeEngine(PLUGIN, tp=2, p_tp=2, settings=settings)
    e.add(d_request("r", p_tp=2))
    assert e.step().error is None
    scrape(e)  # what the first step sent
    release = threading.Event()

    def add_remote_agent(metadata: bytes) -> bytes:
        assert release.wait(60), "never released"
        return b"P9"

    fake_nixl(e.workers[1]).add_remote_agent = add_remote_agent  # type: ignore[attr-defined]
    handshake = threading.Thread(
        target=e.workers[1].nixl_wrapper.add_remote_agent, args=(b"md",), name="handshake"
    )
    handshake.start()
    end = time.monotonic() + 60
    while not any("nixl call stalled" in r.getMessage() for r in caplog.records):
        assert time.monotonic() < end, "the watchdog never reported the held call"
        time.sleep(0.01)
    assert e.step().error is None
    text = scrape(e)
    assert value(text, "vllm:kvdrain_nixl_stalls_total") == 1
    first_age = value(text, "vllm:kvdrain_nixl_oldest_call_seconds")
    assert first_age >= bound_ms / 1000
    time.sleep(0.3)
    e.clock.advance_ms(GAUGE_PERIOD_MS)  # a growing age is sampled once a period
    assert e.step().error is None
    text = scrape(e)
    assert value(text, "vllm:kvdrain_nixl_stalls_total") == 0  # counted once, not again
    assert value(text, "vllm:kvdrain_nixl_oldest_call_seconds") > first_age
    release.set()
    handshake.join(60)
    assert e.step().error is None
    text = scrape(e)
    assert value(text, "vllm:kvdrain_nixl_oldest_call_seconds") == 0
    assert value(text, "vllm:kvdrain_nixl_stalls_total") == 0
    stalled = [r for r in caplog.records if "nixl call stalled" in r.getMessage()]
    assert len(stalled) == 1 and '"call": "add_remote_agent"' in stalled[0].getMessage()
