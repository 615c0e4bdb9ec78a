"""No Python object is created per notification: only the decisions returned (and one
list per batch) are new."""

from __future__ import annotations

import sys

from kvdrain import Ledger


def test_feeding_non_deciding_notices_allocates_nothing_per_notice() -> None:
    n = 4096
    led = Ledger(n)
    for i in range(n):
        led.register(f"req-{i:08x}-cmpl", i, 2)
    first = [f"req-{i:08x}-cmpl:2".encode() for i in range(n)]
    batches = [{"P0": first[k : k + 64]} for k in range(0, n, 64)]
    led.feed(batches[0])  # warm-up: lazily created interned strings, caches
    before = sys.getallocatedblocks()
    for batch in batches[1:]:
        out = led.feed(batch)
        del out
    after = sys.getallocatedblocks()
    assert after - before <= 2, (before, after)
    assert led.poll() == []  # nothing decided: every request still waits for an edge
    assert led.counters()["completions"] == n


def test_a_deciding_batch_creates_only_its_decisions() -> None:
    n = 1024
    led = Ledger(n)
    for i in range(n):
        led.register(f"r{i}", None, 1)
    msgs = [f"r{i}:1".encode() for i in range(n)]
    led.feed({"P0": msgs[:64]})
    led.poll()
    before = sys.getallocatedblocks()
    led.feed({"P0": msgs[64:]})
    after = sys.getallocatedblocks()
    assert after - before <= 2
    decisions = led.poll()
    assert len(decisions) == n - 64
