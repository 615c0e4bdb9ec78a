"""The connector plugin's cost next to vLLM's own push path (the release in the venv), in
one run, on the real worker classes (vLLM's ``NixlPushConnectorWorker`` and the plugin's
``KvdrainPushWorker``, built as the scenario suite builds them, with a fake NIXL agent).

Four paths: vLLM's, the plugin's, the plugin's with its flight recorder on
(``kvdrain_record_dir``, writing to a temporary directory), and the plugin's with no NIXL
call timed (``kvdrain_nixl_stall_ms`` 0; the plugin's path times every call). Three
figures per path, median of ``--repeat`` rounds:

* **step**: one engine step with ``--pending`` receives outstanding and nothing
  arriving (what every step pays): the connector's two calls in it, ``start_load_kv``
  of an empty metadata and ``get_transfer_results()``; and the second alone;
* **notification**: a batch of ``--batch`` completions, one per request (P TP1 -> D TP1),
  from the writer thread's round to the step that reports them all finished, per
  notification;
* **registration**: ``start_load_kv`` of ``--batch`` receives, per request;
* **NIXL call**: one call through the worker's ``nixl_wrapper``, in ns: ``send_notif``
  (one the tap overrides) and ``transfer`` (one it hands through), each against a fake
  agent that returns at once, so the figure is all wrapper.

Then, over real NIXL, once per thread-sync mode of the worker's agent
(``--nixl-sync``, ``kvdrain_nixl_sync``: ``none`` is vLLM's own unsynchronized agent):
the plugin's connector built by its own constructor in the worker role (vLLM's writer
thread running), a second NIXL agent in this process playing the producer over UCX TCP
on loopback:

* **step** and **notification** as above, the notifications sent by the producer agent
  and read by vLLM's writer thread (``--real-repeat`` rounds);
* **worst call**: the longest single call into the worker's agent (any thread), with
  the slowest call's name, and the median of all; first idle, then with ``--load``
  processes beside it, each holding two idle NIXL agents whose progress threads never
  sleep (the load the topology suite's rank processes put on a host).

Usage: .venv-vllm/bin/python bench/python/bench_vllm.py [--batch N] [--pending N]
    [--repeat N] [--nixl-sync none,rw,strict] [--real-repeat N] [--load N]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
    return harness.one_rank_worker(
        which,
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
    whole_ns: list[float] = []
    empty = metadata([])
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
        for _ in range(100):
            w.start_load_kv(empty)
            res = w.get_transfer_results()
        t1 = time.perf_counter_ns()
        assert not res.finished_recving
        whole_ns.append((t1 - t0) / 100)
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
        "whole_step_us": statistics.median(whole_ns) / 1000,
        "step_us": statistics.median(step_ns) / 1000,
        "notification_us": statistics.median(notif_ns) / 1000,
        "registration_us": statistics.median(reg_ns) / 1000,
        "send_notif_ns": statistics.median(send_ns),
        "transfer_ns": statistics.median(pass_ns),
    }


# ---- over real NIXL, per thread-sync mode ------------------------------------------- #

TIMED = (
    "get_new_notifs",
    "send_notif",
    "check_xfer_state",
    "make_prepped_xfer",
    "transfer",
    "release_xfer_handle",
    "add_remote_agent",
    "remove_remote_agent",
)
"""The worker agent's calls that are timed (vLLM's engine step, writer and handshake)."""

LOAD_SCRIPT = """
import sys, time
from nixl._api import nixl_agent, nixl_agent_config
agents = [nixl_agent(f"load-{i}-{time.monotonic_ns()}", nixl_agent_config(backends=["UCX"]))
          for i in range(2)]
sys.stdin.read()
"""


class CallTimes:
    """Every call to ``TIMED`` methods of one NIXL agent, timed (seconds), from any
    thread: the wrappers are set on the agent object, so the plugin's tap and vLLM's
    threads go through them."""

    def __init__(self, agent: Any) -> None:
        self.lock = threading.Lock()
        self.times: list[tuple[float, str]] = []
        for name in TIMED:
            setattr(agent, name, self._timed(name, getattr(agent, name)))

    def _timed(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                took = time.perf_counter() - t0
                with self.lock:
                    self.times.append((took, name))

        return timed

    def take(self) -> list[tuple[float, str]]:
        with self.lock:
            times, self.times = self.times, []
        return times


@contextmanager
def load(processes: int) -> Iterator[None]:
    """``processes`` processes beside this one, each with two idle NIXL agents."""
    procs = [
        subprocess.Popen([sys.executable, "-c", LOAD_SCRIPT], stdin=subprocess.PIPE,
                         stderr=subprocess.DEVNULL)
        for _ in range(processes)
    ]
    try:
        time.sleep(3.0 if processes else 0.0)  # their agents up and spinning
        yield
    finally:
        for p in procs:
            assert p.stdin is not None
            p.stdin.close()
        for p in procs:
            p.wait(timeout=30)


def init_distributed() -> None:
    from vllm.config import set_current_vllm_config
    from vllm.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
        model_parallel_is_initialized,
    )

    with set_current_vllm_config(harness.vllm_config(harness.CONTROL)):
        if not model_parallel_is_initialized():
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            s.close()
            init_distributed_environment(
                world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}",
                local_rank=0, backend="gloo",
            )
            initialize_model_parallel(1, 1)


def measure_real(mode: str, batch: int, pending: int, repeat: int, loads: int) -> dict[str, Any]:
    """The plugin's worker on real NIXL with ``kvdrain_nixl_sync=mode`` (see the doc)."""
    import torch
    from nixl._api import nixl_agent, nixl_agent_config
    from vllm.config import set_current_vllm_config
    from vllm.distributed.kv_transfer.kv_connector.utils import EngineTransferInfo
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from kvdrain.vllm.connector import KvdrainPushConnector

    cfg = harness.vllm_config(harness.PLUGIN, extra={"kvdrain_nixl_sync": mode,
                                                     "kvdrain_capacity": 2 * (pending + batch)})
    with set_current_vllm_config(cfg):
        conn = KvdrainPushConnector(cfg, KVConnectorRole.WORKER, harness.kv_cache_config())
    conn.register_kv_caches(
        {n: torch.zeros((harness.NUM_BLOCKS, 2, harness.BLOCK_SIZE, 4, 16)) for n in harness.LAYERS}
    )
    w: Any = conn.connector_worker
    try:
        w.transfer_topo.register_remote_engine(
            harness.P_ENGINE,
            EngineTransferInfo(
                remote_tp_size=1,
                remote_block_len=w.block_len_per_layer[0],
                remote_block_size=harness.BLOCK_SIZE,
                remote_physical_blocks_per_logical=1,
            ),
        )
        timing = CallTimes(w.nixl_wrapper.agent)
        producer = nixl_agent(f"bench-producer-{mode}", nixl_agent_config(backends=["UCX"]))
        me = producer.add_remote_agent(w.nixl_wrapper.get_agent_metadata())
        w.start_load_kv(metadata([f"idle-{mode}-{i}" for i in range(pending)]))
        out: dict[str, Any] = {}
        for phase, processes in (("idle", 0), ("loaded", loads)):
            if phase == "loaded" and not loads:
                break
            step_ns: list[float] = []
            notif_ns: list[float] = []
            timing.take()
            with load(processes):
                for r in range(repeat):
                    ids = [f"{mode}-{phase}-{r}-{i}" for i in range(batch)]
                    w.start_load_kv(metadata(ids))
                    t0 = time.perf_counter_ns()
                    for rid in ids:
                        producer.send_notif(me, f"{rid}:1".encode())
                    finished: set[str] = set()
                    until = time.monotonic() + 60
                    while finished != set(ids) and time.monotonic() < until:
                        finished |= w.get_transfer_results().finished_recving
                    t1 = time.perf_counter_ns()
                    assert finished == set(ids), (mode, phase, len(finished))
                    notif_ns.append((t1 - t0) / batch)
                    t0 = time.perf_counter_ns()
                    for _ in range(100):
                        res = w.get_transfer_results()
                    t1 = time.perf_counter_ns()
                    assert not res.finished_recving
                    step_ns.append((t1 - t0) / 100)
                times = timing.take()
            worst, worst_call = max(times)
            out[phase] = {
                "step_us": statistics.median(step_ns) / 1000,
                "notification_us": statistics.median(notif_ns) / 1000,
                "worst_call_ms": worst * 1000,
                "worst_call": worst_call,
                "median_call_us": statistics.median(t for t, _ in times) * 1e6,
                "calls": len(times),
            }
        return out
    finally:
        conn.shutdown()


def real_nixl(modes: list[str], batch: int, pending: int, repeat: int, loads: int) -> None:
    os.environ.setdefault("UCX_TLS", "tcp")
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    init_distributed()
    out = {}
    for _ in range(2):  # the second measurement of each is kept (the first warms up)
        for mode in modes:
            out[mode] = measure_real(mode, batch, pending, repeat, loads)
    print()
    print(f"Over real NIXL (UCX {os.environ['UCX_TLS']}), the plugin's worker by thread sync "
          f"(kvdrain_nixl_sync), batch {batch}, {pending} receives pending, median of {repeat}")
    phases = ["idle"] + (["loaded"] if loads else [])
    for phase in phases:
        print(f"  {phase}" + (f" ({loads} processes with 2 idle NIXL agents each beside it)"
                              if phase == "loaded" else ""))
        print(f"    {'':26}" + "".join(f"{m.upper():>14}" for m in modes))
        for key, label, fmt in (
            ("step_us", "engine step (us)", "{:14.2f}"),
            ("notification_us", "per notification (us)", "{:14.2f}"),
            ("median_call_us", "median NIXL call (us)", "{:14.2f}"),
            ("worst_call_ms", "worst NIXL call (ms)", "{:14.2f}"),
        ):
            print(f"    {label:26}" + "".join(fmt.format(out[m][phase][key]) for m in modes))
        print(f"    {'slowest call':26}" + "".join(f"{out[m][phase]['worst_call'][:13]:>14}"
                                                   for m in modes))
    churn(modes)


def churn(modes: list[str], seconds: float = 10.0) -> None:
    """vLLM-shaped threads on one agent with the peer in use evicted and re-added, two
    processes (``tests/nixl_threads``): eviction cycles and WRITEs landed per second,
    and the slowest single call, per mode."""
    sys.path.insert(0, os.path.join(HERE, "..", "..", "crates", "kvdrain-python", "tests",
                                    "nixl_threads"))
    import test_nixl_threads as threads

    print()
    print(f"Evicting and re-adding the peer in use, {seconds:.0f} s per mode (two processes, "
          "writer + engine + handshake threads on one agent)")
    for mode in modes:
        r = threads.run(mode, cycles=10**9, seconds=seconds)
        calls = r.report.get("calls", {})
        worst = max(r.report.get("slowest_ms", {}).items(), key=lambda kv: kv[1],
                    default=("-", 0.0))
        print(f"  {mode.upper():8}{r.failure or 'clean':>10}  {r.cycles:6d} cycles, "
              f"{calls.get('landed', 0) / r.seconds:8.1f} WRITEs landed/s, "
              f"{calls.get('send_notif', 0) / r.seconds:7.1f} heartbeats/s, "
              f"slowest call {worst[1]:.1f} ms ({worst[0]})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--pending", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--nixl-sync", default="none,rw,strict",
                    help="thread-sync modes to time over real NIXL, comma-separated ('' skips)")
    ap.add_argument("--real-repeat", type=int, default=20)
    ap.add_argument("--load", type=int, default=4,
                    help="processes with idle NIXL agents beside the loaded run (0: none)")
    a = ap.parse_args()
    modes = [m.strip() for m in a.nixl_sync.split(",") if m.strip()]
    out = {}
    with tempfile.TemporaryDirectory() as record_dir:
        for _ in range(2):  # the second measurement of each is kept (the first warms up)
            out[harness.CONTROL] = measure(harness.CONTROL, a.batch, a.pending, a.repeat)
            out[harness.PLUGIN] = measure(harness.PLUGIN, a.batch, a.pending, a.repeat)
            out[RECORDING] = measure(harness.PLUGIN, a.batch, a.pending, a.repeat, record_dir)
            out[UNTIMED] = measure(harness.PLUGIN, a.batch, a.pending, a.repeat, stall_ms=0)
    import vllm

    print(f"vLLM {vllm.__version__} push worker, batch {a.batch}, {a.pending} receives pending, "
          f"median of {a.repeat}")
    print(
        f"{'':28}{'vLLM':>12}{'plugin':>12}{'plugin/vLLM':>14}{'+recorder':>12}"
        f"{'rec/plugin':>12}{'untimed':>12}{'timing':>12}"
    )
    for key, label in (
        ("whole_step_us", "engine step (us)"),
        ("step_us", "  get_transfer_results (us)"),
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
    if modes:
        real_nixl(modes, a.batch, a.pending, a.real_repeat, a.load)


if __name__ == "__main__":
    main()
