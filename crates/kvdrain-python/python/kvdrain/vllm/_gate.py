"""The vLLM versions the plugin runs on, checked when it loads.

The plugin hooks vLLM's push connector at a few narrow points: it overrides some methods
(and calls vLLM's own), and reads or writes some of vLLM's private state. A vLLM release
that renames or reshapes any of them would make the plugin skip a step silently, so it
refuses to load outside the versions its suites passed on, and checks, per version:

* the signature of every vLLM method it overrides or calls (:data:`SIGNATURES`);
* the presence of every vLLM attribute it reads or writes (:data:`ATTRIBUTES`). An
  attribute that vLLM's constructor sets on the instance is not on the class; it counts as
  present when some class of the MRO assigns ``self.<name>`` in its source, is a dataclass
  field, or is a class attribute. The adopted worker and scheduler are checked again on
  the built instance (:func:`check_instance`), where no source is read.

Every difference goes into one error naming the version. No vLLM import at module level:
:func:`check` takes the version and the classes (:func:`vllm_classes` imports the
installed ones), so the gate itself is tested without vLLM.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Mapping

from kvdrain._errors import KvdrainError

__all__ = [
    "ATTRIBUTES",
    "SIGNATURES",
    "SUPPORTED_VLLM",
    "UnsupportedVllmError",
    "check",
    "check_instance",
    "differences",
    "expectations",
    "vllm_classes",
]

SUPPORTED_VLLM = ("0.33.0", "0.34.0")
"""The vLLM versions ``make test-vllm`` passes on (each with ``VLLM=X.Y.Z``)."""

Signatures = Mapping[str, Mapping[str, tuple[str, ...]]]
"""Class name -> method name -> its parameters, as ``inspect.signature`` gives them
(``self`` first; ``*name`` and ``**name`` for variadics, ``name=`` for a default)."""

Attributes = Mapping[str, tuple[str, ...]]
"""Class name -> the attributes the plugin reads or writes on its instances."""

# Every vLLM method the plugin overrides or calls, with the parameters it relies on. The
# same in 0.33.0 and 0.34.0.
SIGNATURES: Signatures = {
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
        "record_failed_transfer": ("self",),
        "record_failed_notification": ("self",),
        "record_kv_expired_req": ("self",),
        "record_notification_after_expiry": ("self",),
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
        "_log_failure": ("self", "failure_type", "req_id", "msg=", "error=", "meta=", "**extra_context"),
        "_send_heartbeats": ("self", "metadata"),
        "_do_send_reg_notif": ("self", "req_id", "reg_data"),
        "_do_start_push_kv": ("self", "request_id", "local_block_ids", "registration_data"),
        "_get_new_notifs": ("self",),
        "shutdown": ("self",),
    },
    "TransferTopology": {
        "get_engine_info": ("self", "remote_engine_id", "remote_pp_rank="),
    },
}

# Every vLLM attribute the plugin reads or writes, by the class whose instances hold it.
# The same in 0.33.0 and 0.34.0.
ATTRIBUTES: Attributes = {
    "NixlPushConnector": ("connector_scheduler", "connector_worker"),
    "NixlPushConnectorScheduler": ("_reqs_need_recv",),
    "NixlPushConnectorWorker": (
        "engine_id",
        "world_size",
        "tp_rank",
        "pcp_rank",
        "pcp_dcp_sharded",
        "use_mla",
        "transfer_topo",
        "nixl_wrapper",
        "xfer_stats",
        "_handshake_lock",
        "_remote_agents",
        "_recving_metadata",
        "_recving_transfers",
        "_failed_recv_reqs",
        "_recv_failures",
        "_replicated_pcp_done_sending",
        "_reqs_to_send",
        "_sending_transfers",
        "_invalid_block_ids",
        "_push_writer_wake",
        "_pending_completion_notifs",
    ),
    "NixlKVConnectorStats": ("data",),
    "NixlPromMetrics": ("_counter_cls", "_gauge_cls"),
    "NixlConnectorMetadata": ("reqs_to_recv", "push_registrations", "heartbeat_by_engine"),
    "HeartbeatInfo": ("req_ids",),
    "ReqMeta": ("local_block_ids", "tp_size", "pp_size", "remote"),
    "RemoteMeta": ("engine_id", "request_id"),
    "ReadSpec": ("remote_rank",),
    "EngineTransferInfo": ("remote_tp_size",),
}

_NIXL = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"
LOCATIONS: Mapping[str, str] = {
    "NixlPushConnector": f"{_NIXL}.connector",
    "NixlPushConnectorScheduler": f"{_NIXL}.push_scheduler",
    "NixlPushConnectorWorker": f"{_NIXL}.push_worker",
    "NixlKVConnectorStats": f"{_NIXL}.stats",
    "NixlPromMetrics": f"{_NIXL}.stats",
    "NixlConnectorMetadata": f"{_NIXL}.metadata",
    "HeartbeatInfo": f"{_NIXL}.metadata",
    "ReqMeta": f"{_NIXL}.metadata",
    "RemoteMeta": f"{_NIXL}.metadata",
    "ReadSpec": f"{_NIXL}.tp_mapping",
    "TransferTopology": "vllm.distributed.kv_transfer.kv_connector.utils",
    "EngineTransferInfo": "vllm.distributed.kv_transfer.kv_connector.utils",
}
"""The module of every vLLM class the gate checks, by name."""

_BY_VERSION: Mapping[str, tuple[Signatures, Attributes]] = {
    "0.33.0": (SIGNATURES, ATTRIBUTES),
    "0.34.0": (SIGNATURES, ATTRIBUTES),
}


class UnsupportedVllmError(KvdrainError, ImportError):
    """The installed vLLM is not one the plugin supports (the message says what differs)."""


def expectations(version: str) -> tuple[Signatures, Attributes]:
    """What the plugin expects of vLLM ``version``: that release's own table, or for a
    release outside the tested set the newest's (so the error names what moved)."""
    return _BY_VERSION.get(version) or _BY_VERSION[SUPPORTED_VLLM[-1]]


def vllm_classes() -> dict[str, type]:
    """The installed vLLM's classes of :data:`LOCATIONS`, imported now; a class or module
    that is not there is left out (:func:`differences` names it missing)."""
    found = {}
    for name, module in LOCATIONS.items():
        try:
            cls = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if isinstance(cls, type):
            found[name] = cls
    return found


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


def differences(
    classes: Mapping[str, type],
    signatures: Signatures = SIGNATURES,
    attributes: Attributes = ATTRIBUTES,
) -> list[str]:
    """Every way ``classes`` (vLLM's, by name) differ from ``signatures`` and
    ``attributes``."""
    found = []
    missing: set[str] = set()
    for cls_name in [*signatures, *(n for n in attributes if n not in signatures)]:
        if classes.get(cls_name) is None:
            found.append(f"{cls_name} is missing")
            missing.add(cls_name)
    for cls_name, methods in signatures.items():
        cls = classes.get(cls_name)
        if cls is None:
            continue
        for name, want in methods.items():
            fn = getattr(cls, name, None)
            if fn is None:
                found.append(f"{cls_name}.{name} is missing")
                continue
            got = parameters(fn)
            if got != want:
                found.append(f"{cls_name}.{name}{_show(got)}, the plugin expects {_show(want)}")
    for cls_name, names in attributes.items():
        cls = classes.get(cls_name)
        if cls is None:
            continue
        assigned = _assigned_in_source(cls)
        for name in names:
            if not (hasattr(cls, name) or name in _dataclass_fields(cls) or name in assigned):
                found.append(f"{cls_name} sets no attribute {name}")
    return found


def check(
    version: str,
    classes: Mapping[str, type],
    signatures: Signatures | None = None,
    attributes: Attributes | None = None,
) -> None:
    """Raises :class:`UnsupportedVllmError` unless ``version`` is supported and
    ``classes`` match its expectations (or ``signatures`` and ``attributes``, given)."""
    want_sigs, want_attrs = expectations(version)
    problems = []
    if version not in SUPPORTED_VLLM:
        problems.append(f"the version is not one of {', '.join(SUPPORTED_VLLM)}")
    problems += differences(
        classes,
        want_sigs if signatures is None else signatures,
        want_attrs if attributes is None else attributes,
    )
    _raise(version, problems)


def check_instance(version: str, obj: object, cls_name: str, attributes: Attributes | None = None) -> None:
    """Raises :class:`UnsupportedVllmError` unless ``obj`` (vLLM's built ``cls_name``)
    holds every attribute the plugin uses on it."""
    names = (expectations(version)[1] if attributes is None else attributes).get(cls_name, ())
    _raise(version, [f"{cls_name} has no attribute {n}" for n in names if not hasattr(obj, n)])


def _raise(version: str, problems: list[str]) -> None:
    if problems:
        raise UnsupportedVllmError(
            f"kvdrain's vLLM connector does not support vLLM {version}: "
            + "; ".join(problems)
            + ". Install a supported vLLM, or kvdrain's release for this one."
        )


def _dataclass_fields(cls: type) -> Mapping[str, object]:
    fields: Mapping[str, object] = getattr(cls, "__dataclass_fields__", {})
    return fields


# A statement that assigns ``self.<name>``, its annotation on one line or several.
_ASSIGNED = re.compile(
    r"^[ \t]*self\.([A-Za-z_][A-Za-z0-9_]*)[ \t]*(?::[^=]+?)?=(?!=)", re.MULTILINE
)


def _assigned_in_source(cls: type) -> set[str]:
    """The names a statement of some class of ``cls``'s MRO assigns, ``self.<name> = ...``
    (annotated or not), in its source; none for a class without source."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is object or klass.__module__ == "builtins":
            continue
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        names.update(_ASSIGNED.findall(source))
    return names


def _show(params: tuple[str, ...]) -> str:
    return "(" + ", ".join(params) + ")"
