"""The vLLM versions the plugin runs on, checked when it loads.

The plugin hooks vLLM's push connector at a few narrow points: it overrides some methods
(and calls vLLM's own), and reads some of the worker's state. A vLLM release that renames
or reshapes any of them would make the plugin skip a step silently, so it refuses to load
outside the versions its suites passed on, and checks the signature of every vLLM method it
overrides or calls, with one error naming the version and everything that differs.

No vLLM import at module level: :func:`check` takes the version and the classes, so the
gate itself is tested without vLLM.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping

from kvdrain._errors import KvdrainError

__all__ = ["SUPPORTED_VLLM", "UnsupportedVllmError", "check", "differences"]

SUPPORTED_VLLM = ("0.33.0",)
"""The vLLM versions ``make test-vllm`` and ``make test-vllm-e2e`` pass on."""

Signatures = Mapping[str, Mapping[str, tuple[str, ...]]]
"""Class name -> method name -> its parameters, as ``inspect.signature`` gives them
(``self`` first; ``*name`` and ``**name`` for variadics, ``name=`` for a default)."""

# Every vLLM method the plugin overrides or calls, with the parameters it relies on.
EXPECTED: Signatures = {
    "NixlPushConnector": {
        "__init__": ("self", "vllm_config", "role", "kv_cache_config"),
        "build_kv_connector_stats": ("data=",),
        "build_prom_metrics": (
            "vllm_config",
            "metric_types",
            "labelnames",
            "per_engine_labelvalues",
        ),
    },
    "NixlKVConnectorStats": {
        "reset": ("self",),
        "is_empty": ("self",),
        "aggregate": ("self", "other"),
        "reduce": ("self",),
        "clone_and_reset": ("self",),
    },
    "NixlPromMetrics": {
        "__init__": ("self", "vllm_config", "metric_types", "labelnames", "per_engine_labelvalues"),
        "observe": ("self", "transfer_stats_data", "engine_idx="),
    },
    "NixlPushConnectorScheduler": {
        "get_num_new_matched_tokens": ("self", "request", "num_computed_tokens"),
        "update_state_after_alloc": ("self", "request", "blocks", "num_external_tokens"),
        "request_finished": ("self", "request", "block_ids"),
        "build_connector_meta": ("self", "scheduler_output"),
        "update_connector_output": ("self", "connector_output"),
    },
    "NixlPushConnectorWorker": {
        "start_load_kv": ("self", "metadata"),
        "get_transfer_results": ("self",),
        "get_block_ids_with_load_errors": ("self",),
        "_xfer_blocks_for_req": ("self", "req_id", "meta"),
        "_xfer_blocks": (
            "self",
            "read_spec",
            "dst_engine_id",
            "request_id",
            "remote_request_id",
            "local_xfer_side_handle",
            "remote_xfer_side_handle",
        ),
        "_engines_with_inflight_transfers": ("self",),
        "_cleanup_remote_engine": ("self", "engine_id", "log_eviction="),
        "_push_writer_loop": ("self",),
        "_handle_push_reg_notif": ("self", "notif"),
        "_send_heartbeats": ("self", "metadata"),
        "_do_send_reg_notif": ("self", "req_id", "reg_data"),
        "_do_start_push_kv": ("self", "request_id", "local_block_ids", "registration_data"),
        "_pop_done_transfers": ("self", "transfers"),
        "shutdown": ("self",),
    },
}


class UnsupportedVllmError(KvdrainError, ImportError):
    """The installed vLLM is not one the plugin supports (the message says what differs)."""


def parameters(fn: Callable[..., object]) -> tuple[str, ...]:
    """``fn``'s parameters in :data:`Signatures`' notation."""
    out = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            out.append("*" + p.name)
        elif p.kind is p.VAR_KEYWORD:
            out.append("**" + p.name)
        elif p.default is not p.empty:
            out.append(p.name + "=")
        else:
            out.append(p.name)
    return tuple(out)


def differences(classes: Mapping[str, type], expected: Signatures = EXPECTED) -> list[str]:
    """Every way ``classes`` (vLLM's, by name) differ from ``expected``."""
    found = []
    for cls_name, methods in expected.items():
        cls = classes.get(cls_name)
        if cls is None:
            found.append(f"{cls_name} is missing")
            continue
        for name, want in methods.items():
            fn = getattr(cls, name, None)
            if fn is None:
                found.append(f"{cls_name}.{name} is missing")
                continue
            got = parameters(fn)
            if got != want:
                found.append(f"{cls_name}.{name}{_show(got)}, the plugin expects {_show(want)}")
    return found


def check(version: str, classes: Mapping[str, type], expected: Signatures = EXPECTED) -> None:
    """Raises :class:`UnsupportedVllmError` unless ``version`` is supported and
    ``classes`` match ``expected``."""
    problems = []
    if version not in SUPPORTED_VLLM:
        problems.append(f"the version is not one of {', '.join(SUPPORTED_VLLM)}")
    problems += differences(classes, expected)
    if problems:
        raise UnsupportedVllmError(
            f"kvdrain's vLLM connector does not support vLLM {version}: "
            + "; ".join(problems)
            + ". Install a supported vLLM, or kvdrain's release for this one."
        )


def _show(params: tuple[str, ...]) -> str:
    return "(" + ", ".join(params) + ")"
