"""The test's side of the end-to-end run: two engine processes and the calls between.

Each :class:`EngineProc` is one ``engine.py`` process (a P or a D) with its own side
channel on 127.0.0.1 at a port chosen free at run time. The test plays both schedulers
through JSON commands, and steps both engines until what it waits for holds or a
deadline passes (:func:`run_until`); nothing waits on a timer alone.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import queue
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent  # tests/: vllm_cpu, shared with tests/vllm/

# UCX over TCP on loopback only, or UCX's own choice on one host (RMA over CMA, active
# messages over shared memory): no UCX_* transport setting at all.
TRANSPORTS: dict[str, dict[str, str]] = {
    "tcp": {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo"},
    "shm": {},
}


def free_port() -> int:
    """A loopback TCP port that is free now, below the kernel's ephemeral range: port 0
    binds and outgoing connections (UCX's, ZMQ's, gloo's) are never handed one of those,
    so it stays free until vLLM binds it a moment later (ZMQ cannot take a bound
    socket, and a listener whose bind fails leaves vLLM waiting for ever)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    pick = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(1000):
        port = pick.randrange(min(10000, low // 2), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port below the ephemeral range")


class Steppable(Protocol):
    """What :func:`run_until` steps: an :class:`EngineProc`, or a hosted engine
    (``topo.HostedEngine``)."""

    engine_id: str

    def alive(self) -> bool: ...

    def call(self, op: str, timeout_s: float = 60.0, **kw: Any) -> Any: ...


STACKS_SIGNAL = signal.SIGUSR1
"""What an engine process dumps its threads' stacks on (``install_stack_dump``)."""


def install_stack_dump() -> None:
    """In an engine or rank process: every thread's Python stack to stderr (its log) on
    ``STACKS_SIGNAL``, written by ``faulthandler``, so even a process stuck in C code
    (a collective, a NIXL call holding the GIL) answers."""
    import faulthandler

    faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True)


NATIVE_STACKS_S = 180.0
"""How long gdb may take to print one process's native stacks (about 11 s for an idle
process with torch and NIXL loaded, on the loaded two-core host)."""


def native_stacks(pid: int) -> str:
    """Every thread's native stack in process ``pid`` (gdb's ``thread apply all bt``), or
    why there is none. ``faulthandler`` shows a thread stuck in C only as the Python call
    that entered it; the native frames below it (NIXL, UCX, a lock) say where it waits."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return "no native stacks: gdb is not installed"
    cmd = [gdb, "-p", str(pid), "-batch", "-nx", "-iex", "set debuginfod enabled off"]
    cmd += ["-ex", "set pagination off", "-ex", "thread apply all bt"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=NATIVE_STACKS_S)
    except subprocess.TimeoutExpired:
        return f"no native stacks: gdb took more than {NATIVE_STACKS_S} s"
    except OSError as e:
        return f"no native stacks: {e}"
    return out.stdout + out.stderr[-2000:]


PR_SET_THP_DISABLE = 41
"""``prctl`` option: no transparent huge pages for the process, inherited by its
children across ``fork`` and ``exec``."""


def disable_huge_pages() -> bool:
    """Transparent huge pages off for the test process and so for every engine it starts;
    whether the kernel took it.

    Every long stall of an engine these suites saw whose stacks were taken had threads in
    uninterruptible sleep on the address space: ``mmap`` (UCX's hook), ``mprotect``
    (glibc's heap growth), a ``recv`` into a buffer (a page fault), and a killed producer
    not reaped for over 120 s with its last thread in ``__khugepaged_exit``, waiting for
    khugepaged to let go of its memory. Each waits for the address space's lock, which
    khugepaged takes to collapse pages into huge ones. With huge pages off, khugepaged
    leaves the engines alone. The engines here run on the CPU with a few MB of KV cache,
    and no figure is measured in these suites."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


HUGE_PAGES_OFF = disable_huge_pages()


REAP_NOTED_S = 5.0
"""A killed engine not reaped after this long has its threads written to its log."""
REAP_BOUND_S = 120.0
"""How long a killed engine may take to be reaped at most: far past any teardown seen."""

CPU_SAMPLE_S = 3.0
"""How long each thread's CPU time is sampled before the native stacks are taken."""


def thread_cpu(pid: int) -> dict[int, tuple[str, str, int]]:
    """Each thread of process ``pid``: its name, scheduler state and CPU time so far in
    clock ticks (``/proc/PID/task/TID/stat``); empty once the process is gone."""
    threads: dict[int, tuple[str, str, int]] = {}
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        threads[int(stat.parent.name)] = (name, fields[0], int(fields[11]) + int(fields[12]))
    return threads


def dying_threads(pid: int) -> str:
    """What keeps a killed process ``pid`` from being reaped: each thread still there,
    with its scheduler state, the kernel function it waits in and its kernel stack
    (``/proc/PID/task/TID/{stat,wchan,stack}``; the stack needs root). A thread in ``D``
    (uninterruptible) holds the whole process back: SIGKILL acts when it leaves."""
    rows = [f"process {pid}, killed, not reaped yet:"]
    for tid, (name, state, _) in sorted(thread_cpu(pid).items()):
        task = Path(f"/proc/{pid}/task/{tid}")
        try:
            wchan = (task / "wchan").read_text().strip() or "-"
        except OSError:
            continue
        rows.append(f"  tid {tid} {name!r} state {state} in {wchan}")
        try:
            rows += [f"      {frame}" for frame in (task / "stack").read_text().splitlines()]
        except OSError:
            pass
    return "\n".join(rows) + "\n"


def thread_cpu_table(before: dict[int, tuple[str, str, int]], after: dict[int, tuple[str, str, int]], seconds: float) -> str:
    """Which threads ran just before the native stacks were taken: a thread blocked on a
    lock or in the kernel gains no CPU time, one that spins or crawls does."""
    rows = [f"thread CPU over {seconds:.1f} s (ticks of 1/{os.sysconf('SC_CLK_TCK')} s), busiest first:"]
    gained = sorted(
        ((after[t][2] - before[t][2], t) for t in after if t in before), reverse=True
    )
    for ticks, t in gained:
        name, state, _ = after[t]
        rows.append(f"  tid {t} {name!r} state {state} +{ticks}")
    return "\n".join(rows)


PROGRESS_PAUSE_US = 100
"""How long each NIXL agent's progress thread pauses between passes in the topology
suite's rank processes (``pace_nixl_progress``)."""


def pace_nixl_progress() -> None:
    """In a rank process of the topology suite, before any agent is made: every NIXL
    agent's progress thread pauses ``PROGRESS_PAUSE_US`` between passes. NIXL's Python
    API builds each agent with ``pthrDelay = 0``, a progress thread that never sleeps: four agents
    take two whole cores (measured: 10 CPU-seconds in 5 s idle, 0.3 with the pause), and
    the topology suite's twelve rank processes hold 30 of them on a host of two, where
    they starve the engines' own threads (``docs/limits.md``).
    Notices and completions still come off the wire in the progress thread, at most one
    pause late; nothing the plugin decides depends on a pause of 0.1 ms.

    The two-engine suite (``engine.py``) keeps NIXL's default, with which it ran green
    over many stops; its rare hang in ``send_notif`` (``docs/limits.md``) was seen with
    and without the pause."""
    import nixl._api as api

    make = api.nixlBind.nixlAgent

    def paced(name: str, config: Any) -> Any:
        config.pthrDelay = PROGRESS_PAUSE_US
        return make(name, config)

    api.nixlBind.nixlAgent = paced


class EngineError(RuntimeError):
    """An engine process answered a command with an error, or not at all."""


class EngineTimeout(EngineError):
    """An engine gave no answer within a call's bound: it hung, or the host froze.
    ``in_kernel``: the engine's command thread sat in the kernel the whole while the
    harness sampled it (:func:`held_in_kernel`)."""

    def __init__(self, message: str, *, in_kernel: bool = False) -> None:
        super().__init__(message)
        self.in_kernel = in_kernel


def held_in_kernel(
    before: dict[int, tuple[str, str, int]], after: dict[int, tuple[str, str, int]], tid: int
) -> bool:
    """Whether thread ``tid`` was in uninterruptible sleep in the kernel (state ``D``) at
    both samples of :func:`thread_cpu` and gained no CPU between them: waiting on the
    kernel (an ``mmap`` behind the address space's lock, a disk read), not on anything
    the engine's code does. A thread that deadlocks on a lock of its own sleeps
    interruptibly (``S``), and one that spins runs (``R``)."""
    b, a = before.get(tid), after.get(tid)
    return b is not None and a is not None and b[1] == a[1] == "D" and a[2] == b[2]


def kernel_holds(threads: dict[int, tuple[str, str, int]]) -> bool:
    """Whether a killed process still there (its :func:`thread_cpu`) is the kernel's to
    finish: a thread of it in uninterruptible sleep (state ``D``), which SIGKILL waits
    out. One clean-clone run had a killed producer's last thread in
    ``__khugepaged_exit`` for over 120 s: the kernel tearing down its address space
    waited for khugepaged. Nothing of the engine's code runs in a killed process."""
    return any(state == "D" for _, state, _ in threads.values())


HOST_STALL_S = 5.0
"""A call to an engine that takes this long is a stall: every call the suites make
answers in milliseconds, but a loaded host has frozen an engine process for 27 s
(neither its engine thread nor its writer thread ran, and no NIXL call was in flight),
and the whole host for 156 s (docs/limits.md, "Frozen engines")."""


class HostClock:
    """A thread of the test process that wakes every :data:`TICK_S`: a gap between two
    of its wakes of ``stall_s`` (:data:`HOST_STALL_S`) or more means this process did
    not run either, so the host froze, not one engine (an engine that hangs alone leaves
    no gap here). Started on first use; one per process (:data:`HOST`)."""

    TICK_S = 0.1

    def __init__(self, stall_s: float = HOST_STALL_S) -> None:
        self.stall_s = stall_s
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._gaps: list[tuple[float, float]] = []  # (when it ended, seconds)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._last = time.monotonic()
                self._thread = threading.Thread(target=self._tick, name="host-clock", daemon=True)
                self._thread.start()

    def _tick(self) -> None:
        while True:
            time.sleep(self.TICK_S)
            with self._lock:
                now = time.monotonic()
                if now - self._last >= self.stall_s:
                    self._gaps.append((now, now - self._last))
                self._last = now

    def froze_since(self, t0: float) -> float:
        """The longest gap that ended after ``t0`` (``time.monotonic``), counting the
        one going on now: 0.0 when the host ran throughout."""
        with self._lock:
            now = time.monotonic()
            gaps = [s for end, s in self._gaps if end > t0]
            if now - self._last >= self.stall_s:
                gaps.append(now - self._last)
        return max(gaps, default=0.0)


HOST = HostClock()


class EngineProc:
    _late = 0
    """Calls whose reply did not come in time: a stalled engine that resumes still answers
    them, and those lines must not be read as the answers to later calls."""
    stalls: tuple[tuple[str, str, float], ...] = ()
    """``(engine, call, seconds)`` of each call that took :data:`HOST_STALL_S` or more."""
    in_kernel = False
    """At its last timeout, whether its command thread was held in the kernel."""

    def __init__(
        self,
        role: str,
        which: str,
        engine_id: str,
        workdir: Path,
        *,
        transport: str = "tcp",
        extra: dict[str, Any] | None = None,
        ready_s: float = 400.0,
    ) -> None:
        self.role = role
        self.which = which
        self.engine_id = engine_id
        self._reaper: threading.Thread | None = None  # reaps the process once killed
        self.reaped_at: float | None = None  # when the killed process was reaped
        self.port = 0  # the side channel's, chosen by the engine (wait_ready)
        env = {k: v for k, v in os.environ.items() if k not in ("UCX_TLS", "UCX_NET_DEVICES")}
        env.update(TRANSPORTS[transport])
        env.update(
            VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1",
            KVDRAIN_E2E_DIR=str(workdir),
            PYTHONPATH=os.pathsep.join([str(HERE), str(SHARED), env.get("PYTHONPATH", "")]),
            VLLM_LOGGING_LEVEL=env.get("VLLM_LOGGING_LEVEL", "WARNING"),
        )
        self.log_path = workdir / f"{engine_id}.log"
        # Appended to, by the engine and by the harness (its native stacks on a hang).
        self.log_path.write_text("")
        self._log: TextIO = self.log_path.open("a")
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "engine.py"), role, which, engine_id, json.dumps(extra or {})],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=env,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._ready_s = ready_s
        self._ready = False

    def wait_ready(self) -> EngineProc:
        """Waits for the engine's first line (it has built both connector sides, its
        NIXL agent, registered its KV cache and started its side channel)."""
        if not self._ready:
            hello = self._next(self._ready_s)
            if not hello.get("ready"):
                raise EngineError(f"{self.engine_id}: {hello}")
            self.port = int(hello["port"])
            self._ready = True
        return self

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _next(self, timeout_s: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty as e:
            self._late += 1
            self.dump_stacks()
            tail = self.tail(200)
            where = self.dump_native_stacks()
            held = "; its command thread held in the kernel (state D)" if self.in_kernel else ""
            raise EngineTimeout(
                f"{self.engine_id}: no answer in {timeout_s} s{held}; native stacks in {where}; {tail}",
                in_kernel=self.in_kernel,
            ) from e
        if line is None:
            raise EngineError(f"{self.engine_id}: process ended; {self.tail()}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def processes(self) -> list[subprocess.Popen[str]]:
        return [self.proc]

    def process_logs(self) -> list[Path]:
        """The log of each of ``processes()``, in order (opened for appending)."""
        return [self.log_path]

    def dump_stacks(self) -> None:
        """Asks every live process of this engine for its threads' Python stacks
        (``faulthandler`` on ``SIGUSR1``, into its log), so an engine that stops
        answering says where it stands."""
        for p in self.processes():
            if p.poll() is None:
                try:
                    p.send_signal(STACKS_SIGNAL)
                except OSError:
                    pass
        time.sleep(2.0)  # faulthandler writes from its own signal handler; let it land

    def dump_native_stacks(self) -> str:
        """Appends every live process's native stacks (:func:`native_stacks`) to its log;
        returns the logs' names. Sets :attr:`in_kernel` for the command process's main
        thread (:func:`held_in_kernel` over the CPU sample)."""
        logs = []
        self.in_kernel = False
        for p, log in zip(self.processes(), self.process_logs(), strict=True):
            if p.poll() is None:
                # Sampled before gdb attaches: ptrace stops every thread while it reads.
                before, t = thread_cpu(p.pid), time.monotonic()
                time.sleep(CPU_SAMPLE_S)
                after = thread_cpu(p.pid)
                cpu = thread_cpu_table(before, after, time.monotonic() - t)
                if p is self.proc:  # its main thread runs the commands
                    self.in_kernel = held_in_kernel(before, after, p.pid)
                stacks = native_stacks(p.pid)
                with log.open("a") as f:
                    f.write(f"\n--- native stacks of pid {p.pid} (gdb) ---\n{stacks}\n{cpu}\n")
                    f.write(f"--- end of the native stacks of pid {p.pid} ---\n")
                logs.append(log.name)
        return ", ".join(logs) or "no live process"

    def tail(self, n: int = 30) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "log tail:\n" + "\n".join(lines[-n:])

    def _drop_late_replies(self, timeout_s: float) -> None:
        """Reads and drops the replies owed to calls that timed out, so that the next
        reply read is this call's (one line per call)."""
        while self._late > 0:
            try:
                line = self._lines.get(timeout=timeout_s)
            except queue.Empty:
                raise EngineTimeout(
                    f"{self.engine_id}: still no answer to {self._late} earlier call(s)"
                ) from None
            if line is None:
                raise EngineError(f"{self.engine_id}: process ended; {self.tail()}")
            self._late -= 1

    def call(self, op: str, timeout_s: float = 60.0, **kw: Any) -> Any:
        assert self.proc.stdin is not None
        self._drop_late_replies(timeout_s)
        start = time.monotonic()
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        reply = self._next(timeout_s)
        took = time.monotonic() - start
        if took >= HOST_STALL_S:
            self.stalls = (*self.stalls, (self.engine_id, op, round(took, 2)))
        if not reply.get("ok"):
            raise EngineError(f"{self.engine_id}: {op}: {reply.get('error')}")
        return reply.get("result")

    def send_raw(self, agent: str, message: bytes) -> None:
        self.call("fault_send", agent=agent, message_b64=base64.b64encode(message).decode())

    def alive(self) -> bool:
        return self._reaper is None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL. Returns at once, as ``topo.Host.kill_rank`` does: the kernel's
        teardown took 0.2 s in most runs here but 18.8 s and over 30 s in two of about
        thirty, and the other engines are stepped meanwhile, as a deployment's are. The
        process is not called again (:meth:`alive` is false from now on); :meth:`reaped`
        says when the kernel was done. Past :data:`REAP_NOTED_S`, what its threads wait
        in goes to its log once."""
        if self._reaper is not None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)

        def reap() -> None:
            try:
                self.proc.wait(timeout=REAP_NOTED_S)
            except subprocess.TimeoutExpired:
                with self.log_path.open("a") as f:
                    f.write(dying_threads(self.proc.pid))
                self.proc.wait()
            self.reaped_at = time.monotonic()

        self._reaper = threading.Thread(target=reap, name=f"reap-{self.engine_id}", daemon=True)
        self._reaper.start()

    def reaped(self) -> float | None:
        """When the process :meth:`kill` killed was reaped (``time.monotonic``), waiting
        for it for :data:`REAP_BOUND_S` at most; ``None`` when the kernel still holds it
        then (:func:`kernel_holds`; its threads are in its log). Still there past the
        bound otherwise is an error."""
        assert self._reaper is not None, f"{self.engine_id} was not killed"
        self._reaper.join(timeout=REAP_BOUND_S)
        if self.reaped_at is None and kernel_holds(thread_cpu(self.proc.pid)):
            return None
        self._reaper.join(timeout=1.0)  # gone between the wait and the look: reaped now
        if self.reaped_at is None:
            raise EngineError(f"{self.engine_id}: killed, not reaped after {REAP_BOUND_S} s")
        return self.reaped_at

    def close(self) -> None:
        if self.alive():
            try:
                if self._ready:
                    self.call("quit", timeout_s=10)
                else:
                    self.proc.kill()
            except (EngineError, OSError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        # The process is gone: its stdout reaches EOF, the reader stops, the pipes close.
        self._reader.join(timeout=10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass  # a broken stdin pipe of a killed engine
        self._log.close()


def run_until(
    engines: Sequence[Steppable], done: Callable[[], bool], deadline_s: float
) -> tuple[bool, list[dict[str, Any]]]:
    """Steps every live engine until ``done()`` holds (True) or ``deadline_s`` passes
    (False); returns the steps' answers too."""
    steps: list[dict[str, Any]] = []
    end = time.monotonic() + deadline_s
    while True:
        for e in engines:
            if e.alive():
                steps.append({"engine": e.engine_id, **e.call("step")})
        if done():
            return True, steps
        if time.monotonic() > end:
            return False, steps
        time.sleep(0.002)  # a poll's pause, not a synchronization
