"""A P and a D engine on different vLLM releases do not pair: vLLM's handshake compares a
compatibility hash that covers the vLLM version and ``NIXL_CONNECTOR_VERSION`` (15 in
0.33.0, 16 in 0.34.0), and refuses a peer whose hash differs with a ``RuntimeError``
("NIXL compatibility hash mismatch ... different vLLM versions ..."). So P and D upgrade
together. Here: the hash this release computes for the suite's push config, and the one
the other supported release computes for the same config, differ."""

from __future__ import annotations

from typing import Any

import pytest
import vllm
from harness import vllm_config
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import metadata
from vllm_cpu import PLUGIN

from kvdrain.vllm import _gate

CONNECTOR_VERSION = {"0.33.0": 15, "0.34.0": 16}
"""``NIXL_CONNECTOR_VERSION`` of each supported release, read from its wheel."""


def compat_hash(release: str, connector_version: int, monkeypatch: Any) -> str:
    """The handshake hash of the suite's push config as ``release`` computes it."""
    with monkeypatch.context() as m:
        m.setattr(vllm, "__version__", release)
        m.setattr(metadata, "NIXL_CONNECTOR_VERSION", connector_version)
        out: str = metadata.compute_nixl_compatibility_hash(
            vllm_config(PLUGIN), "CPU_ATTN", transfer_mode="push"
        )
    return out


def test_this_release_has_the_connector_version_of_its_wheel() -> None:
    assert set(CONNECTOR_VERSION) == set(_gate.SUPPORTED_VLLM)
    assert metadata.NIXL_CONNECTOR_VERSION == CONNECTOR_VERSION[vllm.__version__]


@pytest.mark.parametrize("other", [r for r in _gate.SUPPORTED_VLLM])
def test_engines_of_two_releases_refuse_to_pair(other: str, monkeypatch: Any) -> None:
    mine = vllm.__version__
    own = compat_hash(mine, CONNECTOR_VERSION[mine], monkeypatch)
    assert own == compat_hash(mine, CONNECTOR_VERSION[mine], monkeypatch)  # deterministic
    theirs = compat_hash(other, CONNECTOR_VERSION[other], monkeypatch)
    assert (theirs == own) == (other == mine)
    # Either difference alone refuses the pair.
    if other != mine:
        assert compat_hash(other, CONNECTOR_VERSION[mine], monkeypatch) != own
        assert compat_hash(mine, CONNECTOR_VERSION[other], monkeypatch) != own
