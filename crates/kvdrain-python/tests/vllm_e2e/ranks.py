"""One engine of the multi-rank run: every rank its own process, in one gloo group.

An engine with TP=``tp`` and PP=``pp`` is ``tp × pp`` processes. Each calls vLLM's
``init_distributed_environment`` (backend ``gloo``, world size ``tp × pp``, its own rank)
and ``initialize_model_parallel(tp, pp)``, builds the connector with the worker role
from vLLM's factory, creates its own NIXL agent (UCX) and registers its own DRAM KV cache:
its stage's layers, its share of the KV heads. Rank 0 is also the engine's scheduler
process, as in vLLM: it builds the connector with the scheduler role, serves every rank's
handshake metadata on the engine's side channel (``set_xfer_handshake_metadata_pp_aware``
with one payload per ``(pp_rank, tp_rank)``, gathered from the ranks over gloo), and
once per engine step sends the scheduler's connector metadata to every rank
(``broadcast_object_list``) and aggregates their reports with vLLM's own
``KVOutputAggregator`` (``gather_object``), as vLLM's executor does.

Only rank 0 talks to the test (JSON lines on stdin/stdout, as ``engine.py``); the other
ranks run what rank 0 broadcasts. Block checks run on every rank, on its own cache.
Several engines of one role and shape (both connectors' of it, say) share one set of rank
processes and their gloo group: each has its own worker, agent, cache and, on rank 0,
scheduler and side channel; every broadcast names its engine (``main``).

Rank 0's scheduler is the end-to-end runs' one scheduler (``scheduler.py``), which
reaches the ranks through :class:`GlooRanks`.

Stamps: element values name the request, the block's position in it, the layer and the
global KV head (``scheduler.stamp``): P fills its heads of its layers; D checks that each of its
heads of each layer holds the value P's owning rank wrote, so a WRITE into the wrong head
slice, layer or block shows. The MLA cache (one latent per token, replicated) uses head 0.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import vllm_cpu  # before any connector module: selects vLLM's CPU platform
from vllm.config import set_current_vllm_config
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.parallel_state import (
    init_distributed_environment,
    initialize_model_parallel,
)
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MLAAttentionSpec,
)
from vllm_cpu import BLOCK_SIZE, HEAD_SIZE, LAYERS, NUM_KV_HEADS

from e2e import free_port, install_stack_dump, pace_nixl_progress
from faults import FaultyNixl
from scheduler import FREE, RankCache, Scheduler, worker_step

NUM_BLOCKS = 160
MLA_LATENT = 48  # kv_lora_rank 32 + qk_rope_head_dim 16
# The MLA engines run vLLM's reference CPU MLA backend on every host, with its kernel's
# block size: left to itself vLLM picks AMX_MLA (blocks of a multiple of 32) where the
# CPU has AMX tiles and CPU_MLA (blocks of 16) where it has not, and a 32-token block on
# a CPU_MLA host is split in two kernel blocks the cache here is not shaped for.
MLA_BLOCK_SIZE = 16
MLA_LAYERS = ["model.layers.0.self_attn", "model.layers.1.self_attn"]


class NoticeLog:
    """The agent below every wrapper: records each decode-bound notice as it comes off
    NIXL (time, sender agent, bytes), then hands the batch on unchanged."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.seen: list[tuple[float, str, str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def get_new_notifs(self, *args: Any, **kw: Any) -> Any:
        batch = self._real.get_new_notifs(*args, **kw)
        now = time.monotonic()
        for agent, msgs in batch.items():
            for m in msgs:
                if not (m.startswith(b"PUSH_REG:") or m.startswith(b"HB:")):
                    self.seen.append((now, str(agent), m.decode("utf-8", "replace")))
        return batch


def mla_model_dir(root: Path) -> str:
    """A tiny DeepSeek-V2 ``config.json`` (MLA: one latent of ``MLA_LATENT`` per token,
    replicated on every TP rank)."""
    d = root / "tiny-deepseek"
    d.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": len(MLA_LAYERS),
        "kv_lora_rank": 32,
        "q_lora_rank": None,
        "qk_rope_head_dim": 16,
        "qk_nope_head_dim": 16,
        "v_head_dim": 16,
        "n_routed_experts": 1,
        "n_shared_experts": 1,
        "num_experts_per_tok": 1,
        "first_k_dense_replace": 2,
        "vocab_size": 256,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


class RankWorker:
    """What every rank holds: its connector (worker role), its NIXL agent and cache."""

    def __init__(
        self,
        role: str,
        which: str,
        engine_id: str,
        tp: int,
        pp: int,
        rank: int,
        dist_port: int,
        extra: dict[str, Any],
        mla: bool,
    ) -> None:
        self.role, self.which, self.engine_id = role, which, engine_id
        self.tp, self.pp, self.rank, self.world = tp, pp, rank, tp * pp
        self.tp_rank, self.stage = rank % tp, rank // tp
        self.mla = mla
        root = Path(os.environ["KVDRAIN_E2E_DIR"])
        cfg = vllm_cpu.vllm_config(
            which,
            model_root=root,
            role="kv_producer" if role == "P" else "kv_consumer",
            engine_id=engine_id,
            num_blocks=NUM_BLOCKS,
            tp=tp,
            extra=extra,
        )
        self.block_size = MLA_BLOCK_SIZE if mla else BLOCK_SIZE
        if mla:
            from vllm.config import ModelConfig
            from vllm.v1.attention.backends.registry import AttentionBackendEnum

            cfg.model_config = ModelConfig(
                model=mla_model_dir(root), skip_tokenizer_init=True, dtype="float32"
            )
            cfg.cache_config.block_size = MLA_BLOCK_SIZE
            cfg.attention_config.backend = AttentionBackendEnum.CPU_MLA
        cfg.parallel_config.pipeline_parallel_size = pp
        cfg.parallel_config.world_size = tp * pp
        cfg.parallel_config.rank = rank
        # Heads contiguous within a block (LBHNC): vLLM splits a block by heads across
        # TP ranks of different sizes.
        cfg.cache_config.kv_cache_layout = "HND"
        self.cfg = cfg
        names = MLA_LAYERS if mla else LAYERS
        per_stage = len(names) // pp
        self.layer_ids = list(range(self.stage * per_stage, (self.stage + 1) * per_stage))
        self.layers = [names[i] for i in self.layer_ids]
        self.heads = 1 if mla else NUM_KV_HEADS // tp
        self.head0 = 0 if mla else self.tp_rank * self.heads
        with set_current_vllm_config(cfg):
            if not dist.is_initialized():
                init_distributed_environment(
                    world_size=tp * pp,
                    rank=rank,
                    distributed_init_method=f"tcp://127.0.0.1:{dist_port}",
                    local_rank=rank,
                    backend="gloo",
                )
                initialize_model_parallel(tp, pp)
            self.kvcc = self.kv_cache_config(self.layers)
            self.conn = vllm_cpu.worker_connector(cfg, which, self.kvcc)
        self.worker = self.conn.connector_worker
        # Wrappers, innermost first: the real agent; the notice log; the faults; the
        # plugin's tap (built around the agent with the plugin's worker). The faults sit
        # below the tap, where NIXL is: the plugin sees an injected error as NIXL's.
        wrapper = self.worker.nixl_wrapper
        tapped = hasattr(wrapper, "agent") and hasattr(wrapper, "_decode")
        self.notices = NoticeLog(wrapper.agent if tapped else wrapper)
        self.faults = FaultyNixl(self.notices)
        if tapped:
            wrapper.agent = self.faults
        else:
            self.worker.nixl_wrapper = self.faults
        # What the plugin's ledger was told to expect per request on this rank: named
        # edges (the producer agents) or vLLM's count.
        self.expects: dict[str, Any] = {}
        decode = getattr(self.worker, "kvdrain_decode", None)
        if decode is not None:
            register_many = decode.register_many

            def recording_register_many(
                rids: Any, blocks: Any, producers: Any, expect: Any, report: Any
            ) -> Any:
                for rid in rids:
                    self.expects[rid] = expect
                return register_many(rids, blocks, producers, expect, report)

            decode.register_many = recording_register_many
        shape = (
            (NUM_BLOCKS, MLA_BLOCK_SIZE, MLA_LATENT)
            if mla
            else (NUM_BLOCKS, self.heads, BLOCK_SIZE, 2 * HEAD_SIZE)
        )
        caches = {name: torch.full(shape, FREE, dtype=torch.float32) for name in self.layers}
        self.conn.register_kv_caches(caches)
        self.cache = RankCache(rank, caches, self.layer_ids, self.heads, self.head0)

    def kv_cache_config(self, layers: list[str]) -> KVCacheConfig:
        spec: Any
        if self.mla:
            spec = MLAAttentionSpec(
                block_size=MLA_BLOCK_SIZE,
                num_kv_heads=1,
                head_size=MLA_LATENT,
                dtype=torch.float32,
            )
        else:
            spec = FullAttentionSpec(
                block_size=BLOCK_SIZE,
                num_kv_heads=self.heads,
                head_size=HEAD_SIZE,
                dtype=torch.float32,
            )
        return KVCacheConfig(
            num_blocks=NUM_BLOCKS,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(list(layers), spec)],
        )

    def handshake_payload(self) -> bytes:
        return pickle.dumps(self.conn.get_handshake_metadata())

    def worker_step(self, meta: Any) -> dict[str, Any]:
        return worker_step(self.conn, meta)

    def info(self, rid: str | None = None) -> dict[str, Any]:
        """This rank's agent, counters, fault record, notices and ledger expectations;
        with ``rid``, only what concerns that request (``REQ`` or ``REQ@AGENT`` keys, its
        notices)."""
        counters: dict[str, int] = {}
        if hasattr(self.worker, "kvdrain_counters"):
            counters = self.worker.kvdrain_counters()
        faults = self.faults.set()
        notices = list(self.notices.seen)
        expects = dict(self.expects)
        if rid is not None:
            faults = {
                k: {r: v for r, v in d.items() if r == rid or r.startswith(f"{rid}@")}
                for k, d in faults.items()
            }
            notices = [
                n for n in notices if n[2].rsplit(":", 1)[0].removeprefix("PUSH_FAIL:") == rid
            ]
            expects = {r: e for r, e in expects.items() if r == rid}
        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "agent": str(self.faults.name),
            "counters": counters,
            "faults": faults,
            "notices": notices,
            "expects": {r: (e if isinstance(e, int) else list(e)) for r, e in expects.items()},
        }

    def do(self, op: str, kw: dict[str, Any]) -> Any:
        try:
            if op == "fault":
                ranks = kw.pop("ranks", None)
                if ranks is None or self.rank in ranks:
                    return self.faults.set(**kw)
                return None
            if op == "fault_send":
                if self.rank == kw.pop("rank", 0):
                    self.faults.send_raw(**kw)
                return None
            if op in ("worker_step", "info"):
                return getattr(self, op)(**kw)
            return getattr(self.cache, op)(**kw)
        except Exception as e:  # noqa: BLE001 - reported to rank 0, then the test
            return {"error": f"{type(e).__name__}: {e}"}


class GlooRanks:
    """Every rank of one engine, reached from rank 0 over gloo: the op broadcast with the
    engine's id, each rank's answer gathered (this one's included)."""

    def __init__(self, me: RankWorker) -> None:
        self.me = me
        self.world = me.world

    def fan(self, op: str, **kw: Any) -> list[Any]:
        msg: list[Any] = [(self.me.engine_id, op, kw)]
        dist.broadcast_object_list(msg, src=0)
        mine = self.me.do(op, dict(kw))
        out: list[Any] = [None] * self.world
        dist.gather_object(mine, out, dst=0)
        return out


class RankScheduler(Scheduler):
    """Rank 0's scheduler: the end-to-end runs' one scheduler over every rank of the
    engine, and the engine's side channel, serving every rank's handshake metadata."""

    def __init__(self, me: RankWorker) -> None:
        self.me = me
        self.port = free_port()
        os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(self.port)
        names = MLA_LAYERS if me.mla else LAYERS
        with set_current_vllm_config(me.cfg):
            sched = KVConnectorFactory.create_connector(
                me.cfg, KVConnectorRole.SCHEDULER, me.kv_cache_config(names)
            )
        super().__init__(sched, GlooRanks(me), num_blocks=NUM_BLOCKS, block_size=me.block_size)

    def serve_handshakes(self, payloads: list[bytes]) -> None:
        md = {
            (r // self.me.tp, r % self.me.tp): pickle.loads(p) for r, p in enumerate(payloads)
        }
        self.sched.set_xfer_handshake_metadata_pp_aware(md)

    def fault(self, **kw: Any) -> Any:
        return self.fan("fault", **kw)

    def fault_send(self, **kw: Any) -> Any:
        return self.fan("fault_send", **kw)


def main() -> None:
    """``ranks.py ROLE TP PP RANK DIST_PORT ENGINES EXTRA``: ENGINES is a JSON list of
    ``{"which", "engine_id", "mla"}``, the engines of this shape whose rank RANK this
    process is (one process group per shape: the ranks of several engines of one role
    share processes, never a P with a D)."""
    role = sys.argv[1]
    tp, pp, rank, dist_port = (int(x) for x in sys.argv[2:6])
    specs = json.loads(sys.argv[6])
    extra = json.loads(sys.argv[7])
    out = sys.stdout
    sys.stdout = sys.stderr  # vLLM's logs and prints go to stderr; stdout is the channel
    install_stack_dump()
    pace_nixl_progress()
    workers: dict[str, RankWorker] = {}
    for spec in specs:
        w = RankWorker(
            role, spec["which"], spec["engine_id"], tp, pp, rank, dist_port, extra, spec["mla"]
        )
        workers[w.engine_id] = w
    world = tp * pp
    payloads: dict[str, list[Any]] = {}
    for eid, w in workers.items():
        got: list[Any] = [None] * world
        dist.gather_object(w.handshake_payload(), got if rank == 0 else None, dst=0)
        payloads[eid] = got
    if rank != 0:
        while True:
            msg: list[Any] = [None]
            dist.broadcast_object_list(msg, src=0)
            eid, op, kw = msg[0]
            if op == "quit":
                os._exit(0)
            dist.gather_object(workers[eid].do(op, kw), None, dst=0)
    scheds: dict[str, RankScheduler] = {}
    hello: dict[str, Any] = {}
    for eid, w in workers.items():
        sched = scheds[eid] = RankScheduler(w)
        sched.serve_handshakes(payloads[eid])
        hello[eid] = {"port": sched.port, "ranks": sched.ranks()}
    out.write(json.dumps({"ready": True, "engines": hello}) + "\n")
    out.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("op")
        result: Any
        try:
            if op == "quit":
                dist.broadcast_object_list([("", "quit", {})], src=0)
                out.write(json.dumps({"ok": True}) + "\n")
                out.flush()
                break
            sched = scheds[cmd.pop("engine")]
            if op == "agent_md":
                result = {
                    "name": sched.me.faults.name,
                    "md": base64.b64encode(sched.me.faults.get_agent_metadata()).decode(),
                }
            else:
                result = getattr(sched, op)(**cmd)
            reply = {"ok": True, "result": result}
        except Exception as e:  # noqa: BLE001 - reported to the test, which fails
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
