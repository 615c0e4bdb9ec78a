"""The plugin's vLLM gate (``kvdrain.vllm._gate``) without vLLM: a version outside the
supported set, or a vLLM method whose parameters moved, refuses the load with one error
naming the version and every difference."""

from __future__ import annotations

from typing import Any

import pytest

import kvdrain
from kvdrain.vllm import _gate

EXPECTED: _gate.Signatures = {
    "Worker": {"start_load_kv": ("self", "metadata"), "_cleanup": ("self", "engine_id", "log=")},
}


class Worker:
    def start_load_kv(self, metadata: Any) -> None: ...

    def _cleanup(self, engine_id: str, *, log: bool = True) -> None: ...


class Drifted:
    def start_load_kv(self, metadata: Any, *, extra: int) -> None: ...


def test_the_supported_version_with_matching_classes_loads() -> None:
    _gate.check("0.33.0", {"Worker": Worker}, EXPECTED)


def test_another_version_is_refused_by_name() -> None:
    with pytest.raises(_gate.UnsupportedVllmError) as e:
        _gate.check("0.34.0", {"Worker": Worker}, EXPECTED)
    assert "vLLM 0.34.0" in str(e.value)
    assert "0.33.0" in str(e.value)
    assert isinstance(e.value, kvdrain.KvdrainError) and isinstance(e.value, ImportError)


def test_every_difference_is_named_in_one_error() -> None:
    with pytest.raises(_gate.UnsupportedVllmError) as e:
        _gate.check("0.33.0", {"Worker": Drifted}, EXPECTED)
    message = str(e.value)
    assert "Worker.start_load_kv(self, metadata, extra), the plugin expects (self, metadata)" in message
    assert "Worker._cleanup is missing" in message
    assert _gate.differences({}, EXPECTED) == ["Worker is missing"]


def test_parameters_notation() -> None:
    def f(a: int, b: int = 1, *args: int, c: int, d: int = 2, **kw: int) -> None: ...

    assert _gate.parameters(f) == ("a", "b=", "*args", "c", "d=", "**kw")
