"""The scheduler side of the plugin: vLLM's push scheduler plus two things it cannot know.

* **Receives that finish early.** A decode request that finishes (abort, or the load
  failure policy) while its KV may still be landing keeps its blocks
  (``delay_free_blocks``), and the next step's metadata tells every worker
  (``recv_finished_early``) so each rank's ledger holds them. The blocks come back when
  every rank names the request in ``finished_recving``.
* **Admission.** Every rank tracks every receive, so the engine as a whole decides how
  many may be in flight: a receive that would take more than ``kvdrain_capacity`` slots
  (those of requests registered and not yet reported by every rank) waits in the queue
  (``get_num_new_matched_tokens`` answers ``None``, vLLM's "not yet"). No rank then
  refuses a receive that another rank accepted.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import vllm
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import NixlConnectorMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_scheduler import (
    NixlPushConnectorScheduler,
)

from kvdrain.vllm import _gate
from kvdrain.vllm._metadata import KvdrainConnectorMetadata
from kvdrain.vllm._topology import block_groups
from kvdrain.vllm._settings import Settings

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

__all__ = ["KvdrainPushScheduler"]

logger = logging.getLogger("vllm.kvdrain")


class KvdrainPushScheduler(NixlPushConnectorScheduler):
    """vLLM's push scheduler side with the two additions of the module's doc. Built by
    vLLM (:class:`~kvdrain.vllm.connector.KvdrainPushConnector` adopts it); every
    override calls vLLM's method first."""

    def kvdrain_attach(self, settings: Settings) -> None:
        """The plugin's state (vLLM's constructor has run). Refuses a scheduler that
        lacks any vLLM attribute the plugin uses (:func:`_gate.check_instance`)."""
        _gate.check_instance(vllm.__version__, self, "NixlPushConnectorScheduler")
        self.kvdrain_capacity = settings.capacity
        # Waiting for pushed KV, not finished on the scheduler.
        self.kvdrain_receiving: set[str] = set()
        # Taking a ledger slot on the workers: registered, not yet reported by every rank.
        self.kvdrain_tracked: set[str] = set()
        self._kvdrain_finished_early: set[str] = set()
        self._kvdrain_waiting_logged: set[str] = set()

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        count, load_async = super().get_num_new_matched_tokens(request, num_computed_tokens)
        if load_async and count and len(self.kvdrain_tracked) >= self.kvdrain_capacity:
            rid = request.request_id
            if rid not in self._kvdrain_waiting_logged:
                self._kvdrain_waiting_logged.add(rid)
                logger.info(
                    "kvdrain: %d receives in flight (kvdrain_capacity); %s waits",
                    len(self.kvdrain_tracked),
                    rid,
                )
            return None, False
        return count, load_async

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        rid = request.request_id
        staged = self._reqs_need_recv.get(rid)
        if staged is not None and block_groups(staged[1]):
            self.kvdrain_receiving.add(rid)
            self.kvdrain_tracked.add(rid)
            self._kvdrain_waiting_logged.discard(rid)

    def request_finished(
        self, request: Request, block_ids: Any
    ) -> tuple[bool, dict[str, Any] | None]:
        delay, params = super().request_finished(request, block_ids)
        rid = request.request_id
        self._kvdrain_waiting_logged.discard(rid)
        if rid in self.kvdrain_receiving:
            # Finished while its KV may still be landing: the workers' ledgers decide
            # when the blocks are free; they report them through finished_recving.
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
            self.kvdrain_tracked.discard(rid)
