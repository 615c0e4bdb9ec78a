"""``agent_sync``: the name vLLM calls answers NIXL's config with ``sync_mode`` while the
block runs, and only then (a stand-in for NIXL's ``_api`` module; no NIXL needed)."""

from __future__ import annotations

import enum
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

import kvdrain
from kvdrain.vllm._nixl_sync import agent_sync

API = "kvdrain_test_fake_nixl_api"


class nixl_thread_sync_t(enum.Enum):  # noqa: N801 - NIXL's own names
    NIXL_THREAD_SYNC_NONE = 0
    NIXL_THREAD_SYNC_STRICT = 1
    NIXL_THREAD_SYNC_RW = 2


class nixl_agent_config:  # noqa: N801
    def __init__(self, num_threads: int = 0, sync_mode: nixl_thread_sync_t | None = None) -> None:
        self.num_threads = num_threads
        self.sync_mode = sync_mode


@pytest.fixture
def worker_module() -> Iterator[types.ModuleType]:
    """NIXL's ``_api`` (the enum and the config) and a vLLM worker module that imported
    ``nixl_agent_config`` from it."""
    api = types.ModuleType(API)
    api.nixl_thread_sync_t = nixl_thread_sync_t  # type: ignore[attr-defined]
    nixl_agent_config.__module__ = API
    api.nixl_agent_config = nixl_agent_config  # type: ignore[attr-defined]
    sys.modules[API] = api
    worker = types.ModuleType("fake_vllm_worker")
    worker.nixl_agent_config = nixl_agent_config  # type: ignore[attr-defined]
    yield worker
    del sys.modules[API]


def build(worker: types.ModuleType) -> Any:
    """What vLLM's constructor does: look the name up in its module when it runs."""
    return worker.nixl_agent_config(num_threads=4)


@pytest.mark.parametrize(
    ("mode", "member"),
    [
        ("strict", nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT),
        ("rw", nixl_thread_sync_t.NIXL_THREAD_SYNC_RW),
    ],
)
def test_inside_the_block_configs_carry_the_mode(
    worker_module: types.ModuleType, mode: str, member: nixl_thread_sync_t
) -> None:
    with agent_sync(worker_module, mode):
        config = build(worker_module)
    assert isinstance(config, nixl_agent_config)
    assert config.sync_mode is member
    assert config.num_threads == 4  # vLLM's own arguments pass through
    assert worker_module.nixl_agent_config is nixl_agent_config
    assert build(worker_module).sync_mode is None  # after the block: vLLM's again


def test_none_changes_nothing(worker_module: types.ModuleType) -> None:
    with agent_sync(worker_module, "none"):
        assert worker_module.nixl_agent_config is nixl_agent_config
        assert build(worker_module).sync_mode is None


def test_the_name_comes_back_when_the_constructor_raises(worker_module: types.ModuleType) -> None:
    with pytest.raises(RuntimeError, match="vLLM failed"):
        with agent_sync(worker_module, "strict"):
            assert worker_module.nixl_agent_config is not nixl_agent_config
            raise RuntimeError("vLLM failed")
    assert worker_module.nixl_agent_config is nixl_agent_config


def test_a_worker_module_without_nixl_is_left_alone() -> None:
    worker = types.ModuleType("fake_vllm_worker_without_nixl")
    with agent_sync(worker, "strict"):
        assert not hasattr(worker, "nixl_agent_config")


@pytest.mark.parametrize("mode", ["STRICT", "off", ""])
def test_an_unknown_mode_is_refused_before_anything_changes(
    worker_module: types.ModuleType, mode: str
) -> None:
    with pytest.raises(kvdrain.ConfigError):
        with agent_sync(worker_module, mode):
            pass
    assert worker_module.nixl_agent_config is nixl_agent_config


def test_a_nixl_without_sync_mode_is_refused(worker_module: types.ModuleType) -> None:
    del sys.modules[API].nixl_thread_sync_t
    with pytest.raises(kvdrain.ConfigError, match="sync_mode"):
        with agent_sync(worker_module, "rw"):
            pass
    assert worker_module.nixl_agent_config is nixl_agent_config
