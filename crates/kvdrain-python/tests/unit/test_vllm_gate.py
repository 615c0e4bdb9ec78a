"""The plugin's vLLM gate (``kvdrain.vllm._gate``) without vLLM: a version outside the
supported set, a vLLM method whose parameters moved, or a vLLM attribute the plugin uses
that is gone refuses the load with one error naming the version and every difference."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import pytest

import kvdrain
from kvdrain.vllm import _gate

SIGNATURES: _gate.Signatures = {
    "Worker": {"start_load_kv": ("self", "metadata"), "_cleanup": ("self", "engine_id", "log=")},
}
ATTRIBUTES: _gate.Attributes = {
    "Worker": ("tp_rank", "_lock", "_queue", "kind"),
    "Meta": ("remote_rank",),
}


class Base:
    kind = "push"  # a class attribute

    def __init__(self) -> None:
        self.tp_rank = 0
        self._lock: threading.RLock = threading.RLock()


class Worker(Base):
    def __init__(self) -> None:
        super().__init__()
        self._queue: dict[
            str, int
        ] = {}  # an annotation over several lines, as vLLM writes some

    def start_load_kv(self, metadata: Any) -> None: ...

    def _cleanup(self, engine_id: str, *, log: bool = True) -> None: ...


class Drifted:
    """A pretend next release: a parameter added, a method and three attributes gone."""

    kind = "push"

    def __init__(self) -> None:
        self.tp_rank = 0
        if self.tp_rank == 0:  # compared, not assigned: not an attribute it sets
            pass
        self._lock_v2 = threading.RLock()

    def start_load_kv(self, metadata: Any, *, extra: int) -> None: ...

    def uses(self) -> None:
        print(self._queue)  # type: ignore[attr-defined]  # read, never set


@dataclass(frozen=True)
class Meta:
    remote_rank: int


@dataclass(frozen=True)
class MetaDrifted:
    peer_rank: int


def test_every_supported_version_with_matching_classes_loads() -> None:
    for version in _gate.SUPPORTED_VLLM:
        _gate.check(version, {"Worker": Worker, "Meta": Meta}, SIGNATURES, ATTRIBUTES)
    assert _gate.SUPPORTED_VLLM == ("0.33.0", "0.34.0")


def test_another_version_is_refused_by_name() -> None:
    with pytest.raises(_gate.UnsupportedVllmError) as e:
        _gate.check("0.35.0", {"Worker": Worker, "Meta": Meta}, SIGNATURES, ATTRIBUTES)
    assert "vLLM 0.35.0" in str(e.value)
    assert "not one of 0.33.0, 0.34.0" in str(e.value)
    assert isinstance(e.value, kvdrain.KvdrainError) and isinstance(e.value, ImportError)


def test_a_pretend_next_release_is_refused_naming_every_difference() -> None:
    with pytest.raises(_gate.UnsupportedVllmError) as e:
        _gate.check("0.35.0", {"Worker": Drifted, "Meta": MetaDrifted}, SIGNATURES, ATTRIBUTES)
    message = str(e.value)
    assert message.startswith("kvdrain's vLLM connector does not support vLLM 0.35.0: ")
    for difference in (
        "the version is not one of 0.33.0, 0.34.0",
        "Worker.start_load_kv(self, metadata, extra), the plugin expects (self, metadata)",
        "Worker._cleanup is missing",
        "Worker sets no attribute _lock",
        "Worker sets no attribute _queue",
        "Meta sets no attribute remote_rank",
    ):
        assert difference in message
    assert message.count(";") == 5  # those six and nothing else: tp_rank and kind hold


def test_a_supported_version_whose_classes_drifted_is_refused_too() -> None:
    with pytest.raises(_gate.UnsupportedVllmError) as e:
        _gate.check("0.34.0", {"Worker": Drifted, "Meta": Meta}, SIGNATURES, ATTRIBUTES)
    assert "vLLM 0.34.0" in str(e.value) and "not one of" not in str(e.value)
    assert "Worker sets no attribute _queue" in str(e.value)


def test_a_missing_class_is_named_once() -> None:
    assert _gate.differences({}, SIGNATURES, ATTRIBUTES) == ["Worker is missing", "Meta is missing"]


def test_the_built_instance_is_checked_for_every_attribute() -> None:
    _gate.check_instance("0.34.0", Worker(), "Worker", ATTRIBUTES)
    with pytest.raises(_gate.UnsupportedVllmError) as e:
        _gate.check_instance("0.34.0", Drifted(), "Worker", ATTRIBUTES)
    assert str(e.value) == (
        "kvdrain's vLLM connector does not support vLLM 0.34.0: Worker has no attribute "
        "_lock; Worker has no attribute _queue. Install a supported vLLM, or kvdrain's "
        "release for this one."
    )


def test_each_supported_version_has_its_own_table_and_the_newest_judges_the_rest() -> None:
    for version in _gate.SUPPORTED_VLLM:
        assert _gate.expectations(version) == (_gate.SIGNATURES, _gate.ATTRIBUTES)
    assert _gate.expectations("0.35.0") == _gate.expectations(_gate.SUPPORTED_VLLM[-1])


def test_parameters_notation() -> None:
    def f(a: int, b: int = 1, *args: int, c: int, d: int = 2, **kw: int) -> None: ...

    assert _gate.parameters(f) == ("a", "b=", "*args", "c", "d=", "**kw")
