"""Property: the Python API and `kvdrain replay` (the normative trace runner, built from
the same core) take the same decisions on random traces: the same completed, failed,
aborted, expired, released and rejected events at the same times, and the same ignored
counts by reason.

The traces settle failure notices (rule 8) with `settle_ms` 0 (vLLM's release with the
decision) or above 0, carry failure notices for tracked ids, and advance the clock in steps
that land before, on and after settle ends, deadlines and quarantine ends."""

from __future__ import annotations

import collections
import json
import os
import pathlib
import subprocess
from typing import Union

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvdrain

ROOT = pathlib.Path(__file__).resolve().parents[4]
REPLAY = pathlib.Path(os.environ.get("KVDRAIN_BIN", ROOT / "target" / "release" / "kvdrain"))

IDS = ["r0", "r1", "r2", "r3", "r:4", "PUSH_FAIL"]
# The Python ledger refuses an id that can never complete (`PUSH_FAIL`: its completion
# reads as a failure notice), which a trace may register (it expires): traces register
# only the others, and notices and aborts still name it.
REGISTRABLE = [i for i in IDS if i != "PUSH_FAIL"]
AGENTS = ["p0", "p1", "p2", "p3"]

At = tuple[str, int]
Register = tuple[str, str, Union[int, list[str]], Union[int, None]]
Notify = tuple[str, str, bytes]
Other = tuple[str, str]
Command = Union[At, Register, Notify, Other]

completions = st.builds(
    lambda i, tp: f"{i}:{tp}".encode(), st.sampled_from(IDS), st.integers(1, 3)
)
failure_notices = st.builds(
    lambda i, tp: f"PUSH_FAIL:{i}:{tp}".encode(), st.sampled_from(IDS), st.integers(1, 3)
)
messages = st.one_of(
    completions,
    failure_notices,
    st.sampled_from([b"", b"HB:r0,r1", b"PUSH_REG:\x81\xa1x", b"r0:", b"r0:x", b":1", b"\xff:1"]),
    st.binary(max_size=12),
)
# Clock steps: small ones that stop short of or on a settle end (settle_ms below is
# 0, 1, 40 or 150), and large ones that cross deadlines and quarantine ends.
steps = st.one_of(st.sampled_from([0, 1, 39, 40, 41, 149, 150]), st.integers(0, 400))
commands: st.SearchStrategy[Command] = st.one_of(
    st.tuples(st.just("at"), steps),
    st.tuples(
        st.just("register"),
        st.sampled_from(REGISTRABLE),
        st.one_of(
            st.integers(1, 3),
            st.lists(st.sampled_from(AGENTS), min_size=1, max_size=3, unique=True),
        ),
        st.one_of(st.none(), st.integers(0, 600)),
    ),
    st.tuples(st.just("notify"), st.sampled_from(AGENTS + ["stranger"]), messages),
    st.tuples(st.just("notify"), st.sampled_from(AGENTS + ["stranger"]), messages),
    st.tuples(st.just("notify"), st.sampled_from(AGENTS), failure_notices),
    st.tuples(st.just("abort"), st.sampled_from(IDS)),
    st.tuples(st.just("fence"), st.sampled_from(AGENTS)),
    st.tuples(st.just("gone"), st.sampled_from(AGENTS)),
)
# (capacity, deadline_ms, quarantine_ms, settle_ms)
Config = tuple[int, int, int, int]


@st.composite
def settling_story(draw: st.DrawFn) -> list[Command]:
    """A request that fails by failure notices (counting or named edges), then clock
    steps around its settle end, sometimes an abort or a late notice in between: so that
    failed requests that settle, and settle ends the clock crosses, are common."""
    rid = draw(st.sampled_from(REGISTRABLE))
    agents = draw(st.lists(st.sampled_from(AGENTS), min_size=1, max_size=3, unique=True))
    expect: int | list[str] = draw(st.one_of(st.just(agents), st.just(len(agents))))
    story: list[Command] = [("register", rid, expect, draw(st.one_of(st.none(), st.just(600))))]
    for agent in agents:
        if draw(st.booleans()):
            story.append(("at", draw(steps)))
        if draw(st.integers(0, 5)) == 0:
            story.append(("abort", rid))
        body = f"{rid}:{len(agents)}".encode()
        story.append(("notify", agent, draw(st.sampled_from([b"PUSH_FAIL:" + body, body]))))
    story.extend(("at", draw(steps)) for _ in range(draw(st.integers(0, 3))))
    return story


def flatten(chunks: list[list[Command]]) -> list[Command]:
    return [c for chunk in chunks for c in chunk]


traces: st.SearchStrategy[list[Command]] = st.lists(
    st.one_of(commands.map(lambda c: [c]), settling_story()), max_size=25
).map(flatten)

configs: st.SearchStrategy[Config] = st.tuples(
    st.integers(1, 5),
    st.sampled_from([50, 300, 1000]),
    st.sampled_from([0, 40, 100, 700]),
    st.sampled_from([0, 1, 40, 150]),
)


def escape(b: bytes) -> str:
    return "".join(
        chr(c) if 0x20 <= c < 0x7F and c != 0x5C else f"\\x{c:02x}" for c in b
    )


def render(config: Config, cmds: list[Command]) -> tuple[str, list[Command]]:
    """The trace text, and the commands with `at` made absolute and monotone."""
    capacity, deadline, quarantine, settle = config
    lines = [
        f"config capacity={capacity} deadline_ms={deadline} quarantine_ms={quarantine}"
        f" settle_ms={settle}"
    ]
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


def through_python(
    config: Config, cmds: list[Command]
) -> tuple[list[Event], collections.Counter[str]]:
    capacity, deadline, quarantine, settle = config
    led = kvdrain.Ledger(
        capacity, deadline_ms=deadline, quarantine_ms=quarantine, settle_ms=settle
    )
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
        elif c[0] == "gone":
            assert isinstance(c[1], str)
            take(led.gone(c[1]))
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
@given(configs, traces)
def test_python_and_replay_agree(config: Config, cmds: list[Command]) -> None:
    trace, absolute = render(config, cmds)
    assert through_python(config, absolute) == through_replay(trace), trace


def test_the_generated_traces_exercise_settling() -> None:
    """The strategy reaches what it is meant to: both kinds of settle_ms, failure notices
    for tracked requests, and a release that waited for a settle end."""
    seen: collections.Counter[str] = collections.Counter()

    @settings(max_examples=300, deadline=None, derandomize=True, database=None)
    @given(configs, traces)
    def probe(config: Config, cmds: list[Command]) -> None:
        _, absolute = render(config, cmds)
        events, _ = through_python(config, absolute)
        seen["settle_0" if config[3] == 0 else "settle_positive"] += 1
        failed_at = {e["req"]: e["at"] for e in events if e["event"] == "failed"}
        for e in events:
            if e["event"] == "released" and e["req"] in failed_at:
                seen["failed_released"] += 1
                if e["at"] != failed_at[e["req"]]:
                    seen["released_after_settling"] += 1

    probe()
    for key in ("settle_0", "settle_positive", "failed_released", "released_after_settling"):
        assert seen[key] > 0, (key, seen)


def test_a_known_trace_agrees() -> None:
    cmds: list[Command] = [
        ("register", "r1", ["p0", "p1"], None),
        ("notify", "p0", b"r1:2"),
        ("at", 5),
        ("fence", "p1"),
    ]
    trace, absolute = render((4, 1000, 100, 100), cmds)
    events, _ = through_replay(trace)
    assert events == [
        {"at": 5, "event": "failed", "req": "r1"},
        {"at": 5, "event": "released", "req": "r1", "forced": False},
    ]
    assert through_python((4, 1000, 100, 100), absolute) == through_replay(trace)


def test_the_spec_example_with_settling_agrees() -> None:
    """The replay spec's example: a failure notice at 0 settles until 100."""
    cmds: list[Command] = [
        ("register", "r1", ["p0", "p1"], None),
        ("notify", "p1", b"PUSH_FAIL:r1:2"),
        ("at", 5),
        ("notify", "p0", b"r1:2"),
        ("at", 94),
        ("at", 1),
    ]
    config: Config = (1024, 1000, 60000, 100)
    trace, absolute = render(config, cmds)
    events, _ = through_replay(trace)
    assert events == [
        {"at": 5, "event": "failed", "req": "r1"},
        {"at": 100, "event": "released", "req": "r1", "forced": False},
    ]
    assert through_python(config, absolute) == (events, collections.Counter())


def test_quarantine_end_tied_with_a_settle_end_is_not_forced() -> None:
    """An aborted request whose last edge failed at 60 settles at 100, when its quarantine
    (abort at 0 + 100) also ends: the settle end wins the tie (`forced: false`)."""
    cmds: list[Command] = [
        ("register", "r1", ["p0"], None),
        ("abort", "r1"),
        ("at", 60),
        ("notify", "p0", b"PUSH_FAIL:r1:1"),
        ("at", 40),
    ]
    config: Config = (4, 1000, 100, 40)
    trace, absolute = render(config, cmds)
    events, _ = through_replay(trace)
    assert events[-1] == {"at": 100, "event": "released", "req": "r1", "forced": False}
    assert through_python(config, absolute) == through_replay(trace)


def test_an_id_that_can_never_complete_is_refused_by_python_only() -> None:
    """The replay spec lets a trace register any id (its rejections are `full` and
    `duplicate_id`), so the core accepts `PUSH_FAIL` and it expires; the Python API
    refuses it up front instead, since no completion of it can exist."""
    cmds: list[Command] = [
        ("register", "PUSH_FAIL", 1, 10),
        ("notify", "p0", b"PUSH_FAIL:1"),
        ("at", 10),
    ]
    trace, _ = render((4, 1000, 0, 0), cmds)
    events, _ = through_replay(trace)
    assert [e["event"] for e in events] == ["expired", "released"]
    with pytest.raises(kvdrain.InvalidRequestIdError):
        kvdrain.Ledger(4).register("PUSH_FAIL", None, 1)
