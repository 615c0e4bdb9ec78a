"""The flight recorder: one rank's ledger inputs, written as a replay trace.

Off unless ``kvdrain_record_dir`` is set in ``kv_connector_extra_config``. Each decode
rank then writes ``kvdrain-<engine id>-tp<rank>.trace`` in that directory, in the format
``kvdrain replay`` reads (``docs/replay-trace.md``):

=====================  ==================================================================
live call              trace line
=====================  ==================================================================
ledger built           ``config capacity=.. deadline_ms=.. quarantine_ms=.. settle_ms=..``
``advance(now)``       ``at NOW`` (when the clock moved)
``register``           ``register REQ expect=N`` or ``register REQ edges=A,B,..``
``feed(batch, t)``     ``arrival T`` (when it moved), then ``notify AGENT BYTES`` per message
``abort`` / ``gone``   ``abort REQ`` / ``gone AGENT``
a decision taken       ``# => {"at":..,"event":..,"req":..}``: a comment ``replay`` skips
=====================  ==================================================================

Every call is applied and written under one lock, so the trace is a serial history the
live ledger really went through, and replaying it takes the same decisions, each at the
same time. Only what changed the ledger is written: a registration it refused changed
nothing and is left out. The decisions a notice made ready are pulled before each clock
move, at the clock they were taken at (one pull's are all taken at one time, so
``poll_split``'s completed requests are written from their ids, before the pull's other
decisions). The engine takes them in the same step either way, so recording changes
nothing vLLM is told. Across requests, the order of two decisions taken at the same time
may differ from the replay's (a live engine pulls a notice's decision at its next step,
the replay at once); each request's decisions, and their times, are the same.

The file is rotated when it passes ``kvdrain_record_max_bytes`` (default 64 MiB). It
becomes ``.1``, an older ``.1`` becomes ``.2``, and so on, up to
``kvdrain_record_files`` files in all (default 4); the oldest is deleted. A file left by an
earlier process is rotated the same way when the recorder starts. Each part begins with the
``config`` line and the clock, so a part replays alone. Requests registered in an earlier
part then show up as ``ignored unknown``. Parts replay together when every ``config`` line
but the first is dropped (``docs/operations.md``, *Flight recorder*).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from json.encoder import encode_basestring
from pathlib import Path
from typing import IO, cast

from kvdrain._errors import KvdrainError
from kvdrain._kvdrain import Decision, Ledger

__all__ = ["FlightRecorder", "RecordingLedger", "escape_notification"]

logger = logging.getLogger(__name__)

MAX_NAME = 256
"""The longest request id or agent name a trace may hold (bytes)."""


_WORD = re.compile(r"\S+")
_SINGLE = (bytes, bytearray, memoryview, str)
_PLAIN = re.compile(rb"[\x20-\x5b\x5d-\x7e]*")
_PLAIN_LINES = re.compile(rb"[\x20-\x5b\x5d-\x7e\n]*")


def escape_notification(message: bytes) -> str:
    """``message`` as a trace's ``notify`` BYTES: printable ASCII as is, ``\\`` as
    ``\\\\``, every other byte (line ends included) as ``\\xNN``."""
    if _PLAIN.fullmatch(message):
        return message.decode("ascii")  # every vLLM notice: REQ:TP, PUSH_FAIL:REQ:TP
    out = []
    for b in message:
        if b == 0x5C:
            out.append("\\\\")
        elif 0x20 <= b < 0x7F:
            out.append(chr(b))
        else:
            out.append(f"\\x{b:02x}")
    return "".join(out)


def _word(name: str) -> bool:
    """Whether ``name`` can stand as a trace word (REQ, AGENT)."""
    return _WORD.fullmatch(name) is not None and len(name.encode()) <= MAX_NAME


def refused_at(request_ids: list[str], error: KvdrainError, start: int = 0) -> int:
    """Where ``Ledger.register_many(request_ids[start:], ...)`` stopped: the index of the
    request its ``error`` names (every refusal names one; those before it are
    registered). Raises ``error`` itself when it names none of them."""
    named = getattr(error, "request_id", None)
    if isinstance(named, str) and named in request_ids[start:]:
        return request_ids.index(named, start)
    raise error


def _json_string(rid: object) -> str:
    return encode_basestring(rid) if isinstance(rid, str) else json.dumps(rid, ensure_ascii=False)


def decision_line(d: Decision) -> str:
    """``d`` as ``kvdrain replay`` prints it (keys in its order): the same text as
    ``json.dumps(..., separators=(",", ":"), ensure_ascii=False)``, built without a
    dict (one per decision on the recorder's hot path)."""
    kind = d.kind
    line = f'{{"at":{d.at_ms},"event":"{kind}","req":{_json_string(d.request_id)}'
    if kind in ("aborted", "expired"):
        outstanding = json.dumps(d.outstanding, separators=(",", ":"), ensure_ascii=False)
        return f'{line},"outstanding":{outstanding}}}'
    if kind == "released":
        return f'{line},"forced":{"true" if d.forced else "false"}}}'
    return line + "}"


def notify_lines(head: str, messages: list[bytes]) -> str:
    """``head`` (``notify AGENT ``) and each message escaped, one line each."""
    joined = b"\n".join(messages)
    # Every vLLM notice is printable ASCII: one match, one decode for the batch. A
    # message holding a line end (more newlines than joins) takes the escaping path.
    if joined.count(b"\n") == len(messages) - 1 and _PLAIN_LINES.fullmatch(joined):
        return head + joined.decode("ascii").replace("\n", "\n" + head) + "\n"
    return "".join(f"{head}{escape_notification(m)}\n" for m in messages)


class FlightRecorder:
    """One rank's trace file with its rotation; every method is called under the
    :class:`RecordingLedger`'s lock."""

    def __init__(
        self,
        path: Path,
        config: str,
        *,
        max_bytes: int = 64 << 20,
        files: int = 4,
    ) -> None:
        self.path = path
        self.config = config
        self.max_bytes = max(max_bytes, 4096)
        self.files = max(files, 1)
        self.now = 0
        # A clock move that decided nothing is written only when something follows it
        # (an idle engine step costs no line); a later move replaces it.
        self._pending_at = False
        self._dirty = False
        self.arrival: int | None = None
        self.rotations = 0
        self.unrecordable = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = None
        self._size = 0
        self._open()

    def _open(self) -> None:
        self._pending_at = False  # restated below, after the config line
        if self.path.exists():
            self._shift()
        self._file = self.path.open("w", encoding="utf-8", newline="\n")
        self._size = 0
        # line 1 is the config (a part replays alone); drop it to join parts.
        self._write(f"{self.config}\n# kvdrain flight recorder, part {self.rotations}\n")
        if self.now:
            self._pending_at = False
            self._write(f"at {self.now}\n")
        # Arrivals are sticky in the ledger: the next part restates the latest one.
        if self.arrival is not None:
            self._write(f"arrival {self.arrival}\n")

    def _shift(self) -> None:
        """``path`` -> ``path.1`` -> ``path.2`` ...; the oldest beyond ``files`` goes."""
        parts = [self.path] + [self.path.with_name(f"{self.path.name}.{i}") for i in range(1, self.files)]
        if self.files == 1:
            self.path.unlink(missing_ok=True)
            return
        parts[-1].unlink(missing_ok=True)
        for older, newer in zip(reversed(parts[1:]), reversed(parts[:-1])):
            if newer.exists():
                os.replace(newer, older)

    def _write(self, text: str) -> None:
        assert self._file is not None
        if self._pending_at:
            self._pending_at = False
            self._file.write(f"at {self.now}\n")
        self._file.write(text)
        self._size += len(text)
        self._dirty = True

    def _rotate_if_full(self) -> None:
        if self._size >= self.max_bytes and self._file is not None:
            self._file.close()
            self.rotations += 1
            self._open()

    def at(self, now: int, decided: bool) -> None:
        """The clock moved to ``now``; ``decided``: the move took decisions (they are
        written next), so the line cannot wait."""
        if now != self.now:
            self.now = now
            self._pending_at = True
            if decided:
                self._write("")

    def register(self, rids: Iterable[str], expect: int | list[str]) -> None:
        """``register`` lines for ``rids``, registered with ``expect``."""
        if isinstance(expect, int):
            ok, spec = True, f"expect={expect}"
        else:
            ok = all(_word(a) and "," not in a for a in expect)
            spec = "edges=" + ",".join(expect)
        lines = []
        for rid in rids:
            if ok and _word(rid):
                lines.append(f"register {rid} {spec}\n")
            else:
                self._skip(f"register of {rid!r}")
        if lines:
            self._write("".join(lines))

    def feed(self, batch: Mapping[str, Iterable[object]], arrival: int | None) -> None:
        if arrival is not None and (self.arrival is None or arrival > self.arrival):
            self.arrival = arrival
            self._write(f"arrival {arrival}\n")
        for agent, messages in batch.items():
            if not _word(agent):
                self._skip(f"notices from agent {agent!r}")
                continue
            # The ledger feeds bytes only (the rest it counts as not_bytes).
            fed = [m for m in messages if isinstance(m, bytes)]
            if fed:
                self._write(notify_lines(f"notify {agent} ", fed))

    def command(self, verb: str, name: str) -> None:
        if _word(name):
            self._write(f"{verb} {name}\n")
        else:
            self._skip(f"{verb} {name!r}")

    def completed(self, at_ms: int, rids: Iterable[object]) -> None:
        """The ``completed`` decisions of ``rids``, all taken at ``at_ms``: the lines
        :meth:`decisions` writes for them, with no ``Decision`` made."""
        head = f'# => {{"at":{at_ms},"event":"completed","req":'
        text = "".join(f"{head}{_json_string(rid)}}}\n" for rid in rids)
        if text:
            self._write(text)

    def decisions(self, decisions: Iterable[Decision]) -> None:
        text = "".join(f"# => {decision_line(d)}\n" for d in decisions)
        if text:
            self._write(text)

    def flush(self) -> None:
        if self._file is not None and self._dirty:
            self._dirty = False
            self._file.flush()
            self._rotate_if_full()

    def close(self) -> None:
        if self._file is not None:
            if self._pending_at:
                self._write("")  # the last clock move: a replay ends at the same time
            self._file.close()
            self._file = None

    def _skip(self, what: str) -> None:
        self.unrecordable += 1
        self._write(f"# unrecordable: {what} (not a trace word)\n")
        if self.unrecordable == 1:
            logger.warning(
                "kvdrain: flight recorder %s: %s is not a trace word; the replay of this "
                "file will differ from the live decisions",
                self.path,
                what,
            )


class RecordingLedger:
    """A :class:`~kvdrain.Ledger` whose every call is written to a
    :class:`FlightRecorder` as it is applied (the same methods the decode side calls)."""

    def __init__(self, ledger: Ledger, recorder: FlightRecorder) -> None:
        self.inner = ledger
        self.recorder = recorder
        self._lock = threading.Lock()

    @staticmethod
    def config_line(ledger: Ledger) -> str:
        return (
            f"config capacity={ledger.capacity} deadline_ms={ledger.deadline_ms} "
            f"quarantine_ms={ledger.quarantine_ms} settle_ms={ledger.settle_ms}"
        )

    def feed(
        self, notifs: Mapping[str, Iterable[bytes]], now_ms: int | None = None
    ) -> list[tuple[str, bytes]]:
        # Read once, fed and written: a list as is; a bytes-like or str value is one
        # message, as the ledger reads it.
        batch = cast(
            "dict[str, list[bytes]]",
            {
                agent: ms if isinstance(ms, list) else [ms] if isinstance(ms, _SINGLE) else list(ms)
                for agent, ms in notifs.items()
            },
        )
        with self._lock:
            back = self.inner.feed(batch, now_ms=now_ms)
            self.recorder.feed(batch, now_ms)
        return back

    def register(self, request_id: str, blocks: object, expect: int | Iterable[str]) -> None:
        spec: int | list[str] = expect if isinstance(expect, int) else list(expect)
        with self._lock:
            self.inner.register(request_id, blocks, spec)
            self.recorder.register((request_id,), spec)

    def register_many(
        self, request_ids: list[str], blocks: Sequence[object], expect: int | Iterable[str]
    ) -> None:
        spec: int | list[str] = expect if isinstance(expect, int) else list(expect)
        with self._lock:
            try:
                self.inner.register_many(request_ids, blocks, spec)
            except KvdrainError as e:
                self.recorder.register(request_ids[: refused_at(request_ids, e)], spec)
                raise
            self.recorder.register(request_ids, spec)

    def _ready(self) -> list[Decision]:
        """The decisions notices made ready, pulled at the clock they were taken at."""
        ready = self.inner.poll()
        self.recorder.decisions(ready)
        return ready

    def advance(self, now_ms: int) -> list[Decision]:
        with self._lock:
            ready = self._ready()
            moved = self.inner.advance(now_ms)
            self.recorder.at(now_ms, bool(moved))
            self.recorder.decisions(moved)
            self.recorder.flush()
        return ready + moved

    def poll(self) -> list[Decision]:
        with self._lock:
            return self._ready()

    def poll_split(self) -> tuple[list[str], list[Decision]]:
        # The hot path records as it feeds: the completed requests' ids, no Decision
        # made for them. A poll dates every decision it hands out at the clock, which
        # nothing but this ledger's own calls (under this lock) moves.
        with self._lock:
            completed, others = self.inner.poll_split()
            if completed:  # an idle step writes nothing
                self.recorder.completed(self.inner.now_ms, completed)
            if others:
                self.recorder.decisions(others)
        return completed, others

    # abort and gone do not move the clock: a decision a notice made ready is taken at
    # the same time whether it is pulled before them or after.
    def abort(self, request_id: str) -> Decision | None:
        with self._lock:
            d = self.inner.abort(request_id)
            self.recorder.command("abort", request_id)
            if d is not None:
                self.recorder.decisions([d])
        return d

    def gone(self, agent: str) -> list[Decision]:
        with self._lock:
            decisions = self.inner.gone(agent)
            self.recorder.command("gone", agent)
            self.recorder.decisions(decisions)
        return decisions

    # A refused hold has no trace word: it changes no request, so no decision a replay
    # checks (the trace has the refusal itself).
    def hold_refused(self, request_id: str, blocks: object) -> int:
        with self._lock:
            return self.inner.hold_refused(request_id, blocks)

    def poll_refused_releases(self) -> list[tuple[str, object]]:
        with self._lock:
            return self.inner.poll_refused_releases()

    def counters(self) -> dict[str, int]:
        return dict(self.inner.counters())

    def __len__(self) -> int:
        return len(self.inner)

    def close(self) -> None:
        with self._lock:
            self.recorder.close()
