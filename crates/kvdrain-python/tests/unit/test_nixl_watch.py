"""The NIXL call watchdog (no vLLM needed): a fake agent whose calls block on an event
past the bound, called through the plugin's tap as vLLM's threads call it."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kvdrain.vllm import DecodeSide, Settings
from kvdrain.vllm import _nixl_watch
from kvdrain.vllm._nixl_tap import NixlTap
from kvdrain.vllm._nixl_watch import (
    GAUGE_FLOOR_S,
    STACK_TOOLS,
    TOOL_TIMEOUT_S,
    CallWatch,
    _Watchdog,
    thread_stacks,
)
from kvdrain.vllm._prefill import PrefillSide

BOUND_MS = 200
# The longest a wait below may take: a stall's line comes after its stack dump, and each
# tool may run TOOL_TIMEOUT_S (gdb pausing this process, on a loaded machine, is slow).
# Only the test of the dump itself runs the tools; the others ask for none.
WAIT_S = len(STACK_TOOLS) * TOOL_TIMEOUT_S + 60.0


class HeldAgent:
    """A NIXL agent whose calls each wait on ``release`` while ``hold`` is set."""

    def __init__(self) -> None:
        self.hold = threading.Event()
        self.release = threading.Event()
        self.calls: list[str] = []

    def _maybe_hold(self, name: str) -> None:
        self.calls.append(name)
        if self.hold.is_set():
            assert self.release.wait(WAIT_S), "the test never released the call"

    def add_remote_agent(self, metadata: bytes) -> bytes:
        self._maybe_hold("add_remote_agent")
        return b"peer-" + metadata

    def remove_remote_agent(self, agent: str) -> None:
        self._maybe_hold("remove_remote_agent")

    def send_notif(self, remote_agent_name: str, notif_msg: bytes) -> None:
        self._maybe_hold("send_notif")

    def get_new_notifs(self) -> dict[str, list[bytes]]:
        self._maybe_hold("get_new_notifs")
        return {}

    def check_xfer_state(self, handle: int) -> str:
        self._maybe_hold("check_xfer_state")
        return "PROC"

    def make_prepped_xfer(self, *args: Any, **kwargs: Any) -> int:
        self._maybe_hold("make_prepped_xfer")
        return 7

    name = "agent-D"  # a plain attribute: handed through, not wrapped


def tap_over(
    agent: HeldAgent,
    stall_ms: int = BOUND_MS,
    clock_ns: Callable[[], int] = time.monotonic_ns,
    stack_tools: tuple[str, ...] = (),
) -> NixlTap:
    settings = Settings(30_000, 60_000, 500, 16, nixl_stall_ms=stall_ms)
    decode = DecodeSide(settings, world_size=1, name="test")
    watch = CallWatch(stall_ms, name="D-tp0", stack_tools=stack_tools, clock_ns=clock_ns)
    return NixlTap(agent, decode, PrefillSide(settings, decode.now_ms), watch)


# Frames only a native unwinder shows for a thread parked in CPython's lock wait.
NATIVE_WAIT = ("PyThread_acquire_lock", "futex", "sem_clockwait", "sem_timedwait", "sem_wait")


def until(what: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    end = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


@pytest.fixture
def log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.WARNING, logger="vllm.kvdrain")
    yield caplog


@pytest.fixture(autouse=True)
def fresh_dump_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test may dump stacks once (the limit is per process)."""
    monkeypatch.setattr(_nixl_watch, "_last_dump", [float("-inf")])


def lines(log: pytest.LogCaptureFixture, what: str) -> list[dict[str, Any]]:
    prefix = f"kvdrain: nixl call {what} "
    return [
        json.loads(r.getMessage()[len(prefix):])
        for r in log.records
        if r.name == "vllm.kvdrain" and r.getMessage().startswith(prefix)
    ]


def held(tap: NixlTap, call: Callable[[], Any], name: str) -> threading.Thread:
    t = threading.Thread(target=call, name=name, daemon=True)
    t.start()
    return t


def test_a_held_send_is_logged_once_with_every_stack_and_counted_once(
    log: pytest.LogCaptureFixture,
) -> None:
    agent = HeldAgent()
    tap = tap_over(agent, stack_tools=STACK_TOOLS)
    agent.hold.set()
    t = held(tap, lambda: tap.send_notif("agent-P0", notif_msg=b"HB:x"), "engine-step")
    until(lambda: tap.watch.oldest_s() >= GAUGE_FLOOR_S)  # the gauge sees it in flight
    until(lambda: bool(lines(log, "stalled")))
    first_age = tap.watch.oldest_s()
    assert first_age >= BOUND_MS / 1000
    time.sleep(4 * BOUND_MS / 1000)  # several watchdog passes over the same call
    assert tap.watch.oldest_s() > first_age  # still in flight, older
    [line] = lines(log, "stalled")  # once, not once a pass
    assert tap.watch.take_stalls() == 1
    assert tap.watch.take_stalls() == 0
    assert line["call"] == "send_notif"
    assert line["peer"] == "agent-P0"
    assert line["thread"] == "engine-step"
    assert line["agent"] == "D-tp0"
    assert line["elapsed_s"] >= BOUND_MS / 1000
    assert [c["call"] for c in line["in_flight"]] == ["send_notif"]
    stacks, source = line["stacks"], line["stack_source"]
    native = shutil.which("gdb") is not None or source.startswith("py-spy")
    if native:
        # Native frames: the held thread waits in CPython's lock, a C frame.
        assert source in ("py-spy --native", "gdb"), source
        assert any(frame in stacks for frame in NATIVE_WAIT), stacks
    else:
        assert source.startswith("python (") and "not installed" in source
        assert "_maybe_hold" in stacks
    agent.release.set()
    t.join(WAIT_S)
    assert tap.watch.oldest_s() == 0  # nothing in flight
    until(lambda: bool(lines(log, "returned after stall")))
    [back] = lines(log, "returned after stall")
    assert back["call"] == "send_notif" and back["returned_after_s"] >= BOUND_MS / 1000
    assert tap.watch.take_stalls() == 0
    assert len(lines(log, "stalled")) == 1


def test_a_native_dump_that_never_returns_does_not_hold_the_line(
    log: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Starting a stack tool forks the process, and the fork can block as long as the
    stall does (docs/limits.md): the line goes out anyway, with the Python stacks, and
    no second dump starts while the first has not returned."""
    stuck = threading.Event()

    def never(*args: Any, **kw: Any) -> tuple[str, str]:
        stuck.wait(WAIT_S)
        return "late", "gdb"

    monkeypatch.setattr(_nixl_watch, "thread_stacks", never)
    monkeypatch.setattr(_nixl_watch, "DUMP_WAIT_S", 0.2)
    monkeypatch.setattr(_nixl_watch, "_dumping", [None])
    agent = HeldAgent()
    tap = tap_over(agent, stack_tools=STACK_TOOLS)
    agent.hold.set()
    t = held(tap, lambda: tap.send_notif("agent-P0", notif_msg=b"HB:x"), "engine-step")
    until(lambda: bool(lines(log, "stalled")))
    [line] = lines(log, "stalled")
    assert line["stack_source"] == "python (the native dump did not return in 0.2 s)"
    assert "_maybe_hold" in line["stacks"]  # the held call's own Python frames
    assert tap.watch.take_stalls() == 1
    _nixl_watch._last_dump[0] = float("-inf")  # a new budget: the dump is still stuck
    stacks, source = _nixl_watch._dump_stacks(STACK_TOOLS)
    assert source == "python (an earlier native dump has not returned)" and stacks
    stuck.set()
    agent.release.set()
    t.join(WAIT_S)
    _nixl_watch._dumping[0].join(WAIT_S)  # type: ignore[union-attr]


def test_calls_through_getattr_are_timed_too(log: pytest.LogCaptureFixture) -> None:
    """The handshake executor's ``add_remote_agent`` is not one the tap overrides."""
    agent = HeldAgent()
    tap = tap_over(agent)
    assert tap.name == "agent-D"  # plain attributes pass through
    assert tap.add_remote_agent(b"P0") == b"peer-P0"  # not held: returns as the agent's
    agent.hold.set()
    t = held(tap, lambda: tap.add_remote_agent(b"P1"), "handshake")
    until(lambda: bool(lines(log, "stalled")))
    [line] = lines(log, "stalled")
    assert line["call"] == "add_remote_agent" and line["thread"] == "handshake"
    assert line["peer"] is None  # its argument is metadata, not a name
    agent.release.set()
    t.join(WAIT_S)
    assert tap.watch.take_stalls() == 1


def test_a_call_from_a_finalizer_on_the_watchdog_thread_does_not_deadlock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM's worker shuts its NIXL agent down in ``__del__``, so the garbage collector
    can make a NIXL call on any thread, the watchdog's included, while the watchdog
    copies its watches under its lock. Seen in a clean-clone run: the watchdog's first
    timed call went back for that lock and both it and the engine thread waited for
    ever. Here the copy makes the call, as the collector did; the call returns, untimed,
    and the watchdog goes on."""
    agent = HeldAgent()
    tap = tap_over(agent)
    made = threading.Event()

    class Collecting(weakref.WeakSet[CallWatch]):
        def __iter__(self) -> Iterator[CallWatch]:
            if threading.current_thread() is _Watchdog._thread and not made.is_set():
                tap.remove_remote_agent("P0")  # a finalizer, under the watchdog's lock
                made.set()
            return super().__iter__()

    monkeypatch.setattr(_Watchdog, "_watches", Collecting(_Watchdog._watches))
    tap.send_notif("P0", notif_msg=b"x")  # starts (or wakes) the watchdog
    assert made.wait(10.0), "the watchdog never took its watches"
    assert agent.calls.count("remove_remote_agent") == 1
    # Neither thread waits on the watchdog's lock: another thread's first call returns.
    t = held(tap, lambda: tap.get_new_notifs(), "writer")
    t.join(10.0)
    assert not t.is_alive()


def test_a_method_replaced_on_the_agent_is_the_one_called() -> None:
    """The tap keeps its timed wrapper after the first access; the wrapper looks the
    agent's method up at each call, so a replaced method (as tests replace a fake's)
    is the one that runs, timed."""
    agent = HeldAgent()
    tap = tap_over(agent)
    assert tap.make_prepped_xfer("WRITE") == 7
    seen: list[str] = []

    def replaced(*args: Any) -> int:
        seen.append(tap.watch.in_flight()[0][2][1])  # the call in flight, as the watch sees it
        return 8

    agent.make_prepped_xfer = replaced  # type: ignore[method-assign]
    agent.get_new_notifs = lambda: {"P0": [b"x"]}  # type: ignore[method-assign]
    assert tap.make_prepped_xfer("WRITE") == 8 and seen == ["make_prepped_xfer"]
    assert tap.get_new_notifs() == {}  # fed to the ledger: nothing producer-bound
    assert tap.watch.in_flight() == []


def test_calls_stalled_together_share_one_dump_and_later_ones_wait_for_the_limit(
    log: pytest.LogCaptureFixture,
) -> None:
    agent = HeldAgent()
    now_ns = [0]  # the watch's clock: both calls pass the bound in the same pass
    tap = tap_over(agent, clock_ns=lambda: now_ns[0])
    agent.hold.set()
    threads = [
        held(tap, lambda: tap.get_new_notifs(), "writer"),
        held(tap, lambda: tap.check_xfer_state(3), "engine-step"),
    ]
    until(lambda: len(tap.watch.in_flight()) == 2)
    assert not lines(log, "stalled")
    now_ns[0] = (BOUND_MS + 1) * 1_000_000
    until(lambda: len(lines(log, "stalled")) == 2)
    a, b = lines(log, "stalled")
    assert {a["call"], b["call"]} == {"get_new_notifs", "check_xfer_state"}
    assert len(a["in_flight"]) == 2
    assert a["stacks"] and a["stack_source"] == "python (no tool asked for)"
    assert b["stacks"] is None and b["stack_source"] == "in the line before"
    agent.release.set()
    for t in threads:
        t.join(WAIT_S)
    assert tap.watch.take_stalls() == 2
    # A new stall inside the dump limit: logged and counted, its stacks skipped.
    agent.release.clear()
    t = held(tap, lambda: tap.make_prepped_xfer("WRITE", 1, [0], 2, [0]), "writer")
    until(lambda: len(tap.watch.in_flight()) == 1)
    now_ns[0] += (BOUND_MS + 1) * 1_000_000
    until(lambda: len(lines(log, "stalled")) == 3)
    third = lines(log, "stalled")[2]
    assert third["call"] == "make_prepped_xfer" and third["stacks"] is None
    assert third["stack_source"].startswith("skipped: stacks were dumped")
    agent.release.set()
    t.join(WAIT_S)
    assert tap.watch.take_stalls() == 1


def test_calls_under_the_bound_are_not_reported(log: pytest.LogCaptureFixture) -> None:
    agent = HeldAgent()
    tap = tap_over(agent, stall_ms=60_000)
    agent.hold.set()
    t = held(tap, lambda: tap.remove_remote_agent("agent-P0"), "handshake")
    until(lambda: tap.watch.oldest_s() >= 2 * GAUGE_FLOOR_S)
    agent.release.set()
    t.join(WAIT_S)
    assert tap.watch.take_stalls() == 0 and not lines(log, "stalled")
    assert agent.calls == ["remove_remote_agent"]


def test_a_zero_bound_times_nothing() -> None:
    agent = HeldAgent()
    tap = tap_over(agent, stall_ms=0)
    # The agent's own bound method, unwrapped: the hot path pays nothing.
    assert tap.make_prepped_xfer == agent.make_prepped_xfer
    agent.hold.set()
    t = held(tap, lambda: tap.get_new_notifs(), "writer")
    until(lambda: agent.calls == ["get_new_notifs"])
    assert tap.watch.oldest_s() == 0
    agent.release.set()
    t.join(WAIT_S)


def test_without_tools_the_python_stacks_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        _nixl_watch, "_tools", lambda pid, tools: [("py-spy --native", None), ("gdb", None)]
    )
    stacks, source = thread_stacks()
    assert source.startswith("python (py-spy --native: not installed; gdb: not installed")
    assert "test_without_tools_the_python_stacks_say_so" in stacks
    assert 'Thread ' in stacks and '"MainThread"' in stacks


def test_a_tool_that_fails_falls_through_to_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        _nixl_watch, "_tools",
        lambda pid, tools: [
            ("py-spy --native", ["false"]),
            ("gdb", ["sh", "-c", "echo denied >&2; exit 3"]),
        ],
    )
    _, source = thread_stacks()
    assert source.startswith("python (py-spy --native: exit 1: no output; gdb: exit 3: denied")


FORK_SCRIPT = """
import os, sys, threading, time
from kvdrain.vllm import _nixl_watch
from kvdrain.vllm._nixl_watch import CallWatch
_nixl_watch._last_dump[0] = time.monotonic()  # no stack dumps: this is about counting
class Agent:
    def __init__(self, wait): self.wait = wait
    def block(self): self.wait()
w = CallWatch(100)
held = threading.Event()
threading.Thread(target=w.timed(Agent(held.wait), "block"), daemon=True).start()
while not w.take_stalls():
    time.sleep(0.01)
pid = os.fork()
if pid == 0:  # only the forking thread lives on: the held call is not the child's
    w.timed(Agent(lambda: time.sleep(0.5)), "block")()
    time.sleep(0.3)
    print("child", len(w.in_flight()), w.take_stalls(), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print("parent", len(w.in_flight()), w.take_stalls(), flush=True)
held.set()
"""


def test_a_forked_child_watches_its_own_calls_only() -> None:
    """After a fork only the forking thread exists: the child reports its own stall,
    not the parent's call that is still held, and counts from zero."""
    r = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT], capture_output=True, text=True, timeout=WAIT_S,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["child 0 1", "parent 1 0"], r.stdout + r.stderr


def test_the_tools_are_tried_in_the_order_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """``kvdrain_nixl_stack_tools``: gdb first (every native thread), or none at all."""
    assert [src for src, _ in _nixl_watch._tools(1, ("gdb", "py-spy"))] == [
        "gdb",
        "py-spy --native",
    ]
    stacks, source = thread_stacks(tools=())
    assert source == "python (no tool asked for)"
    assert "test_the_tools_are_tried_in_the_order_asked" in stacks
