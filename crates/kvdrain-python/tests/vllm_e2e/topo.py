"""The test's side of the multi-rank run: one :class:`Host` per engine shape and role,
``tp × pp`` processes (``ranks.py``) in one gloo group, hosting the ranks of one or more
engines (:class:`HostedEngine`); rank 0 (each engine's scheduler process) answers the test.
Same channel as ``e2e.EngineProc`` (JSON lines), and a :class:`HostedEngine` answers
``call``/``alive`` as an ``EngineProc`` does, so :func:`e2e.run_until` steps it."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any, TextIO

from e2e import HERE, SHARED, TRANSPORTS, EngineError, EngineProc, free_port
from report import TopologyLine


class Host(EngineProc):
    """The ``tp × pp`` rank processes of one shape and role, in one gloo group: rank
    ``r`` of every engine in ``engines`` lives in process ``r`` (each engine its own
    worker, NIXL agent, cache and, on rank 0, scheduler and side channel). Rank 0 talks
    to the test; ranks 1.. follow it over gloo."""

    def __init__(
        self,
        role: str,
        engines: list[dict[str, Any]],
        workdir: Path,
        *,
        tp: int = 1,
        pp: int = 1,
        transport: str = "tcp",
        extra: dict[str, Any] | None = None,
        ready_s: float = 600.0,
    ) -> None:
        self.role = role
        self.tp, self.pp = tp, pp
        self.exited_at: dict[int, float] = {}  # rank -> when a killed rank was reaped
        self.name = f"{role}-tp{tp}-pp{pp}"
        self.engine_id = self.name
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
        self.log_path = workdir / f"{self.name}.rank0.log"
        self._logs: list[TextIO] = []
        self.procs: list[subprocess.Popen[str]] = []
        for rank in range(tp * pp):
            # Appended to, by the rank and by the harness (its native stacks on a hang).
            (workdir / f"{self.name}.rank{rank}.log").write_text("")
            log = (workdir / f"{self.name}.rank{rank}.log").open("a")
            self._logs.append(log)
            args = [
                sys.executable,
                str(HERE / "ranks.py"),
                role,
                str(tp),
                str(pp),
                str(rank),
                str(dist_port),
                json.dumps(engines),
                json.dumps(extra or {}),
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
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._ready_s = ready_s
        self._ready = False
        self.engines: dict[str, HostedEngine] = {}

    def wait_ready(self) -> Host:
        if not self._ready:
            hello = self._next(self._ready_s)
            if not hello.get("ready"):
                raise EngineError(f"{self.name}: {hello}")
            for eid, e in hello["engines"].items():
                self.engines[eid] = HostedEngine(self, eid, int(e["port"]), list(e["ranks"]))
            self._ready = True
        return self

    def alive(self) -> bool:
        return not self.dead and all(p.poll() is None for p in self.procs)

    def processes(self) -> list[subprocess.Popen[str]]:
        return self.procs

    def process_logs(self) -> list[Path]:
        return [self.log_path.parent / f"{self.name}.rank{r}.log" for r in range(len(self.procs))]

    def tail(self, n: int = 30) -> str:
        """Every rank's log tail: a stuck collective shows on the rank it waits for."""
        out = []
        for rank in range(len(self.procs)):
            path = self.log_path.parent / f"{self.name}.rank{rank}.log"
            lines = path.read_text(errors="replace").splitlines() if path.exists() else []
            out.append(f"rank {rank} log tail:\n" + "\n".join(lines[-n:]))
        return "\n".join(out)

    def kill_rank(self, rank: int) -> None:
        """SIGKILL one rank process: every engine with a rank in it is dead from then on
        (vLLM's engine dies with a worker) and never stepped again. Returns at once: the
        kernel may take seconds to tear a loaded process down (its sockets close only
        then), and the engines it serves are stepped meanwhile, as a deployment's are.
        When the process was reaped is kept in ``exited_at``."""
        self.dead = True
        p = self.procs[rank]
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)

        def reap() -> None:
            p.wait()
            self.exited_at[rank] = time.monotonic()

        threading.Thread(target=reap, daemon=True).start()

    def close(self) -> None:
        if self.alive() and self._ready:
            try:
                self.call("quit", timeout_s=10)
            except (EngineError, OSError):
                pass
        for p in self.procs:
            if self.dead and p.poll() is None:
                p.send_signal(signal.SIGKILL)
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


class HostedEngine:
    """One engine on a :class:`Host`: what ``e2e.run_until`` and the scenarios call."""

    def __init__(self, host: Host, engine_id: str, port: int, ranks: list[dict[str, Any]]) -> None:
        self.host = host
        self.engine_id = engine_id
        self.port = port
        self.ranks = ranks
        self.role, self.tp, self.pp = host.role, host.tp, host.pp

    @property
    def agents(self) -> list[str]:
        """Every rank's NIXL agent name, in rank order (rank = pp_rank × tp + tp_rank)."""
        return [str(r["agent"]) for r in self.ranks]

    def call(self, op: str, timeout_s: float = 60.0, **kw: Any) -> Any:
        return self.host.call(op, timeout_s=timeout_s, engine=self.engine_id, **kw)

    def alive(self) -> bool:
        return self.host.alive()

    def kill_rank(self, rank: int) -> None:
        self.host.kill_rank(rank)


class Summary:
    """The table in pytest's terminal summary: one row per topology × scenario ×
    connector, from the runs' report lines."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str, str], list[TopologyLine]] = {}
        self.hangs: dict[str, dict[str, Any]] = {}
        self.started = time.monotonic()
        self.startup_s = 0.0

    def add(self, line: TopologyLine) -> None:
        key = (line.topology, line.scenario, line.connector)
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
        topo_order = {t: i for i, (t, _, _) in reversed(list(enumerate(self.rows)))}
        scen_order = ["warm_up", "ok", "fail_first", "fail_last", "abort", "p_rank_killed"]

        def order(key: tuple[str, str, str]) -> tuple[int, int, str]:
            t, sc, c = key
            return (topo_order[t], scen_order.index(sc) if sc in scen_order else 99, c[::-1])

        for topo, scen, conn in sorted(self.rows, key=order):
            lines = self.rows[(topo, scen, conn)]
            decided: dict[str, int] = {}
            for ln in lines:
                decided[ln.decided] = decided.get(ln.decided, 0) + 1
            told = sorted({"+".join(ln.told) or "nothing" for ln in lines})
            once = all(ln.told_once for ln in lines)
            viol = sum(len(ln.violations) for ln in lines)
            nbytes = sum(ln.bytes_checked for ln in lines)
            late = sum(ln.late_bytes for ln in lines)
            dec = [ln.decision_s for ln in lines if ln.decision_s is not None]
            rel = [ln.release_s for ln in lines if ln.release_s is not None]
            edges = sorted({str(e) for ln in lines for e in ln.edges})
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
        out.append(
            f"suite wall time: {time.monotonic() - self.started:.0f} s "
            f"(of which {self.startup_s:.0f} s starting the rank processes)"
        )
        return out


SUMMARY = Summary()


