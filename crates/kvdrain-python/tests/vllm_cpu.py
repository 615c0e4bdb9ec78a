"""vLLM (0.33.0, 0.34.0) on a CPU host, for the two vLLM suites (``tests/vllm/`` and
``tests/vllm_e2e/``): the CPU platform, a tiny local model, the ``VllmConfig`` with a
push connector, and the ``KVCacheConfig`` of one full-attention group.

Importing this module selects vLLM's CPU platform as the current platform, so import it
before any vLLM connector module. Test set-up only: the plugin itself selects nothing.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

# Importing vLLM imports humming (GPU GEMM kernels), which starts two background builds of
# its CUDA launcher per process: on a CPU host each imports torch, finds no CUDA and
# exits, minutes later when a dozen rank processes share two cores. Nothing here runs a
# GPU kernel, so none is started.
os.environ.setdefault("HUMMING_DISABLE_PARALLEL_BUILD", "1")
# vLLM 0.34's CPU platform refuses an x86 host without Triton, and its Triton check finds
# no active driver on a host without GPUs, unless no device is visible (its "distributed
# environment" case): then it keeps the installed Triton. No GPU is used here, so none is
# made visible.
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import vllm.platforms as _platforms  # noqa: E402
from vllm.platforms.cpu import CpuPlatform

_platforms._current_platform = CpuPlatform()  # test set-up: no GPU here

import torch  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1,
    KVConnectorRole,
)
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402

BLOCK_SIZE = 32  # the CPU attention backend wants a multiple of 32
NUM_KV_HEADS = 4
HEAD_SIZE = 16
LAYERS = ["model.layers.0.self_attn", "model.layers.1.self_attn"]

PLUGIN = "plugin"
CONTROL = "control"
CONNECTORS: dict[str, tuple[str, str | None]] = {
    PLUGIN: ("KvdrainPushConnector", "kvdrain.vllm.connector"),
    CONTROL: ("NixlPushConnector", None),
}
"""``kv_connector`` and ``kv_connector_module_path`` of the plugin and of vLLM's own
push connector (the negative control)."""

CONTROL_NIXL_SYNC = "strict"
"""NIXL's thread sync for the end-to-end suites' control engines, as the plugin's default.

vLLM builds its agent with none, and on a 2-core host one control step in about twelve
clean-clone runs then sat 60 s in ``send_notif`` while the handshake thread held UCX's
worker lock (``docs/limits.md``); UCX's mutex in place of its spinlock did not end it.
The control is there to show vLLM's *protocol* failures beside the plugin's decisions,
so it gets the one change the plugin makes to vLLM's agent, and nothing else of the
plugin's. Its thread hazard, unsynchronized, is ``make test-nixl-threads``'s to show."""


def worker_connector(
    cfg: VllmConfig, which: str, kv_cache_config: KVCacheConfig
) -> KVConnectorBase_V1:
    """The worker side of ``which``'s connector, as vLLM's factory builds it. The
    control's agent is built with :data:`CONTROL_NIXL_SYNC`, through the plugin's own
    :func:`~kvdrain.vllm._nixl_sync.agent_sync`; the plugin sets its mode itself."""
    if which != CONTROL:
        return KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, kv_cache_config)
    # Imported here, not with the rest: NIXL's logger takes sys.stdout when it is first
    # imported, and an engine process makes stdout its channel to the test only after
    # importing this module (it points sys.stdout at stderr first).
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker

    from kvdrain.vllm._nixl_sync import agent_sync

    with agent_sync(base_worker, CONTROL_NIXL_SYNC) as built:
        conn = KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, kv_cache_config)
    if not built:
        raise RuntimeError("vLLM built its control agent without nixl_agent_config")
    return conn


def model_dir(root: Path) -> str:
    """Writes a tiny llama ``config.json`` (2 layers, 4 KV heads of 16) under ``root``;
    returns its folder. No weights: nothing loads a model."""
    d = root / "tiny-llama"
    d.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": NUM_KV_HEADS * HEAD_SIZE,
        "intermediate_size": 128,
        "num_attention_heads": NUM_KV_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "num_hidden_layers": len(LAYERS),
        "vocab_size": 256,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def vllm_config(
    which: str,
    *,
    model_root: Path,
    role: str,
    engine_id: str,
    num_blocks: int,
    tp: int = 1,
    policy: str = "fail",
    extra: dict[str, Any] | None = None,
) -> VllmConfig:
    """The config of one engine with connector ``which`` (``PLUGIN`` or ``CONTROL``) in
    ``role`` (``kv_producer`` or ``kv_consumer``), a DRAM KV buffer, ``num_blocks``
    blocks, the NHD layout set (the engine core would resolve it) and
    ``kv_connector_extra_config`` ``extra`` (for the plugin, ``kvdrain_nixl_sync`` from
    ``KVDRAIN_TEST_NIXL_SYNC`` when set and ``extra`` sets none)."""
    name, module = CONNECTORS[which]
    extra = dict(extra or {})
    sync = os.environ.get("KVDRAIN_TEST_NIXL_SYNC")
    if which == PLUGIN and sync:
        # The plugin's agents in another NIXL thread-sync mode (the stall runs of
        # docs/limits.md compare "none", vLLM's own, with the default).
        extra.setdefault("kvdrain_nixl_sync", sync)
    kv = KVTransferConfig(
        kv_connector=name,
        kv_connector_module_path=module,
        kv_role=role,
        kv_buffer_device="cpu",
        engine_id=engine_id,
        kv_load_failure_policy=policy,
        kv_connector_extra_config=extra,
    )
    model = ModelConfig(model=model_dir(model_root), skip_tokenizer_init=True, dtype="float32")
    cfg = VllmConfig(
        model_config=model,
        cache_config=CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=False),
        scheduler_config=SchedulerConfig(
            max_model_len=4096,
            is_encoder_decoder=False,
            max_num_batched_tokens=4096,
            max_num_seqs=16,
        ),
        device_config=DeviceConfig(device="cpu"),
        kv_transfer_config=kv,
    )
    cfg.parallel_config.tensor_parallel_size = tp
    cfg.cache_config.num_gpu_blocks = num_blocks
    cfg.cache_config.kv_cache_layout = "NHD"
    return cfg


def kv_cache_config(num_blocks: int) -> KVCacheConfig:
    """One KV cache group: full attention over ``LAYERS``, float32."""
    spec = FullAttentionSpec(
        block_size=BLOCK_SIZE,
        num_kv_heads=NUM_KV_HEADS,
        head_size=HEAD_SIZE,
        dtype=torch.float32,
    )
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), spec)],
    )


def model_runner_output(req_ids: list[str], **fields: Any) -> ModelRunnerOutput:
    """vLLM's ``ModelRunnerOutput`` for ``req_ids``, with ``req_id_to_index`` where the
    release has it (0.33; 0.34 removed it)."""
    if "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}:
        fields["req_id_to_index"] = {r: i for i, r in enumerate(req_ids)}
    return ModelRunnerOutput(req_ids=req_ids, **fields)
