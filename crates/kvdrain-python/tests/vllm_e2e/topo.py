"""The test's side of the multi-rank run: one :class:`Group` per engine, ``tp × pp``
processes (``ranks.py``), of which rank 0 (the engine's scheduler process) answers the
test. Same channel as ``e2e.EngineProc`` (JSON lines), so :func:`e2e.run_until` steps a
group as it steps a one-process engine."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from e2e import HERE, SHARED, TRANSPORTS, EngineError, EngineProc


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range (see ``engine.free_port``:
    gloo binds it a moment later, and nothing else is handed one of those meanwhile)."""
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


class Group(EngineProc):
    """One engine: rank 0 talks to the test, ranks 1.. follow rank 0 over gloo."""

    def __init__(  # noqa: PLR0913 - one engine's whole shape
        self,
        role: str,
        which: str,
        engine_id: str,
        workdir: Path,
        *,
        tp: int = 1,
        pp: int = 1,
        mla: bool = False,
        transport: str = "tcp",
        extra: dict[str, Any] | None = None,
        ready_s: float = 400.0,
    ) -> None:
        self.role = role
        self.which = which
        self.engine_id = engine_id
        self.tp, self.pp, self.mla = tp, pp, mla
        self.port = 0
        self.dead = False
        env = {k: v for k, v in os.environ.items() if k not in ("UCX_TLS", "UCX_NET_DEVICES")}
        env.update(TRANSPORTS[transport])
        env.update(
            VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1",
            KVDRAIN_E2E_DIR=str(workdir),
            PYTHONPATH=os.pathsep.join([str(HERE), str(SHARED), env.get("PYTHONPATH", "")]),
            VLLM_LOGGING_LEVEL=env.get("VLLM_LOGGING_LEVEL", "WARNING"),
            # one CPU thread per rank: the host has few cores and many ranks
            OMP_NUM_THREADS="1",
        )
        dist_port = free_port()
        self.log_path = workdir / f"{engine_id}.rank0.log"
        self._logs: list[TextIO] = []
        self.procs: list[subprocess.Popen[str]] = []
        for rank in range(tp * pp):
            log = (workdir / f"{engine_id}.rank{rank}.log").open("w")
            self._logs.append(log)
            args = [
                sys.executable,
                str(HERE / "ranks.py"),
                role,
                which,
                engine_id,
                str(tp),
                str(pp),
                str(rank),
                str(dist_port),
                json.dumps(extra or {}),
                "mla" if mla else "-",
            ]
            self.procs.append(
                subprocess.Popen(
                    args,
                    stdin=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                    stdout=subprocess.PIPE if rank == 0 else log,
                    stderr=log,
                    text=True,
                    env=env,
                )
            )
        self.proc = self.procs[0]
        self._log = self._logs[0]
        self._start_reader()
        self._ready_s = ready_s
        self._ready = False
        self.ranks: list[dict[str, Any]] = []

    def _start_reader(self) -> None:
        import queue
        import threading

        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def wait_ready(self) -> Group:
        if not self._ready:
            hello = self._next(self._ready_s)
            if not hello.get("ready"):
                raise EngineError(f"{self.engine_id}: {hello}")
            self.port = int(hello["port"])
            self.ranks = list(hello["ranks"])
            self._ready = True
        return self

    @property
    def agents(self) -> list[str]:
        """Every rank's NIXL agent name, in rank order (rank = pp_rank × tp + tp_rank)."""
        return [str(r["agent"]) for r in self.ranks]

    def alive(self) -> bool:
        return not self.dead and all(p.poll() is None for p in self.procs)

    def kill_rank(self, rank: int) -> None:
        """SIGKILL one rank; the engine is dead from then on (vLLM's engine dies with a
        worker): it is never stepped again."""
        self.dead = True
        p = self.procs[rank]
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)

    def kill(self) -> None:
        self.dead = True
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in self.procs:
            p.wait(timeout=30)

    def close(self) -> None:
        if self.alive() and self._ready:
            try:
                self.call("quit", timeout_s=10)
            except (EngineError, OSError):
                pass
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        for p in self.procs:
            for pipe in (p.stdin, p.stdout):
                if pipe is not None:
                    pipe.close()
        for log in self._logs:
            log.close()


class Summary:
    """The table in pytest's terminal summary: one row per topology × scenario ×
    connector, from the runs' report lines."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        self.hangs: dict[str, dict[str, Any]] = {}
        self.started = time.monotonic()

    def add(self, line: dict[str, Any]) -> None:
        key = (str(line["topology"]), str(line["scenario"]), str(line["connector"]))
        self.rows.setdefault(key, []).append(line)

    @staticmethod
    def _span(values: list[float]) -> str:
        if not values:
            return "-"
        lo, hi = min(values), max(values)
        return f"{lo:.2f}" if lo == hi else f"{lo:.2f}-{hi:.2f}"

    def lines(self) -> list[str]:
        head = (
            f"{'topology':<12} {'scenario':<14} {'connector':<8} {'runs':>4} "
            f"{'decisions':<22} {'told (once)':<34} {'viol':>4} {'bytes':>9} "
            f"{'late':>7} {'last write->decision s':>22} {'->release s':>12} edges"
        )
        out = [head, "-" * len(head)]
        for (topo, scen, conn), lines in self.rows.items():
            decided: dict[str, int] = {}
            for ln in lines:
                decided[ln["decided"]] = decided.get(ln["decided"], 0) + 1
            told = sorted({"+".join(ln["told"]) or "nothing" for ln in lines})
            once = all(ln["told_once"] for ln in lines)
            viol = sum(len(ln["violations"]) for ln in lines)
            nbytes = sum(int(ln["bytes_checked"]) for ln in lines)
            late = sum(int(ln["late_bytes"]) for ln in lines)
            dec = [float(ln["decision_s"]) for ln in lines if ln["decision_s"] is not None]
            rel = [float(ln["release_s"]) for ln in lines if ln["release_s"] is not None]
            edges = sorted({str(e) for ln in lines for e in ln["edges"]})
            decisions = ", ".join(f"{k} {v}" for k, v in sorted(decided.items()))
            out.append(
                f"{topo:<12} {scen:<14} {conn:<8} {len(lines):>4} {decisions:<22} "
                f"{','.join(told) + (' (once)' if once else ' (TWICE)'):<34} {viol:>4} "
                f"{nbytes / 1e6:>8.1f}M {late:>7} {self._span(dec):>22} {self._span(rel):>12} "
                f"{'/'.join(edges)}"
            )
        for conn, h in self.hangs.items():
            out.append(
                f"{conn}: {h['hung_requests']} request(s) still waiting (told nothing, "
                f"blocks held) at least {h['watched_s']:.0f} s after their last write"
            )
        out.append(f"suite wall time: {time.monotonic() - self.started:.0f} s")
        return out


SUMMARY = Summary()
