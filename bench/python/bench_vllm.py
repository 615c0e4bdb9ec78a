"""The connector plugin's cost next to vLLM 0.33's own push path, in one run, on the real
worker classes (vLLM's ``NixlPushConnectorWorker`` and the plugin's ``KvdrainPushWorker``,
built as the scenario suite builds them, with a fake NIXL agent).

Four paths: vLLM's, the plugin's, the plugin's with its flight recorder on
(``kvdrain_record_dir``, writing to a temporary directory), and the plugin's with no NIXL
call timed (``kvdrain_nixl_stall_ms`` 0; the plugin's path times every call). Three
figures per path, median of ``--repeat`` rounds:

* **step**: one engine step's ``get_transfer_results()`` with ``--pending`` receives
  outstanding and nothing arriving (what every step pays);
* **notification**: a batch of ``--batch`` completions, one per request (P TP1 -> D TP1),
  from the writer thread's round to the step that reports them all finished, per
  notification;
* **registration**: ``start_load_kv`` of ``--batch`` receives, per request;
* **NIXL call**: one call through the worker's ``nixl_wrapper``, in ns: ``send_notif``
  (one the tap overrides) and ``transfer`` (one it hands through), each against a fake
  agent that returns at once, so the figure is all wrapper.

Usage: .venv-vllm/bin/python bench/python/bench_vllm.py [--batch N] [--pending N] [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "crates", "kvdrain-python", "tests", "vllm"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "crates", "kvdrain-python", "tests"))

import harness  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (  # noqa: E402
    NixlConnectorMetadata,
    RemoteMeta,
    ReqMeta,
)

from kvdrain.vllm._settings import Settings  # noqa: E402


def metadata(ids: list[str]) -> NixlConnectorMetadata:
    meta = NixlConnectorMetadata()
    for i, rid in enumerate(ids):
        meta.reqs_to_recv[rid] = ReqMeta(
            local_block_ids=([i % harness.NUM_BLOCKS],),
            local_physical_block_ids=([i % harness.NUM_BLOCKS],),
            tp_size=1,
            remote=RemoteMeta(
                block_ids=(), host="127.0.0.1", port=5600, engine_id=harness.P_ENGINE,
                request_id=f"p-{rid}",
            ),
        )
    return meta


CALLS = 2_000  # NIXL calls per round for the per-call figures
RECORDING = "plugin+recorder"
UNTIMED = "plugin, untimed"


def worker(
    which: str, capacity: int, record_dir: str | None = None, stall_ms: int = 5_000
) -> object:
    cfg = harness.vllm_config(which, tp=1)
    return harness.make_worker(
        which,
        cfg,
        tp_rank=0,
        world_size=1,
        engine_id=harness.D_ENGINE,
        remote_engine=harness.P_ENGINE,
        remote_tp=1,
        remote_agents={(0, 0): "P0"},
        clock=harness.Clock(),
        settings=Settings(
            480_000, 60_000, 5_000, capacity, record_dir=record_dir, nixl_stall_ms=stall_ms
        ),
    )


def measure(
    which: str,
    batch: int,
    pending: int,
    repeat: int,
    record_dir: str | None = None,
    stall_ms: int = 5_000,
) -> dict[str, float]:
    w = worker(which, capacity=pending + batch + 16, record_dir=record_dir, stall_ms=stall_ms)
    # Requests that stay outstanding for the whole run (never completed).
    w.start_load_kv(metadata([f"idle-{i}" for i in range(pending)]))
    step_ns: list[float] = []
    notif_ns: list[float] = []
    reg_ns: list[float] = []
    send_ns: list[float] = []
    pass_ns: list[float] = []
    nixl: Any = w.nixl_wrapper
    fake = harness.fake_nixl(w)
    for r in range(repeat):
        ids = [f"r{r}-{i}" for i in range(batch)]
        meta = metadata(ids)
        t0 = time.perf_counter_ns()
        w.start_load_kv(meta)
        t1 = time.perf_counter_ns()
        reg_ns.append((t1 - t0) / batch)
        w.nixl_wrapper.deliver({"P0": [f"{rid}:1".encode() for rid in ids]})
        t0 = time.perf_counter_ns()
        harness.writer_round(w)
        res = w.get_transfer_results()
        t1 = time.perf_counter_ns()
        assert res.finished_recving == set(ids), (which, len(res.finished_recving))
        notif_ns.append((t1 - t0) / batch)
        t0 = time.perf_counter_ns()
        for _ in range(100):
            res = w.get_transfer_results()
        t1 = time.perf_counter_ns()
        assert not res.finished_recving
        step_ns.append((t1 - t0) / 100)
        t0 = time.perf_counter_ns()
        for _ in range(CALLS):
            nixl.send_notif("P0", notif_msg=b"HB:x")
        t1 = time.perf_counter_ns()
        send_ns.append((t1 - t0) / CALLS)
        fake.sent.clear()
        t0 = time.perf_counter_ns()
        for _ in range(CALLS):
            nixl.transfer(1)
        t1 = time.perf_counter_ns()
        pass_ns.append((t1 - t0) / CALLS)
    return {
        "step_us": statistics.median(step_ns) / 1000,
        "notification_us": statistics.median(notif_ns) / 1000,
        "registration_us": statistics.median(reg_ns) / 1000,
        "send_notif_ns": statistics.median(send_ns),
        "transfer_ns": statistics.median(pass_ns),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--pending", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=30)
    a = ap.parse_args()
    out = {}
    with tempfile.TemporaryDirectory() as record_dir:
        for _ in range(2):  # the second measurement of each is kept (the first warms up)
            out[harness.CONTROL] = measure(harness.CONTROL, a.batch, a.pending, a.repeat)
            out[harness.PLUGIN] = measure(harness.PLUGIN, a.batch, a.pending, a.repeat)
            out[RECORDING] = measure(harness.PLUGIN, a.batch, a.pending, a.repeat, record_dir)
            out[UNTIMED] = measure(harness.PLUGIN, a.batch, a.pending, a.repeat, stall_ms=0)
    print(f"vLLM 0.33.0 push worker, batch {a.batch}, {a.pending} receives pending, "
          f"median of {a.repeat}")
    print(
        f"{'':28}{'vLLM 0.33':>12}{'plugin':>12}{'plugin/vLLM':>14}{'+recorder':>12}"
        f"{'rec/plugin':>12}{'untimed':>12}{'timing':>12}"
    )
    for key, label in (
        ("step_us", "engine step (us)"),
        ("notification_us", "per notification (us)"),
        ("registration_us", "per registration (us)"),
        ("send_notif_ns", "NIXL send_notif (ns)"),
        ("transfer_ns", "NIXL transfer (ns)"),
    ):
        c, p, r = out[harness.CONTROL][key], out[harness.PLUGIN][key], out[RECORDING][key]
        u = out[UNTIMED][key]
        print(
            f"{label:28}{c:12.2f}{p:12.2f}{p / c:13.2f}x{r:12.2f}{r / p:11.2f}x"
            f"{u:12.2f}{p - u:+12.2f}"
        )
    print("timing: the plugin's figure less the untimed one (same unit): the cost of timing")


if __name__ == "__main__":
    main()
