"""A decode node's two threads around one kvdrain.Ledger (NIXL stubbed by a queue)."""

from __future__ import annotations

import queue
import threading

import kvdrain

ledger = kvdrain.Ledger(capacity=4096, deadline_ms=30_000, quarantine_ms=60_000)
nixl: queue.Queue[dict[str, list[bytes]] | None] = queue.Queue()


def writer_thread() -> None:
    """Owns the NIXL agent: hands each get_new_notifs() batch over whole."""
    while (batch := nixl.get()) is not None:
        for agent, message in ledger.feed(batch):
            print(f"producer-bound from {agent}: {message!r}")  # PUSH_REG:/HB: handlers


writer = threading.Thread(target=writer_thread)
writer.start()
ledger.register("cmpl-1-0", blocks=[10, 11], expect=2)  # P TP2 -> D TP1: two writes
ledger.register("cmpl-2-0", blocks=[12], expect=["P0", "P1"])  # named producer agents
nixl.put({"P0": [b"cmpl-1-0:2", b"cmpl-2-0:2"], "P1": [b"PUSH_FAIL:cmpl-1-0:2", b"HB:x"]})
nixl.put({"P1": [b"cmpl-2-0:2"]})
nixl.put(None)
writer.join()

for d in ledger.poll() + ledger.advance(now_ms=10):
    print(d.kind, d.request_id, d.blocks)
