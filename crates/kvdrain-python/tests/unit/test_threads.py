"""A writer thread feeds NIXL-shaped batches while the engine thread registers, polls and
advances: no decision is lost or doubled over 10^5 requests."""

from __future__ import annotations

import collections
import queue
import random
import threading

from kvdrain import Decision, Ledger

REQUESTS = 100_000
WINDOW = 2048  # requests in flight at most
BATCH = 64  # notifications per NIXL batch


def writer(led: Ledger, todo: queue.Queue[list[str] | None], seed: int) -> None:
    """Two producer agents; about 1 % failure notices, some duplicates and garbage."""
    rng = random.Random(seed)
    pending: list[tuple[str, bytes]] = []
    while True:
        ids = todo.get()
        if ids is None:
            break
        for rid in ids:
            for agent in ("P0", "P1"):
                body = f"{rid}:2".encode()
                pending.append((agent, b"PUSH_FAIL:" + body if rng.random() < 0.01 else body))
        rng.shuffle(pending)
        while len(pending) >= BATCH or (pending and todo.empty()):
            chunk, pending = pending[:BATCH], pending[BATCH:]
            batch: dict[str, list[bytes]] = collections.defaultdict(list)
            for agent, msg in chunk:
                batch[agent].append(msg)
            if rng.random() < 0.05:
                batch["P0"].append(b"\xff garbage")
                batch["P1"].append(b"HB:x")
            led.feed(batch)


def test_two_threads_lose_and_double_nothing() -> None:
    # Failures release with their decision, as in vLLM. The engine loop below moves the
    # clock 1 ms a pass, and it passes as often as the host lets it while it waits for the
    # writer thread: on a loaded host 30 000 passes came, and the default deadline fired.
    # Nothing here is about time: no deadline within any number of passes.
    led = Ledger(4096, settle_ms=0, deadline_ms=1_000_000_000)
    todo: queue.Queue[list[str] | None] = queue.Queue()
    t = threading.Thread(target=writer, args=(led, todo, 7))
    t.start()
    seen: dict[str, list[str]] = collections.defaultdict(list)
    registered = 0
    open_requests = 0
    now = 0

    def take(decisions: list[Decision]) -> None:
        nonlocal open_requests
        for d in decisions:
            seen[d.request_id].append(d.kind)
            assert d.blocks == int(d.request_id[1:])
            if d.kind in ("completed", "released"):
                open_requests -= 1

    try:
        while registered < REQUESTS or open_requests:
            ids: list[str] = []
            while registered < REQUESTS and open_requests < WINDOW and len(ids) < 256:
                rid = f"r{registered}"
                led.register(rid, registered, ["P0", "P1"] if registered % 2 else 2)
                ids.append(rid)
                registered += 1
                open_requests += 1
            if ids:
                todo.put(ids)
            take(led.poll())
            now += 1
            take(led.advance(now))  # no deadline is near: nothing expires
    finally:
        todo.put(None)
        t.join()
    take(led.poll())
    assert len(seen) == REQUESTS
    outcomes = collections.Counter(tuple(v) for v in seen.values())
    assert set(outcomes) <= {("completed",), ("failed", "released")}, outcomes
    assert outcomes[("failed", "released")] > 0
    c = led.counters()
    assert c["completed"] == outcomes[("completed",)]
    assert c["failed"] == c["released"] == outcomes[("failed", "released")]
    assert c["completions"] + c["failure_notices"] == 2 * REQUESTS
    assert c["unknown"] == c["late"] == c["duplicate"] == 0
    assert len(led) == 0
