"""The plugin's settings, read from ``kv_transfer_config.kv_connector_extra_config``.

Pure Python (no vLLM import), so the defaults can be checked without vLLM installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvdrain._errors import ConfigError
from kvdrain.vllm._nixl_sync import NIXL_SYNC_MODES
from kvdrain.vllm._nixl_watch import STACK_TOOLS

__all__ = ["Settings", "check_windows", "settings_from_extra_config"]

# vLLM 0.33's own defaults for the knobs the plugin derives from.
VLLM_LEASE_S = 30
"""``kv_lease_duration``: how long a producer holds its source blocks (s)."""
VLLM_DECODER_KV_BLOCKS_TTL_S = 480
"""``decoder_kv_blocks_ttl``: the default of ``push_registration_timeout`` (s)."""


@dataclass(frozen=True)
class Settings:
    """What one rank's ledger is built with.

    ``deadline_ms``: a receive that has not resolved by then fails (``expired``);
    vLLM's ``push_registration_timeout`` unless ``kvdrain_deadline_ms`` is given.
    ``quarantine_ms``: the longest the blocks of an aborted or expired request stay
    held; twice the producers' ``kv_lease_duration`` unless ``kvdrain_quarantine_ms``
    is given (it must stay above the lease: a producer may write until its lease ends).
    ``settle_ms``: how long a failed request's blocks stay held after its last failure
    notice (a write that errored after posting may still land); ``kvdrain_settle_ms``.
    ``capacity``: requests one rank tracks at once (``kvdrain_capacity``).
    ``record_dir``: where each decode rank's flight recorder writes its ledger inputs as
    a replay trace (``kvdrain_record_dir``; ``None``, the default, records nothing);
    ``record_max_bytes`` (``kvdrain_record_max_bytes``, 64 MiB) and ``record_files``
    (``kvdrain_record_files``, 4) bound it: see :mod:`kvdrain.vllm._recorder`.
    ``nixl_sync``: the thread synchronization NIXL runs the worker's agent with
    (``kvdrain_nixl_sync``): ``"strict"`` (the default: every agent call serialized),
    ``"rw"`` (transfers and notifications shared, peer changes exclusive) or ``"none"``
    (vLLM's own agent, unsynchronized): see :mod:`kvdrain.vllm._nixl_sync`.
    ``nixl_stall_ms``: a NIXL call in flight longer than this is logged once with every
    thread's stack and counted (``kvdrain_nixl_stall_ms``, 5 000; 0 times no call): see
    :mod:`kvdrain.vllm._nixl_watch`. ``nixl_stack_tools``: the tools tried, in order, for
    that line's native stacks (``kvdrain_nixl_stack_tools``, ``"py-spy,gdb"``; ``""``:
    Python stacks only).
    ``lease_ms``: the producers' ``kv_lease_duration``.
    ``margin_ms``: what the quarantine keeps beyond the last moment a producer may post
    (``kvdrain_margin_ms``, 1 000): a message's transit from this node to a producer,
    and a WRITE posted at that last moment landing.
    ``registration_lifetime_ms``: how long a producer may act on this node's
    ``PUSH_REG`` (``kvdrain_registration_lifetime_ms``); ``None``, the default, gives
    :attr:`lifetime_ms`.
    """

    deadline_ms: int
    quarantine_ms: int
    settle_ms: int
    capacity: int
    record_dir: str | None = None
    record_max_bytes: int = 64 << 20
    record_files: int = 4
    nixl_sync: str = "strict"
    nixl_stall_ms: int = 5_000
    nixl_stack_tools: tuple[str, ...] = STACK_TOOLS
    lease_ms: int = VLLM_LEASE_S * 1000
    margin_ms: int = 1_000
    registration_lifetime_ms: int | None = None

    @property
    def lifetime_ms(self) -> int:
        """How long a producer may act on a ``PUSH_REG`` of this node, from when it was
        registered here: ``registration_lifetime_ms``, else the deadline, cut to what
        the quarantine covers (``quarantine_ms - margin_ms``)."""
        if self.registration_lifetime_ms is not None:
            return self.registration_lifetime_ms
        return max(0, min(self.deadline_ms, self.quarantine_ms - self.margin_ms))


def _int(extra: Mapping[str, Any], key: str, default: int) -> int:
    value = extra.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{key} must be a number, got {value!r}")
    try:
        number = int(float(value))
    except ValueError as e:
        raise ConfigError(f"{key} must be a number, got {value!r}") from e
    if number < 0:
        raise ConfigError(f"{key} must not be negative, got {number}")
    return number


def _path(extra: Mapping[str, Any], key: str) -> str | None:
    value = extra.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{key} must be a directory path, got {value!r}")
    return value


def _choice(extra: Mapping[str, Any], key: str, choices: tuple[str, ...], default: str) -> str:
    value = extra.get(key, default)
    if not isinstance(value, str) or value.strip().lower() not in choices:
        raise ConfigError(f"{key} must be one of {', '.join(choices)}, got {value!r}")
    return value.strip().lower()
def _tools(extra: Mapping[str, Any], key: str, default: tuple[str, ...]) -> tuple[str, ...]:
    value = extra.get(key)
    if value is None:
        return default
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)) or any(v not in STACK_TOOLS for v in value):
        raise ConfigError(f"{key} must name tools among {', '.join(STACK_TOOLS)}, got {value!r}")
    return tuple(value)


def settings_from_extra_config(extra: Mapping[str, Any] | None) -> Settings:
    """The settings for ``kv_connector_extra_config`` ``extra`` (``None``: defaults).

    Raises :class:`~kvdrain.ConfigError` for a value that is not a non-negative number,
    a quarantine that leaves a window (:func:`check_windows`), or an unknown
    ``kvdrain_nixl_sync``.
    """
    extra = extra or {}
    lease_s = _int(extra, "kv_lease_duration", VLLM_LEASE_S)
    ttl_s = _int(extra, "decoder_kv_blocks_ttl", VLLM_DECODER_KV_BLOCKS_TTL_S)
    registration_s = _int(extra, "push_registration_timeout", ttl_s)
    settings = Settings(
        deadline_ms=_int(extra, "kvdrain_deadline_ms", registration_s * 1000),
        quarantine_ms=_int(extra, "kvdrain_quarantine_ms", 2 * lease_s * 1000),
        settle_ms=_int(extra, "kvdrain_settle_ms", 5_000),
        capacity=_int(extra, "kvdrain_capacity", 4096),
        record_dir=_path(extra, "kvdrain_record_dir"),
        record_max_bytes=_int(extra, "kvdrain_record_max_bytes", 64 << 20),
        record_files=_int(extra, "kvdrain_record_files", 4),
        nixl_sync=_choice(extra, "kvdrain_nixl_sync", tuple(NIXL_SYNC_MODES), Settings.nixl_sync),
        nixl_stall_ms=_int(extra, "kvdrain_nixl_stall_ms", 5_000),
        nixl_stack_tools=_tools(extra, "kvdrain_nixl_stack_tools", STACK_TOOLS),
        lease_ms=lease_s * 1000,
        margin_ms=_int(extra, "kvdrain_margin_ms", 1_000),
        registration_lifetime_ms=(
            None
            if extra.get("kvdrain_registration_lifetime_ms") is None
            else _int(extra, "kvdrain_registration_lifetime_ms", 0)
        ),
    )
    check_windows(settings)
    if settings.record_files == 0:
        raise ConfigError("kvdrain_record_files must be at least 1")
    if settings.deadline_ms == 0 or settings.capacity == 0:
        raise ConfigError("kvdrain_deadline_ms and kvdrain_capacity must be at least 1")
    return settings


def check_windows(settings: Settings) -> None:
    """Raises :class:`~kvdrain.ConfigError` where a producer could still post after the
    quarantine of a request this node gave up has ended:

    * ``quarantine_ms >= lease_ms + margin_ms``: a producer holds its source blocks, and
      may post, until its lease ends. The lease runs from its prefill's end or, extended
      by a heartbeat, two thirds of a lease from when the heartbeat arrived; this node
      sends no heartbeat for a receive it has decided, so the last one leaves before the
      decision, whatever the heartbeat interval and however long a step pauses. Both
      ends fall at most a lease after the decision.
    * ``quarantine_ms >= lifetime_ms + margin_ms`` and ``lifetime_ms >= 1``: a producer
      running the plugin acts on a ``PUSH_REG`` for its lifetime at most, counted from
      the receive's registration here (the quarantine of an abort right after it ends
      ``quarantine_ms`` later).
    """
    q, margin = settings.quarantine_ms, settings.margin_ms
    if q < settings.lease_ms + margin:
        raise ConfigError(
            f"kvdrain_quarantine_ms={q} leaves a window: it must be at least the "
            f"producers' kv_lease_duration ({settings.lease_ms} ms) plus kvdrain_margin_ms "
            f"({margin} ms), since a producer may post until its lease ends and a "
            "heartbeat sent just before a receive's deadline extends that lease by two "
            "thirds of it"
        )
    lifetime = settings.lifetime_ms
    if lifetime < 1:
        raise ConfigError(
            f"the registration lifetime is {lifetime} ms: kvdrain_quarantine_ms ({q}) must "
            f"exceed kvdrain_margin_ms ({margin}), and "
            "kvdrain_registration_lifetime_ms must be at least 1"
        )
    if q < lifetime + margin:
        raise ConfigError(
            f"kvdrain_quarantine_ms={q} leaves a window: it must be at least "
            f"kvdrain_registration_lifetime_ms ({lifetime}) plus kvdrain_margin_ms "
            f"({margin}), since a producer may act on a registration for its lifetime"
        )
