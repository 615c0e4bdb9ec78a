"""vLLM's real scheduler and push worker classes (0.33.0, 0.34.0) on a CPU, with a fake
NIXL agent.

The scheduler is vLLM's own ``Scheduler`` with its real KV cache manager and block pool,
built from a tiny local model config; its connector comes from vLLM's connector factory
(``kv_connector`` + ``kv_connector_module_path``), so the plugin loads the way a
deployment loads it. The workers are the real worker classes (vLLM's
``NixlPushConnectorWorker`` or the plugin's ``KvdrainPushWorker``) built the way vLLM's
own unit tests build them: ``object.__new__`` and the attributes the methods under test
read, with :class:`FakeNixl` in place of the NIXL agent. Worker outputs reach the
scheduler through vLLM's ``KVOutputAggregator``, and ``Scheduler.update_from_output``
applies them: every assert of the scheduler's runs.

The CPU platform, the tiny model and the configs come from ``vllm_cpu`` (shared with the
end-to-end suite). Test set-up only: the plugin itself selects no platform.
"""

from __future__ import annotations

import copy
import queue
import tempfile
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import vllm_cpu  # before any connector module: selects vLLM's CPU platform
from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.utils import (
    EngineTransferInfo,
    KVOutputAggregator,
    TransferTopology,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorTransferResults,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import (
    NixlPushConnectorWorker,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import (
    NixlKVConnectorStats,
)
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager
from vllm_cpu import BLOCK_SIZE, CONTROL, LAYERS, PLUGIN, model_runner_output

from kvdrain.vllm._settings import Settings
from kvdrain.vllm._nixl_tap import NixlTap
from kvdrain.vllm.connector import KvdrainPushWorker

__all__ = ["BLOCK_SIZE", "CONTROL", "D_HANDLE", "LAYERS", "PLUGIN", "install_decode_layout"]

NUM_BLOCKS = 64

try:  # vLLM 0.34 pairs the KV regions of P and D by layer, per peer (``_dst_pairs``)
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import (
        _RegionPairs as REGION_PAIRS,
    )
except ImportError:  # 0.33: by region group (``dst_region_group_ids`` and the rest)
    REGION_PAIRS = None
P_ENGINE = "engine-P"
D_ENGINE = "engine-D"
MODEL_ROOT = Path(tempfile.gettempdir()) / "kvdrain-tests-vllm"


def vllm_config(
    which: str,
    *,
    tp: int = 1,
    role: str = "kv_consumer",
    policy: str = "fail",
    extra: dict[str, Any] | None = None,
) -> VllmConfig:
    return vllm_cpu.vllm_config(
        which,
        model_root=MODEL_ROOT,
        role=role,
        engine_id=D_ENGINE if role == "kv_consumer" else P_ENGINE,
        num_blocks=NUM_BLOCKS,
        tp=tp,
        policy=policy,
        extra=extra,
    )


def kv_cache_config() -> KVCacheConfig:
    return vllm_cpu.kv_cache_config(NUM_BLOCKS)


def make_scheduler(
    which: str,
    *,
    tp: int = 1,
    policy: str = "fail",
    extra: dict[str, Any] | None = None,
    max_inflight_kv_loads: int | None = None,
) -> Scheduler:
    """vLLM's scheduler; ``max_inflight_kv_loads``: 0.34's ``--max-num-inflight-kv-loads``."""
    cfg = vllm_config(which, tp=tp, policy=policy, extra=extra)
    if max_inflight_kv_loads is not None:
        cfg.scheduler_config.max_num_inflight_kv_loads = max_inflight_kv_loads
    return Scheduler(
        vllm_config=cfg,
        kv_cache_config=kv_cache_config(),
        structured_output_manager=StructuredOutputManager(cfg),
        block_size=BLOCK_SIZE,
        log_stats=False,
    )


def d_request(rid: str, *, p_tp: int, pp: int = 1, num_tokens: int = 3 * BLOCK_SIZE) -> Request:
    """A decode request whose prompt's KV a producer engine pushes."""
    params = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": P_ENGINE,
        "remote_request_id": f"p-{rid}",
        "remote_host": "127.0.0.1",
        "remote_port": 5600,
        "remote_block_ids": [],
        "tp_size": p_tp,
        "pp_size": pp,
        "transfer_mode": "push",
    }
    return Request(
        request_id=rid,
        prompt_token_ids=list(range(10, 10 + num_tokens)),
        sampling_params=SamplingParams(max_tokens=4, extra_args={"kv_transfer_params": params}),
        pooling_params=None,
    )


class FakeNixl:
    """Stands in for vLLM's NIXL wrapper: records every notification sent, delivers the
    batches a test queues, and reports the transfer states a test sets."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []
        # Agents the transport lost: a send to one whose message starts with the prefix
        # given raises, as NIXL's send_notif does for a peer it cannot reach.
        self.unreachable: dict[str, bytes] = {}
        self.refused: list[tuple[str, bytes]] = []
        self.batches: queue.Queue[dict[str, list[bytes]]] = queue.Queue()
        self.states: dict[int, str | BaseException] = {}
        self.posted: list[tuple[int, bytes]] = []
        self.fail_posts = 0
        self.released: list[int] = []
        self.removed_agents: list[str] = []
        self._next = 100

    def deliver(self, batch: dict[str, list[bytes]]) -> None:
        self.batches.put(batch)

    def get_new_notifs(self) -> dict[str, list[bytes]]:
        try:
            return self.batches.get_nowait()
        except queue.Empty:
            return {}

    def send_notif(self, agent: str, notif_msg: bytes) -> None:
        prefix = self.unreachable.get(agent)
        if prefix is not None and notif_msg.startswith(prefix):
            self.refused.append((agent, notif_msg))
            raise nixlRemoteDisconnectError(f"cannot reach {agent}")
        self.sent.append((agent, notif_msg))

    def make_prepped_xfer(self, op: str, *args: Any, notif_msg: bytes = b"") -> int:
        if self.fail_posts:
            self.fail_posts -= 1
            raise RuntimeError("nixlBackendError: cannot post")
        self._next += 1
        self.posted.append((self._next, notif_msg))
        self.states[self._next] = "PROC"
        return self._next

    def transfer(self, handle: int) -> str:
        return "PROC"

    def check_xfer_state(self, handle: int) -> str:
        state = self.states[handle]
        if isinstance(state, BaseException):
            raise state
        return state

    def get_xfer_telemetry(self, handle: int) -> None:
        return None

    def release_xfer_handle(self, handle: int) -> None:
        self.released.append(handle)

    def release_dlist_handle(self, handle: int) -> None:
        pass

    def remove_remote_agent(self, agent: str) -> None:
        self.removed_agents.append(agent)


def fake_nixl(w: NixlPushConnectorWorker) -> FakeNixl:
    """A worker's :class:`FakeNixl` (the plugin's sits behind its NIXL tap)."""
    agent = w.nixl_wrapper
    fake = agent.agent if isinstance(agent, NixlTap) else agent
    assert isinstance(fake, FakeNixl)
    return fake


class nixlNotFoundError(RuntimeError):  # noqa: N801 - NIXL's own exception name
    """What NIXL's status call raises for a handle whose remote metadata is gone."""


class nixlBackendError(RuntimeError):  # noqa: N801
    """What NIXL's status call raises for a backend failure."""


class nixlRemoteDisconnectError(RuntimeError):  # noqa: N801
    """What NIXL raises for an operation towards a peer it lost."""


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance_ms(self, ms: int) -> None:
        self.t += ms / 1000


def make_worker(
    which: str,
    cfg: VllmConfig,
    *,
    tp_rank: int,
    world_size: int,
    engine_id: str,
    remote_engine: str,
    remote_tp: int,
    remote_agents: dict[tuple[int, int], str],
    clock: Clock,
    settings: Settings | None = None,
) -> NixlPushConnectorWorker:
    """One real worker (``NixlPushConnectorWorker`` or ``KvdrainPushWorker``), built as
    vLLM's unit tests build theirs: no NIXL agent, no GPU, no distributed state."""
    cls = KvdrainPushWorker if which == PLUGIN else NixlPushConnectorWorker
    w = object.__new__(cls)
    nixl = FakeNixl()
    kv_cfg = cfg.kv_transfer_config
    assert kv_cfg is not None
    attrs: dict[str, Any] = dict(
        vllm_config=cfg,
        kv_transfer_config=kv_cfg,
        kv_cache_config=kv_cache_config(),
        nixl_wrapper=nixl,
        engine_id=engine_id,
        tp_rank=tp_rank,
        world_size=world_size,
        pcp_size=1,
        dcp_size=1,
        pcp_rank=0,
        pcp_dcp_sharded=False,
        transfer_tp_size=world_size,
        transfer_tp_rank=tp_rank,
        pp_size=1,
        block_size=BLOCK_SIZE,
        num_blocks=NUM_BLOCKS,
        use_mla=False,
        use_host_buffer=False,
        _has_mamba=False,
        _is_csa_linear=False,
        _is_hma_required=False,
        _physical_blocks_per_logical_kv_block=1,
        enable_permute_local_kv=False,
        enable_heterogeneous_attn_post_process=False,
        _remote_agents=defaultdict(dict, {remote_engine: dict(remote_agents)}),
        _engine_last_active={},
        _engine_by_address={},
        _failed_remote_engines=set(),
        _invalid_remote_engines=set(),
        _invalid_engine_backoff={},
        _engine_clock_offset={},
        _engine_ttl=0,
        _handshake_lock=threading.RLock(),
        _handshake_futures={},
        _recving_metadata={},
        _recving_transfers=defaultdict(list),
        _reqs_to_send={},
        _reqs_to_process=set(),
        _replicated_pcp_done_sending=set(),
        _invalid_block_ids=queue.Queue(),
        _failed_recv_reqs=queue.Queue(),
        _recv_failures=set(),
        _pending_recv_notifs={},
        consumer_notification_counts_by_req=defaultdict(int),
        expected_consumer_notifications_by_req={},
        xfer_stats=NixlKVConnectorStats(),
        _lease_extension=20,
        _hb_handshake_notif_only=True,
        _sending_transfers=defaultdict(list),
        _send_failures=set(),
        _sending_transfers_lock=threading.Lock(),
        _push_finished_blocks={},
        _pending_d_registrations={},
        _reg_send_inbox=queue.Queue(),
        _finished_blocks_inbox=queue.Queue(),
        _pending_completion_notifs=queue.Queue(),
        _evict_finished_inbox=queue.Queue(),
        _deferred_push_inbox=queue.Queue(),
        _push_writer_wake=threading.Event(),
        _push_writer_stop=threading.Event(),
        _push_writer_thread=None,
        dst_xfer_side_handles=defaultdict(dict),
        kv_caches_base_addr=defaultdict(dict),
        dst_num_blocks={},
        dst_region_num_blocks={},
        dst_region_group_ids={},  # this and the two region-group ones below: 0.33's
        dst_uses_region_group_mapping={},
        dst_region_mem_types={},
        _dst_pairs={},  # 0.34's region pairs per peer
        tp_mappings={},
        draft_tp_mappings={},
        region_group_ids=[],
        _uses_region_group_mapping=False,
        _transfer_layer_group_ids=(),
        num_regions=0,
        block_len_per_layer=[1024],
        src_xfer_handles_by_block_size={BLOCK_SIZE: 7},
        src_xfer_handles_by_tp_ratio={},
    )
    for k, v in attrs.items():
        setattr(w, k, v)
    topo = TransferTopology(
        tp_rank=tp_rank,
        tp_size=world_size,
        block_size=BLOCK_SIZE,
        engine_id=engine_id,
        is_mla=False,
        is_mamba=False,
        total_num_kv_heads=4,
        attn_backends=[],
    )
    topo.register_remote_engine(
        remote_engine,
        EngineTransferInfo(
            remote_tp_size=remote_tp,
            remote_block_len=1024,
            remote_block_size=BLOCK_SIZE,
            remote_physical_blocks_per_logical=1,
        ),
    )
    w.transfer_topo = topo
    if isinstance(w, KvdrainPushWorker):
        w.kvdrain_attach(settings or Settings(60_000, 60_000, 5_000, 256), clock=clock)
    return w


def one_rank_worker(
    which: str, *, config: VllmConfig | None = None, settings: Settings | None = None
) -> NixlPushConnectorWorker:
    """:func:`make_worker` for the smallest layout: one D rank (TP 1) of :data:`D_ENGINE`
    facing one P rank of :data:`P_ENGINE` (agent ``P0``), on a fresh :class:`Clock`.
    ``config``: vLLM's config, :func:`vllm_config` of ``which`` unless given."""
    return make_worker(
        which,
        config or vllm_config(which, tp=1),
        tp_rank=0,
        world_size=1,
        engine_id=D_ENGINE,
        remote_engine=P_ENGINE,
        remote_tp=1,
        remote_agents={(0, 0): "P0"},
        clock=Clock(),
        settings=settings,
    )


def writer_round(w: NixlPushConnectorWorker) -> None:
    """One round of the worker's writer thread, run inline (deterministic): the body of
    vLLM's writer loop (0.33 and 0.34 alike), steps 1 and 4 (the registrations to send,
    then one NIXL batch, ``PUSH_REG:`` to vLLM's handler and the rest to the engine
    thread). The plugin runs this same code of vLLM's; it sees the batch through its
    NIXL tap."""
    while not w._reg_send_inbox.empty():
        rid, reg = w._reg_send_inbox.get_nowait()
        w._send_registration_to_p(rid, reg)
    for notifs in w.nixl_wrapper.get_new_notifs().values():
        for notif in notifs:
            if notif.startswith(b"PUSH_REG:"):
                w._handle_push_reg_notif(notif)
            else:
                w._pending_completion_notifs.put(notif)


@dataclass
class Step:
    """What the scheduler saw in one step."""

    finished_recving: set[str] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)
    invalid_block_ids: set[int] = field(default_factory=set)
    per_rank_recving: list[set[str]] = field(default_factory=list)
    per_rank_invalid: list[set[int]] = field(default_factory=list)
    error: BaseException | None = None


class DecodeEngine:
    """One decode engine: vLLM's real scheduler (plugin or vLLM connector by
    ``which``), ``tp`` real workers and vLLM's aggregator between them."""

    def __init__(
        self,
        which: str,
        *,
        tp: int = 1,
        p_tp: int = 1,
        policy: str = "fail",
        settings: Settings | None = None,
        p_agents: dict[tuple[int, int], str] | None = None,
        extra: dict[str, Any] | None = None,
        max_inflight_kv_loads: int | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.which = which
        self.clock = clock or Clock()
        self.scheduler = make_scheduler(
            which, tp=tp, policy=policy, extra=extra, max_inflight_kv_loads=max_inflight_kv_loads
        )
        cfg = self.scheduler.vllm_config
        agents = p_agents or {(0, r): f"P{r}" for r in range(p_tp)}
        self.workers = [
            make_worker(
                which,
                cfg,
                tp_rank=r,
                world_size=tp,
                engine_id=D_ENGINE,
                remote_engine=P_ENGINE,
                remote_tp=p_tp,
                remote_agents=agents,
                clock=self.clock,
                settings=settings,
            )
            for r in range(tp)
        ]
        self.aggregator = KVOutputAggregator(tp)
        self.reported: list[list[str]] = [[] for _ in range(tp)]
        self.freed_at: dict[str, int] = {}
        self.steps = 0
        self.pending_output: list[KVConnectorOutput] | None = None
        self._last: SchedulerOutput | None = None
        # Test hook: called with the rank just before that rank's writer round (after
        # its start_load_kv and the step's deliveries), e.g. to move the clock inside a
        # slow step so the notices of that round arrive late in the step.
        self.before_writer_round: Callable[[int], None] | None = None

    # -- scheduler -------------------------------------------------------------------- #

    def free_blocks(self) -> int:
        return int(self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks())

    def add(self, req: Request) -> None:
        self.scheduler.add_request(req)

    def status(self, rid: str) -> RequestStatus | None:
        req = self.scheduler.requests.get(rid)
        return None if req is None else req.status

    def abort(self, rid: str) -> None:
        self.scheduler.finish_requests(rid, RequestStatus.FINISHED_ABORTED)

    def step(
        self, deliver: dict[int, dict[str, list[bytes]]] | None = None, *, slow_ms: int = 0
    ) -> Step:
        """One engine step: schedule, every worker runs the step's metadata, takes its
        batch (``deliver[rank]``) on its writer thread and reports; the aggregate goes
        to ``update_from_output``. ``slow_ms``: the step is slow: the clock moves on that
        much after the workers started it, before their writer threads read the batch.
        An exception (an assert of vLLM's) is returned in ``Step.error``."""
        self.steps += 1
        seen = Step()
        out = self.scheduler.schedule()
        meta = out.kv_connector_metadata
        outputs = []
        try:
            for w in self.workers:
                w.start_load_kv(copy.deepcopy(meta))  # each rank has its own copy
            self.clock.advance_ms(slow_ms)
            for rank, w in enumerate(self.workers):
                if deliver and rank in deliver:
                    fake_nixl(w).deliver(deliver[rank])
                if self.before_writer_round is not None:
                    self.before_writer_round(rank)
                writer_round(w)
                res: KVConnectorTransferResults = w.get_transfer_results()
                invalid = w.get_block_ids_with_load_errors()
                seen.per_rank_invalid.append(set(invalid))
                self.reported[rank].extend(sorted(res.finished_recving))
                seen.per_rank_recving.append(set(res.finished_recving))
                kvo = KVConnectorOutput(
                    finished_sending=res.finished_sending or None,
                    finished_recving=res.finished_recving or None,
                    failed_recving=res.failed_recving,
                    invalid_block_ids=invalid,
                )
                ids = list(out.num_scheduled_tokens)
                mro = model_runner_output(
                    ids,
                    sampled_token_ids=[[7] for _ in ids],
                    kv_connector_output=kvo,
                )
                outputs.append(mro)
        except Exception as e:  # noqa: BLE001 - the control's failures are the point
            seen.error = e
            return seen
        agg = self.aggregator.aggregate(outputs)
        assert agg is not None and agg.kv_connector_output is not None
        kvo = agg.kv_connector_output
        seen.finished_recving = set(kvo.finished_recving or ())
        seen.failed_recving = set(kvo.failed_recving or ())
        seen.invalid_block_ids = set(kvo.invalid_block_ids or ())
        before = set(self.scheduler.requests)
        try:
            self.scheduler.update_from_output(out, agg)
        except Exception as e:  # noqa: BLE001
            seen.error = e
        for rid in before - set(self.scheduler.requests):
            self.freed_at.setdefault(rid, self.steps)
        return seen

    def run(self, n: int) -> list[Step]:
        return [self.step() for _ in range(n)]


def completion(rid: str, p_tp: int) -> bytes:
    return f"{rid}:{p_tp}".encode()


def push_fail(rid: str, p_tp: int) -> bytes:
    return f"PUSH_FAIL:{rid}:{p_tp}".encode()


def sources(d_rank: int, d_tp: int, p_tp: int) -> list[int]:
    """The producer ranks that write consumer rank ``d_rank`` (non-MLA)."""
    if p_tp >= d_tp:
        k = p_tp // d_tp
        return [d_rank * k + i for i in range(k)]
    return [d_rank // (d_tp // p_tp)]


def all_completions(rid: str, *, d_tp: int, p_tp: int, pp: int = 1) -> dict[int, dict[str, list[bytes]]]:
    """Every completion each consumer rank receives for ``rid``, per sender agent."""
    out: dict[int, dict[str, list[bytes]]] = {}
    for d in range(d_tp):
        batch: dict[str, list[bytes]] = {}
        for stage in range(pp):
            for p in sources(d, d_tp, p_tp):
                batch[f"P{p}" if pp == 1 else f"P{stage}.{p}"] = [completion(rid, p_tp)]
        out[d] = batch
    return out


def split(batches: dict[int, dict[str, list[bytes]]], keep: Iterable[str]) -> dict[int, dict[str, list[bytes]]]:
    keep = set(keep)
    return {d: {a: m for a, m in b.items() if a in keep} for d, b in batches.items()}



D_HANDLE = 50
"""A producer's remote transfer-side handle for decode rank ``d`` is ``D_HANDLE + d``."""


def install_decode_layout(w: Any, d_tp: int) -> None:
    """What a completed handshake with the decode engine (``d_tp`` ranks, registered in
    ``w.transfer_topo``) leaves on a producer worker: the TP mapping, a transfer-side
    handle per decode rank, block counts, and (0.34) the region pairs: one region on each
    side, cache group 0."""
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.tp_mapping import (
        compute_tp_mapping,
    )

    topo = w.transfer_topo
    assert topo is not None
    w._group_spec_types = (FullAttentionSpec,)
    w.tp_mappings[D_ENGINE] = compute_tp_mapping(topo, d_tp, (FullAttentionSpec,))
    w.dst_xfer_side_handles[D_ENGINE] = {d: D_HANDLE + d for d in range(d_tp)}
    ratio = topo.tp_ratio(d_tp)
    if ratio < 0:
        w.src_xfer_handles_by_tp_ratio[(ratio, BLOCK_SIZE)] = [60 + i for i in range(-ratio)]
    for eid in (D_ENGINE, P_ENGINE):
        w.dst_num_blocks[eid] = NUM_BLOCKS
        w.dst_region_num_blocks[eid] = None
        w.dst_region_group_ids[eid] = []
        w.dst_uses_region_group_mapping[eid] = False
    if REGION_PAIRS is not None:
        w._dst_pairs[D_ENGINE] = REGION_PAIRS(
            remote=[0], local=[0], group=[0], remote_regions=[0], partner=[0]
        )


class ProducerRank:
    """One producer (prefill) worker rank pushing one request's KV to a decode engine of
    ``d_tp`` ranks, through vLLM's real ``_xfer_blocks_for_req`` (topology, descriptors,
    posting, publication), polled by the real ``get_transfer_results``."""

    def __init__(self, which: str, *, p_tp: int = 1, tp_rank: int = 0, d_tp: int = 1) -> None:
        self.clock = Clock()
        cfg = vllm_config(which, tp=p_tp, role="kv_producer")
        self.d_agents = {(0, d): f"D{d}" for d in range(d_tp)}
        w = make_worker(
            which,
            cfg,
            tp_rank=tp_rank,
            world_size=p_tp,
            engine_id=P_ENGINE,
            remote_engine=D_ENGINE,
            remote_tp=d_tp,
            remote_agents=self.d_agents,
            clock=self.clock,
        )
        install_decode_layout(w, d_tp)
        self.w = w
        self.nixl = fake_nixl(w)
        self.which = which

    def push(self, p_rid: str, d_rid: str, *, lease_s: float = 30.0) -> list[int]:
        """The writer thread's WRITE for ``p_rid`` into D's request ``d_rid``; returns the
        handles posted."""
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
            RemoteMeta,
            ReqMeta,
        )

        import time as _time

        self.w._reqs_to_send[p_rid] = _time.perf_counter() + lease_s
        self.w._reqs_to_process.add(p_rid)
        meta = ReqMeta(
            local_block_ids=([1, 2, 3],),
            local_physical_block_ids=([1, 2, 3],),
            tp_size=self.w.world_size,
            remote=RemoteMeta(
                block_ids=([4, 5, 6],), host="", port=0, engine_id=D_ENGINE, request_id=d_rid
            ),
        )
        before = {h for h, _ in self.nixl.posted}
        self.w._xfer_blocks_for_req(p_rid, meta)
        return [h for h, _ in self.nixl.posted if h not in before]

    def results(self) -> KVConnectorTransferResults:
        return self.w.get_transfer_results()
