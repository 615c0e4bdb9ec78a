"""The Python hammer, run as a child process by test_hostile.py (so a deadlock is a
timeout, not a hung run): `python hammer_child.py SECONDS SEED`.

Three threads share one ledger for SECONDS:

* the engine thread registers (valid and hostile arguments), polls (sometimes while
  holding the pool lock the blocks' finalizers take), splits polls, advances, aborts and
  fences, and checks every decision sequence;
* a writer thread feeds random batches: completions, failure notices, garbage, control
  messages, values of the wrong type, iterables that raise, odd keys, and batches long
  enough to be fed without the GIL;
* a collector thread runs `gc.collect()` and makes cyclic garbage.

The blocks objects' `__del__` takes the pool lock and calls back into the ledger. Each
registration's decisions must be `completed` alone or one of `failed`/`expired`/`aborted`
then one `released`, with the caller's own objects; at the end every request is decided
and every blocks object was finalized exactly once, after its last decision.
Prints `ok` and figures on success; any failure raises.
"""

from __future__ import annotations

import gc
import random
import sys
import threading
import time
from collections.abc import Iterator

import kvdrain
from kvdrain import Decision, Ledger

NAMES = [f"h-{i}" for i in range(300)]
AGENTS = ["p0", "p1", "p2", "p3"]
HOSTILE_IDS = ["", "HB:x", "PUSH_REG:y", "PUSH_FAIL:z", "\ud800", "a\udfffb"]
HOSTILE_EXPECTS: list[object] = [True, False, 0, -1, 65, 2**100, "p0", ["p0", "p0"],
                                 ["\ud800"], [1, 2], AGENTS * 3, [], None, 3.5]

# Reentrant: a collection can run finalizers on any thread, the one holding the lock
# included (that self-deadlock would be the pool's, with any object).
pool_lock = threading.RLock()
finalized: list[int] = []
led = Ledger(256, deadline_ms=200, quarantine_ms=400, settle_ms=20)


class Blocks:
    """A request's blocks: finalizing returns them to the pool under its lock and looks
    at the ledger, as an engine's block pool might."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.cycle: object = None

    def __del__(self) -> None:
        with pool_lock:
            finalized.append(self.n)
        len(led)


class Broken(Exception):
    pass


def raising(msgs: list[bytes]) -> Iterator[bytes]:
    yield from msgs
    raise Broken


def message(rng: random.Random) -> object:
    rid = rng.choice(NAMES)
    pick = rng.randrange(10)
    if pick < 4:
        return f"{rid}:{rng.choice([1, 2, 3])}".encode()
    if pick < 6:
        return f"PUSH_FAIL:{rid}:2".encode()
    if pick == 6:
        return rng.choice([b"HB:" + rid.encode(), b"PUSH_REG:\x81\xa1x"])
    if pick == 7:
        return rng.randbytes(rng.randrange(12))
    return rng.choice([bytearray(b"h-1:1"), "h-1:1", None, 7, memoryview(b"h-2:1")])


def writer(stop: threading.Event, seed: int, fed: list[int]) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        size = rng.choice([1, 4, 16, 64, 600])
        batch: dict[object, object] = {}
        for _ in range(size):
            key: object = rng.choice(AGENTS + ["stranger", "\udcff", 5])
            msgs = batch.setdefault(key, [])
            assert isinstance(msgs, list)
            msgs.append(message(rng))
        odd = rng.randrange(8)
        if odd == 0:
            first = next(iter(batch))
            batch[first] = raising(batch[first])  # type: ignore[arg-type]
        elif odd == 1:
            batch["p0"] = rng.choice([b"h-3:1", bytearray(b"h-3:1"), "h-3:1", 42])
        try:
            back = led.feed(batch)  # type: ignore[arg-type]
        except Broken as e:
            back = getattr(e, "kvdrain_producer_bound")
            assert odd == 0
        for agent, msg in back:
            assert isinstance(msg, bytes) and msg.startswith((b"HB:", b"PUSH_REG:")), msg
            assert agent in batch, agent
        fed[0] += size


def collector(stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        junk = [Blocks(-1) for _ in range(rng.randrange(4))]
        for b in junk:
            b.cycle = b
        del junk
        gc.collect(rng.choice([0, 1, 2]))
        time.sleep(0.001)


class Checker:
    """The decision sequence of every registration, by its blocks number."""

    def __init__(self) -> None:
        self.state: dict[int, str] = {}  # n -> pending, quarantined, done
        self.live: dict[str, int] = {}  # request id -> n, while not done
        self.decisions = 0

    def registered(self, rid: str, n: int) -> None:
        assert rid not in self.live, rid
        self.live[rid] = n
        self.state[n] = "pending"

    def take(self, d: Decision) -> None:
        self.decisions += 1
        blocks = d.blocks
        assert isinstance(blocks, Blocks), blocks
        n = blocks.n
        assert self.live.get(d.request_id) == n, (d, n)
        state = self.state[n]
        if d.kind == "completed":
            assert state == "pending", (d, state)
            self.done(d.request_id, n)
        elif d.kind in ("failed", "expired", "aborted"):
            assert state == "pending", (d, state)
            self.state[n] = "quarantined"
        else:
            assert d.kind == "released" and state == "quarantined", (d, state)
            self.done(d.request_id, n)

    def completed(self, rid: str) -> None:
        self.decisions += 1
        n = self.live[rid]
        assert self.state[n] == "pending", (rid, self.state[n])
        self.done(rid, n)

    def done(self, rid: str, n: int) -> None:
        self.state[n] = "done"
        del self.live[rid]


def engine(seconds: float, seed: int, check: Checker) -> tuple[int, int]:
    rng = random.Random(seed)
    now = 0
    refused = 0
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pick = rng.randrange(20)
        if pick < 7:
            hostile = rng.randrange(10) == 0
            rid = rng.choice(HOSTILE_IDS) if hostile else rng.choice(NAMES)
            expect: object = (
                rng.choice(HOSTILE_EXPECTS)
                if rng.randrange(10) == 0
                else rng.choice([1, 2, 3, rng.sample(AGENTS, rng.randrange(1, 4))])
            )
            n += 1
            try:
                if rng.randrange(3) == 0:
                    led.register_many([rid], [Blocks(n)], expect)  # type: ignore[arg-type]
                else:
                    led.register(rid, Blocks(n), expect, deadline_ms=rng.choice([None, 50]))  # type: ignore[arg-type]
            except kvdrain.KvdrainError:
                refused += 1
            else:
                assert not hostile or rid not in HOSTILE_IDS
                check.registered(rid, n)
        elif pick < 10:
            if rng.randrange(2):
                with pool_lock:  # the engine's shape: poll while holding the pool lock
                    ds = led.poll()
            else:
                ds = led.poll()
            for d in ds:
                check.take(d)
        elif pick < 13:
            done, others = led.poll_split()
            for rid in done:
                check.completed(rid)
            for d in others:
                check.take(d)
        elif pick < 16:
            now += rng.randrange(30)
            for d in led.advance(now):
                check.take(d)
            if rng.randrange(20) == 0:
                try:
                    led.advance(rng.choice([-1, 2**64, now - 1 if now else -1]))
                except (kvdrain.InvalidArgumentError, kvdrain.ClockBackwardsError):
                    pass
        elif pick < 18:
            rid = rng.choice(NAMES + HOSTILE_IDS[:1] + HOSTILE_IDS[4:])
            try:
                a = led.abort(rid)
            except (kvdrain.UnknownRequestError, kvdrain.InvalidRequestIdError):
                pass
            else:
                if a is not None:
                    check.take(a)
        else:
            try:
                for d in led.fence(rng.choice(AGENTS + ["nobody", "\ud800"])):
                    check.take(d)
            except kvdrain.InvalidArgumentError:
                pass
    # Drain: every request reaches its last decision.
    for _ in range(100):
        if not check.live:
            break
        now += 1000
        for d in led.advance(now):
            check.take(d)
        for d in led.poll():
            check.take(d)
    return n, refused


def main() -> None:
    seconds, seed = float(sys.argv[1]), int(sys.argv[2])
    check = Checker()
    stop = threading.Event()
    fed = [0]
    threads = [
        threading.Thread(target=writer, args=(stop, seed, fed)),
        threading.Thread(target=collector, args=(stop, seed + 1)),
    ]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    try:
        made, refused = engine(seconds, seed + 2, check)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not check.live, f"{len(check.live)} requests never decided"
    assert len(led) == 0
    gc.collect()
    accepted = [n for n, s in check.state.items()]
    assert all(check.state[n] == "done" for n in accepted)
    mine = sorted(n for n in finalized if n > 0)
    assert mine == sorted(set(mine)), "a blocks object finalized twice"
    assert set(accepted) <= set(mine), "a blocks object outlived its last decision"
    print(
        f"hammer: {time.monotonic() - t0:.1f} s, {len(accepted)} registered, {refused} refused"
        f" of {made}, {check.decisions} decisions checked, {fed[0]} messages fed"
    )
    print("ok")


if __name__ == "__main__":
    main()
