"""Property: the Python API and `kvdrain replay` (the normative trace runner, built from
the same core) take the same decisions on random traces: the same completed, failed,
aborted, expired, released and rejected events at the same times, and the same ignored
counts by reason."""

from __future__ import annotations

import collections
import json
import os
import pathlib
import subprocess
from typing import Union

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvdrain

ROOT = pathlib.Path(__file__).resolve().parents[3]
REPLAY = pathlib.Path(os.environ.get("KVDRAIN_BIN", ROOT / "target" / "release" / "kvdrain"))

IDS = ["r0", "r1", "r2", "r3", "r:4", "PUSH_FAIL"]
AGENTS = ["p0", "p1", "p2", "p3"]

At = tuple[str, int]
Register = tuple[str, str, Union[int, list[str]], Union[int, None]]
Notify = tuple[str, str, bytes]
Other = tuple[str, str]
Command = Union[At, Register, Notify, Other]

messages = st.one_of(
    st.builds(lambda i, tp: f"{i}:{tp}".encode(), st.sampled_from(IDS), st.integers(1, 3)),
    st.builds(lambda i, tp: f"PUSH_FAIL:{i}:{tp}".encode(), st.sampled_from(IDS), st.integers(1, 3)),
    st.sampled_from([b"", b"HB:r0,r1", b"PUSH_REG:\x81\xa1x", b"r0:", b"r0:x", b":1", b"\xff:1"]),
    st.binary(max_size=12),
)
commands: st.SearchStrategy[Command] = st.one_of(
    st.tuples(st.just("at"), st.integers(0, 400)),
    st.tuples(
        st.just("register"),
        st.sampled_from(IDS),
        st.one_of(
            st.integers(1, 3),
            st.lists(st.sampled_from(AGENTS), min_size=1, max_size=3, unique=True),
        ),
        st.one_of(st.none(), st.integers(0, 600)),
    ),
    st.tuples(st.just("notify"), st.sampled_from(AGENTS + ["stranger"]), messages),
    st.tuples(st.just("notify"), st.sampled_from(AGENTS + ["stranger"]), messages),
    st.tuples(st.just("abort"), st.sampled_from(IDS)),
    st.tuples(st.just("fence"), st.sampled_from(AGENTS)),
)
configs = st.tuples(
    st.integers(1, 5), st.sampled_from([50, 300, 1000]), st.sampled_from([0, 100, 700])
)


def escape(b: bytes) -> str:
    return "".join(
        chr(c) if 0x20 <= c < 0x7F and c != 0x5C else f"\\x{c:02x}" for c in b
    )


def render(config: tuple[int, int, int], cmds: list[Command]) -> tuple[str, list[Command]]:
    """The trace text, and the commands with `at` made absolute and monotone."""
    capacity, deadline, quarantine = config
    lines = [f"config capacity={capacity} deadline_ms={deadline} quarantine_ms={quarantine}"]
    now = 0
    absolute: list[Command] = []
    for c in cmds:
        if c[0] == "at":
            assert isinstance(c[1], int)
            now += c[1]
            absolute.append(("at", now))
            lines.append(f"at {now}")
        elif c[0] == "register":
            _, rid, expect, dl = c  # type: ignore[misc]
            what = f"expect={expect}" if isinstance(expect, int) else "edges=" + ",".join(expect)
            lines.append(f"register {rid} {what}" + (f" deadline={dl}" if dl is not None else ""))
            absolute.append(c)
        elif c[0] == "notify":
            _, agent, msg = c  # type: ignore[misc]
            lines.append(f"notify {agent} {escape(msg)}")
            absolute.append(c)
        else:
            lines.append(f"{c[0]} {c[1]}")
            absolute.append(c)
    return "\n".join(lines) + "\n", absolute


Event = dict[str, object]


def through_python(config: tuple[int, int, int], cmds: list[Command]) -> tuple[list[Event], collections.Counter[str]]:
    capacity, deadline, quarantine = config
    led = kvdrain.Ledger(capacity, deadline_ms=deadline, quarantine_ms=quarantine)
    events: list[Event] = []

    def take(ds: list[kvdrain.Decision]) -> None:
        for d in ds:
            e: Event = {"at": d.at_ms, "event": d.kind, "req": d.request_id}
            if d.kind == "released":
                e["forced"] = d.forced
            if d.kind in ("expired", "aborted"):
                e["outstanding"] = d.outstanding
            events.append(e)

    for c in cmds:
        if c[0] == "at":
            assert isinstance(c[1], int)
            take(led.advance(c[1]))
        elif c[0] == "register":
            _, rid, expect, dl = c  # type: ignore[misc]
            try:
                led.register(rid, None, expect, deadline_ms=dl)
            except kvdrain.FullError:
                events.append({"at": led.now_ms, "event": "rejected", "req": rid, "reason": "full"})
            except kvdrain.DuplicateRequestError:
                events.append(
                    {"at": led.now_ms, "event": "rejected", "req": rid, "reason": "duplicate_id"}
                )
        elif c[0] == "notify":
            _, agent, msg = c  # type: ignore[misc]
            led.feed({agent: [msg]})
        elif c[0] == "abort":
            assert isinstance(c[1], str)
            try:
                d = led.abort(c[1])
            except kvdrain.UnknownRequestError:
                d = None
            if d is not None:
                take([d])
        elif c[0] == "fence":
            assert isinstance(c[1], str)
            take(led.fence(c[1]))
        take(led.poll())
    k = led.counters()
    ignored = collections.Counter(
        {
            "malformed": k["malformed"],
            "not_for_consumer": k["not_for_consumer"],
            "unknown": k["unknown"] + k["abort_unknown"],
            "late": k["late"] + k["abort_late"],
            "duplicate": k["duplicate"],
            "unexpected_sender": k["unexpected_sender"],
        }
    )
    return events, +ignored


def through_replay(trace: str) -> tuple[list[Event], collections.Counter[str]]:
    run = subprocess.run(
        [str(REPLAY), "replay", "-"], input=trace.encode(), capture_output=True, check=False
    )
    assert run.returncode == 0, run.stderr.decode()
    events: list[Event] = []
    ignored: collections.Counter[str] = collections.Counter()
    for line in run.stdout.decode().splitlines():
        e = json.loads(line)
        if e["event"] == "ignored":
            ignored[e["reason"]] += 1
        else:
            events.append(e)
    return events, ignored


def test_replay_binary_is_built() -> None:
    assert REPLAY.exists(), f"{REPLAY} missing: run `make python` (or set KVDRAIN_BIN)"


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,  # the same 300 traces on every run
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(configs, st.lists(commands, max_size=40))
def test_python_and_replay_agree(config: tuple[int, int, int], cmds: list[Command]) -> None:
    trace, absolute = render(config, cmds)
    assert through_python(config, absolute) == through_replay(trace), trace


def test_a_known_trace_agrees() -> None:
    cmds: list[Command] = [
        ("register", "r1", ["p0", "p1"], None),
        ("notify", "p0", b"r1:2"),
        ("at", 5),
        ("fence", "p1"),
    ]
    trace, absolute = render((4, 1000, 100), cmds)
    events, _ = through_replay(trace)
    assert events == [
        {"at": 5, "event": "failed", "req": "r1"},
        {"at": 5, "event": "released", "req": "r1", "forced": False},
    ]
    assert through_python((4, 1000, 100), absolute) == through_replay(trace)
