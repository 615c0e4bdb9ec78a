"""The plugin's version gate on the real vLLM (0.33.0 or 0.34.0, whichever this
environment holds): its classes match every signature and hold every attribute the plugin
relies on, and the plugin refuses to load under a pretend next release whose classes
moved, with one error naming the version and each difference."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import vllm
from harness import CONTROL, one_rank_worker, vllm_config
from vllm_cpu import PLUGIN

from kvdrain.vllm import _gate
from kvdrain.vllm._settings import Settings
from kvdrain.vllm.connector import KvdrainPushWorker

SHARED = Path(__file__).resolve().parent.parent  # tests/: vllm_cpu


def test_this_vllm_matches_every_signature_and_attribute_the_plugin_uses() -> None:
    assert vllm.__version__ in _gate.SUPPORTED_VLLM
    signatures, attributes = _gate.expectations(vllm.__version__)
    classes = _gate.vllm_classes()
    assert set(classes) == set(_gate.LOCATIONS) == set(signatures) | set(attributes)
    assert _gate.differences(classes, signatures, attributes) == []


def load_under(code: str) -> str:
    """The last line of stderr of a python that runs ``code`` (vLLM patched), then
    imports the plugin; fails unless that import fails."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SHARED), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", code + "\nimport kvdrain.vllm.connector\n"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0, done.stdout[-2000:]
    last: str = done.stderr.strip().splitlines()[-1]
    assert last.startswith("kvdrain.vllm._gate.UnsupportedVllmError: "), last
    return last


def test_the_plugin_refuses_an_unknown_version() -> None:
    last = load_under("import vllm_cpu, vllm; vllm.__version__ = '0.35.0'")
    assert "does not support vLLM 0.35.0: the version is not one of 0.33.0, 0.34.0." in last


PRETEND_0_35 = """
import dataclasses
import vllm_cpu, vllm
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import push_worker, tp_mapping
vllm.__version__ = "0.35.0"

def _xfer_blocks(self, read_spec, dst_engine_id, request_id, remote_request_id,
                 local_xfer_side_handle, remote_xfer_side_handle, pairs): ...

push_worker.NixlPushConnectorWorker._xfer_blocks = _xfer_blocks

@dataclasses.dataclass(frozen=True)
class ReadSpec:
    peer_rank: int
    local_block_ids: list
    remote_block_ids: list

tp_mapping.ReadSpec = ReadSpec
"""


def test_the_plugin_refuses_a_pretend_next_release_naming_each_difference() -> None:
    """vLLM "0.35.0" with ``_xfer_blocks`` given a parameter and ``ReadSpec.remote_rank``
    renamed: the one error names the version and both differences."""
    last = load_under(PRETEND_0_35)
    assert "does not support vLLM 0.35.0: " in last
    assert "the version is not one of 0.33.0, 0.34.0" in last
    assert (
        "NixlPushConnectorWorker._xfer_blocks(self, read_spec, dst_engine_id, request_id, "
        "remote_request_id, local_xfer_side_handle, remote_xfer_side_handle, pairs), "
        "the plugin expects (self, read_spec, dst_engine_id, request_id, "
        "remote_request_id, local_xfer_side_handle, remote_xfer_side_handle)"
    ) in last
    assert "ReadSpec sets no attribute remote_rank" in last
    assert last.count(";") == 2


@pytest.mark.parametrize("name", _gate.ATTRIBUTES["NixlPushConnectorWorker"])
def test_a_built_worker_without_an_attribute_the_plugin_uses_is_refused(name: str) -> None:
    """vLLM's worker, built (as the harness builds it), then one attribute removed: the
    plugin refuses to adopt it, naming the attribute."""
    w = one_rank_worker(CONTROL, config=vllm_config(PLUGIN, tp=1))
    KvdrainPushWorker.kvdrain_attach(w, Settings(60_000, 60_000, 5_000, 256))
    delattr(w, name)
    with pytest.raises(_gate.UnsupportedVllmError) as e:
        KvdrainPushWorker.kvdrain_attach(w, Settings(60_000, 60_000, 5_000, 256))
    assert f"NixlPushConnectorWorker has no attribute {name}." in str(e.value)
