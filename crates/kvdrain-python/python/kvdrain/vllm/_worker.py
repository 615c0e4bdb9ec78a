"""The plugin's worker side: vLLM's push worker, adopted, with a
:class:`~kvdrain.vllm._decode.DecodeSide` and a :class:`~kvdrain.vllm._prefill.PrefillSide`
(:mod:`kvdrain.vllm.connector` says how). Imported after the gate."""

from __future__ import annotations

import copy
import logging
import queue
import time
from collections.abc import Callable, Iterable, Sized
from typing import Any

import vllm
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import NixlConnectorMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import (
    NixlPushConnectorWorker,
)

from kvdrain._kvdrain import PushPlan, encode_cancel
from kvdrain.vllm import _gate
from kvdrain.vllm._clock import RankClock
from kvdrain.vllm._decode import DecodeReport, DecodeSide, VllmReceives
from kvdrain.vllm._idle_step import IdleStep, unread
from kvdrain.vllm._metrics import KvdrainStats
from kvdrain.vllm._nixl_tap import NixlTap
from kvdrain.vllm._nixl_watch import CallWatch
from kvdrain.vllm._prefill import LIFETIME_KEY, PrefillSide
from kvdrain.vllm._settings import Settings
from kvdrain.vllm._topology import agent_name, block_groups, expected_edges
from kvdrain.vllm._writer_wake import BoundedWake

__all__ = ["KvdrainPushWorker"]

# A child of vLLM's own logger, so the lines appear in vLLM's log with its format.
logger = logging.getLogger("vllm.kvdrain")


class KvdrainPushWorker(NixlPushConnectorWorker):
    """vLLM's push worker with a :class:`DecodeSide` and a :class:`PrefillSide` (see the
    module's doc). Built by vLLM and adopted (:meth:`kvdrain_attach`)."""

    nixl_wrapper: Any  # vLLM's NIXL agent, behind the plugin's NixlTap once attached
    xfer_stats: Any  # vLLM's NIXL stats, a KvdrainStats once attached
    _push_writer_wake: Any  # vLLM's writer-thread event, a BoundedWake once attached
    _pending_completion_notifs: object  # what vLLM's writer forwards, a queue.Queue

    # -- set-up ---------------------------------------------------------------------- #

    def kvdrain_attach(
        self, settings: Settings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """The plugin's state, once vLLM's constructor has run (``clock``: monotonic
        seconds): the two sides, and the NIXL agent behind the tap. Refuses a worker
        that lacks any vLLM attribute the plugin uses (:func:`_gate.check_instance`)."""
        _gate.check_instance(vllm.__version__, self, "NixlPushConnectorWorker")
        rank_clock = RankClock(clock)  # one clock for both sides and the writer thread
        self.kvdrain_decode = DecodeSide(
            settings,
            world_size=self.world_size,
            clock=rank_clock,
            name=f"{self.engine_id}-tp{self.tp_rank}",
        )
        self.kvdrain_prefill = PrefillSide(settings, rank_clock.now_ms)
        # This step's report from start_load_kv, told with the rest in get_transfer_results.
        self._kvdrain_report: DecodeReport | None = None
        stats = KvdrainStats()
        for key, values in self.xfer_stats.data.items():
            stats.data[key].extend(values)
        self.xfer_stats = stats
        # vLLM binds each of these once, in its constructor (0.33, 0.34), and changes
        # them in place; the gate checks that each is there.
        self._kvdrain_vllm = VllmReceives(
            pending=self._recving_metadata,
            done=self._recving_transfers,
            failed=self._failed_recv_reqs,
            invalid=self._invalid_block_ids,
            stats=stats,
        )
        agent = self.nixl_wrapper
        if isinstance(agent, NixlTap):
            agent = agent.agent  # attached again: a new tap over the same agent
        watch = CallWatch(
            settings.nixl_stall_ms,
            name=f"{self.engine_id}-tp{self.tp_rank}",
            stack_tools=settings.nixl_stack_tools,
        )
        self.nixl_wrapper = NixlTap(agent, self.kvdrain_decode, self.kvdrain_prefill, watch)
        # The deque under vLLM's queue of forwarded messages (bound once, in its
        # constructor), read for emptiness by _get_new_notifs; None: not a queue.Queue.
        forwarded = self._pending_completion_notifs
        self._kvdrain_forwarded: Sized | None = (
            forwarded.queue if isinstance(forwarded, queue.Queue) else None
        )
        # vLLM's step is answered here on a step with nothing for it, where its code is
        # the code read for that (kvdrain.vllm._idle_step).
        self._kvdrain_idle: IdleStep | None = None
        why = unread(type(self))
        if why is None:
            self._kvdrain_idle = IdleStep(
                forwarded=self._pending_completion_notifs,
                receives_done=self._recving_transfers,
                receives_failed=self._failed_recv_reqs,
                receive_failures=self._recv_failures,
                pcp_done_sending=self._replicated_pcp_done_sending,
                leases=self._reqs_to_send,
                pushes=self._sending_transfers,
            )
        else:
            logger.info("kvdrain: vLLM's get_transfer_results runs every step: %s", why)
        # Before register_kv_caches starts the writer thread: it drains when idle too.
        self._push_writer_wake = BoundedWake.around(self._push_writer_wake)
        logger.info(
            "kvdrain: ledger on TP rank %d (deadline_ms=%d, quarantine_ms=%d, "
            "settle_ms=%d, capacity=%d)",
            self.tp_rank,
            settings.deadline_ms,
            settings.quarantine_ms,
            settings.settle_ms,
            settings.capacity,
        )

    def kvdrain_counters(self) -> dict[str, int]:
        """The ledger's counters (every ingest and decision count, by name)."""
        return self.kvdrain_decode.counters()

    # -- decode side ------------------------------------------------------------------ #

    def start_load_kv(self, metadata: NixlConnectorMetadata) -> None:
        decode = self.kvdrain_decode
        # Continues a report no get_transfer_results has told yet, if any.
        report = decode.catch_up(self._kvdrain_report)
        refused: list[str] = []  # no PUSH_REG for these (refused or held, not tracked)
        if metadata.reqs_to_recv and not (self.pcp_rank > 0 and not self.pcp_dcp_sharded):
            # Registered before vLLM queues the PUSH_REG: no notice can precede its request.
            agents: dict[str, dict[tuple[int, int], Any]] = {}  # per producer engine
            # One expectation per producer engine and layout in a step (the same agents,
            # so the same edges), and one registration of all its receives: their ids,
            # blocks and producers in three lists.
            batches: dict[tuple[str | None, int, int], tuple[Any, list[Any], list[Any], list[Any]]]
            batches = {}
            for rid, meta in metadata.reqs_to_recv.items():
                groups = block_groups(meta.local_block_ids)
                if groups:
                    remote = meta.remote
                    if remote is None:
                        key, producer = (None, meta.tp_size, meta.pp_size), None
                    else:
                        key = (remote.engine_id, meta.tp_size, meta.pp_size)
                        producer = (remote.engine_id, remote.request_id)
                    batch = batches.get(key)
                    if batch is None:
                        batch = batches[key] = (self._kvdrain_expect(meta, agents), [], [], [])
                    batch[1].append(rid)
                    batch[2].append(groups)
                    batch[3].append(producer)
            for expect, rids, blocks, producers in batches.values():
                refused += decode.register_many(rids, blocks, producers, expect, report)
        if refused and metadata.push_registrations:
            # A refused receive sends no PUSH_REG: this rank asks nobody to write into it.
            metadata = copy.copy(metadata)  # vLLM's own object stays as it built it
            not_sent = set(refused)
            metadata.push_registrations = {
                k: v for k, v in metadata.push_registrations.items() if k not in not_sent
            }
        for rid in getattr(metadata, "recv_finished_early", ()):
            decode.abort(rid, report)
        super().start_load_kv(metadata)
        self._kvdrain_report = report  # told in this step's get_transfer_results

    def _send_heartbeats(self, metadata: NixlConnectorMetadata) -> None:
        beats = metadata.heartbeat_by_engine
        if not beats:
            super()._send_heartbeats(metadata)
            return
        kept = {}
        for engine, info in beats.items():
            ids = self.kvdrain_decode.beats(engine, info.req_ids)
            if len(ids) == len(info.req_ids):
                kept[engine] = info
            elif ids:
                kept[engine] = copy.copy(info)
                kept[engine].req_ids = set(ids)
        if len(kept) != len(beats) or any(kept[e] is not beats[e] for e in kept):
            metadata = copy.copy(metadata)  # vLLM's own object stays as it built it
            metadata.heartbeat_by_engine = kept
        super()._send_heartbeats(metadata)

    def _do_send_reg_notif(self, req_id: str, reg_data: dict[str, Any]) -> None:
        left = self.kvdrain_decode.lifetime_left_ms(req_id)
        if left is None:
            super()._do_send_reg_notif(req_id, reg_data)
        elif left > 0:
            super()._do_send_reg_notif(req_id, {**reg_data, LIFETIME_KEY: left})
        else:
            logger.info("kvdrain: PUSH_REG for %s not sent: the receive ended first", req_id)

    def _get_new_notifs(self) -> set[str]:
        # vLLM's writer thread forwards here only what the tap hands back: the heartbeats
        # to this rank as a producer, every few seconds (the ledger keeps the rest). On a
        # step with none, vLLM's drain would pay a lock and a raised queue.Empty to find
        # that out; the deque's length is read without either (a message put meanwhile
        # waits for the next step, as it would after vLLM's own drain).
        forwarded = self._kvdrain_forwarded
        if forwarded is not None and not forwarded:
            return set()
        return super()._get_new_notifs()

    def get_transfer_results(self) -> KVConnectorTransferResults:
        decode = self.kvdrain_decode
        report = decode.step(self._kvdrain_report)
        self._kvdrain_report = None
        if report.cancelled:
            self._kvdrain_cancel(report.cancelled)
        watch = self.nixl_wrapper.watch
        stats = self.xfer_stats
        stats.record_gauges(self.tp_rank, *decode.gauges(), watch.oldest_s())
        stalls = watch.take_stalls()
        if stalls:
            stats.record_nixl_stalls(stalls)
        results = decode.tell(report, self._kvdrain_vllm, self._kvdrain_vllm_step)
        prefill = self.kvdrain_prefill
        prefill.release_sources(results.finished_sending)
        owed = prefill.take_owed()
        if owed:
            self._kvdrain_send(owed)
        return results

    def _kvdrain_vllm_step(self) -> KVConnectorTransferResults:
        """vLLM's ``get_transfer_results``, or on a step with nothing for it what that
        would do: wake the writer thread, and report nothing."""
        idle = self._kvdrain_idle
        if idle is not None and idle.idle():
            self._push_writer_wake.set()
            return KVConnectorTransferResults()
        return super().get_transfer_results()

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.kvdrain_decode.drop_reported(super().get_block_ids_with_load_errors())

    def shutdown(self) -> None:
        super().shutdown()
        decode: DecodeSide | None = getattr(self, "kvdrain_decode", None)
        if decode is not None:
            decode.close()  # the flight recorder's file, if recording

    def _cleanup_remote_engine(self, engine_id: str, *, log_eviction: bool = True) -> None:
        with self._handshake_lock:
            agents = list(self._remote_agents.get(engine_id, {}).values())
        super()._cleanup_remote_engine(engine_id, log_eviction=log_eviction)
        for agent in agents:
            self.kvdrain_decode.gone(agent_name(agent), f"engine {engine_id} evicted")

    def _kvdrain_cancel(self, cancelled: list[tuple[str, str]]) -> None:
        """``PUSH_CANCEL:`` to every agent of each producer engine a receive given up was
        registered with."""
        for engine, rid in cancelled:
            with self._handshake_lock:
                agents = list((self._remote_agents.get(engine) or {}).values())
            message = encode_cancel(rid)
            for agent in agents:
                self._kvdrain_notify(agent, message, "push_cancel_notif_failed", rid)

    def _kvdrain_expect(
        self, meta: Any, agents_of: dict[str, dict[tuple[int, int], Any]]
    ) -> int | list[str]:
        """What this rank waits for (:func:`~kvdrain.vllm._topology.expected_edges`),
        from the agents vLLM's handshake gave the request's producer engine.
        ``agents_of``: the engines' agents read so far in this step."""
        agents = None
        if meta.remote is not None:
            engine = meta.remote.engine_id
            agents = agents_of.get(engine)
            if agents is None:
                with self._handshake_lock:
                    agents = agents_of[engine] = dict(self._remote_agents.get(engine) or {})
        return expected_edges(
            d_rank=self.tp_rank,
            d_tp=self.world_size,
            p_tp=meta.tp_size,
            p_pp=meta.pp_size,
            mla=bool(self.use_mla),
            agents=agents,
        )

    # -- prefill side ----------------------------------------------------------------- #

    def _kvdrain_plan(self, d_rid: str, engine_id: str, d_tp: int) -> PushPlan:
        with self._handshake_lock:
            agents = dict(self._remote_agents.get(engine_id) or {})
        return PushPlan(
            d_rid,
            p_tp=self.world_size,
            d_tp=d_tp,
            d_agents=[
                None if (a := agents.get((0, r))) is None else agent_name(a) for r in range(d_tp)
            ],
            tp_rank=self.tp_rank,
            mla=bool(self.use_mla),
        )

    def _do_start_push_kv(
        self, request_id: str, local_block_ids: Any, registration_data: dict[str, Any]
    ) -> None:
        # vLLM calls this when it matches a registration, and again once a deferred
        # handshake is done: a registration that ended is not acted on.
        d_rid = registration_data.get("request_id")
        if not isinstance(d_rid, str) or self.kvdrain_prefill.alive(d_rid):
            super()._do_start_push_kv(request_id, local_block_ids, registration_data)
            return
        logger.warning(
            "kvdrain: push of %s not posted: the registration of %s ended (lifetime or "
            "cancel)",
            request_id,
            d_rid,
        )
        try:
            plan = self._kvdrain_plan(
                d_rid,
                registration_data["decode_engine_id"],
                registration_data["decode_tp_size"],
            )
        except Exception:  # noqa: BLE001 - a registration vLLM would refuse owes nothing
            logger.debug("kvdrain: no plan for %s", request_id, exc_info=True)
            return
        self._kvdrain_send(self.kvdrain_prefill.dropped(plan))

    def _xfer_blocks_for_req(self, req_id: str, meta: Any) -> None:
        assert meta.remote is not None and self.transfer_topo is not None
        engine_id = meta.remote.engine_id
        d_tp = self.transfer_topo.get_engine_info(engine_id).remote_tp_size
        plan = self._kvdrain_plan(meta.remote.request_id, engine_id, d_tp)
        if not self.kvdrain_prefill.begin(req_id, engine_id, plan):
            logger.warning(
                "kvdrain: push of %s not posted: its source blocks were released", req_id
            )
            return
        try:
            super()._xfer_blocks_for_req(req_id, meta)
        except BaseException:
            self._kvdrain_send(self.kvdrain_prefill.unwound(req_id))
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
        if not self.kvdrain_prefill.alive(remote_request_id):
            # The registration ended since it was matched: not posted, owed as such.
            logger.warning(
                "kvdrain: WRITE of %s to rank %d not posted: the registration of %s ended",
                request_id,
                read_spec.remote_rank,
                remote_request_id,
            )
            self._kvdrain_send(
                self.kvdrain_prefill.posted(request_id, read_spec.remote_rank, None)
            )
            return None
        handle: int | None = super()._xfer_blocks(
            read_spec=read_spec,
            dst_engine_id=dst_engine_id,
            request_id=request_id,
            remote_request_id=remote_request_id,
            local_xfer_side_handle=local_xfer_side_handle,
            remote_xfer_side_handle=remote_xfer_side_handle,
        )
        self._kvdrain_send(self.kvdrain_prefill.posted(request_id, read_spec.remote_rank, handle))
        return handle

    def _engines_with_inflight_transfers(self) -> set[str]:
        return set(super()._engines_with_inflight_transfers()) | self.kvdrain_prefill.busy_engines()

    def _kvdrain_send(self, owed: Iterable[tuple[str, bytes]]) -> None:
        for agent, message in owed:
            if self._kvdrain_notify(agent, message, "push_fail_notif_failed", None):
                self.xfer_stats.record_push_fail_sent()

    def _kvdrain_notify(
        self, agent: Any, message: bytes, failure_type: str, req_id: str | None
    ) -> bool:
        """Sends one of the plugin's own notices (``PUSH_FAIL``, ``PUSH_CANCEL``); a send
        that fails is counted and logged as vLLM logs its own, and returns ``False``."""
        try:
            self.nixl_wrapper.send_notif(agent, notif_msg=message)
        except Exception as e:
            self.xfer_stats.record_failed_notification()
            self._log_failure(
                failure_type=failure_type, req_id=req_id, error=e, remote_agent_name=agent
            )
            return False
        return True
