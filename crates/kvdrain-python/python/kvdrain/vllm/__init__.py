"""kvdrain for vLLM.

* :mod:`kvdrain.vllm.connector`: the vLLM 0.33/0.34 connector plugin ``KvdrainPushConnector``
  (imports vLLM; turned on with ``"kv_connector": "KvdrainPushConnector",
  "kv_connector_module_path": "kvdrain.vllm.connector"``).
* :class:`DecodeSide`: the plugin's decode side for one rank, the one mapping of the
  ledger's decisions to what vLLM is told (no vLLM import; :meth:`DecodeSide.tell` takes
  vLLM's structures as :class:`VllmReceives`), for engines of their own and for tests.
"""

from __future__ import annotations

from kvdrain.vllm._decode import DecodeReport, DecodeSide, Phase, VllmReceives
from kvdrain.vllm._settings import Settings, settings_from_extra_config

__all__ = [
    "DecodeReport",
    "DecodeSide",
    "Phase",
    "Settings",
    "VllmReceives",
    "settings_from_extra_config",
]
