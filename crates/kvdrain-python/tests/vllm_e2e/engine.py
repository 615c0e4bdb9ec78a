"""One engine of the end-to-end run, in its own process: a P (prefill) or a D (decode).

The engine holds the connector twice, as vLLM builds it: once with the scheduler role and
once with the worker role, both from vLLM's connector factory (``kv_connector`` and
``kv_connector_module_path``), so the plugin loads the way a deployment loads it. The
worker creates a real NIXL agent with the UCX backend and registers a DRAM KV cache; the
scheduler side serves vLLM's handshake on its side channel. Where an engine's scheduler
would call the connector, :class:`Engine` does, through the connector's own scheduler
API, and keeps the block pool the way vLLM's scheduler does (a decode request's blocks
stay allocated until a worker names it in ``finished_recving``).

Every block is stamped with its request: P fills a request's source blocks with the
request's stamp; D checks them when the scheduler would start decoding, scrubs blocks
when they are freed, and scans them when they are allocated again (a stamp there is a
write that landed after the blocks were handed back).

Commands come from the test as JSON lines on stdin; each is answered with one JSON line
on stdout. The CPU platform, the tiny model and the configs come from ``vllm_cpu``
(shared with ``tests/vllm/``). Test set-up only: the plugin itself selects no platform.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
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
from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request, RequestStatus
from vllm_cpu import BLOCK_SIZE, HEAD_SIZE, LAYERS, NUM_KV_HEADS

from e2e import free_port, install_stack_dump
from faults import FaultyNixl

NUM_BLOCKS = 32
FREE = -1.0  # a free block's scrubbed value
FENCED = -2.0  # a failed request's blocks, scrubbed when the scheduler is told


def stamp_of(req_index: int, block_pos: int) -> float:
    """The value every element of a request's ``block_pos``-th block holds."""
    return float(req_index * 1000 + block_pos + 1)


def owner_of(value: float) -> int:
    return int(value) // 1000


class Engine:
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
            self.sched = KVConnectorFactory.create_connector(cfg, KVConnectorRole.SCHEDULER, kvcc)
            self.conn = KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, kvcc)
        self.worker = self.conn.connector_worker
        self.faults = FaultyNixl(self.worker.nixl_wrapper)
        self.worker.nixl_wrapper = self.faults
        self.caches = {
            layer: torch.full(
                (NUM_BLOCKS, 2, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE), FREE, dtype=torch.float32
            )
            for layer in LAYERS
        }
        self.conn.register_kv_caches(self.caches)
        self.sched.set_xfer_handshake_metadata_pp_aware(
            {(0, 0): self.conn.get_handshake_metadata()}
        )
        self.block_bytes = sum(t[0].numel() * t.element_size() for t in self.caches.values())
        # The scheduler's part: the block pool and what it was told.
        self.free: list[int] = list(range(NUM_BLOCKS))
        self.reqs: dict[str, dict[str, Any]] = {}
        self.told: dict[str, list[str]] = {}
        # When each was told (time.monotonic(), one clock for every process on a host).
        self.told_at: dict[str, list[float]] = {}
        self.violations: list[str] = []
        self.bytes_checked = 0
        self.late_bytes = 0
        self.errors: list[str] = []

    # -- blocks ------------------------------------------------------------------------ #

    def _block_values(self, b: int) -> torch.Tensor:
        return torch.cat([t[b].reshape(-1) for t in self.caches.values()])

    def _fill(self, b: int, value: float) -> None:
        for t in self.caches.values():
            t[b].fill_(value)

    def _alloc(self, n: int) -> list[int]:
        if len(self.free) < n:
            raise RuntimeError(f"block pool exhausted: {len(self.free)} free, {n} wanted")
        blocks, self.free = self.free[:n], self.free[n:]
        for b in blocks:
            vals = self._block_values(b)
            self.bytes_checked += self.block_bytes
            bad = vals != FREE
            if bool(bad.any()):
                owners = sorted({owner_of(float(v)) for v in vals[bad].unique()})
                self.violations.append(
                    f"block {b} held stamps of request(s) {owners} after it was freed"
                )
                self._fill(b, FREE)
        return blocks

    def _release(self, rid: str) -> None:
        r = self.reqs[rid]
        if r["freed"]:
            self.violations.append(f"{rid}: blocks freed twice")
            return
        if r.get("fenced_at") is not None:
            # Bytes that landed between the failure event and the release.
            for b in r["blocks"]:
                vals = self._block_values(b)
                self.late_bytes += int((vals != FENCED).sum()) * 4
                self.bytes_checked += self.block_bytes
        for b in r["blocks"]:
            self._fill(b, FREE)
        self.free.extend(r["blocks"])
        r["freed"] = True
        r["freed_at"] = time.monotonic()

    # -- requests ---------------------------------------------------------------------- #

    def _request(self, rid: str, n_blocks: int, params: dict[str, Any]) -> Request:
        req = Request(
            request_id=rid,
            prompt_token_ids=list(range(10, 10 + n_blocks * BLOCK_SIZE)),
            sampling_params=SamplingParams(max_tokens=1, extra_args={"kv_transfer_params": params}),
            pooling_params=None,
        )
        return req

    def recv(self, rid: str, index: int, n_blocks: int, p_engine: str, p_port: int) -> Any:
        """D: a decode request whose prompt KV P pushes; blocks allocated, the connector
        told (``get_num_new_matched_tokens``, ``update_state_after_alloc``)."""
        params = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": p_engine,
            "remote_request_id": rid,
            "remote_host": "127.0.0.1",
            "remote_port": p_port,
            "remote_block_ids": [],
            "tp_size": 1,
            "pp_size": 1,
            "transfer_mode": "push",
        }
        req = self._request(rid, n_blocks, params)
        # What vLLM's scheduler does when the request arrives (add_request): the
        # connector starts heartbeating its producer engine.
        self.sched.on_new_request(req)
        n_ext, _async = self.sched.get_num_new_matched_tokens(req, 0)
        blocks = self._alloc(n_blocks)
        req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
        kvb = KVCacheBlocks(blocks=([KVCacheBlock(block_id=b) for b in blocks],))
        self.sched.update_state_after_alloc(req, kvb, n_ext)
        self.reqs[rid] = {
            "req": req,
            "index": index,
            "blocks": blocks,
            "state": "waiting",
            "freed": False,
            "added_at": time.monotonic(),
        }
        return {"blocks": blocks}

    def send(self, rid: str, index: int, n_blocks: int) -> Any:
        """P: a prefill request that finished; its blocks are stamped and handed to the
        connector (``request_finished``), which holds them for the push."""
        params = {"do_remote_decode": True, "do_remote_prefill": False}
        req = self._request(rid, n_blocks, params)
        blocks = self._alloc(n_blocks)
        kvb = KVCacheBlocks(blocks=([KVCacheBlock(block_id=b) for b in blocks],))
        self.sched.update_state_after_alloc(req, kvb, 0)  # scheduled for its prefill
        for pos, b in enumerate(blocks):
            self._fill(b, stamp_of(index, pos))
        req.status = RequestStatus.FINISHED_LENGTH_CAPPED
        req.num_computed_tokens = n_blocks * BLOCK_SIZE
        delay, _params = self.sched.request_finished(req, list(blocks))
        self.reqs[rid] = {
            "req": req,
            "index": index,
            "blocks": blocks,
            "state": "sending" if delay else "done",
            "freed": False,
            "added_at": time.monotonic(),
        }
        if not delay:
            self._release(rid)
        return {"blocks": blocks, "delay": delay}

    def abort(self, rid: str) -> Any:
        """D: the request is aborted while it waits for its KV."""
        r = self.reqs[rid]
        req = r["req"]
        was_waiting = r["state"] == "waiting"
        req.status = RequestStatus.FINISHED_ABORTED
        delay, _ = self.sched.request_finished(req, list(r["blocks"]))
        r["state"] = "aborted"
        self._fence(rid)  # from here on, whatever lands in its blocks is late
        if not was_waiting and not delay:
            self._release(rid)
        # A request aborted while waiting for remote KV keeps its blocks until a
        # worker names it in finished_recving (vLLM's scheduler).
        return {"delay": delay}

    # -- steps ------------------------------------------------------------------------- #

    def step(self) -> Any:
        meta = self.sched.build_connector_meta(SchedulerOutput.make_empty())
        self.conn.bind_connector_metadata(meta)
        try:
            self.worker.start_load_kv(meta)
            res = self.worker.get_transfer_results()
            invalid = self.worker.get_block_ids_with_load_errors()
        except Exception as e:  # noqa: BLE001 - an exception here kills vLLM's engine
            self.errors.append(f"{type(e).__name__}: {e}")
            return {"error": f"{type(e).__name__}: {e}"}
        finally:
            self.conn.clear_connector_metadata()
        out = KVConnectorOutput(
            finished_sending=res.finished_sending or None,
            finished_recving=res.finished_recving or None,
            failed_recving=res.failed_recving,
            invalid_block_ids=invalid,
        )
        self.sched.update_connector_output(out)
        self._apply(out)
        return {
            "finished_sending": sorted(res.finished_sending),
            "finished_recving": sorted(res.finished_recving),
            "failed_recving": sorted(res.failed_recving),
            "invalid_block_ids": sorted(invalid),
        }

    def _tell(self, rid: str, what: str) -> None:
        self.told.setdefault(rid, []).append(what)
        self.told_at.setdefault(rid, []).append(time.monotonic())

    def _apply(self, out: KVConnectorOutput) -> None:
        """What vLLM's scheduler does with the workers' report."""
        failed = set(out.failed_recving or ())
        if out.invalid_block_ids:
            for rid, held in self.reqs.items():
                if (
                    not held["freed"]
                    and held.get("fenced_at") is None
                    and set(held["blocks"]) & out.invalid_block_ids
                ):
                    self._tell(rid, "invalid_blocks")
                    self._fence(rid)
        for rid in sorted(out.finished_sending or ()):
            self._tell(rid, "finished_sending")
            r = self.reqs.get(rid)
            if r is None or r["freed"]:
                self.violations.append(f"{rid}: finished_sending for a freed or unknown request")
                continue
            self._release(rid)
            r["state"] = "sent"
        for rid in sorted(out.finished_recving or ()):
            self._tell(rid, "failed_recving" if rid in failed else "finished_recving")
            r = self.reqs.get(rid)
            if r is None or r["freed"]:
                # vLLM's scheduler asserts here: the engine dies.
                self.violations.append(f"{rid}: finished_recving for a freed or unknown request")
                continue
            if rid in failed:
                self._fence(rid)
                r["state"] = "failed"
                self._release(rid)
            elif r["state"] == "waiting":
                self._check_stamps(rid)
                r["state"] = "completed"
                r["completed_at"] = time.monotonic()
                self._release(rid)  # decoded one token, finished: D frees at once
            elif r["state"] == "aborted":
                self._release(rid)
            else:
                self.violations.append(f"{rid}: finished_recving in state {r['state']}")

    def _fence(self, rid: str) -> None:
        r = self.reqs[rid]
        if r.get("fenced_at") is None:
            r["fenced_at"] = time.monotonic()
            for b in r["blocks"]:
                self._fill(b, FENCED)

    def _check_stamps(self, rid: str) -> None:
        r = self.reqs[rid]
        for pos, b in enumerate(r["blocks"]):
            vals = self._block_values(b)
            self.bytes_checked += self.block_bytes
            want = stamp_of(r["index"], pos)
            bad = vals != want
            if bool(bad.any()):
                seen = sorted({float(v) for v in vals[bad].unique()})[:4]
                self.violations.append(
                    f"{rid}: block {b} (position {pos}) holds {seen} where {want} belongs, "
                    "when decoding would start"
                )

    # -- the report -------------------------------------------------------------------- #

    def report(self, final: bool = False) -> Any:
        states: dict[str, str] = {rid: r["state"] for rid, r in self.reqs.items()}
        held = {rid: r["blocks"] for rid, r in self.reqs.items() if not r["freed"]}
        counters: dict[str, int] = {}
        if hasattr(self.worker, "kvdrain_counters"):
            counters = self.worker.kvdrain_counters()
        # Scan the free pool: a stamp in a free block is a write after the release.
        for b in self.free if final else ():
            vals = self._block_values(b)
            self.bytes_checked += self.block_bytes
            bad = vals != FREE
            if bool(bad.any()):
                owners = sorted({owner_of(float(v)) for v in vals[bad].unique()})
                self.violations.append(f"free block {b} holds stamps of request(s) {owners}")
                self._fill(b, FREE)
        return {
            "states": states,
            "held": held,
            "told": self.told,
            "told_at": self.told_at,
            "violations": list(self.violations),
            "bytes_checked": self.bytes_checked,
            "late_bytes": self.late_bytes,
            "errors": list(self.errors),
            "counters": counters,
            "free_blocks": len(self.free),
        }

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
