"""One process of the NIXL thread-safety reproduction (``test_nixl_threads.py``).

``subject MODE DIR CYCLES SECONDS``: one NIXL agent used from three threads shaped like
vLLM's push worker, for ``CYCLES`` evictions of the peer or at most ``SECONDS``:

* the writer thread (vLLM's ``_push_writer_loop``): ``get_new_notifs``, then a WRITE of
  one block into the peer with a notification (``initialize_xfer`` + ``transfer``);
* the engine thread (vLLM's step): a heartbeat ``send_notif`` to the peer, then
  ``check_xfer_state`` on every posted WRITE, ``release_xfer_handle`` once it is over;
* the handshake thread (vLLM's idle-engine eviction and the next handshake):
  ``remove_remote_agent`` of the peer in use, then ``add_remote_agent`` of its metadata
  again, one cycle after the other.

The agent is built the way vLLM's worker builds it, ``nixl_agent(name,
nixl_agent_config(num_threads=4, capture_telemetry=True))``, with the name
``nixl_agent_config`` looked up in this module, inside the plugin's
:func:`kvdrain.vllm._nixl_sync.agent_sync` for ``MODE`` (``none``: vLLM's own agent).
On exit it prints one JSON line: the sync mode NIXL's binding received, the cycles, the
calls and the exceptions by type. A crash (SIGSEGV, an abort) ends the process before.

``peer DIR``: the other process, one agent used from one thread: publishes its metadata
and block addresses, loads the subject's, reads its notifications and sends some back,
until its stdin closes.

The two meet through files in ``DIR`` (``peer.json``, ``subject.json``).
"""

from __future__ import annotations

import base64
import faulthandler
import json
import os
import queue
import sys
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import nixl._api as nixl_api
from nixl._api import nixl_agent, nixl_agent_config

from kvdrain.vllm._nixl_sync import agent_sync

BLOCKS = 64
BLOCK_BYTES = 4096
REMOVED_S = 0.0005
LOADED_S = 0.002
"""The handshake thread's pauses: the peer stays removed, then loaded, this long."""
IN_FLIGHT = 32
"""WRITEs the writer keeps posted at most, as vLLM's are bounded by the blocks it holds."""
WRITES_PER_ROUND = 4
WRITER_POLL_S = 0.001
"""The writer's pause between rounds (vLLM's push writer polls every millisecond)."""
JOIN_S = 10.0
"""How long a thread may take to notice the stop; longer is a stuck call."""

# The exceptions NIXL raises for a peer that is not (or no longer) loaded, or whose
# connection went away: the plugin and vLLM handle these. Anything else is misbehaviour.
EXPECTED = {
    "nixlNotFoundError",
    "nixlBackendError",
    "nixlInvalidParamError",
    "nixlRemoteDisconnectError",
}


def build_agent(name: str) -> Any:
    """vLLM's worker's construction, word for word in what it passes."""
    return nixl_agent(name, nixl_agent_config(num_threads=4, capture_telemetry=True))


def publish(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def wait_for(path: Path, until: float) -> dict[str, Any]:
    while time.monotonic() < until:
        if path.exists():
            record: dict[str, Any] = json.loads(path.read_text())
            return record
        time.sleep(0.01)
    raise TimeoutError(f"{path} did not appear")


def register_blocks(agent: Any) -> tuple[Any, list[tuple[int, int, int]]]:
    """A DRAM buffer of ``BLOCKS`` blocks, registered: (the buffer, its block descs)."""
    buf = np.zeros(BLOCKS * BLOCK_BYTES, dtype=np.uint8)
    base = int(buf.ctypes.data)
    agent.register_memory(agent.get_reg_descs([(base, buf.nbytes, 0, "")], "DRAM"))
    return buf, [(base + i * BLOCK_BYTES, BLOCK_BYTES, 0) for i in range(BLOCKS)]


def record_sync_modes() -> list[str]:
    """The ``syncMode`` of every agent config NIXL's binding is handed from now on, by
    name (``NIXL_THREAD_SYNC_STRICT``, ...)."""
    seen: list[str] = []
    make = nixl_api.nixlBind.nixlAgent

    def recording(name: str, config: Any) -> Any:
        seen.append(nixl_api.nixl_thread_sync_t(config.syncMode).name)
        return make(name, config)

    nixl_api.nixlBind.nixlAgent = recording
    return seen


class Subject:
    def __init__(self, mode: str, workdir: Path, cycles: int, seconds: float) -> None:
        self.until = time.monotonic() + seconds
        self.target = cycles
        self.stop = threading.Event()
        self.errors: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.slowest: dict[str, float] = {}  # call -> its longest time (s)
        # Cycles done, in a file: the test reads it after a crash.
        self.cycles = np.memmap(workdir / "cycles", dtype=np.int64, mode="w+", shape=(1,))
        self.lock = threading.Lock()  # the counters only
        self.posted: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.in_flight = 0
        modes = record_sync_modes()
        with agent_sync(sys.modules[__name__], mode):
            self.agent = build_agent(f"subject-{os.getpid()}")
        self.sync_modes = modes
        self.buf, self.local = register_blocks(self.agent)
        publish(
            workdir / "subject.json",
            {"md": base64.b64encode(self.agent.get_agent_metadata()).decode()},
        )
        peer = wait_for(workdir / "peer.json", self.until)
        self.peer_md = base64.b64decode(peer["md"])
        self.remote = [(a, n, d) for a, n, d in peer["blocks"]]
        self.peer = self.agent.add_remote_agent(self.peer_md)
        self.agent.make_connection(self.peer)  # as vLLM's handshake does
        self.until = time.monotonic() + seconds  # the run proper, once both are up

    def count(self, call: str, took: float, error: BaseException | None = None) -> None:
        with self.lock:
            self.calls[call] += 1
            if took > self.slowest.get(call, 0.0):
                self.slowest[call] = took
            if error is not None:
                self.errors[f"{call}:{type(error).__name__}"] += 1

    def guarded(self, call: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            result = fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - counted, judged by type at the end
            self.count(call, time.perf_counter() - t0, e)
            if type(e).__name__ not in EXPECTED:
                traceback.print_exc()
            return None
        self.count(call, time.perf_counter() - t0)
        return result

    def writer(self) -> None:
        i = 0
        while not self.stop.is_set():
            self.guarded("get_new_notifs", self.agent.get_new_notifs)
            for _ in range(WRITES_PER_ROUND):
                if self.in_flight >= IN_FLIGHT:
                    break
                i += 1
                self.write(i)
            time.sleep(WRITER_POLL_S)

    def write(self, i: int) -> None:
        b = i % BLOCKS
        local = self.agent.get_xfer_descs([self.local[b]], "DRAM")
        remote = self.agent.get_xfer_descs([self.remote[b]], "DRAM")
        handle = self.guarded(
            "initialize_xfer",
            self.agent.initialize_xfer,
            "WRITE",
            local,
            remote,
            self.peer,
            f"req-{i}:1".encode(),
        )
        if handle is None:
            return
        state = self.guarded("transfer", self.agent.transfer, handle)
        if state == "DONE":
            self.count("landed", 0.0)
        if state == "PROC":
            with self.lock:
                self.in_flight += 1
            self.posted.put(handle)
        else:
            self.guarded("release_xfer_handle", self.agent.release_xfer_handle, handle)

    def engine(self) -> None:
        pending: list[Any] = []
        while not self.stop.is_set():
            self.guarded("send_notif", self.agent.send_notif, self.peer, notif_msg=b"HB:subject")
            while True:
                try:
                    pending.append(self.posted.get_nowait())
                except queue.Empty:
                    break
            still: list[Any] = []
            for handle in pending:
                state = self.guarded("check_xfer_state", self.agent.check_xfer_state, handle)
                if state == "PROC":
                    still.append(handle)
                    continue
                if state == "DONE":
                    self.count("landed", 0.0)
                self.guarded("release_xfer_handle", self.agent.release_xfer_handle, handle)
                with self.lock:
                    self.in_flight -= 1
            pending = still
            time.sleep(0.0005)

    def handshake(self) -> None:
        while self.cycles[0] < self.target and time.monotonic() < self.until:
            self.guarded("remove_remote_agent", self.agent.remove_remote_agent, self.peer)
            time.sleep(REMOVED_S)
            self.guarded("add_remote_agent", self.agent.add_remote_agent, self.peer_md)
            self.cycles[0] += 1
            time.sleep(LOADED_S)
        self.stop.set()

    def run(self) -> int:
        threads = [
            threading.Thread(target=fn, name=fn.__name__, daemon=True)
            for fn in (self.writer, self.engine, self.handshake)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.0, self.until - time.monotonic()) + JOIN_S)
        stuck = [t.name for t in threads if t.is_alive()]
        if stuck:
            faulthandler.dump_traceback(all_threads=True)
        print(
            json.dumps(
                {
                    "sync_modes": self.sync_modes,
                    "cycles": int(self.cycles[0]),
                    "slowest_ms": {k: round(v * 1000, 3) for k, v in self.slowest.items()},
                    "calls": dict(self.calls),
                    "errors": dict(self.errors),
                    "unexpected": sorted(
                        k for k in self.errors if k.split(":", 1)[1] not in EXPECTED
                    ),
                    "stuck": stuck,
                }
            ),
            flush=True,
        )
        return 3 if stuck else 0


def peer(workdir: Path) -> None:
    agent = build_agent(f"peer-{os.getpid()}")
    buf, blocks = register_blocks(agent)
    publish(
        workdir / "peer.json",
        {"md": base64.b64encode(agent.get_agent_metadata()).decode(), "blocks": blocks},
    )
    closed = threading.Event()

    def wait_for_eof() -> None:
        sys.stdin.read()
        closed.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    subject = None
    while not closed.is_set():
        if subject is None and (workdir / "subject.json").exists():
            md = json.loads((workdir / "subject.json").read_text())["md"]
            subject = agent.add_remote_agent(base64.b64decode(md))
        agent.get_new_notifs()
        if subject is not None:
            try:
                agent.send_notif(subject, notif_msg=b"PUSH_REG:x")
            except Exception:  # noqa: BLE001 - the subject may be gone or crashing
                pass
        time.sleep(0.002)
    del buf


def main() -> None:
    faulthandler.enable()  # a crash prints every thread's Python stack on stderr
    # Hand the GIL on within 0.5 ms (5 ms by default), so a thread back from a pause
    # is not held a whole interval by the writer's loop: more cycles per second.
    sys.setswitchinterval(0.0005)
    role, rest = sys.argv[1], sys.argv[2:]
    if role == "peer":
        peer(Path(rest[0]))
        os._exit(0)
    mode, workdir, cycles, seconds = rest[0], Path(rest[1]), int(rest[2]), float(rest[3])
    code = Subject(mode, workdir, cycles, seconds).run()
    # Teardown is not under test: leave without destroying the agent under live threads.
    os._exit(code)


if __name__ == "__main__":
    main()
