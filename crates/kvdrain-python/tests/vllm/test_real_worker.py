"""The worker side built for real: vLLM's connector facade (``KvdrainPushConnector`` or
vLLM's ``NixlPushConnector``) in the WORKER role, over a single-process gloo group, with
a real NIXL agent (UCX) and a DRAM KV cache; ``register_kv_caches`` starts the worker's
own writer thread. A second NIXL agent in this process plays a producer rank and sends
real NIXL notifications: a non-UTF-8 one, then the completion."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from harness import (
    BLOCK_SIZE,
    CONTROL,
    LAYERS,
    NUM_BLOCKS,
    P_ENGINE,
    PLUGIN,
    kv_cache_config,
    vllm_config,
)
from vllm.config import set_current_vllm_config
from vllm.distributed.kv_transfer.kv_connector.utils import EngineTransferInfo
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlPushConnector
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
    NixlConnectorMetadata,
    RemoteMeta,
    ReqMeta,
)
from vllm.distributed.parallel_state import (
    init_distributed_environment,
    initialize_model_parallel,
    model_parallel_is_initialized,
)

from kvdrain.vllm.connector import KvdrainPushConnector, KvdrainPushWorker


@pytest.fixture(scope="module")
def distributed() -> Iterator[None]:
    cfg = vllm_config(CONTROL)
    with set_current_vllm_config(cfg):
        if not model_parallel_is_initialized():
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            s.close()
            init_distributed_environment(
                world_size=1,
                rank=0,
                distributed_init_method=f"tcp://127.0.0.1:{port}",
                local_rank=0,
                backend="gloo",
            )
            initialize_model_parallel(1, 1)
    yield


def build(which: str) -> Any:
    cfg = vllm_config(which, extra={"kvdrain_settle_ms": 1234})
    cfg.cache_config.kv_cache_layout = "NHD"  # the engine core resolves it normally
    cls = KvdrainPushConnector if which == PLUGIN else NixlPushConnector
    with set_current_vllm_config(cfg):
        conn = cls(cfg, KVConnectorRole.WORKER, kv_cache_config())
    kv = {n: torch.zeros((NUM_BLOCKS, 2, BLOCK_SIZE, 4, 16)) for n in LAYERS}
    conn.register_kv_caches(kv)
    return conn


@pytest.mark.parametrize("which", [PLUGIN, CONTROL])
def test_real_worker_with_a_real_nixl_producer_agent(distributed: None, which: str) -> None:
    from nixl._api import nixl_agent, nixl_agent_config

    conn = build(which)
    w = conn.connector_worker
    try:
        assert w._push_writer_thread is not None and w._push_writer_thread.is_alive()
        if which == PLUGIN:
            assert isinstance(w, KvdrainPushWorker)
            assert w.kvdrain_decode.settings.settle_ms == 1234  # from kv_connector_extra_config
        # What the handshake with the producer engine records.
        w.transfer_topo.register_remote_engine(
            P_ENGINE,
            EngineTransferInfo(
                remote_tp_size=1,
                remote_block_len=w.block_len_per_layer[0],
                remote_block_size=BLOCK_SIZE,
                remote_physical_blocks_per_logical=1,
            ),
        )
        producer = nixl_agent(f"producer-{which}", nixl_agent_config(backends=["UCX"]))
        me = producer.add_remote_agent(w.nixl_wrapper.get_agent_metadata())
        meta = NixlConnectorMetadata()
        meta.reqs_to_recv["r"] = ReqMeta(
            local_block_ids=([3],),
            local_physical_block_ids=([3],),
            tp_size=1,
            remote=RemoteMeta(
                block_ids=(), host="127.0.0.1", port=1, engine_id=P_ENGINE, request_id="p-r"
            ),
        )
        w.start_load_kv(meta)
        producer.send_notif(me, b"\xff not utf-8")
        producer.send_notif(me, b"r:1")
        finished: set[str] = set()
        error: BaseException | None = None
        until = time.monotonic() + 20
        while not finished and error is None and time.monotonic() < until:
            try:
                finished = set(w.get_transfer_results().finished_recving)
            except Exception as e:  # noqa: BLE001 - the control's failure
                error = e
            time.sleep(0.005)
        if which == CONTROL:
            assert isinstance(error, UnicodeDecodeError)
            return
        assert error is None and finished == {"r"}
        assert w.kvdrain_counters()["malformed"] == 1
        assert w.kvdrain_counters()["completions"] == 1
    finally:
        conn.shutdown()


@pytest.fixture
def agent_configs(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The thread sync of every agent NIXL's binding builds from now on, by the agent's
    name (``NIXL_THREAD_SYNC_STRICT``, ...): what NIXL itself was handed, read where
    vLLM's agent config becomes NIXL's."""
    import nixl._api as api

    seen: dict[str, str] = {}
    make = api.nixlBind.nixlAgent

    def recording(name: str, config: Any) -> Any:
        seen[name] = api.nixl_thread_sync_t(config.syncMode).name
        return make(name, config)

    monkeypatch.setattr(api.nixlBind, "nixlAgent", recording)
    return seen


@pytest.mark.parametrize("role", ["kv_consumer", "kv_producer"])
@pytest.mark.parametrize(
    ("which", "setting", "expected"),
    [
        (PLUGIN, None, "NIXL_THREAD_SYNC_STRICT"),  # the plugin's default
        (PLUGIN, "strict", "NIXL_THREAD_SYNC_STRICT"),
        (PLUGIN, "rw", "NIXL_THREAD_SYNC_RW"),
        (PLUGIN, "none", "NIXL_THREAD_SYNC_NONE"),
        (CONTROL, None, "NIXL_THREAD_SYNC_NONE"),  # vLLM's own agent
    ],
)
def test_the_worker_agent_runs_with_the_chosen_thread_sync(
    distributed: None,
    agent_configs: dict[str, str],
    role: str,
    which: str,
    setting: str | None,
    expected: str,
) -> None:
    """vLLM's real worker constructor, in either role, builds the agent NIXL runs with
    ``kvdrain_nixl_sync``'s mode under the plugin, and with no sync under vLLM's own
    connector; vLLM's module has its own ``nixl_agent_config`` back afterwards."""
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker

    original = base_worker.nixl_agent_config
    extra = {} if setting is None else {"kvdrain_nixl_sync": setting}
    cfg = vllm_config(which, role=role, extra=extra)
    cls = KvdrainPushConnector if which == PLUGIN else NixlPushConnector
    with set_current_vllm_config(cfg):
        conn = cls(cfg, KVConnectorRole.WORKER, kv_cache_config())
    try:
        agent = conn.connector_worker.nixl_wrapper
        assert agent_configs == {agent.name: expected}
        assert base_worker.nixl_agent_config is original
    finally:
        conn.shutdown()


def test_a_failing_constructor_leaves_vllm_module_as_it_was(
    distributed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If vLLM's constructor raises while the plugin's wrapper is in place, the name is
    vLLM's again."""
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker

    original = base_worker.nixl_agent_config

    def broken(*args: Any, **kwargs: Any) -> Any:
        assert base_worker.nixl_agent_config is not original  # wrapped while it runs
        raise RuntimeError("NIXL is not available")

    monkeypatch.setattr(base_worker, "NixlWrapper", broken)
    cfg = vllm_config(PLUGIN, extra={"kvdrain_nixl_sync": "rw"})
    with set_current_vllm_config(cfg), pytest.raises(RuntimeError, match="not available"):
        KvdrainPushConnector(cfg, KVConnectorRole.WORKER, kv_cache_config())
    assert base_worker.nixl_agent_config is original
