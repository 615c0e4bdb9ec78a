"""The plugin's version gate on the real vLLM: 0.33.0's classes match every signature the
plugin relies on, and the plugin refuses to load under another version, with one error
naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import vllm_cpu  # noqa: F401 - before any connector module: selects vLLM's CPU platform
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlPushConnector
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_scheduler import (
    NixlPushConnectorScheduler,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import (
    NixlPushConnectorWorker,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import (
    NixlKVConnectorStats,
    NixlPromMetrics,
)

from kvdrain.vllm import _gate

SHARED = Path(__file__).resolve().parent.parent  # tests/: vllm_cpu


def test_vllm_0_33_matches_every_signature_the_plugin_uses() -> None:
    classes: dict[str, type] = {
        "NixlPushConnector": NixlPushConnector,
        "NixlPushConnectorScheduler": NixlPushConnectorScheduler,
        "NixlPushConnectorWorker": NixlPushConnectorWorker,
        "NixlKVConnectorStats": NixlKVConnectorStats,
        "NixlPromMetrics": NixlPromMetrics,
    }
    assert set(classes) == set(_gate.EXPECTED)
    assert _gate.differences(classes) == []


def test_the_plugin_refuses_to_load_under_another_vllm() -> None:
    code = "import vllm_cpu, vllm; vllm.__version__ = '0.34.0'; import kvdrain.vllm.connector"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SHARED), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("kvdrain.vllm._gate.UnsupportedVllmError: ")
    assert "does not support vLLM 0.34.0" in last and "0.33.0" in last
