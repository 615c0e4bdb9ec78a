"""vLLM's NIXL agent across vLLM's threads, on real NIXL: the control crashes, the
plugin's agent does not.

Two processes over UCX TCP on loopback (``threads_child.py``): a subject whose one agent
is used by a writer thread, an engine thread and a handshake thread that removes and
re-adds the peer in use, as vLLM's idle-engine eviction and the next handshake do; and a
peer. The subject's agent is built the way vLLM's worker builds it, through the plugin's
:func:`kvdrain.vllm._nixl_sync.agent_sync`:

* the control, ``none``: vLLM's own configuration, ``NIXL_THREAD_SYNC_NONE``. Runs are
  repeated until at least ``CONTROL_RUNS`` have been made and one has failed (at most
  ``CONTROL_MAX_RUNS``); a run fails when the subject dies (SIGSEGV, an abort), hangs,
  or raises anything but NIXL's own errors for a missing peer;
* the plugin's configurations, ``strict`` and ``rw``: one run each of at least
  ``PLUGIN_CYCLES`` eviction cycles (at most ``PLUGIN_RUN_S``), which must end clean,
  with WRITEs landed and heartbeats sent, after at least ``EXPOSURE`` times the
  control's cycles per failure.

The figures (runs, cycles to failure, the plugin's cycles, the slowest call of each kind)
are printed in pytest's summary.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvdrain.vllm._nixl_sync import NIXL_SYNC_MODES

HERE = Path(__file__).resolve().parent
CHILD = HERE / "threads_child.py"

CONTROL_RUNS = 3
CONTROL_MAX_RUNS = 12
CONTROL_RUN_S = 10.0
"""A control run that survives this long counts as a clean run."""
PLUGIN_CYCLES = 600
PLUGIN_RUN_S = 40.0
EXPOSURE = 5
"""The plugin's cycles must reach this multiple of the control's cycles per failure (all
its cycles over its failures): at the control's rate, that many failures would have been
expected, and none happening by chance has a probability of about e**-5 (each plugin run
aims at twice that, and at least ``PLUGIN_CYCLES``)."""
STARTUP_S = 60.0
"""The time a process may take to start its agent and meet the other, on a loaded host."""
TRANSPORT = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo"}

SUMMARY: list[str] = []


@dataclass
class Run:
    mode: str
    returncode: int | None  # None: hung, killed by the test
    cycles: int
    seconds: float
    report: dict[str, Any] = field(default_factory=dict)
    stderr_tail: str = ""

    @property
    def failure(self) -> str | None:
        """Why this run counts as a failure, or ``None`` for a clean run."""
        if self.returncode is None:
            return "hung"
        if self.returncode < 0:
            return signal.Signals(-self.returncode).name
        if self.returncode != 0:
            return f"exit {self.returncode}" + (
                f" (stuck: {self.report['stuck']})" if self.report.get("stuck") else ""
            )
        if self.report.get("unexpected"):
            return f"raised {self.report['unexpected']}"
        return None


def run(mode: str, *, cycles: int, seconds: float) -> Run:
    """One subject against one peer; the subject's result."""
    env = {k: v for k, v in os.environ.items() if k not in ("UCX_TLS", "UCX_NET_DEVICES")}
    env.update(TRANSPORT)
    env["NIXL_LOG_LEVEL"] = "WARN"
    with tempfile.TemporaryDirectory(prefix="kvdrain-nixl-threads-") as tmp:
        workdir = Path(tmp)
        peer_log = (workdir / "peer.log").open("w")
        peer = subprocess.Popen(
            [sys.executable, str(CHILD), "peer", str(workdir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=peer_log,
            env=env,
        )
        subject_log = (workdir / "subject.log").open("w+")
        t0 = time.monotonic()
        subject = subprocess.Popen(
            [sys.executable, str(CHILD), "subject", mode, str(workdir), str(cycles), str(seconds)],
            stdout=subprocess.PIPE,
            stderr=subject_log,
            env=env,
            text=True,
        )
        try:
            out, _ = subject.communicate(timeout=seconds + STARTUP_S)
            returncode: int | None = subject.returncode
        except subprocess.TimeoutExpired:
            subject.kill()
            out, _ = subject.communicate()
            returncode = None
        elapsed = time.monotonic() - t0
        assert peer.stdin is not None
        peer.stdin.close()
        try:
            peer.wait(timeout=10)
        except subprocess.TimeoutExpired:
            peer.kill()
            peer.wait()
        peer_log.close()
        lines = [line for line in out.splitlines() if line.startswith("{")]
        report: dict[str, Any] = json.loads(lines[-1]) if lines else {}
        done = workdir / "cycles"
        count = struct.unpack("<q", done.read_bytes()[:8])[0] if done.exists() else 0
        subject_log.seek(0)
        tail = subject_log.read()[-4000:]
        subject_log.close()
    return Run(mode, returncode, int(count), elapsed, report, tail)


def slowest(r: Run) -> str:
    calls = r.report.get("slowest_ms", {})
    worst = max(calls.items(), key=lambda kv: kv[1], default=("-", 0.0))
    return f"slowest call {worst[1]:.1f} ms ({worst[0]})"


@pytest.fixture(scope="module")
def control() -> list[Run]:
    runs: list[Run] = []
    while len(runs) < CONTROL_MAX_RUNS and (
        len(runs) < CONTROL_RUNS or not any(r.failure for r in runs)
    ):
        runs.append(run("none", cycles=10**9, seconds=CONTROL_RUN_S))
    failed = [r for r in runs if r.failure]
    SUMMARY.append(
        f"control (vLLM's agent, NONE): {len(failed)} of {len(runs)} runs failed "
        f"({', '.join(sorted({str(r.failure) for r in failed})) or '-'}); cycles to failure "
        f"{[r.cycles for r in failed]}, {sum(r.cycles for r in runs) // max(1, len(failed))} "
        f"cycles per failure; {sum(r.seconds for r in runs):.1f} s"
    )
    return runs


def test_control_fails(control: list[Run]) -> None:
    """vLLM's own agent configuration crashes or misbehaves under eviction in use."""
    failed = [r for r in control if r.failure]
    assert failed, f"the control never failed in {len(control)} runs: {control}"
    for r in control:
        if r.report:  # it lived to report: its agent was configured as vLLM does
            assert r.report["sync_modes"] == [NIXL_SYNC_MODES["none"]]


@pytest.mark.parametrize("mode", ["strict", "rw"])
def test_plugin_agent_stays_clean(control: list[Run], mode: str) -> None:
    """The plugin's agent, through the same construction, survives ``EXPOSURE`` times the
    control's cycles per failure, and still moves data."""
    failures = sum(1 for c in control if c.failure)
    needed = sum(c.cycles for c in control) // max(1, failures)  # cycles per failure
    r = run(mode, cycles=max(PLUGIN_CYCLES, 2 * EXPOSURE * needed), seconds=PLUGIN_RUN_S)
    SUMMARY.append(
        f"plugin ({mode.upper()}): {r.cycles} cycles in {r.seconds:.1f} s, "
        f"{r.failure or 'clean'}; {r.report.get('calls', {}).get('landed', 0)} WRITEs landed; "
        f"{slowest(r)}"
    )
    assert r.failure is None, (r.failure, r.stderr_tail)
    assert r.report["sync_modes"] == [NIXL_SYNC_MODES[mode]]
    calls, errors = r.report["calls"], r.report["errors"]
    assert calls.get("landed", 0) > 0, r.report
    assert calls["send_notif"] > errors.get("send_notif:nixlNotFoundError", 0), r.report
    assert r.cycles >= EXPOSURE * needed, (r.cycles, needed)
