"""A vLLM KV connector (vLLM 0.33.0, 0.34.0): vLLM's NIXL push connector with kvdrain's
decisions.

Turned on with one setting, nothing in vLLM edited::

    --kv-transfer-config '{"kv_connector": "KvdrainPushConnector",
                           "kv_connector_module_path": "kvdrain.vllm.connector",
                           "kv_role": "kv_consumer", ...}'

:class:`KvdrainPushConnector` lets vLLM build its own push connector (scheduler or worker
side, every check of vLLM's constructors included), then adopts the side it built as the
plugin's subclass: :class:`~kvdrain.vllm._scheduler.KvdrainPushScheduler` or
:class:`KvdrainPushWorker`. Handshakes, ``PUSH_REG``, heartbeats, the writer thread, the
WRITEs and their polls stay vLLM's own code; the plugin sees NIXL through
:class:`~kvdrain.vllm._nixl_tap.NixlTap` and decides through one helper per role. The
one argument it changes is the agent's thread sync (``kvdrain_nixl_sync``), set while
vLLM's constructor runs (:mod:`kvdrain.vllm._nixl_sync`).

* decode: :class:`~kvdrain.vllm._decode.DecodeSide` (the ledger; the one mapping of its
  decisions to vLLM's reports, and the rules for refusals and vLLM's own failures);
* prefill: :class:`~kvdrain.vllm._prefill.PrefillSide` (a ``PushPlan`` per request: owed
  ``PUSH_FAIL``, source blocks, retired requests; each registration's lifetime and
  cancel);
* scheduler: :class:`~kvdrain.vllm._scheduler.KvdrainPushScheduler` (receives that finish
  early, admission by ``kvdrain_capacity``).

Every override below calls vLLM's own method and delegates in a few lines. The vLLM
version, the signature of every vLLM method the plugin uses and the presence of every
vLLM attribute it reads or writes are checked when this module loads, before anything
else of vLLM's is imported (:mod:`kvdrain.vllm._gate`).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import vllm

from kvdrain.vllm import _gate

# The gate first: under a vLLM that moved a class, one error says everything that differs
# before an import below fails on the first of it.
_gate.check(vllm.__version__, _gate.vllm_classes())

from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorRole,
    KVConnectorTransferResults,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import (  # noqa: E402
    base_worker as vllm_base_worker,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import (  # noqa: E402
    NixlPushConnector,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (  # noqa: E402
    NixlConnectorMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import (  # noqa: E402
    NixlPushConnectorWorker,
)

from kvdrain._errors import ConfigError  # noqa: E402
from kvdrain._kvdrain import PushPlan, encode_cancel  # noqa: E402
from kvdrain.vllm._decode import (  # noqa: E402
    DecodeReport,
    DecodeSide,
    Registered,
    block_groups,
    producer_ranks,
)
from kvdrain.vllm._metrics import KvdrainPromMetrics, KvdrainStats  # noqa: E402
from kvdrain.vllm._nixl_sync import agent_sync  # noqa: E402
from kvdrain.vllm._nixl_tap import NixlTap, agent_name  # noqa: E402
from kvdrain.vllm._nixl_watch import CallWatch  # noqa: E402
from kvdrain.vllm._prefill import LIFETIME_KEY, PrefillSide  # noqa: E402
from kvdrain.vllm._scheduler import KvdrainConnectorMetadata, KvdrainPushScheduler  # noqa: E402
from kvdrain.vllm._settings import Settings, settings_from_extra_config  # noqa: E402

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

__all__ = [
    "KvdrainConnectorMetadata",
    "KvdrainPushConnector",
    "KvdrainPushScheduler",
    "KvdrainPushWorker",
    "producer_ranks",
]

# A child of vLLM's own logger, so the lines appear in vLLM's log with its format.
logger = logging.getLogger("vllm.kvdrain")


class KvdrainPushWorker(NixlPushConnectorWorker):
    """vLLM's push worker with a :class:`DecodeSide` and a :class:`PrefillSide` (see the
    module's doc). Built by vLLM and adopted (:meth:`kvdrain_attach`)."""

    nixl_wrapper: Any  # vLLM's NIXL agent, behind the plugin's NixlTap once attached
    xfer_stats: Any  # vLLM's NIXL stats, a KvdrainStats once attached

    # -- set-up ---------------------------------------------------------------------- #

    def kvdrain_attach(
        self, settings: Settings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """The plugin's state, once vLLM's constructor has run (``clock``: monotonic
        seconds): the two sides, and the NIXL agent behind the tap. Refuses a worker
        that lacks any vLLM attribute the plugin uses (:func:`_gate.check_instance`)."""
        _gate.check_instance(vllm.__version__, self, "NixlPushConnectorWorker")
        self.kvdrain_decode = DecodeSide(
            settings,
            world_size=self.world_size,
            clock=clock,
            name=f"{self.engine_id}-tp{self.tp_rank}",
        )
        self.kvdrain_prefill = PrefillSide(settings, self.kvdrain_decode.now_ms)
        self._kvdrain_late: set[str] = set()
        stats = KvdrainStats()
        for key, values in self.xfer_stats.data.items():
            stats.data[key].extend(values)
        self.xfer_stats = stats
        agent = self.nixl_wrapper
        if isinstance(agent, NixlTap):
            agent = agent.agent  # attached again: a new tap over the same agent
        watch = CallWatch(
            settings.nixl_stall_ms,
            name=f"{self.engine_id}-tp{self.tp_rank}",
            stack_tools=settings.nixl_stack_tools,
        )
        self.nixl_wrapper = NixlTap(agent, self.kvdrain_decode, self.kvdrain_prefill, watch)
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
        report = decode.catch_up()
        refused: dict[str, Registered] = {}  # "refused" (nothing written) or "held"
        if not (self.pcp_rank > 0 and not self.pcp_dcp_sharded):
            # Registered before vLLM queues the PUSH_REG: no notice can precede its request.
            agents: dict[str, dict[tuple[int, int], Any]] = {}  # per producer engine
            for rid, meta in metadata.reqs_to_recv.items():
                groups = block_groups(meta.local_block_ids)
                if any(groups):
                    expect = self._kvdrain_expect(meta, agents)
                    remote = meta.remote
                    producer = None if remote is None else (remote.engine_id, remote.request_id)
                    done = decode.register(rid, groups, expect, report, producer)
                    if done in ("refused", "held"):
                        refused[rid] = done
        if refused and metadata.push_registrations:
            # A refused receive sends no PUSH_REG: this rank asks nobody to write into it.
            metadata = copy.copy(metadata)  # vLLM's own object stays as it built it
            metadata.push_registrations = {
                k: v for k, v in metadata.push_registrations.items() if k not in refused
            }
        for rid in getattr(metadata, "recv_finished_early", ()):
            decode.abort(rid, report)
        super().start_load_kv(metadata)
        for rid, done in refused.items():
            if done == "refused":
                self._failed_recv_reqs.put(rid)  # nothing written: vLLM fails it now
        self._kvdrain_tell(report)

    def _send_heartbeats(self, metadata: NixlConnectorMetadata) -> None:
        beats = metadata.heartbeat_by_engine
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

    def get_transfer_results(self) -> KVConnectorTransferResults:
        self._kvdrain_tell(self.kvdrain_decode.step())
        watch = self.nixl_wrapper.watch
        self.xfer_stats.record_gauges(
            self.tp_rank, *self.kvdrain_decode.gauges(), oldest_call_s=watch.oldest_s()
        )
        self.xfer_stats.record_nixl_stalls(watch.take_stalls())
        late, self._kvdrain_late = self._kvdrain_late, set()
        results = super().get_transfer_results()
        for rid in results.failed_recving - late:
            if self.kvdrain_decode.vllm_failed(rid):
                results.finished_recving.discard(rid)
                results.failed_recving.discard(rid)
        results.finished_recving |= late
        results.failed_recving |= late
        self.kvdrain_prefill.release_sources(results.finished_sending)
        self._kvdrain_send(self.kvdrain_prefill.take_owed())
        return results

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

    def _kvdrain_tell(self, report: DecodeReport) -> None:
        """Applies a decode report to vLLM's own structures. A released request whose
        receive vLLM closed already waits in ``_kvdrain_late`` for the next results."""
        for rid in report.completed:
            self._recving_transfers.setdefault(rid, [])  # vLLM's done path reports it
        for rid in report.released:
            if rid in self._recving_metadata:
                self._failed_recv_reqs.put(rid)  # vLLM's failure path, once on this rank
            else:
                self._kvdrain_late.add(rid)
        for blocks in report.invalid:
            self._invalid_block_ids.put(blocks)
        for _ in range(report.failed):
            self.xfer_stats.record_failed_transfer()
        for _ in range(report.expired):
            self.xfer_stats.record_kv_expired_req()
        for _ in range(report.after_expiry):
            self.xfer_stats.record_notification_after_expiry()
        if report.counts:
            self.xfer_stats.record_counts(report)
        for engine, rid in report.cancelled:
            with self._handshake_lock:
                agents = list((self._remote_agents.get(engine) or {}).values())
            message = encode_cancel(rid)
            for agent in agents:
                try:
                    self.nixl_wrapper.send_notif(agent, notif_msg=message)
                except Exception as e:
                    self.xfer_stats.record_failed_notification()
                    self._log_failure(
                        failure_type="push_cancel_notif_failed",
                        req_id=rid,
                        error=e,
                        remote_agent_name=agent,
                    )

    def _kvdrain_expect(
        self, meta: Any, agents_of: dict[str, dict[tuple[int, int], Any]]
    ) -> int | list[str]:
        """The producer agents that write this rank for a request (named edges: each
        must send exactly one notice), when the handshake with that engine is done and
        the layout is one vLLM writes rank to rank; else vLLM's count,
        ``pp × max(1, TP // world_size)``. ``agents_of``: the engines' agents read so far
        in this step."""
        count: int = meta.pp_size * max(1, meta.tp_size // self.world_size)
        if self.use_mla or meta.remote is None:
            return count
        engine = meta.remote.engine_id
        agents = agents_of.get(engine)
        if agents is None:
            with self._handshake_lock:
                agents = agents_of[engine] = dict(self._remote_agents.get(engine) or {})
        names = [
            agents.get((stage, p))
            for stage in range(meta.pp_size)
            for p in producer_ranks(self.tp_rank, self.world_size, meta.tp_size)
        ]
        if None in names:
            return count
        named = [agent_name(n) for n in names if n is not None]
        if len(set(named)) != count:
            return count
        return named

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
            try:
                self.nixl_wrapper.send_notif(agent, notif_msg=message)
                self.xfer_stats.record_push_fail_sent()
            except Exception as e:
                self.xfer_stats.record_failed_notification()
                self._log_failure(
                    failure_type="push_fail_notif_failed",
                    req_id=None,
                    error=e,
                    remote_agent_name=agent,
                )


class KvdrainPushConnector(NixlPushConnector):
    """vLLM's push connector, whose scheduler or worker side the plugin adopts, with the
    plugin's metrics beside vLLM's NIXL ones (:mod:`kvdrain.vllm._metrics`)."""

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KvdrainStats:
        return KvdrainStats() if data is None else KvdrainStats(data=data)

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[Any, Any],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KvdrainPromMetrics:
        return KvdrainPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        assert vllm_config.kv_transfer_config is not None
        settings = settings_from_extra_config(
            vllm_config.kv_transfer_config.kv_connector_extra_config
        )
        # vLLM's constructor, with NIXL's thread sync in the agent config it builds.
        with agent_sync(vllm_base_worker, settings.nixl_sync) as synced:
            super().__init__(vllm_config, role, kv_cache_config)
        if self.connector_worker is not None and settings.nixl_sync != "none" and not synced:
            raise ConfigError(
                f"kvdrain_nixl_sync={settings.nixl_sync!r}: vLLM built its NIXL agent without "
                "going through nixl_agent_config; set kvdrain_nixl_sync to \"none\" to run it "
                "unsynchronized"
            )
        # vLLM built its own sides; the plugin's subclasses add only methods, so the
        # built objects become them, every attribute vLLM set kept.
        if self.connector_scheduler is not None:
            self.connector_scheduler.__class__ = KvdrainPushScheduler
            self.connector_scheduler.kvdrain_attach(settings)
        if self.connector_worker is not None:
            self.connector_worker.__class__ = KvdrainPushWorker
            self.connector_worker.kvdrain_attach(settings)
