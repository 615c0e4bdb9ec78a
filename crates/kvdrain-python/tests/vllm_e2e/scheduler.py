"""The one scheduler of the end-to-end runs, and the one cache every rank stamps and checks.

:class:`Scheduler` does, for one engine, what vLLM's scheduler does around the connector:
the block pool, the requests, one engine step (the connector's metadata to every rank,
their reports aggregated by vLLM's own ``KVOutputAggregator``, the result applied as
vLLM applies it), and what it was told. It reaches its ranks through :class:`Ranks`: the
two-engine run's engine has one, in its own process (``engine.py``); the topology run's
rank 0 fans out to every rank over gloo (``ranks.py``).

:class:`RankCache` is one rank's KV cache and the block checks on it. Element values
name the request, the block's position in it, the layer and the global KV head
(:func:`stamp`): P fills its heads of its layers; D checks that each of its heads of each
layer holds what P's owning rank wrote, scrubs blocks when they are freed and scans them
when they are allocated again (a stamp there is a write that landed after the blocks
were handed back).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import vllm_cpu  # noqa: F401 - before any connector module: selects vLLM's CPU platform
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request, RequestStatus
from vllm_cpu import model_runner_output

FREE = -1.0
"""A free block's scrubbed value."""
FENCED = -2.0
"""A failed or aborted request's blocks, scrubbed when the scheduler is told: whatever
else is there at the release landed after that."""


def stamp(index: int, pos: int, layer: int, head: int) -> float:
    """Every element of request ``index``'s ``pos``-th block, in layer ``layer`` and
    global KV head ``head``: exact in float32 below 2**24."""
    return float(index * 1000 + pos * 8 + layer * 4 + head + 1)


def owner_of(value: float) -> int:
    """The request index a stamp names."""
    return int(value) // 1000


@dataclass
class RankCache:
    """One rank's KV cache, by layer name, and the block checks on it. ``layer_ids``: the
    global index of each layer (as ``caches`` orders them); ``heads`` KV heads per block
    starting at global head ``head0``, contiguous within a block; ``heads=1`` with
    ``head0=0`` stamps a block of a layer as one (a layout whose heads are not
    contiguous, or MLA's one latent)."""

    rank: int
    caches: dict[str, torch.Tensor]
    layer_ids: list[int]
    heads: int
    head0: int

    @property
    def block_bytes(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in self.caches.values())

    def _heads_view(self, layer: str, b: int) -> torch.Tensor:
        """(heads, elements) of block ``b`` of ``layer`` on this rank."""
        t = self.caches[layer][b]
        return t.reshape(self.heads, -1)

    def fill(self, blocks: list[int], value: float) -> None:
        for t in self.caches.values():
            for b in blocks:
                t[b].fill_(value)

    def stamp(self, blocks: list[int], index: int) -> None:
        for li, layer in zip(self.layer_ids, self.caches):
            for pos, b in enumerate(blocks):
                v = self._heads_view(layer, b)
                for h in range(v.shape[0]):
                    v[h].fill_(stamp(index, pos, li, self.head0 + h))

    def check(self, blocks: list[int], index: int, rid: str) -> dict[str, Any]:
        """The stamps when decoding would start: every head of every layer of every
        block holds what its producer rank wrote."""
        bad: list[str] = []
        for li, layer in zip(self.layer_ids, self.caches):
            for pos, b in enumerate(blocks):
                v = self._heads_view(layer, b)
                for h in range(v.shape[0]):
                    want = stamp(index, pos, li, self.head0 + h)
                    wrong = v[h] != want
                    if bool(wrong.any()):
                        seen = sorted({float(x) for x in v[h][wrong].unique()})[:4]
                        bad.append(
                            f"{rid}: rank {self.rank} layer {li} head {self.head0 + h} "
                            f"block {b} (position {pos}) holds {seen} where {want} belongs, "
                            "when decoding would start"
                        )
        return {"bytes": self.block_bytes * len(blocks), "violations": bad}

    def scan_free(self, blocks: list[int], where: str) -> dict[str, Any]:
        """Blocks that must hold the free value (allocated now, or in the free pool)."""
        bad: list[str] = []
        for b in blocks:
            vals = torch.cat([t[b].reshape(-1) for t in self.caches.values()])
            wrong = vals != FREE
            if bool(wrong.any()):
                owners = sorted({owner_of(float(x)) for x in vals[wrong].unique()})
                bad.append(f"rank {self.rank}: {where} block {b} held stamps of request(s) {owners}")
                for t in self.caches.values():
                    t[b].fill_(FREE)
        return {"bytes": self.block_bytes * len(blocks), "violations": bad}

    def late(self, blocks: list[int]) -> dict[str, Any]:
        """Bytes that landed in a fenced request's blocks since the failure event."""
        n = 0
        for t in self.caches.values():
            for b in blocks:
                n += int((t[b] != FENCED).sum()) * 4
        return {"bytes": self.block_bytes * len(blocks), "late": n}


def worker_step(conn: Any, meta: Any) -> dict[str, Any]:
    """One rank's part of an engine step: the connector's metadata bound, vLLM's three
    worker calls, and what they returned (or the exception, which kills vLLM's engine)."""
    worker = conn.connector_worker
    conn.bind_connector_metadata(meta)
    try:
        worker.start_load_kv(meta)
        res = worker.get_transfer_results()
        invalid = worker.get_block_ids_with_load_errors()
    except Exception as e:  # noqa: BLE001 - reported: an exception here kills vLLM's engine
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        conn.clear_connector_metadata()
    return {
        "finished_sending": sorted(res.finished_sending),
        "finished_recving": sorted(res.finished_recving),
        "failed_recving": sorted(res.failed_recving),
        "invalid_block_ids": sorted(invalid),
    }


class Ranks(Protocol):
    """An engine's ranks, as its scheduler reaches them."""

    world: int

    def fan(self, op: str, **kw: Any) -> list[Any]:
        """Runs ``op`` (a :class:`RankCache` method, ``worker_step`` or ``info``) on
        every rank; answers in rank order."""
        ...


_NOTHING: dict[str, list[str]] = {"finished_sending": [], "finished_recving": [], "failed_recving": [], "invalid_block_ids": []}


class Scheduler:
    """One engine's scheduler: the connector with the scheduler role (``sched``), the
    block pool, the requests and what they were told, and the engine's ranks."""

    def __init__(self, sched: Any, ranks: Ranks, *, num_blocks: int, block_size: int) -> None:
        self.sched = sched
        self._ranks = ranks
        self.block_size = block_size
        self.aggregator = KVOutputAggregator.from_connector(sched, ranks.world)
        self.free: list[int] = list(range(num_blocks))
        self.reqs: dict[str, dict[str, Any]] = {}
        self.told: dict[str, list[str]] = {}
        # When each was told (time.monotonic(), one clock for every process on a host).
        self.told_at: dict[str, list[float]] = {}
        # Per request: the ranks that reported it in finished_recving.
        self.rank_reports: dict[str, list[int]] = {}
        self.violations: list[str] = []
        self.bytes_checked = 0
        self.late_bytes = 0
        self.errors: list[str] = []

    def fan(self, op: str, **kw: Any) -> list[Any]:
        out = self._ranks.fan(op, **kw)
        for r in out:
            if isinstance(r, dict) and "error" in r and op != "worker_step":
                raise RuntimeError(f"{op} on a rank: {r['error']}")
        return out

    # -- blocks ------------------------------------------------------------------------ #

    def _merge(self, results: list[dict[str, Any]]) -> None:
        for r in results:
            self.bytes_checked += int(r["bytes"])
            self.violations.extend(r.get("violations", []))
            self.late_bytes += int(r.get("late", 0))

    def _alloc(self, n: int) -> list[int]:
        if len(self.free) < n:
            raise RuntimeError(f"block pool exhausted: {len(self.free)} free, {n} wanted")
        blocks, self.free = self.free[:n], self.free[n:]
        self._merge(self.fan("scan_free", blocks=blocks, where="allocated"))
        return blocks

    def _release(self, rid: str) -> None:
        r = self.reqs[rid]
        if r["freed"]:
            self.violations.append(f"{rid}: blocks freed twice")
            return
        if r.get("fenced_at") is not None:
            # Bytes that landed between the failure event and the release.
            self._merge(self.fan("late", blocks=r["blocks"]))
        self.fan("fill", blocks=r["blocks"], value=FREE)
        self.free.extend(r["blocks"])
        r["freed"] = True
        r["freed_at"] = time.monotonic()

    def _fence(self, rid: str) -> None:
        r = self.reqs[rid]
        if r.get("fenced_at") is None:
            r["fenced_at"] = time.monotonic()
            self.fan("fill", blocks=r["blocks"], value=FENCED)

    # -- requests ---------------------------------------------------------------------- #

    def _request(self, rid: str, n_blocks: int, params: dict[str, Any]) -> Request:
        return Request(
            request_id=rid,
            prompt_token_ids=list(range(10, 10 + n_blocks * self.block_size)),
            sampling_params=SamplingParams(max_tokens=1, extra_args={"kv_transfer_params": params}),
            pooling_params=None,
        )

    def _track(self, rid: str, req: Request, index: int, blocks: list[int], state: str) -> None:
        self.reqs[rid] = {
            "req": req,
            "index": index,
            "blocks": blocks,
            "state": state,
            "freed": False,
            "added_at": time.monotonic(),
        }

    def recv(
        self,
        rid: str,
        index: int,
        n_blocks: int,
        p_engine: str,
        p_port: int,
        p_tp: int = 1,
        p_pp: int = 1,
    ) -> Any:
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
            "tp_size": p_tp,
            "pp_size": p_pp,
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
        self._track(rid, req, index, blocks, "waiting")
        return {"blocks": blocks}

    def send(self, rid: str, index: int, n_blocks: int) -> Any:
        """P: a prefill request that finished; its blocks are stamped and handed to the
        connector (``request_finished``), which holds them for the push."""
        params = {"do_remote_decode": True, "do_remote_prefill": False}
        req = self._request(rid, n_blocks, params)
        blocks = self._alloc(n_blocks)
        kvb = KVCacheBlocks(blocks=([KVCacheBlock(block_id=b) for b in blocks],))
        self.sched.update_state_after_alloc(req, kvb, 0)  # scheduled for its prefill
        self.fan("stamp", blocks=blocks, index=index)
        req.status = RequestStatus.FINISHED_LENGTH_CAPPED
        req.num_computed_tokens = n_blocks * self.block_size
        delay, _params = self.sched.request_finished(req, list(blocks))
        self._track(rid, req, index, blocks, "sending" if delay else "done")
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
        results = self.fan("worker_step", meta=meta)
        outs = []
        errors = []
        for rank, res in enumerate(results):
            if "error" in res:
                errors.append(f"rank {rank}: {res['error']}")
                self.errors.append(f"rank {rank}: {res['error']}")
                res = _NOTHING
            for rid in res["finished_recving"]:
                self.rank_reports.setdefault(rid, []).append(rank)
            kv = KVConnectorOutput(
                finished_sending=set(res["finished_sending"]) or None,
                finished_recving=set(res["finished_recving"]) or None,
                failed_recving=set(res["failed_recving"]),
                invalid_block_ids=set(res["invalid_block_ids"]),
            )
            outs.append(model_runner_output([], kv_connector_output=kv))
        agg = self.aggregator.aggregate(outs, output_rank=0)
        assert agg is not None and agg.kv_connector_output is not None
        out = agg.kv_connector_output
        self.sched.update_connector_output(out)
        self._apply(out)
        return {
            "finished_sending": sorted(out.finished_sending or ()),
            "finished_recving": sorted(out.finished_recving or ()),
            "failed_recving": sorted(out.failed_recving or ()),
            "invalid_block_ids": sorted(out.invalid_block_ids or ()),
            "errors": errors,
        }

    def _tell(self, rid: str, what: str) -> None:
        self.told.setdefault(rid, []).append(what)
        self.told_at.setdefault(rid, []).append(time.monotonic())

    def _apply(self, out: KVConnectorOutput) -> None:
        """What vLLM's scheduler does with the aggregated report."""
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
                self._merge(self.fan("check", blocks=r["blocks"], index=r["index"], rid=rid))
                r["state"] = "completed"
                r["completed_at"] = time.monotonic()
                self._release(rid)  # decoded one token, finished: D frees at once
            elif r["state"] == "aborted":
                self._release(rid)
            else:
                self.violations.append(f"{rid}: finished_recving in state {r['state']}")

    # -- the report -------------------------------------------------------------------- #

    def report(self, final: bool = False, rids: list[str] | None = None) -> Any:
        """What the scheduler saw (of ``rids`` only, when given); ``final`` scans the free
        pool first (a stamp in a free block is a write after the release) and adds every
        rank's ``info``."""
        if final and self.free:
            self._merge(self.fan("scan_free", blocks=list(self.free), where="free"))
        ranks = self.fan("info", rid=rids[0] if rids and len(rids) == 1 else None) if final else []
        want = set(rids) if rids is not None else None

        def keep(rid: str) -> bool:
            return want is None or rid in want

        return {
            "states": {rid: r["state"] for rid, r in self.reqs.items() if keep(rid)},
            "held": {rid: r["blocks"] for rid, r in self.reqs.items() if not r["freed"] and keep(rid)},
            "told": {rid: t for rid, t in self.told.items() if keep(rid)},
            "told_at": {rid: t for rid, t in self.told_at.items() if keep(rid)},
            "rank_reports": {rid: t for rid, t in self.rank_reports.items() if keep(rid)},
            "violations": list(self.violations),
            "bytes_checked": self.bytes_checked,
            "late_bytes": self.late_bytes,
            "errors": list(self.errors),
            "free_blocks": len(self.free),
            "ranks": ranks,
        }

    def ranks(self, rid: str | None = None) -> Any:
        """Every rank's ``info`` (of ``rid`` only, when given)."""
        return self.fan("info", rid=rid)
