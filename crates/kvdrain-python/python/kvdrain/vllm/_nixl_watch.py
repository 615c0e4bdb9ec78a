"""Every NIXL call timed, and a watchdog that reports one held past its bound.

A NIXL call is native code that releases the GIL; one that never returns (a wedged
transport, a lock NIXL never releases) leaves its thread parked with nothing in Python to
say so. :class:`CallWatch` times each call the tap passes to the agent, and a daemon
thread shared by every watch in the process checks them:

* **Timing** (the hot path): each thread owns one slot, a one-item list; a call writes
  ``(start_ns, name, args, kwargs)`` into it and puts back what was there when it
  returns. One tuple, two list stores and a ``time.monotonic_ns()``; no lock. The
  watchdog reads the slot's one item, which the interpreter stores whole.
* **Stalls**: a call in flight longer than the bound (``kvdrain_nixl_stall_ms``) is
  counted once (:meth:`CallWatch.take_stalls`, ``vllm:kvdrain_nixl_stalls_total``) and
  reported in ONE warning on the ``vllm.kvdrain`` logger, ``kvdrain: nixl call stalled``
  and a JSON object: the call, its thread, its age, the peer agent when the call names
  one, the other calls stalled at that moment, and every thread's stack
  (:func:`thread_stacks`). When the call returns, one more line says after how long.
* **Stacks**: the first tool of ``kvdrain_nixl_stack_tools`` that gives them:
  ``py-spy dump --native`` (fast; the threads Python knows, native frames included) or
  ``gdb``'s ``thread apply all bt`` (every thread, NIXL's and UCX's own too, but it pauses
  the process for seconds while it reads the symbols of torch's libraries); else the
  interpreter's own Python stacks. ``stack_source`` says which, and why the tools before
  it gave nothing. One dump per :data:`STACKS_EVERY_S` at most: a stall that comes
  sooner is logged without stacks, saying so.
* **The gauge**: :meth:`CallWatch.oldest_s`, the age of the oldest call in flight on any
  thread (``vllm:kvdrain_nixl_oldest_call_seconds``); calls younger than
  :data:`GAUGE_FLOOR_S` count as none, so a quiet engine stays quiet.

A watch with bound 0 times nothing: :meth:`CallWatch.timed` only looks the agent's
method up.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["GAUGE_FLOOR_S", "STACKS_EVERY_S", "STACK_TOOLS", "CallWatch", "thread_stacks"]

logger = logging.getLogger("vllm.kvdrain")

STACKS_EVERY_S = 60.0
"""At most one stack dump per this many seconds (a dump pauses the process)."""
GAUGE_FLOOR_S = 0.1
"""A call in flight for less than this shows as no call in the gauge."""
STACK_TOOLS = ("py-spy", "gdb")
"""The tools that can dump native stacks, in the default order of trying."""
TOOL_TIMEOUT_S = 60.0
"""The longest a stack tool may run before its dump is abandoned."""
DUMP_WAIT_S = 20.0
"""The longest the stall line waits for the native dump. Starting a tool forks this
process, and a fork can block as long as the stall does (seen: a thread in the kernel
growing glibc's heap while others spun on the UCX lock it held); past this the line goes
out with the Python stacks, which need no other process."""

# Where a call names the peer agent it talks to: NIXL's Python API, argument position and
# keyword. Calls not listed here name none (transfers name a prepared handle).
PEER_ARGUMENT: dict[str, tuple[int, str]] = {
    "send_notif": (0, "remote_agent_name"),
    "remove_remote_agent": (0, "agent"),
    "make_connection": (0, "remote_agent"),
    "check_remote_metadata": (0, "remote_name"),
    "fetch_remote_metadata": (0, "remote_name"),
    "invalidate_remote_metadata": (0, "remote_name"),
    "prep_xfer_dlist": (0, "agent_name"),
    "initialize_xfer": (3, "remote_agent"),
}

# A call in flight: (start in monotonic ns, NIXL method, its positional and keyword args).
Call = tuple[int, str, tuple[Any, ...], dict[str, Any]]


class CallWatch:
    """The NIXL calls in flight on one agent, one slot per thread (see the module's doc).

    ``stall_ms``: the bound (0: nothing is timed). ``name``: says which agent in the log
    line. ``stack_tools``: the tools tried for the stacks, in order (a subset of
    :data:`STACK_TOOLS`; none: Python stacks only). ``clock_ns``: monotonic nanoseconds
    (the hot path calls it once per call).
    """

    def __init__(
        self,
        stall_ms: int,
        *,
        name: str = "",
        stack_tools: tuple[str, ...] = STACK_TOOLS,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.stall_ns = stall_ms * 1_000_000
        self.name = name
        self.stack_tools = stack_tools
        self._clock_ns = clock_ns
        self._local = threading.local()
        # thread ident -> (thread name, slot); a slot is [Call | None].
        self._slots: dict[int, tuple[str, list[Call | None]]] = {}
        self._slots_lock = threading.Lock()
        self._stalls = 0  # written under _check_lock only
        self._stalls_taken = 0  # written by the thread that takes them only
        self._reported: dict[int, Call] = {}  # under _check_lock: thread -> its call
        self._check_lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.stall_ns > 0

    def timed(self, agent: Any, name: str) -> Callable[..., Any]:
        """``agent``'s method ``name`` as a function that times each call, looking the
        method up at each call (a test may replace it); with bound 0, it only looks it up."""
        if not self.stall_ns:
            return lambda *args, **kwargs: getattr(agent, name)(*args, **kwargs)
        local = self._local
        clock_ns = self._clock_ns

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                slot = local.slot
            except AttributeError:
                new = self._new_slot()
                if new is None:
                    return getattr(agent, name)(*args, **kwargs)
                slot = new
            outer = slot[0]
            slot[0] = (clock_ns(), name, args, kwargs)
            try:
                return getattr(agent, name)(*args, **kwargs)
            finally:
                slot[0] = outer

        return call

    def in_flight(self) -> list[tuple[int, str, Call]]:
        """``(thread ident, thread name, call)`` for each call in flight, oldest first."""
        with self._slots_lock:
            slots = list(self._slots.items())
        names = {t.ident: t.name for t in threading.enumerate()}  # as named now
        calls = [
            (ident, names.get(ident, tname), c)
            for ident, (tname, slot) in slots
            if (c := slot[0]) is not None
        ]
        calls.sort(key=lambda t: t[2][0])
        return calls

    def oldest_s(self) -> float:
        """Age of the oldest call in flight (s); 0 when none is older than
        :data:`GAUGE_FLOOR_S`."""
        if not self.stall_ns:
            return 0.0
        oldest = None
        # No lock: a thread adds its slot under the lock, and the interpreter copies the
        # dict's values in one step (no Python code runs during the copy).
        for _, slot in tuple(self._slots.values()):
            c = slot[0]
            if c is not None and (oldest is None or c[0] < oldest):
                oldest = c[0]
        if oldest is None:
            return 0.0
        age = (self._clock_ns() - oldest) / 1e9
        return age if age >= GAUGE_FLOOR_S else 0.0

    def take_stalls(self) -> int:
        """Stalled calls counted since the last take (each stalled call counts once)."""
        stalls = self._stalls
        taken, self._stalls_taken = stalls - self._stalls_taken, stalls
        return taken

    def check(self) -> None:
        """One look at the calls in flight (the shared thread's, every poll): counts and
        reports each call past the bound not reported yet, and says when a reported call
        has returned."""
        if not self.stall_ns:
            return
        with self._check_lock:
            self._check()

    def _check(self) -> None:
        now = self._clock_ns()
        calls = self.in_flight()
        current = {ident: c for ident, _, c in calls}
        for ident, c in list(self._reported.items()):
            if current.get(ident) is not c:
                del self._reported[ident]
                logger.warning(
                    "kvdrain: nixl call returned after stall %s",
                    json.dumps(
                        {"agent": self.name, "call": c[1], "thread": self._thread_name(ident),
                         "thread_id": ident, "peer": peer_of(c),
                         "returned_after_s": round((now - c[0]) / 1e9, 3)}
                    ),
                )
        stalled = [
            (ident, tname, c)
            for ident, tname, c in calls
            if now - c[0] > self.stall_ns and self._reported.get(ident) is not c
        ]
        if not stalled:
            return
        for ident, _, c in stalled:
            self._reported[ident] = c
        self._stalls += len(stalled)
        stacks, source = _dump_stacks(self.stack_tools)
        for ident, tname, c in stalled:
            line = {
                "agent": self.name,
                "call": c[1],
                "thread": tname,
                "thread_id": ident,
                "peer": peer_of(c),
                "elapsed_s": round((now - c[0]) / 1e9, 3),
                "bound_s": self.stall_ns / 1e9,
                "in_flight": [
                    {"call": o[1], "thread": oname, "elapsed_s": round((now - o[0]) / 1e9, 3)}
                    for _, oname, o in calls
                ],
                "stack_source": source,
                "stacks": stacks,
            }
            logger.warning("kvdrain: nixl call stalled %s", json.dumps(line))
            # One dump for the calls stalled at one moment: the others refer to it.
            stacks, source = None, "in the line before"

    def _after_fork(self) -> None:
        me = threading.get_ident()
        self._slots = {i: entry for i, entry in self._slots.items() if i == me}
        self._slots_lock = threading.Lock()
        self._check_lock = threading.Lock()
        self._reported = {}
        self._stalls = self._stalls_taken = 0  # the parent's stalls are the parent's

    def _thread_name(self, ident: int) -> str:
        with self._slots_lock:
            entry = self._slots.get(ident)
        return "?" if entry is None else entry[0]

    def _new_slot(self) -> list[Call | None] | None:
        """This thread's slot, made on its first call; ``None`` on the watchdog's own
        thread. A call there comes from a finalizer the garbage collector ran on it
        (vLLM's worker shuts its NIXL agent down in ``__del__``), possibly while the
        watchdog holds its lock, and the watchdog cannot watch itself: it is not timed."""
        me = threading.current_thread()
        if me is _Watchdog._thread:
            return None
        slot: list[Call | None] = [None]
        ident = threading.get_ident()
        with self._slots_lock:
            # A thread that ended leaves its slot; prune those whose ident is not alive.
            alive = {t.ident for t in threading.enumerate()}
            for dead in [i for i in self._slots if i not in alive]:
                del self._slots[dead]
            self._slots[ident] = (me.name, slot)
        self._local.slot = slot
        _Watchdog.watch(self)
        return slot


def peer_of(c: Call) -> str | None:
    """The peer agent a call names, if its method is one that names one."""
    where = PEER_ARGUMENT.get(c[1])
    if where is None:
        return None
    pos, key = where
    _, _, args, kwargs = c
    peer = args[pos] if len(args) > pos else kwargs.get(key)
    if isinstance(peer, bytes):
        return peer.decode("utf-8", "replace")
    return None if peer is None else str(peer)


class _Watchdog:
    """The one daemon thread that runs :meth:`CallWatch.check` on every live watch,
    started by the first watch that times a call; it polls at a quarter of the
    smallest bound, between 10 ms and 1 s."""

    # Reentrant: a finalizer the garbage collector runs while a thread holds it may make
    # a NIXL call, whose first timed call on that thread comes back to watch().
    _lock = threading.RLock()
    _watches: weakref.WeakSet[CallWatch] = weakref.WeakSet()
    _thread: threading.Thread | None = None
    _wake = threading.Event()

    @classmethod
    def watch(cls, w: CallWatch) -> None:
        with cls._lock:
            if w in cls._watches and cls._thread is not None:
                return
            cls._watches.add(w)
            if cls._thread is None or not cls._thread.is_alive():
                cls._thread = threading.Thread(
                    target=cls._run, name="kvdrain-nixl-watchdog", daemon=True
                )
                cls._thread.start()
        cls._wake.set()  # a smaller bound takes effect now

    @classmethod
    def _run(cls) -> None:
        while True:
            with cls._lock:
                watches = list(cls._watches)
            for w in watches:
                try:
                    w.check()
                except Exception:  # the watchdog outlives any one report
                    logger.exception("kvdrain: nixl watchdog pass failed")
            bound_s = min((w.stall_ns / 1e9 for w in watches), default=1.0)
            cls._wake.wait(min(1.0, max(0.01, bound_s / 4)))
            cls._wake.clear()

    @classmethod
    def _after_fork(cls) -> None:
        """A forked child has only the thread that forked: fresh locks (one another
        thread held stays held), only that thread's slot, and a watchdog of its own."""
        cls._lock = threading.RLock()
        cls._thread = None
        watches = list(cls._watches)
        for w in watches:
            w._after_fork()
        for w in watches:
            cls.watch(w)


os.register_at_fork(after_in_child=_Watchdog._after_fork)


# -- stacks -------------------------------------------------------------------------- #

_last_dump = [float("-inf")]  # monotonic seconds of the last dump, any watch
_dump_lock = threading.Lock()
_dumping: list[threading.Thread | None] = [None]  # the native dump's thread, if one ran


def _dump_stacks(tools: tuple[str, ...]) -> tuple[str | None, str]:
    """Every thread's stack and how it was taken, or ``None`` and why not (rate limit).
    The native dump runs on a thread of its own, waited for at most :data:`DUMP_WAIT_S`;
    while one has not returned no other starts."""
    with _dump_lock:
        now = time.monotonic()
        since = now - _last_dump[0]
        if since < STACKS_EVERY_S:
            return None, f"skipped: stacks were dumped {since:.1f} s ago"
        _last_dump[0] = now
        running = _dumping[0]
        if running is not None and running.is_alive():
            return _python_stacks(), "python (an earlier native dump has not returned)"
        out: list[tuple[str, str]] = []
        dump = threading.Thread(
            target=lambda: out.append(thread_stacks(tools=tools)),
            name="kvdrain-stack-dump",
            daemon=True,
        )
        _dumping[0] = dump
        dump.start()
    dump.join(DUMP_WAIT_S)
    if out:
        return out[0]
    return _python_stacks(), f"python (the native dump did not return in {DUMP_WAIT_S:g} s)"


def thread_stacks(
    pid: int | None = None, tools: tuple[str, ...] = STACK_TOOLS
) -> tuple[str, str]:
    """Every thread's stack in process ``pid`` (default: this one), native frames
    included where one of ``tools`` (tried in order) can attach: ``(text, source)``.
    ``source`` is ``py-spy --native``, ``gdb``, or ``python`` followed by why each tool
    gave nothing."""
    pid = os.getpid() if pid is None else pid
    why: list[str] = []
    allowed = _allow_tracing()
    if allowed is not None:
        why.append(allowed)
    if not tools:
        why.append("no tool asked for")
    for source, argv in _tools(pid, tools):
        if argv is None:
            why.append(f"{source}: not installed")
            continue
        try:
            r = subprocess.run(
                argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.SubprocessError) as e:
            why.append(f"{source}: {e}")
            continue
        if r.returncode == 0 and _has_threads(source, r.stdout):
            return r.stdout, source
        err = (r.stderr or r.stdout).strip().splitlines()
        why.append(f"{source}: exit {r.returncode}: {err[-1] if err else 'no output'}")
    if pid != os.getpid():
        return "", "none (" + "; ".join(why) + ")"
    return _python_stacks(), "python (" + "; ".join(why) + ")"


def _tools(pid: int, tools: tuple[str, ...]) -> list[tuple[str, list[str] | None]]:
    """``(source, argv or None when not installed)`` for each of ``tools``, in order."""
    out: list[tuple[str, list[str] | None]] = []
    for tool in tools:
        if tool == "py-spy":
            here = os.path.dirname(sys.executable)  # the venv's bin, often not on PATH
            spy = shutil.which("py-spy", path=here + os.pathsep + os.environ.get("PATH", ""))
            out.append(("py-spy --native", None if spy is None else
                        [spy, "dump", "--native", "--pid", str(pid)]))
        elif tool == "gdb":
            gdb = shutil.which("gdb")
            out.append(("gdb", None if gdb is None else
                        [gdb, "-p", str(pid), "-batch", "-nx", "-ex", "set pagination off",
                         "-ex", "set print frame-arguments none",
                         "-ex", "thread apply all bt"]))
    return out


# gdb prints each frame on a line of its own that starts with "#", its number and a space.
_GDB_FRAME = re.compile(r"^#\d+ ", re.MULTILINE)


def _has_threads(source: str, out: str) -> bool:
    if source.startswith("py-spy"):
        return "Thread " in out
    return _GDB_FRAME.search(out) is not None


def _python_stacks() -> str:
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        parts.append(f'Thread {ident} "{names.get(ident, "?")}":\n')
        parts.extend(traceback.format_stack(frame))
    return "".join(parts)


_PR_SET_PTRACER = 0x59616D61
_PR_SET_PTRACER_ANY = ctypes.c_ulong(-1).value


def _allow_tracing() -> str | None:
    """Lets a tool this process starts attach to it: under Yama's ``ptrace_scope`` 1 a
    process may be traced only by its ancestors, so the process names any tracer
    (``PR_SET_PTRACER``). Scope 2 needs ``CAP_SYS_PTRACE`` (root in most set-ups), scope 3
    forbids it. Returns a note for the log, or ``None`` when nothing stands in the way."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = int(f.read().strip())
    except (OSError, ValueError):
        return None  # no Yama: ordinary ptrace rules (same user, or root)
    if scope == 1:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PTRACER, _PR_SET_PTRACER_ANY, 0, 0, 0) != 0:
                return f"ptrace_scope 1: prctl(PR_SET_PTRACER) failed, errno {ctypes.get_errno()}"
        except (OSError, AttributeError) as e:
            return f"ptrace_scope 1: prctl unavailable: {e}"
        return None
    if scope >= 2:
        return f"ptrace_scope {scope}: tracing needs CAP_SYS_PTRACE" + (
            "" if scope == 2 else ", or is off"
        )
    return None
