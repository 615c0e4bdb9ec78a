"""What the suites share (``unit/`` in ``.venv``; ``vllm/``, ``vllm_e2e/`` and
``nixl_threads/`` in ``.venv-vllm``, with ``vllm_cpu`` beside this file): a fake monotonic
clock, the vLLM suites' warning filters, and the randomized checks' figures, the
multi-rank end-to-end table and the NIXL thread reproduction's figures in pytest's
terminal summary (visible with ``-q`` too)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# vLLM, torch and their dependencies warn on import and at use; the unit suite, which
# imports none of them, keeps the configured "every warning is an error".
VLLM_SUITES = (HERE / "vllm", HERE / "vllm_e2e", HERE / "nixl_threads")


class FakeClock:
    """Monotonic seconds that move only when told."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance_ms(self, ms: int) -> None:
        self.t += ms / 1000


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(suite in item.path.parents for suite in VLLM_SUITES):
            item.add_marker(pytest.mark.filterwarnings("ignore::DeprecationWarning"))
            item.add_marker(pytest.mark.filterwarnings("ignore::UserWarning"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    oracle = sys.modules.get("randomized_oracle")
    if oracle is not None and oracle.SUMMARY.rows:
        terminalreporter.section("kvdrain randomized check")
        for line in oracle.SUMMARY.lines():
            terminalreporter.write_line(line)
    pd = sys.modules.get("pd_oracle")  # vllm/test_randomized_pd.py
    if pd is not None and pd.SUMMARY.rows:
        terminalreporter.section("kvdrain prefill+decode randomized check")
        for line in pd.SUMMARY.lines():
            terminalreporter.write_line(line)
    topo = sys.modules.get("topo")  # tests/vllm_e2e/test_topologies.py
    if topo is not None and topo.SUMMARY.rows:
        terminalreporter.section("kvdrain multi-rank end to end (topology x scenario x connector)")
        for line in topo.SUMMARY.lines():
            terminalreporter.write_line(line)
    threads = sys.modules.get("test_nixl_threads")  # tests/nixl_threads/
    if threads is not None and threads.SUMMARY:
        terminalreporter.section("kvdrain: NIXL's agent across vLLM's threads")
        for line in threads.SUMMARY:
            terminalreporter.write_line(line)
