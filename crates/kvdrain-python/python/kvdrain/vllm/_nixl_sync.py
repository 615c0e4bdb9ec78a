"""NIXL's own thread synchronization for the agent vLLM builds, without copying vLLM's code.

vLLM's worker builds its NIXL agent with ``nixl_agent_config(num_threads=...,
capture_telemetry=True)`` and no ``sync_mode``, so NIXL's Python API picks
``NIXL_THREAD_SYNC_NONE``: every agent lock is a no-op, while vLLM calls that one agent
from its engine step, its writer thread and its handshake threads, and removing or
re-adding a peer (``remove_remote_agent``, ``add_remote_agent``) rewrites maps the other
calls read (``docs/limits.md``).

:func:`agent_sync` changes only that argument: for as long as its block runs (vLLM's
constructor, called by the plugin's), the name ``nixl_agent_config`` in the module that
builds the agent answers NIXL's own config class with ``sync_mode`` set. Everything else
vLLM passes, and the agent it builds, stay vLLM's. The original name is back when the
block ends, whatever it raised.

The modes (``kvdrain_nixl_sync``): ``"strict"``, every agent call serialized
(``NIXL_THREAD_SYNC_STRICT``); ``"rw"``, the data path shared and metadata changes
exclusive (``NIXL_THREAD_SYNC_RW``); ``"none"``, vLLM's own agent, unsynchronized.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from kvdrain._errors import ConfigError

__all__ = ["NIXL_SYNC_MODES", "agent_sync", "thread_sync"]

NIXL_SYNC_MODES: dict[str, str] = {
    "strict": "NIXL_THREAD_SYNC_STRICT",
    "rw": "NIXL_THREAD_SYNC_RW",
    "none": "NIXL_THREAD_SYNC_NONE",
}
"""``kvdrain_nixl_sync``'s values and the member of NIXL's ``nixl_thread_sync_t`` each
names."""

CONFIG_NAME = "nixl_agent_config"
"""The name vLLM's worker module calls to build its agent's configuration."""

# Two constructors in one process would otherwise restore each other's wrapper.
_patching = threading.Lock()


def _unknown(mode: str) -> ConfigError:
    choices = ", ".join(NIXL_SYNC_MODES)
    return ConfigError(f"kvdrain_nixl_sync must be one of {choices}, got {mode!r}")


def thread_sync(config_class: Callable[..., Any], mode: str) -> Any:
    """The ``nixl_thread_sync_t`` member for ``mode``, from the module that defines
    ``config_class`` (NIXL's ``nixl_agent_config``: it accepts only its own enum).

    Raises :class:`~kvdrain.ConfigError` for an unknown mode, or a NIXL whose config has
    no ``sync_mode`` (NIXL before 1.0)."""
    member = NIXL_SYNC_MODES.get(mode)
    if member is None:
        raise _unknown(mode)
    api = sys.modules.get(getattr(config_class, "__module__", ""))
    enum = getattr(api, "nixl_thread_sync_t", None)
    if enum is None or not hasattr(enum, member):
        raise ConfigError(
            f"kvdrain_nixl_sync={mode!r}: this NIXL's {CONFIG_NAME} takes no sync_mode; "
            "set kvdrain_nixl_sync to \"none\" to run vLLM's unsynchronized agent"
        )
    return getattr(enum, member)


@contextmanager
def agent_sync(module: ModuleType, mode: str) -> Iterator[list[Any]]:
    """While the block runs, ``module.nixl_agent_config(...)`` returns NIXL's own config
    built with the same arguments and ``sync_mode`` for ``mode`` (see the module's doc).
    The block gets the list of the configs built that way, to check that the
    constructor did build its agent's through the name.

    ``"none"``, or a module without that name (vLLM without NIXL installed), leaves
    the module as it is. Raises :class:`~kvdrain.ConfigError` as :func:`thread_sync`
    does, before anything is changed."""
    built: list[Any] = []
    original = getattr(module, CONFIG_NAME, None)
    if mode == "none" or original is None:
        if mode not in NIXL_SYNC_MODES:
            raise _unknown(mode)
        yield built
        return
    sync = thread_sync(original, mode)

    def synchronized(*args: Any, **kwargs: Any) -> Any:
        kwargs["sync_mode"] = sync
        config = original(*args, **kwargs)
        built.append(config)
        return config

    with _patching:
        setattr(module, CONFIG_NAME, synchronized)
        try:
            yield built
        finally:
            setattr(module, CONFIG_NAME, original)
