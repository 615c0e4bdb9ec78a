"""What the plugin's scheduler side tells its workers each step, beside vLLM's own
metadata. Imported after the gate (:mod:`kvdrain.vllm.connector`)."""

from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import NixlConnectorMetadata

__all__ = ["KvdrainConnectorMetadata"]


class KvdrainConnectorMetadata(NixlConnectorMetadata):
    """vLLM's metadata plus ``recv_finished_early``: the ids of receiving requests that
    finished on the scheduler since the last step, so every worker's ledger holds their
    blocks until no write may still land."""

    recv_finished_early: set[str]

    @classmethod
    def wrapping(cls, meta: NixlConnectorMetadata, early: set[str]) -> KvdrainConnectorMetadata:
        out = cls.__new__(cls)
        out.__dict__.update(meta.__dict__)
        out.recv_finished_early = early
        return out
