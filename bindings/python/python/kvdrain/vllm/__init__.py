"""kvdrain for vLLM.

* :mod:`kvdrain.vllm.connector`: the vLLM 0.33 connector plugin ``KvdrainPushConnector``
  (imports vLLM; turned on with ``"kv_connector": "KvdrainPushConnector",
  "kv_connector_module_path": "kvdrain.vllm.connector"``).
* :class:`PushConsumer`: the same decode-side decisions as one engine-neutral object
  (no vLLM import).
"""

from __future__ import annotations

from kvdrain.vllm._consumer import PushConsumer, expected_notifications
from kvdrain.vllm._settings import Settings, settings_from_extra_config

__all__ = ["PushConsumer", "Settings", "expected_notifications", "settings_from_extra_config"]
