"""The plugin's flight recorder (``kvdrain_record_dir``): what a decode rank's ledger
went through, as a replay trace that ``kvdrain replay`` turns back into the same
decisions, at the same times; its rotation; and the one log line of a receive that did
not complete."""

from __future__ import annotations

import collections
import json
import logging
import os
import pathlib
import subprocess
import threading
from types import SimpleNamespace
from typing import cast

import pytest

from kvdrain.vllm import DecodeReport, DecodeSide, Settings
from kvdrain import Decision, FullError, Ledger
from kvdrain.vllm._recorder import (
    FlightRecorder,
    RecordingLedger,
    decision_line,
    escape_notification,
    notify_lines,
)

from conftest import FakeClock

ROOT = pathlib.Path(__file__).resolve().parents[4]
REPLAY = pathlib.Path(os.environ.get("KVDRAIN_BIN", ROOT / "target" / "release" / "kvdrain"))

Line = dict[str, object]


def recorded_side(
    tmp: pathlib.Path,
    clock: FakeClock,
    *,
    max_bytes: int = 64 << 20,
    files: int = 4,
    capacity: int = 8,
) -> DecodeSide:
    settings = Settings(
        deadline_ms=1_000,
        quarantine_ms=3_000,
        settle_ms=200,
        capacity=capacity,
        record_dir=str(tmp),
        record_max_bytes=max_bytes,
        record_files=files,
    )
    return DecodeSide(settings, world_size=1, clock=clock, name="d0-tp0")


def live_decisions(text: str) -> list[Line]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("# => ")]


def replayed(trace: str) -> list[Line]:
    out = subprocess.run(
        [str(REPLAY), "replay", "-"], input=trace.encode(), capture_output=True, check=True
    )
    lines = [json.loads(line) for line in out.stdout.decode().splitlines()]
    return [d for d in lines if d["event"] not in ("ignored", "rejected")]


def per_request(decisions: list[Line]) -> dict[object, list[Line]]:
    out: dict[object, list[Line]] = collections.defaultdict(list)
    for d in decisions:
        out[d["req"]].append(d)
    return dict(out)


def step(d: DecodeSide, clock: FakeClock, ms: int) -> DecodeReport:
    clock.advance_ms(ms)
    return d.step()


def receive(d: DecodeSide, rid: str, want: int | list[str]) -> None:
    report = d.catch_up()
    assert d.register(rid, [[hash(rid) % 100]], want, report) == "tracked"


def incident(d: DecodeSide, clock: FakeClock) -> None:
    """Every kind of decision, with a slow step between a failure notice's arrival and
    the engine's next clock move (the arrival times a replay without them would lose)."""
    receive(d, "ok", ["P0", "P1"])
    receive(d, "fail", ["P0", "P1"])
    receive(d, "count", 2)
    receive(d, "cancel", ["P0", "P1"])
    receive(d, "lost", ["P0", "P2"])
    receive(d, "late", ["P0"])
    d.step()  # the registrations' step: the clock moved at its start
    step(d, clock, 10)
    d.feed({"P0": [b"ok:2", b"fail:2", b"count:2", b"lost:2"], "P1": [b"ok:2"]})
    clock.advance_ms(150)  # the engine is inside a slow step when P1's failure arrives
    d.feed({"P1": [b"PUSH_FAIL:fail:2", b"count:2", b"cancel:2"]})
    clock.advance_ms(150)
    d.step()
    d.abort("cancel", d.catch_up())
    d.step()  # the abort's step
    d.gone("P2", "connection reset")
    step(d, clock, 5)
    d.feed({"P0": [b"garbage\n\\\xff", b"cancel:2", b"HB:x"], "stranger": [b"ok:2"]})
    for _ in range(16):
        step(d, clock, 250)  # settle ends, the expiry of "late" and its quarantine


@pytest.mark.skipif(not REPLAY.exists(), reason=f"{REPLAY} not built (make python builds it)")
def test_a_recorded_incident_replays_to_the_same_decisions(tmp_path: pathlib.Path) -> None:
    clock = FakeClock()
    d = recorded_side(tmp_path, clock)
    incident(d, clock)
    d.close()
    trace = (tmp_path / "kvdrain-d0-tp0.trace").read_text()
    assert trace.startswith("config capacity=8 deadline_ms=1000 quarantine_ms=3000 settle_ms=200\n")
    assert "arrival 160\n" in trace  # the slow step's failure notice, dated at arrival
    live, replay = live_decisions(trace), replayed(trace)
    kinds = collections.Counter(x["event"] for x in live)
    assert kinds == {"completed": 2, "failed": 2, "aborted": 1, "expired": 1, "released": 4}
    # The same decisions, each request's in the same order and at the same times.
    assert per_request(live) == per_request(replay)
    assert sorted(map(json.dumps, live)) == sorted(map(json.dumps, replay))
    # P1's failure arrived at 160 and settles until 360: released at the first step
    # after (565). Dated at the step before (10), it would have been released at 310.
    assert {"at": 565, "event": "released", "req": "fail", "forced": False} in live
    assert {"at": 4065, "event": "released", "req": "late", "forced": True} in live


@pytest.mark.skipif(not REPLAY.exists(), reason=f"{REPLAY} not built (make python builds it)")
def test_rotation_keeps_parts_that_replay_alone_and_together(tmp_path: pathlib.Path) -> None:
    clock = FakeClock()
    d = recorded_side(tmp_path, clock, max_bytes=4096, files=30)
    for n in range(120):
        receive(d, f"r{n}", ["P0", "P1"])
        d.feed({"P0": [f"r{n}:2".encode()], "P1": [f"r{n}:2".encode() if n % 3 else f"PUSH_FAIL:r{n}:2".encode()]})
        step(d, clock, 97)
    for _ in range(5):
        step(d, clock, 250)
    d.close()
    base = tmp_path / "kvdrain-d0-tp0.trace"
    parts = sorted(tmp_path.iterdir(), key=lambda p: -int(p.suffix[1:]) if p != base else 0)
    assert len(parts) > 3, "small parts: the trace rotated"
    texts = [p.read_text() for p in parts]
    assert all(t.startswith("config ") for t in texts)
    assert all(len(t) < 4096 + 512 for t in texts)
    # Each part alone is a valid trace.
    for t in texts:
        replayed(t)
    # Together (every config line but the first dropped), the whole history.
    joined = texts[0] + "".join(t.split("\n", 1)[1] for t in texts[1:])
    live = [x for t in texts for x in live_decisions(t)]
    assert len(live) == 80 + 40 * 2  # completed; failed and released
    assert per_request(live) == per_request(replayed(joined))


def test_rotation_is_bounded(tmp_path: pathlib.Path) -> None:
    clock = FakeClock()
    (tmp_path / "kvdrain-d0-tp0.trace").write_text("left by an earlier process\n")
    d = recorded_side(tmp_path, clock, max_bytes=4096, files=3)
    assert (tmp_path / "kvdrain-d0-tp0.trace.1").read_text() == "left by an earlier process\n"
    for n in range(200):
        receive(d, f"r{n}", 1)
        d.feed({"P0": [f"r{n}:1".encode()]})
        step(d, clock, 3)
    d.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["kvdrain-d0-tp0.trace", "kvdrain-d0-tp0.trace.1", "kvdrain-d0-tp0.trace.2"]


def test_feed_and_steps_from_two_threads_record_a_serial_history(tmp_path: pathlib.Path) -> None:
    clock = FakeClock()
    d = recorded_side(tmp_path, clock, capacity=256)
    for n in range(200):
        receive(d, f"r{n}", ["P0"])

    def writer() -> None:
        for n in range(200):
            d.feed({"P0": [f"r{n}:1".encode()]})

    t = threading.Thread(target=writer)
    t.start()
    completed: list[str] = []
    while t.is_alive() or len(completed) < 200:
        completed += step(d, clock, 1).completed
    t.join()
    d.close()
    text = (tmp_path / "kvdrain-d0-tp0.trace").read_text()
    live = live_decisions(text)
    assert sorted(str(x["req"]) for x in live) == sorted(completed)
    if REPLAY.exists():
        assert per_request(live) == per_request(replayed(text))


def test_escape_keeps_every_byte() -> None:
    assert escape_notification(b"r1:2") == "r1:2"
    assert escape_notification(b"a b\\c\n\r\xff") == "a b\\\\c\\x0a\\x0d\\xff"


def test_a_batch_of_notices_is_written_as_each_one_escaped() -> None:
    """The batch path (one match, one decode) writes what escaping each message does,
    whatever bytes a sender put in."""
    head = "notify P0 "
    batches = [
        [b"r1:0", b"r2:1", b"PUSH_FAIL:r3:0"],
        [b""],
        [b"", b""],
        [b"a\nb", b"c"],
        [b"a", b"b\n"],
        [b"\n"],
        [b"back\\slash", b"\xff\x00", b"tab\t"],
    ]
    for batch in batches:
        each = "".join(f"{head}{escape_notification(m)}\n" for m in batch)
        assert notify_lines(head, batch) == each, batch
        assert notify_lines(head, batch).count("\n") == len(batch), batch


def test_a_decision_line_is_the_json_replay_prints() -> None:
    """Built without a dict, the line is ``json.dumps``'s, keys in replay's order."""
    rids: list[object] = ["r1", 'q"uote', "back\\slash", "caf\u00e9", "ctl\x01", 7]
    cases: list[tuple[str, dict[str, object]]] = [
        ("completed", {}),
        ("failed", {}),
        ("aborted", {"outstanding": 3}),
        ("expired", {"outstanding": ["P0", "P\u00e9"]}),
        ("expired", {"outstanding": None}),
        ("released", {"forced": True}),
        ("released", {"forced": False}),
    ]
    for rid in rids:
        for kind, extra in cases:
            fields = {"outstanding": None, "forced": False, **extra}
            d = SimpleNamespace(at_ms=1234, kind=kind, request_id=rid, **fields)
            want = {"at": 1234, "event": kind, "req": rid, **extra}
            line = decision_line(cast(Decision, d))
            assert line == json.dumps(want, separators=(",", ":"), ensure_ascii=False)


def test_the_split_pull_writes_what_the_full_pull_does(tmp_path: pathlib.Path) -> None:
    """``poll_split`` writes its completed requests from their ids, at the clock: the
    same lines ``poll`` writes from their decisions."""
    written: list[list[str]] = []
    for pull in ("poll", "poll_split"):
        ledger = Ledger(capacity=8, deadline_ms=1_000, quarantine_ms=3_000, settle_ms=200)
        path = tmp_path / f"{pull}.trace"
        rec = RecordingLedger(ledger, FlightRecorder(path, RecordingLedger.config_line(ledger)))
        rec.advance(1_234)
        for rid in ("a", 'q"', "caf\u00e9", "f"):
            rec.register(rid, ([1],), ["P0"])
        rec.feed({"P0": [b"a:1", b'q":1', "caf\u00e9:1".encode(), b"PUSH_FAIL:f:1"]})
        getattr(rec, pull)()
        rec.close()
        written.append(sorted(x for x in path.read_text().splitlines() if x.startswith("# => ")))
    assert written[0] == written[1]
    assert '# => {"at":1234,"event":"completed","req":"q\\""}' in written[1]
    assert len(written[1]) == 4


def test_a_batch_registration_records_those_before_its_refusal(tmp_path: pathlib.Path) -> None:
    ledger = Ledger(capacity=2, deadline_ms=1_000, quarantine_ms=3_000, settle_ms=200)
    path = tmp_path / "many.trace"
    rec = RecordingLedger(ledger, FlightRecorder(path, RecordingLedger.config_line(ledger)))
    with pytest.raises(FullError) as refused:
        rec.register_many(["a", "b", "c", "d"], [None] * 4, ["P0", "P1"])
    assert refused.value.request_id == "c"
    rec.register_many([], [], 1)
    rec.close()
    lines = path.read_text().splitlines()
    assert [x for x in lines if x.startswith("register ")] == [
        "register a edges=P0,P1",
        "register b edges=P0,P1",
    ]


def test_recording_is_off_by_default() -> None:
    settings = Settings(deadline_ms=1_000, quarantine_ms=3_000, settle_ms=200, capacity=8)
    d = DecodeSide(settings, world_size=1, clock=FakeClock())
    assert d.recorder is None
    d.close()  # nothing to close


def test_one_log_line_per_receive_that_does_not_complete(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    d = recorded_side(tmp_path, clock)
    caplog.set_level(logging.INFO, logger="vllm.kvdrain")
    incident(d, clock)
    lines = [
        json.loads(r.getMessage().split(" ", 4)[4])
        for r in caplog.records
        if r.getMessage().startswith("kvdrain: receive not completed ")
    ]
    by_req = {line["req"]: line for line in lines}
    assert len(lines) == len(by_req) == 4, "one line each, none for the completed ones"
    assert set(by_req) == {"fail", "cancel", "lost", "late"}
    fail = by_req["fail"]
    assert fail["outcome"] == "failed" and fail["release"] == "settled"
    assert fail["registered_ms"] == 0 and fail["decided_ms"] == 10
    assert fail["released_ms"] == 565
    # The ledger's record: each edge by producer agent and how it stood, the first
    # failure, the settle end (P1's notice arrived at 160 and settled for 200).
    assert fail["edges"] == [
        {"agent": "P0", "how": "landed"},
        {"agent": "P1", "how": "failure_notice", "at_ms": 160},
    ]
    assert (fail["first_failure"], fail["first_failure_ms"]) == ("failure_notice", 160)
    assert fail["settle_end_ms"] == 360
    cancel = by_req["cancel"]
    assert cancel["outcome"] == "aborted" and cancel["release"] == "resolved"
    assert cancel["first_failure"] == "aborted"
    assert cancel["edges"] == [{"agent": "P0", "how": "landed"}, {"agent": "P1", "how": "landed"}]
    late = by_req["late"]
    assert late["outcome"] == "expired" and late["outstanding"] == ["P0"]
    assert late["edges"] == [{"agent": "P0", "how": "outstanding"}]
    # Expired at the first step at or past its deadline (1000): 1065.
    assert (late["first_failure"], late["first_failure_ms"]) == ("expired", 1065)
    assert late["release"] == "forced" and "settle_end_ms" not in late
    lost = by_req["lost"]
    assert lost["rank"] == "d0-tp0"
    gone_at = lost["first_failure_ms"]
    assert lost["first_failure"] == "gone" and isinstance(gone_at, int)
    assert lost["edges"] == [
        {"agent": "P0", "how": "landed"},
        {"agent": "P2", "how": "gone", "at_ms": gone_at},
    ]
    assert lost["settle_end_ms"] == gone_at + 200
    d.close()


def test_the_log_line_of_a_counting_receive_gives_the_count(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    d = recorded_side(tmp_path, clock)
    caplog.set_level(logging.INFO, logger="vllm.kvdrain")
    receive(d, "count", 3)
    d.feed({"P0": [b"count:1"]})
    for _ in range(20):
        step(d, clock, 250)  # the deadline, then the quarantine
    (line,) = [
        json.loads(r.getMessage().split(" ", 4)[4])
        for r in caplog.records
        if r.getMessage().startswith("kvdrain: receive not completed ")
    ]
    assert (line["outcome"], line["release"]) == ("expired", "forced")
    assert (line["expected"], line["owed"]) == (3, 2)
    assert "edges" not in line
    assert line["first_failure"] == "expired"
    d.close()
