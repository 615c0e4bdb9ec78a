"""Prints the randomized check's figures (test_randomized.py) in pytest's terminal
summary, visible with ``-q`` too."""

from __future__ import annotations

import sys

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    oracle = sys.modules.get("randomized_oracle")
    if oracle is None or not oracle.SUMMARY.rows:
        return
    terminalreporter.section("kvdrain randomized check")
    for line in oracle.SUMMARY.lines():
        terminalreporter.write_line(line)
