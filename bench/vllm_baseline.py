#!/usr/bin/env python3
"""Baseline: vLLM's push-mode consumer (decode side) notification counting, in Python.

What is modelled
----------------
A Python rendering of the per-notification path of vLLM's NIXL push worker on the
consumer (D) side, written from the upstream source (not copied):

  vllm/distributed/kv_transfer/kv_connector/v1/nixl/push_worker.py
    * upstream main @ 039e79a6: ``_push_writer_loop`` step 4 (raw-bytes
      ``startswith(PUSH_REG_NOTIF_PREFIX)``, everything else put on
      ``_pending_completion_notifs``) and ``_get_new_notifs`` (drain, decode,
      ``HB:`` check, ``rsplit(":", 1)``, producer-side membership checks,
      ``_recving_metadata`` lookup, ``int(tp_size)``, defaultdict counter).
    * vLLM PR #50754 @ 5cb2a379 (YannikHinteregger/vllm): ``PUSH_FAIL:`` prefix
      strip in ``_get_new_notifs`` and ``_count_consumer_notif`` (remember the
      failure in ``_failed_write_reqs``; a failure notice counts like a completion).

Per notification (``PushConsumer.process``):

  1. ``notif.startswith(b"PUSH_REG:")`` on the raw bytes (writer thread upstream);
  2. ``notif.decode("utf-8")``;
  3. ``msg.startswith("HB:")`` -> heartbeat handler (never taken here);
  4. ``msg.startswith("PUSH_FAIL:")`` -> strip the prefix, remember "failed";
  5. ``req_id, tp_size = msg.rsplit(":", 1)``;
  6. ``req_id not in _reqs_to_send and req_id not in _reqs_to_process`` (both
     empty on a pure consumer, but the lookups are paid per message upstream);
  7. ``meta = _recving_metadata.get(req_id)``; unknown ids are dropped (upstream
     logs "Unrecognized request ... (may have expired)");
  8. ``expected = meta.pp_size * max(1, int(tp_size) // world_size)``;
  9. ``counts[req_id] += 1`` (a ``defaultdict(int)``); below expected -> next;
 10. at the expected count: ``del counts[req_id]``; if it was marked failed,
     discard the mark and append it to a failed list, else append it to the
     finished list; pop its receive metadata.  Upstream defers the metadata pop
     and the "done" report to ``get_finished`` / ``_pop_done_transfers`` (once per
     request, not per message); that bookkeeping is collapsed into the pop+append.
 11. Like the Rust benchmark, the request is then re-registered at once
     (``_recving_metadata[req_id] = meta``) so R requests stay in flight.

Benchmark setup: D TP world size 1 and ``pp_size`` 1, so with the TP field = E the
expected count per request is ``1 * max(1, E // 1) = E``.  Optional
``--queue-hop`` also models the writer-thread -> engine-thread
``queue.Queue.put`` / ``get_nowait`` hop each non-PUSH_REG notification takes
upstream (single-threaded here, so no contention is modelled); it is off by
default and reported as impl ``vllm-python+queue``.

Message generation rule (shared with `kvdrain bench`, tools/kvdrain-cli/src/bench/stream.rs;
must stay byte-identical)
---------------------------------------------------------------------------
* R requests, ids ``req-{i:08x}-cmpl`` for i in 0..R (ASCII, 17 bytes).
* PRNG: xorshift64* (Vigna), 64-bit state, seeded with S (default
  0x9E3779B97F4A7C15; a seed of 0 is replaced by the default since the state
  must be non-zero).  next(): x ^= x >> 12; x ^= x << 25; x ^= x >> 27 (all
  mod 2**64); state = x; return (x * 0x2545F4914F6CDD1D) mod 2**64.
* Message k (k = 0..M-1) goes to request ``(k // E) % R``: round-robin over
  requests, E consecutive messages (one per edge) per request per pass.
* For every message, in order, draw r = next(); if ``r % 10000 < fail_share *
  10000`` (integer compared with the double ``fail_share * 10000.0``; exact in
  both languages) the message is the failure notice ``PUSH_FAIL:{id}:{E}``,
  otherwise the completion ``{id}:{E}``.  The TP field is E in decimal.  One
  draw per message always, also with --fail-share 0.
* Requests are registered with expected count E before the timed loop; on
  completion they are re-registered (same id here; a new generation in Rust).

Timing: the messages are prepared as a list of distinct ``bytes`` objects before
timing (NIXL hands over fresh objects too); each repetition builds a fresh
consumer (untimed), then times one pass over all M messages with
``time.perf_counter_ns``.  The JSON line reports the median ns per notification, and
(``cpu_ns_per_notification``) the median thread CPU time (``time.thread_time_ns``),
which leaves out time spent descheduled on a shared machine.
The garbage collector stays enabled (vLLM runs with it), but the benchmark's own
long-lived objects are moved out of its reach with ``gc.freeze()`` first.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import queue
import statistics
import sys
import time
from collections import defaultdict

DEFAULT_SEED = 0x9E3779B97F4A7C15
MASK64 = (1 << 64) - 1

PUSH_REG_NOTIF_PREFIX = b"PUSH_REG:"
PUSH_FAIL_PREFIX_STR = "PUSH_FAIL:"


class XorShift64Star:
    """xorshift64* (Vigna 2016); identical to the Rust bench's generator."""

    __slots__ = ("state",)

    def __init__(self, seed: int) -> None:
        seed &= MASK64
        self.state = seed if seed != 0 else DEFAULT_SEED

    def next(self) -> int:
        x = self.state
        x ^= x >> 12
        x ^= (x << 25) & MASK64
        x ^= x >> 27
        self.state = x
        return (x * 0x2545F4914F6CDD1D) & MASK64


def request_id(i: int) -> str:
    return f"req-{i:08x}-cmpl"


def generate(inflight: int, edges: int, notifications: int, fail_share: float,
             seed: int) -> tuple[list[bytes], int]:
    """Return (messages, number of failure notices) per the generation rule."""
    rng = XorShift64Star(seed)
    threshold = fail_share * 10000.0
    ids = [request_id(i) for i in range(inflight)]
    tp = str(edges)
    msgs: list[bytes] = []
    fails = 0
    for k in range(notifications):
        rid = ids[(k // edges) % inflight]
        if rng.next() % 10000 < threshold:
            # str.encode makes a fresh bytes object per message.
            msgs.append(f"PUSH_FAIL:{rid}:{tp}".encode("utf-8"))
            fails += 1
        else:
            msgs.append(f"{rid}:{tp}".encode("utf-8"))
    return msgs, fails


class ReqMeta:
    """Stand-in for vLLM's ReqMeta (a plain dataclass upstream); only pp_size is read."""

    def __init__(self, pp_size: int = 1) -> None:
        self.pp_size = pp_size
        self.local_block_ids = ([0],)


class PushConsumer:
    """The consumer-side state and counting path of NixlPushConnectorWorker."""

    def __init__(self, world_size: int = 1) -> None:
        self.world_size = world_size
        self.transfer_topo = object()  # only asserted non-None upstream
        self._reqs_to_send: dict[str, float] = {}  # producer-side; empty on D
        self._reqs_to_process: set[str] = set()  # producer-side; empty on D
        self._recving_metadata: dict[str, ReqMeta] = {}
        self.consumer_notification_counts_by_req: defaultdict[str, int] = defaultdict(int)
        self._failed_write_reqs: set[str] = set()
        self._pending_completion_notifs: queue.Queue[bytes] = queue.Queue()
        self.finished: list[str] = []
        self.failed: list[str] = []
        self.unknown = 0
        self.heartbeats = 0
        self.registrations = 0

    def register(self, req_id: str, meta: ReqMeta) -> None:
        self._recving_metadata[req_id] = meta

    # -- writer thread upstream: raw-bytes PUSH_REG routing ---------------- #

    def _handle_push_reg_notif(self, notif: bytes) -> None:
        self.registrations += 1  # never taken: the stream has no registrations

    def _handle_heartbeat(self, body: str) -> None:
        self.heartbeats += 1  # never taken: the stream has no heartbeats

    # -- engine main thread upstream: counting ----------------------------- #

    def _count_consumer_notif(self, req_id: str, producer_tp_size: int,
                              failed_write: bool) -> None:
        meta = self._recving_metadata.get(req_id)
        if meta is None:
            # Upstream: logger.error("Unrecognized request %s notif ...").
            self.unknown += 1
            return
        if failed_write:
            self._failed_write_reqs.add(req_id)
        producers_per_consumer = max(1, producer_tp_size // self.world_size)
        expected_notifs = meta.pp_size * producers_per_consumer
        self.consumer_notification_counts_by_req[req_id] += 1
        if self.consumer_notification_counts_by_req[req_id] < expected_notifs:
            return
        del self.consumer_notification_counts_by_req[req_id]
        if req_id in self._failed_write_reqs:
            self._failed_write_reqs.discard(req_id)
            self.failed.append(req_id)
        else:
            self.finished.append(req_id)
        meta = self._recving_metadata.pop(req_id)
        # Benchmark: re-register at once so R requests stay in flight.
        self._recving_metadata[req_id] = meta

    def _consume(self, notif: bytes) -> None:
        msg = notif.decode("utf-8")
        if msg.startswith("HB:"):
            self._handle_heartbeat(msg[3:])
            return
        failed_write = msg.startswith(PUSH_FAIL_PREFIX_STR)
        if failed_write:
            msg = msg[len(PUSH_FAIL_PREFIX_STR):]
        req_id, tp_size = msg.rsplit(":", 1)
        if req_id not in self._reqs_to_send and req_id not in self._reqs_to_process:
            self._count_consumer_notif(req_id, int(tp_size), failed_write)
            return
        # Producer-side (pull-style) count: never taken on a pure consumer.
        raise AssertionError("producer path not modelled")

    def process(self, notifs: list[bytes]) -> None:
        """Inline path: PUSH_REG check, then the consumer path, per message."""
        assert self.transfer_topo is not None
        for notif in notifs:
            if notif.startswith(PUSH_REG_NOTIF_PREFIX):
                self._handle_push_reg_notif(notif)
                continue
            self._consume(notif)

    def process_with_queue_hop(self, notifs: list[bytes]) -> None:
        """Writer loop step 4 (route/put) then the engine-thread drain (get_nowait)."""
        q = self._pending_completion_notifs
        for notif in notifs:
            if notif.startswith(PUSH_REG_NOTIF_PREFIX):
                self._handle_push_reg_notif(notif)
            else:
                q.put(notif)
        assert self.transfer_topo is not None
        while True:
            try:
                notif = q.get_nowait()
            except queue.Empty:
                break
            self._consume(notif)


def parse_int(text: str) -> int:
    return int(text.replace("_", ""), 0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--inflight", type=parse_int, required=True, help="R requests in flight")
    ap.add_argument("--edges", type=parse_int, required=True, help="E notifications per request")
    ap.add_argument("--notifications", type=parse_int, required=True, help="M messages per rep")
    ap.add_argument("--fail-share", type=float, default=0.01)
    ap.add_argument("--reps", type=parse_int, default=5)
    ap.add_argument("--seed", type=parse_int, default=DEFAULT_SEED)
    ap.add_argument("--queue-hop", action="store_true",
                    help="also model the writer->engine queue.Queue hop")
    ap.add_argument("--dump-stream", action="store_true",
                    help="print the generated messages, one a line, and exit")
    args = ap.parse_args(argv)
    if args.inflight < 1 or args.edges < 1 or args.notifications < 1 or args.reps < 1:
        ap.error("--inflight, --edges, --notifications and --reps must be >= 1")
    if not 0.0 <= args.fail_share <= 1.0:
        ap.error("--fail-share must be within [0, 1]")

    msgs, fails = generate(args.inflight, args.edges, args.notifications,
                           args.fail_share, args.seed)
    if args.dump_stream:
        out = sys.stdout.buffer
        for m in msgs:
            out.write(m + b"\n")
        out.flush()
        return 0
    ids = [request_id(i) for i in range(args.inflight)]
    expected_done = args.notifications // args.edges  # round-robin, E per request

    samples: list[float] = []
    cpu_samples: list[float] = []
    for _ in range(args.reps):
        worker = PushConsumer(world_size=1)
        for rid in ids:
            worker.register(rid, ReqMeta(pp_size=1))
        run = worker.process_with_queue_hop if args.queue_hop else worker.process
        gc.collect()
        gc.freeze()
        c0 = time.thread_time_ns()
        t0 = time.perf_counter_ns()
        run(msgs)
        t1 = time.perf_counter_ns()
        c1 = time.thread_time_ns()
        gc.unfreeze()
        samples.append((t1 - t0) / args.notifications)
        cpu_samples.append((c1 - c0) / args.notifications)
        done = len(worker.finished) + len(worker.failed)
        if done != expected_done or worker.unknown:
            print(f"sanity check failed: done={done} expected={expected_done} "
                  f"unknown={worker.unknown}", file=sys.stderr)
            return 1

    print(json.dumps({
        "impl": "vllm-python+queue" if args.queue_hop else "vllm-python",
        "ns_per_notification": round(statistics.median(samples), 2),
        "cpu_ns_per_notification": round(statistics.median(cpu_samples), 2),
        "notifications": args.notifications,
        "inflight": args.inflight,
        "edges": args.edges,
        "reps": args.reps,
        "python": platform.python_version(),
    }, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
