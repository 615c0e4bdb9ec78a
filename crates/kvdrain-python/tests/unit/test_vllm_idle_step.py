"""The idle-step answer's own rules (:mod:`kvdrain.vllm._idle_step`, no vLLM): which
sources the digest reads, when the answer is off, and when a step counts as idle.
``tests/vllm/test_idle_step.py`` checks the same on vLLM's real worker."""

from __future__ import annotations

import queue
from collections import defaultdict
from typing import Any

import pytest

from kvdrain.vllm import _idle_step


class Base:
    _TRANSFER_MODE = "push"

    def get_transfer_results(self) -> None:
        self._reap_expired_send_leases(set())

    def _reap_expired_send_leases(self, done: set[str]) -> None:
        done.clear()


class Push(Base):
    def get_transfer_results(self) -> None:
        super().get_transfer_results()


def test_the_digest_reads_every_definition_along_the_mro_but_the_plugin_s() -> None:
    plugin = type("Plugin", (Push,), {"get_transfer_results": lambda self: None})
    plugin.__module__ = "kvdrain.vllm._worker"
    assert _idle_step.digest(plugin) == _idle_step.digest(Push)  # the plugin's: skipped
    assert _idle_step.digest(Push) != _idle_step.digest(Base)  # Push's own: read

    class Other(Push):  # anyone else's override changes it
        def _reap_expired_send_leases(self, done: set[str]) -> None:
            done.clear()

    assert _idle_step.digest(Other) != _idle_step.digest(Push)


def test_a_source_that_cannot_be_read_gives_no_digest() -> None:
    scope: dict[str, Any] = {}
    exec("class Built:\n    def _get_new_notifs(self):\n        return set()\n", scope)
    assert _idle_step.digest(scope["Built"]) == ""
    why = _idle_step.unread(type("Pushing", (scope["Built"],), {"_TRANSFER_MODE": "push"}))
    assert why is not None and "(unreadable) is not one read" in why


def test_the_answer_is_off_outside_push_mode_and_for_a_path_not_read() -> None:
    assert _idle_step.unread(type("Pull", (Base,), {"_TRANSFER_MODE": "pull"})) == (
        "the worker is not in push mode"
    )
    why = _idle_step.unread(Push)
    assert why is not None and _idle_step.digest(Push) in why


def inputs() -> dict[str, Any]:
    return dict(
        forwarded=queue.Queue(),
        receives_done=defaultdict(list),
        receives_failed=queue.Queue(),
        receive_failures=set(),
        pcp_done_sending=set(),
        leases={},
        pushes=defaultdict(list),
    )


@pytest.mark.parametrize("name", list(inputs()))
def test_a_step_is_idle_only_while_every_input_is_empty(name: str) -> None:
    given = inputs()
    idle = _idle_step.IdleStep(**given)
    assert idle.idle()
    held = given[name]
    if isinstance(held, queue.Queue):
        held.put("x")
    elif isinstance(held, set):
        held.add("x")
    else:
        held["x"] = []
    assert not idle.idle()  # bound once: changes in place are seen


def test_queues_that_are_not_queue_queue_are_refused() -> None:
    given = inputs()
    given["forwarded"] = []
    with pytest.raises(TypeError):
        _idle_step.IdleStep(**given)
