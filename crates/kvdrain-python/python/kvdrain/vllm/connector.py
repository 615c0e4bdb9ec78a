"""A vLLM KV connector (vLLM 0.33.0, 0.34.0): vLLM's NIXL push connector with kvdrain's
decisions.

Turned on with one setting, nothing in vLLM edited::

    --kv-transfer-config '{"kv_connector": "KvdrainPushConnector",
                           "kv_connector_module_path": "kvdrain.vllm.connector",
                           "kv_role": "kv_consumer", ...}'

:class:`KvdrainPushConnector` lets vLLM build its own push connector (scheduler or worker
side, every check of vLLM's constructors included), then adopts the side it built as the
plugin's subclass: :class:`~kvdrain.vllm._scheduler.KvdrainPushScheduler` or
:class:`~kvdrain.vllm._worker.KvdrainPushWorker`. This module is only that facade, as
vLLM's own ``nixl/connector.py`` is. Handshakes, ``PUSH_REG``, heartbeats, the writer thread, the
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
  early, admission by ``kvdrain_capacity``), with
  :class:`~kvdrain.vllm._metadata.KvdrainConnectorMetadata` to its workers;
* who writes which rank: :mod:`kvdrain.vllm._topology` (the core's rule, vLLM-free).

Every override calls vLLM's own method and delegates in a few lines. The vLLM
version, the signature of every vLLM method the plugin uses and the presence of every
vLLM attribute it reads or writes are checked when this module loads, before anything
else of vLLM's is imported (:mod:`kvdrain.vllm._gate`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import vllm

from kvdrain.vllm import _gate

# The gate first: under a vLLM that moved a class, one error says everything that differs
# before an import below fails on the first of it.
_gate.check(vllm.__version__, _gate.vllm_classes())

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import (  # noqa: E402
    base_worker as vllm_base_worker,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import (  # noqa: E402
    NixlPushConnector,
)

from kvdrain._errors import ConfigError  # noqa: E402
from kvdrain.vllm._metadata import KvdrainConnectorMetadata  # noqa: E402
from kvdrain.vllm._metrics import KvdrainPromMetrics, KvdrainStats  # noqa: E402
from kvdrain.vllm._nixl_sync import agent_sync  # noqa: E402
from kvdrain.vllm._scheduler import KvdrainPushScheduler  # noqa: E402
from kvdrain.vllm._settings import settings_from_extra_config  # noqa: E402
from kvdrain.vllm._worker import KvdrainPushWorker  # noqa: E402

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

__all__ = [
    "KvdrainConnectorMetadata",
    "KvdrainPushConnector",
    "KvdrainPushScheduler",
    "KvdrainPushWorker",
]


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
