"""A vLLM 0.33 KV connector: vLLM's NIXL push connector with kvdrain's decisions.

Turned on with one setting, nothing in vLLM edited::

    --kv-transfer-config '{"kv_connector": "KvdrainPushConnector",
                           "kv_connector_module_path": "kvdrain.vllm.connector",
                           "kv_role": "kv_consumer", ...}'

:class:`KvdrainPushConnector` is a :class:`NixlPushConnector` whose scheduler side is a
:class:`KvdrainPushScheduler` (a ``NixlPushConnectorScheduler``) and whose worker side is
a :class:`KvdrainPushWorker` (a ``NixlPushConnectorWorker``). Handshakes, ``PUSH_REG``,
heartbeats, the WRITEs and their descriptors stay vLLM's; what changes is who decides.

Decode side (one ledger per worker, that is per TP rank):

* the writer thread feeds each ``get_new_notifs()`` batch whole to the ledger's ingest
  half and hands vLLM only the producer-bound messages (``PUSH_REG:``, ``HB:``);
* each engine step (``get_transfer_results``) pulls the ledger's decisions:

  - ``completed``: the request enters ``_recving_transfers`` with no handle, so vLLM's
    own ``_pop_done_transfers`` reports it in ``finished_recving``;
  - ``failed`` / ``expired``: its blocks go on ``_invalid_block_ids`` at once (one KV
    cache group; the scheduler fails or recomputes the request, by
    ``kv_load_failure_policy``), but the request is **not** reported finished yet: the
    scheduler keeps its blocks (it holds the blocks of a request that waits for remote KV
    until a worker names it in ``finished_recving``);
  - ``aborted``: the scheduler side tells every worker which receiving requests finished
    early (in the step's connector metadata); the ledger keeps their blocks fenced;
  - ``released``: no write can land any more; the request goes on ``_failed_recv_reqs``,
    so vLLM's own failure path names it in ``finished_recving`` and ``failed_recving``
    exactly once on this rank, and the scheduler frees the blocks when every rank has.

* a producer agent the transport shows lost is reported to the ledger with
  ``gone(agent)`` on the next engine step: a heartbeat (``HB:``) or ``PUSH_REG`` that
  ``send_notif`` could not send to it (vLLM 0.33 logs these and goes on), or an engine
  vLLM evicts (``_cleanup_remote_engine``, each of its agents). Its outstanding named
  edges fail at once and their blocks settle like a failure notice's (the bytes of a
  lost producer can still land for a while); the ledger decides, the plugin only
  reports.

Prefill side (per worker): one :class:`kvdrain.PushPlan` per request. A WRITE that cannot
be posted, or that ends in a backend error, owes one ``PUSH_FAIL:REQ:TP`` to the consumer
rank it was for; a ``NOT_FOUND`` status owes nothing (the write may still land); a
request's source blocks are not reported free (``finished_sending``) while any of its
writes is still in flight or of unknown state (bounded by ``quarantine_ms``), and the
producer does not evict a consumer engine it still writes to.
"""

from __future__ import annotations

import copy
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import msgspec
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import (
    NixlBaseConnector,
    NixlPushConnector,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
    PUSH_REG_NOTIF_PREFIX,
    NixlConnectorMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_scheduler import (
    NixlPushConnectorScheduler,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import (
    NixlPushConnectorWorker,
)

from kvdrain._errors import (
    DuplicateRequestError,
    FullError,
    KvdrainError,
    UnknownRequestError,
)
from kvdrain._kvdrain import Decision, Ledger, PushPlan
from kvdrain.vllm._settings import Settings, settings_from_extra_config

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

__all__ = [
    "KvdrainConnectorMetadata",
    "KvdrainPushConnector",
    "KvdrainPushScheduler",
    "KvdrainPushWorker",
    "producer_ranks",
]

# A child of vLLM's own logger, so the lines appear in vLLM's log with its format.
logger = logging.getLogger("vllm.kvdrain")

# The writer thread's poll while producer blocks wait for a registration (vLLM's 1 ms).
_WRITER_POLL_S = 0.001

# Ledger counters that vLLM's own metric "notifications after expiry" stands for.
_AFTER_EXPIRY = ("unknown", "late")


def _groups(block_ids: Any) -> list[list[int]]:
    """``BlockIds`` (one list per KV cache group, or one flat list) as lists of ints."""
    if not block_ids:
        return []
    if isinstance(block_ids[0], int):
        return [list(block_ids)]
    return [list(g) for g in block_ids]


def _agent_name(agent: str | bytes | None) -> str | None:
    """A remote agent's name as ``str``: NIXL's Python API returns the names it loads
    (``add_remote_agent``) as ``bytes``, and keys notification batches by ``str``."""
    if isinstance(agent, bytes):
        return agent.decode("utf-8", "replace")
    return agent


def producer_ranks(d_rank: int, d_tp: int, p_tp: int) -> list[int]:
    """The producer TP ranks whose WRITEs land on consumer rank ``d_rank`` (one PP
    stage): ``k = p_tp / d_tp`` consecutive ranks when the producer has more, else the
    one rank whose heads this rank holds."""
    if p_tp >= d_tp:
        k = p_tp // d_tp
        return list(range(d_rank * k, d_rank * k + k))
    return [d_rank * p_tp // d_tp]


class KvdrainConnectorMetadata(NixlConnectorMetadata):
    """vLLM's metadata plus ``recv_finished_early``: the ids of receiving requests that
    finished on the scheduler (aborted, or failed by the load failure policy) since the
    last step, so every worker can fence their blocks."""

    recv_finished_early: set[str]

    @classmethod
    def wrapping(cls, meta: NixlConnectorMetadata, early: set[str]) -> KvdrainConnectorMetadata:
        out = cls.__new__(cls)
        out.__dict__.update(meta.__dict__)
        out.recv_finished_early = early
        return out


class KvdrainPushScheduler(NixlPushConnectorScheduler):
    """vLLM's push scheduler side, plus: it remembers which decode requests wait for
    pushed KV, and when one of them finishes before its receive was reported (abort, or
    the load failure policy) it keeps the blocks (``delay_free_blocks``) and tells the
    workers in the next step's metadata. The blocks come back when every worker names
    the request in ``finished_recving`` (after its ledger released them)."""

    def __init__(
        self, vllm_config: VllmConfig, engine_id: str, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config, engine_id, kv_cache_config)
        self.kvdrain_receiving: set[str] = set()
        self._kvdrain_finished_early: set[str] = set()

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        staged = self._reqs_need_recv.get(request.request_id)
        if staged is not None and any(_groups(staged[1])):
            self.kvdrain_receiving.add(request.request_id)

    def request_finished(
        self, request: Request, block_ids: Any
    ) -> tuple[bool, dict[str, Any] | None]:
        delay, params = super().request_finished(request, block_ids)
        rid = request.request_id
        if rid in self.kvdrain_receiving:
            # Finished while its KV may still be landing: the workers' ledgers decide
            # when the blocks are free; report them through finished_recving.
            self.kvdrain_receiving.discard(rid)
            self._kvdrain_finished_early.add(rid)
            return True, params
        return delay, params

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        meta = super().build_connector_meta(scheduler_output)
        assert isinstance(meta, NixlConnectorMetadata)
        early, self._kvdrain_finished_early = self._kvdrain_finished_early, set()
        return KvdrainConnectorMetadata.wrapping(meta, early)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        super().update_connector_output(connector_output)
        for rid in connector_output.finished_recving or ():
            self.kvdrain_receiving.discard(rid)


class KvdrainPushWorker(NixlPushConnectorWorker):
    """vLLM's push worker with a :class:`kvdrain.Ledger` deciding the decode side and a
    :class:`kvdrain.PushPlan` per request on the prefill side (see the module's doc)."""

    def __init__(
        self, vllm_config: VllmConfig, engine_id: str, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config, engine_id, kv_cache_config)
        extra = self.kv_transfer_config.kv_connector_extra_config
        self.kvdrain_setup(settings_from_extra_config(extra))

    # -- set-up ---------------------------------------------------------------------- #

    def kvdrain_setup(
        self, settings: Settings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """Builds this rank's ledger and the plugin's state (the constructor calls it;
        ``clock`` returns monotonic seconds)."""
        self.kvdrain_settings = settings
        self.kvdrain_ledger = Ledger(
            settings.capacity,
            deadline_ms=settings.deadline_ms,
            quarantine_ms=settings.quarantine_ms,
            settle_ms=settings.settle_ms,
        )
        self._kvdrain_clock = clock
        self._kvdrain_epoch = clock()
        # D side, engine thread only: request -> "waiting" | "failed" | "aborted" for
        # every request the ledger tracks that this rank has not reported yet.
        self._kvdrain_phase: dict[str, str] = {}
        # Requests put on _failed_recv_reqs by this step's released decisions.
        self._kvdrain_reporting: set[str] = set()
        self._kvdrain_seen: dict[str, int] = dict.fromkeys(_AFTER_EXPIRY, 0)
        self._kvdrain_seen["malformed"] = 0
        self._kvdrain_fed = False  # set by the writer thread after a non-empty batch
        # P side, shared by the writer thread (posts) and the engine thread (polls).
        self._kvdrain_lock = threading.Lock()
        self._kvdrain_plans: dict[str, PushPlan] = {}
        self._kvdrain_edges: dict[int, tuple[str, int]] = {}  # handle -> (request, D rank)
        self._kvdrain_engine_of: dict[str, str] = {}  # request -> D engine
        # Requests whose finished_sending waits for their writes: request -> deadline ms.
        self._kvdrain_held: dict[str, int] = {}
        # PUSH_FAILs owed by this step's polls, sent once vLLM's lock is released.
        self._kvdrain_owed: list[tuple[str, bytes]] = []
        # D side: producer agents a send to failed, from the writer thread (PUSH_REG)
        # or the engine thread (heartbeats); the engine step reports them to the ledger.
        self._kvdrain_lost: queue.Queue[tuple[str, str]] = queue.Queue()
        logger.info(
            "kvdrain: ledger on TP rank %d (deadline_ms=%d, quarantine_ms=%d, "
            "settle_ms=%d, capacity=%d)",
            self.tp_rank,
            settings.deadline_ms,
            settings.quarantine_ms,
            settings.settle_ms,
            settings.capacity,
        )

    def kvdrain_now_ms(self) -> int:
        """This rank's clock, in ms since the ledger was built."""
        return int((self._kvdrain_clock() - self._kvdrain_epoch) * 1000)

    # -- D side: engine thread --------------------------------------------------------- #

    def start_load_kv(self, metadata: NixlConnectorMetadata) -> None:
        if metadata.reqs_to_recv:
            # The ledger's clock moves only with advance(); an engine that sat idle (no
            # steps) would register, and time the settling of the first failure
            # notices, on the time of its last step. Bring it to now first.
            for d in self.kvdrain_ledger.advance(self.kvdrain_now_ms()):
                self._kvdrain_apply(d)
        refused: set[str] = set()
        if not (self.pcp_rank > 0 and not self.pcp_dcp_sharded):
            # Registered before vLLM queues the PUSH_REG, so no completion can arrive
            # ahead of its request.
            agents: dict[str, dict[tuple[int, int], str]] = {}
            for rid, meta in metadata.reqs_to_recv.items():
                groups = _groups(meta.local_block_ids)
                if not any(groups):
                    continue  # finished before allocation: nothing was registered
                expect = self._kvdrain_expect(meta, agents)
                try:
                    self.kvdrain_ledger.register(rid, tuple(groups), expect)
                except DuplicateRequestError:
                    continue  # re-staged after a preemption: tracked already
                except (FullError, KvdrainError) as e:
                    logger.error("kvdrain: receive of %s refused (%s); failing it", rid, e)
                    refused.add(rid)
                    continue
                self._kvdrain_phase[rid] = "waiting"
        if refused and metadata.push_registrations:
            # Untracked requests send no PUSH_REG (nothing will write into them) and
            # fail through vLLM's own path.
            metadata = copy.copy(metadata)
            metadata.push_registrations = {
                k: v for k, v in metadata.push_registrations.items() if k not in refused
            }
            for rid in refused:
                self._failed_recv_reqs.put(rid)
        super().start_load_kv(metadata)
        for rid in getattr(metadata, "recv_finished_early", ()):
            if self._kvdrain_phase.get(rid) != "waiting":
                continue
            try:
                decision = self.kvdrain_ledger.abort(rid)
            except UnknownRequestError:
                continue
            if decision is not None:
                self._kvdrain_phase[rid] = "aborted"

    def _kvdrain_expect(
        self, meta: Any, agents_of: dict[str, dict[tuple[int, int], str]]
    ) -> int | list[str]:
        """The producer agents that write this rank for a request (named edges: each
        must send exactly one notice), when the handshake with that engine is done and
        the layout is one vLLM writes rank to rank; else vLLM's count,
        ``pp × max(1, TP // world_size)``."""
        count: int = meta.pp_size * max(1, meta.tp_size // self.world_size)
        if self.use_mla or meta.remote is None:
            return count
        engine = meta.remote.engine_id
        agents = agents_of.get(engine)
        if agents is None:
            with self._handshake_lock:
                agents = agents_of[engine] = dict(self._remote_agents.get(engine) or {})
        names = [
            _agent_name(agents.get((stage, p)))
            for stage in range(meta.pp_size)
            for p in producer_ranks(self.tp_rank, self.world_size, meta.tp_size)
        ]
        if len(names) != count or None in names or len(set(names)) != count:
            return count
        return [n for n in names if n is not None]

    def _get_new_notifs(self) -> set[str]:
        # Only producer-bound messages reach this queue: the ledger kept the rest.
        while True:
            try:
                notif = self._pending_completion_notifs.get_nowait()
            except queue.Empty:
                break
            if notif.startswith(b"HB:"):
                self._handle_heartbeat(notif[3:].decode("utf-8", "replace"))
        completed, others = self.kvdrain_ledger.poll_split()
        for rid in completed:
            if self._kvdrain_phase.pop(rid, None) is not None:
                self._recving_transfers.setdefault(rid, [])
        for d in others:
            self._kvdrain_apply(d)
        # After the poll: a notice the writer thread counted before the loss stands.
        self._kvdrain_take_lost()
        for d in self.kvdrain_ledger.advance(self.kvdrain_now_ms()):
            self._kvdrain_apply(d)
        if self._kvdrain_fed:
            self._kvdrain_fed = False
            self._kvdrain_count_notices()
        return set()

    def kvdrain_producer_lost(self, agent: str, why: str) -> None:
        """Reports that the transport lost producer agent ``agent`` (``why``: what
        failed). Any thread may call it; the next engine step tells the ledger
        (``gone``)."""
        self._kvdrain_lost.put((agent, why))

    def _kvdrain_take_lost(self) -> None:
        """Engine thread: every producer agent reported lost since the last step goes to
        the ledger as ``gone``, the clock brought to now first so the settling counts
        from the report."""
        lost: dict[str, str] = {}
        for agent, why in _drain(self._kvdrain_lost):
            lost.setdefault(agent, why)
        if not lost:
            return
        for d in self.kvdrain_ledger.advance(self.kvdrain_now_ms()):
            self._kvdrain_apply(d)
        for agent, why in lost.items():
            decisions = self.kvdrain_ledger.gone(agent)
            if decisions:
                logger.warning(
                    "kvdrain: producer agent %s lost (%s); %d receive(s) from it fail now "
                    "and their blocks settle",
                    agent,
                    why,
                    sum(1 for d in decisions if d.kind == "failed"),
                )
            for d in decisions:
                self._kvdrain_apply(d)

    def _send_heartbeats(self, metadata: NixlConnectorMetadata) -> None:
        # vLLM 0.33's own loop (the base worker's), except that a heartbeat that
        # send_notif cannot send reports its producer agent lost; vLLM only logs it at
        # debug level and goes on.
        for engine_id, hb_info in metadata.heartbeat_by_engine.items():
            pending = self._ensure_handshake(
                engine_id,
                hb_info.host,
                hb_info.port,
                hb_info.tp_size,
                hb_info.dcp_size,
                hb_info.pp_size,
                self._hb_handshake_notif_only and hb_info.pp_size > 1,
            )
            if pending is not None:
                continue  # the handshake is still pending
            self._engine_last_active[engine_id] = time.perf_counter()
            hb_msg = ("HB:" + ",".join(hb_info.req_ids)).encode()
            with self._handshake_lock:
                agents = list(self._remote_agents[engine_id].values())
            for agent_name in agents:
                try:
                    self.nixl_wrapper.send_notif(agent_name, notif_msg=hb_msg)
                except Exception as e:
                    logger.debug(
                        "Failed to send heartbeat to engine %s", engine_id, exc_info=True
                    )
                    name = _agent_name(agent_name)
                    if name is not None:
                        self.kvdrain_producer_lost(name, f"heartbeat not sent: {e}")

    def _kvdrain_apply(self, d: Decision) -> None:
        rid = d.request_id
        phase = self._kvdrain_phase.get(rid)
        if phase is None:
            return  # reported already (vLLM failed it itself)
        kind = d.kind
        if kind == "completed":
            del self._kvdrain_phase[rid]
            self._recving_transfers.setdefault(rid, [])
        elif kind in ("failed", "expired"):
            self._kvdrain_phase[rid] = "failed"
            if kind == "failed":
                self.xfer_stats.record_failed_transfer()
            else:
                self.xfer_stats.record_kv_expired_req()
            logger.warning(
                "kvdrain: receive of %s %s; its blocks stay fenced until released",
                rid,
                kind,
            )
            groups = _groups(d.blocks)
            if len(groups) == 1:
                # The scheduler maps block ids to requests for one KV cache group only;
                # with more, failed_recving at release carries the failure.
                self._invalid_block_ids.put(set(groups[0]))
        elif kind == "aborted":
            self._kvdrain_phase[rid] = "aborted"
        elif kind == "released":
            del self._kvdrain_phase[rid]
            self._kvdrain_reporting.add(rid)
            self._failed_recv_reqs.put(rid)

    def _kvdrain_count_notices(self) -> None:
        counters = self.kvdrain_ledger.counters()
        after_expiry = sum(counters[k] for k in _AFTER_EXPIRY)
        for _ in range(after_expiry - sum(self._kvdrain_seen[k] for k in _AFTER_EXPIRY)):
            self.xfer_stats.record_notification_after_expiry()
        if counters["malformed"] > self._kvdrain_seen["malformed"]:
            logger.warning(
                "kvdrain: %d malformed notification(s) ignored",
                counters["malformed"] - self._kvdrain_seen["malformed"],
            )
        for k in _AFTER_EXPIRY:
            self._kvdrain_seen[k] = counters[k]
        self._kvdrain_seen["malformed"] = counters["malformed"]

    def get_transfer_results(self) -> KVConnectorTransferResults:
        results = super().get_transfer_results()
        # A failure vLLM raised itself (no registration reached the producer) is final:
        # nothing can land, so the ledger forgets it and will report nothing more.
        for rid in results.failed_recving - self._kvdrain_reporting:
            if self._kvdrain_phase.pop(rid, None) is not None:
                try:
                    self.kvdrain_ledger.abort(rid)
                except UnknownRequestError:
                    pass
        self._kvdrain_reporting.clear()
        owed, self._kvdrain_owed = self._kvdrain_owed, []
        self._kvdrain_send(owed)
        self._kvdrain_hold_sends(results.finished_sending)
        return results

    def _cleanup_remote_engine(self, engine_id: str, *, log_eviction: bool = True) -> None:
        with self._handshake_lock:
            agents = [_agent_name(a) for a in self._remote_agents.get(engine_id, {}).values()]
        super()._cleanup_remote_engine(engine_id, log_eviction=log_eviction)
        # vLLM evicts from the engine thread or, through a handshake's TTL scan, from
        # the writer thread: the next engine step tells the ledger.
        for agent in agents:
            if agent is not None:
                self.kvdrain_producer_lost(agent, f"engine {engine_id} evicted")

    def kvdrain_counters(self) -> dict[str, int]:
        """The ledger's counters (every ingest and decision count, by name)."""
        return dict(self.kvdrain_ledger.counters())

    # -- D side: writer thread --------------------------------------------------------- #

    def _push_writer_loop(self) -> None:
        while not self._push_writer_stop.is_set():
            try:
                self._kvdrain_writer_round()
            except Exception:
                logger.exception("kvdrain: push writer error; continuing")
            if self._push_finished_blocks:
                self._push_writer_stop.wait(timeout=_WRITER_POLL_S)
            else:
                self._push_writer_wake.wait()
                self._push_writer_wake.clear()

    def _kvdrain_writer_round(self) -> None:
        """One round of the writer thread: vLLM's registration, deferred-push, finished
        blocks and eviction inboxes in vLLM's order, then one NIXL batch into the ledger."""
        for rid, reg in _drain(self._reg_send_inbox):
            self._send_registration_to_p(rid, reg)
        for rid, blocks, reg in _drain(self._deferred_push_inbox):
            self._do_start_push_kv(rid, blocks, reg)
        for rid, blocks in _drain(self._finished_blocks_inbox):
            matched = self._pop_matching_registration(rid)
            if matched is not None:
                self._do_start_push_kv(rid, blocks, matched)
            else:
                self._push_finished_blocks[rid] = blocks
        for rid in _drain(self._evict_finished_inbox):
            self._push_finished_blocks.pop(rid, None)
            self._pending_d_registrations.pop(rid, None)
        batch = self.nixl_wrapper.get_new_notifs()
        if not batch:
            return
        back = self.kvdrain_ledger.feed(batch)
        self._kvdrain_fed = True
        for _agent, notif in back:
            if notif.startswith(PUSH_REG_NOTIF_PREFIX):
                self._handle_push_reg_notif(notif)
            else:
                self._pending_completion_notifs.put(notif)

    def _do_send_reg_notif(self, req_id: str, reg_data: dict[str, Any]) -> None:
        # vLLM 0.33's own send (the push worker's), except that a PUSH_REG that
        # send_notif cannot send reports its producer agent lost; vLLM logs it and keeps
        # the receive waiting.
        engine_id = reg_data["remote_engine_id"]
        notif_msg = PUSH_REG_NOTIF_PREFIX + msgspec.msgpack.encode(reg_data)
        with self._handshake_lock:
            agents = dict(self._remote_agents.get(engine_id) or {})
        if not agents:
            logger.error(
                "No remote agents for engine %s; cannot send registration for %s",
                engine_id,
                req_id,
            )
            self.xfer_stats.record_failed_notification()
            self._failed_recv_reqs.put(req_id)
            return
        for rank, agent_name in agents.items():
            try:
                self.nixl_wrapper.send_notif(agent_name, notif_msg=notif_msg)
            except Exception as e:
                self._log_failure(
                    failure_type="push_reg_notif_failed",
                    req_id=req_id,
                    error=e,
                    remote_rank=rank,
                )
                self.xfer_stats.record_failed_notification()
                name = _agent_name(agent_name)
                if name is not None:
                    self.kvdrain_producer_lost(name, f"PUSH_REG not sent: {e}")

    # -- P side ----------------------------------------------------------------------- #

    def _xfer_blocks_for_req(self, req_id: str, meta: Any) -> None:
        assert meta.remote is not None and self.transfer_topo is not None
        engine_id = meta.remote.engine_id
        d_tp = self.transfer_topo.get_engine_info(engine_id).remote_tp_size
        with self._handshake_lock:
            agents = dict(self._remote_agents.get(engine_id) or {})
        plan = PushPlan(
            meta.remote.request_id,
            p_tp=self.world_size,
            d_tp=d_tp,
            d_agents=[_agent_name(agents.get((0, r))) for r in range(d_tp)],
            tp_rank=self.tp_rank,
            mla=bool(self.use_mla),
        )
        with self._kvdrain_lock:
            self._kvdrain_plans[req_id] = plan
            self._kvdrain_engine_of[req_id] = engine_id
        try:
            super()._xfer_blocks_for_req(req_id, meta)
        except BaseException:
            # The loop unwound: the ranks it never reached are owed a notice too.
            with self._kvdrain_lock:
                plan.retire()
                owed = plan.take_owed_notices()
            self._kvdrain_send(owed)
            raise

    def _xfer_blocks(
        self,
        read_spec: Any,
        dst_engine_id: str,
        request_id: str,
        remote_request_id: str,
        local_xfer_side_handle: int,
        remote_xfer_side_handle: int,
    ) -> int | None:
        handle = super()._xfer_blocks(
            read_spec=read_spec,
            dst_engine_id=dst_engine_id,
            request_id=request_id,
            remote_request_id=remote_request_id,
            local_xfer_side_handle=local_xfer_side_handle,
            remote_xfer_side_handle=remote_xfer_side_handle,
        )
        d_rank = read_spec.remote_rank
        owed: list[tuple[str, bytes]] = []
        with self._kvdrain_lock:
            plan = self._kvdrain_plans.get(request_id)
            if plan is not None and d_rank in plan.targets and plan.may_post(d_rank):
                if handle is None:
                    plan.post_failed(d_rank)  # nothing was sent: one PUSH_FAIL is owed
                    owed = plan.take_owed_notices()
                else:
                    plan.posted(d_rank)
                    self._kvdrain_edges[handle] = (request_id, d_rank)
        self._kvdrain_send(owed)
        return handle

    def _pop_done_transfers(
        self, transfers: dict[str, list[int]]
    ) -> tuple[set[str], set[str]]:
        if transfers is not self._sending_transfers:
            return super()._pop_done_transfers(transfers)
        done: set[str] = set()
        failed: set[str] = set()
        owed: list[tuple[str, bytes]] = []
        for rid, handles in list(transfers.items()):
            in_flight: list[int] = []
            for handle in handles:
                outcome = self._kvdrain_poll(rid, handle, failed)
                if outcome == "in_flight":
                    in_flight.append(handle)
                    continue
                with self._kvdrain_lock:
                    edge = self._kvdrain_edges.pop(handle, None)
                    plan = self._kvdrain_plans.get(rid)
                    if edge is not None and plan is not None:
                        if outcome == "landed":
                            plan.landed(edge[1])
                        elif outcome == "unknown":
                            plan.status_unknown(edge[1])
                        else:
                            plan.backend_error(edge[1])
                            owed.extend(plan.take_owed_notices())
            if in_flight:
                transfers[rid] = in_flight
            else:
                done.add(rid)
                del transfers[rid]
        # vLLM holds its sending-transfers lock here: the notices go out after it.
        self._kvdrain_owed.extend(owed)
        return done, failed

    def _kvdrain_poll(self, rid: str, handle: int, failed: set[str]) -> str:
        """One WRITE handle's state: ``in_flight``, ``landed``, ``unknown`` (NIXL
        ``NOT_FOUND``: the write may still land) or ``error`` (a backend error: nothing
        more of it lands)."""
        try:
            state = self.nixl_wrapper.check_xfer_state(handle)
        except Exception as e:
            unknown = type(e).__name__ == "nixlNotFoundError"
            self._log_failure(failure_type="transfer_exception", req_id=rid, error=e)
            if not self._handle_failed_transfer(rid, handle, failed):
                return "in_flight"  # the handle could not be released: keep polling it
            return "unknown" if unknown else "error"
        if state == "PROC":
            return "in_flight"
        if state == "DONE":
            self.xfer_stats.record_transfer(self.nixl_wrapper.get_xfer_telemetry(handle))
            self.nixl_wrapper.release_xfer_handle(handle)
            return "landed"
        self._log_failure(failure_type="transfer_failed", req_id=rid, xfer_state=state)
        if not self._handle_failed_transfer(rid, handle, failed):
            return "in_flight"
        return "error"

    def _kvdrain_send(self, owed: Iterable[tuple[str, bytes]]) -> None:
        for agent, message in owed:
            try:
                self.nixl_wrapper.send_notif(agent, notif_msg=message)
            except Exception as e:
                self.xfer_stats.record_failed_notification()
                self._log_failure(
                    failure_type="push_fail_notif_failed",
                    req_id=None,
                    error=e,
                    remote_agent_name=agent,
                )

    def _kvdrain_hold_sends(self, finished_sending: set[str]) -> None:
        """Keeps a request out of ``finished_sending`` (its source blocks in use) while
        any of its writes may still read them, at most ``quarantine_ms``; reports it once
        they are all over."""
        now = self.kvdrain_now_ms()
        with self._kvdrain_lock:
            for rid in list(finished_sending):
                plan = self._kvdrain_plans.get(rid)
                if plan is not None and not plan.is_terminal:
                    finished_sending.discard(rid)
                    self._kvdrain_held[rid] = now + self.kvdrain_settings.quarantine_ms
                elif plan is not None:
                    self._kvdrain_forget(rid)
            for rid, until in list(self._kvdrain_held.items()):
                plan = self._kvdrain_plans.get(rid)
                if plan is None or plan.is_terminal or now >= until:
                    del self._kvdrain_held[rid]
                    self._kvdrain_forget(rid)
                    finished_sending.add(rid)

    def _kvdrain_forget(self, rid: str) -> None:
        self._kvdrain_plans.pop(rid, None)
        self._kvdrain_engine_of.pop(rid, None)

    def _engines_with_inflight_transfers(self) -> set[str]:
        busy = set(super()._engines_with_inflight_transfers())
        with self._kvdrain_lock:
            busy.update(
                self._kvdrain_engine_of[rid]
                for rid, plan in self._kvdrain_plans.items()
                if not plan.is_terminal and rid in self._kvdrain_engine_of
            )
        return busy


def _drain(q: queue.Queue[Any]) -> Iterable[Any]:
    while True:
        try:
            yield q.get_nowait()
        except queue.Empty:
            return


class KvdrainPushConnector(NixlPushConnector):
    """vLLM's push connector facade, building the plugin's scheduler or worker side."""

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        # NixlPushConnector's own constructor would build vLLM's sides; the shared base
        # does the common checks, then the plugin builds its own.
        NixlBaseConnector.__init__(self, vllm_config, role, kv_cache_config)
        if vllm_config.parallel_config.decode_context_parallel_size > 1:
            raise ValueError(
                "KvdrainPushConnector does not support decode_context_parallel_size > 1."
            )
        self.connector_scheduler: NixlPushConnectorScheduler | None = None
        self.connector_worker: NixlPushConnectorWorker | None = None
        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler = KvdrainPushScheduler(
                vllm_config, self.engine_id, kv_cache_config
            )
        elif role == KVConnectorRole.WORKER:
            self.connector_worker = KvdrainPushWorker(
                vllm_config, self.engine_id, kv_cache_config
            )
        else:
            raise ValueError(f"Unsupported KVConnectorRole: {role}")

