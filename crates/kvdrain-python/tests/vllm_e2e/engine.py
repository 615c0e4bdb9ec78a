"""One engine of the end-to-end run, in its own process: a P (prefill) or a D (decode).

The engine holds the connector twice, as vLLM builds it: once with the scheduler role and
once with the worker role, both from vLLM's connector factory (``kv_connector`` and
``kv_connector_module_path``), so the plugin loads the way a deployment loads it. The
worker creates a real NIXL agent with the UCX backend and registers a DRAM KV cache; the
scheduler side serves vLLM's handshake on its side channel. Where an engine's scheduler
would call the connector, the engine does, with the end-to-end runs' one scheduler
(:class:`scheduler.Scheduler`, which also stamps and checks the blocks), over its one
rank in this process.

Commands come from the test as JSON lines on stdin; each is answered with one JSON line
on stdout. The CPU platform, the tiny model and the configs come from ``vllm_cpu``
(shared with ``tests/vllm/``). Test set-up only: the plugin itself selects no platform.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import vllm_cpu  # before any connector module: selects vLLM's CPU platform
from vllm.config import set_current_vllm_config
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.parallel_state import (
    init_distributed_environment,
    initialize_model_parallel,
)
from vllm_cpu import BLOCK_SIZE, HEAD_SIZE, LAYERS, NUM_KV_HEADS

from e2e import free_port, install_stack_dump
from faults import FaultyNixl
from scheduler import FREE, RankCache, Scheduler, worker_step

NUM_BLOCKS = 32


class LocalRank:
    """The engine's one rank, in this process: what :class:`scheduler.Scheduler` fans
    out goes straight to its cache or its connector."""

    world = 1

    def __init__(self, conn: Any, cache: RankCache) -> None:
        self.conn = conn
        self.cache = cache

    def fan(self, op: str, **kw: Any) -> list[Any]:
        if op == "worker_step":
            return [worker_step(self.conn, kw["meta"])]
        if op == "info":
            return [{"rank": 0, "pid": os.getpid()}]
        return [getattr(self.cache, op)(**kw)]


class Engine(Scheduler):
    """A P or a D engine with one rank: the two connectors vLLM builds, a real NIXL agent
    behind the fault injector, and a DRAM KV cache laid out as vLLM's CPU platform lays
    it out (heads not contiguous: each block of a layer is stamped as one)."""

    def __init__(self, role: str, which: str, engine_id: str, extra: dict[str, Any]) -> None:
        self.role = role
        self.which = which
        cfg = vllm_cpu.vllm_config(
            which,
            model_root=Path(os.environ["KVDRAIN_E2E_DIR"]),
            role="kv_producer" if role == "P" else "kv_consumer",
            engine_id=engine_id,
            num_blocks=NUM_BLOCKS,
            extra=extra,
        )
        self.cfg = cfg
        # vLLM reads the side channel's address when the scheduler side is built.
        self.port = free_port()
        os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(self.port)
        kvcc = vllm_cpu.kv_cache_config(NUM_BLOCKS)
        with set_current_vllm_config(cfg):
            init_distributed_environment(
                world_size=1,
                rank=0,
                distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
                local_rank=0,
                backend="gloo",
            )
            initialize_model_parallel(1, 1)
            sched = KVConnectorFactory.create_connector(cfg, KVConnectorRole.SCHEDULER, kvcc)
            self.conn = vllm_cpu.worker_connector(cfg, which, kvcc)
        self.worker = self.conn.connector_worker
        self.faults = FaultyNixl(self.worker.nixl_wrapper)
        self.worker.nixl_wrapper = self.faults
        caches = {
            layer: torch.full(
                (NUM_BLOCKS, 2, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE), FREE, dtype=torch.float32
            )
            for layer in LAYERS
        }
        self.conn.register_kv_caches(caches)
        sched.set_xfer_handshake_metadata_pp_aware({(0, 0): self.conn.get_handshake_metadata()})
        cache = RankCache(0, caches, list(range(len(LAYERS))), heads=1, head0=0)
        super().__init__(
            sched, LocalRank(self.conn, cache), num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE
        )

    def report(self, final: bool = False, rids: list[str] | None = None) -> Any:
        counters: dict[str, int] = {}
        if hasattr(self.worker, "kvdrain_counters"):
            counters = self.worker.kvdrain_counters()
        return {**super().report(final, rids), "counters": counters}

    def agent_md(self) -> Any:
        w = self.worker
        return {
            "name": w.nixl_wrapper.name,
            "md": base64.b64encode(w.nixl_wrapper.get_agent_metadata()).decode(),
        }


def main() -> None:
    role, which, engine_id = sys.argv[1], sys.argv[2], sys.argv[3]
    extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    out = sys.stdout
    sys.stdout = sys.stderr  # vLLM's logs and prints go to stderr; stdout is the channel
    install_stack_dump()
    eng = Engine(role, which, engine_id, extra)
    out.write(json.dumps({"ready": True, "pid": os.getpid(), "port": eng.port}) + "\n")
    out.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("op")
        result: Any
        try:
            if op == "quit":
                out.write(json.dumps({"ok": True}) + "\n")
                out.flush()
                break
            if op == "fault":
                result = eng.faults.set(**cmd)
            elif op == "fault_send":
                eng.faults.send_raw(**cmd)
                result = None
            elif op == "stray_send":
                result = eng.faults.stray_send(**cmd)
            else:
                result = getattr(eng, op)(**cmd)
            reply = {"ok": True, "result": result}
        except Exception as e:  # noqa: BLE001 - reported to the test, which fails
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    os._exit(0)  # NIXL's and ZMQ's threads: no teardown races at exit


if __name__ == "__main__":
    main()
