"""Hostile use of the module: finalizers that call back or take locks, iterables that
raise, floods of refused registrations, strings and ints the module cannot use. Each
either works or raises a KvdrainError subclass; nothing hangs, nothing is lost."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

import kvdrain
from kvdrain import Ledger, PushPlan

# A deadlock must fail the test, not hang the run: each reproduction runs in a child
# interpreter that is killed after this many seconds.
CHILD_TIMEOUT_S = 30


def run_child(script: str) -> str:
    """Runs `script` in a fresh interpreter; returns its stdout, which must end in ok."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(script)],
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child hung for {CHILD_TIMEOUT_S} s (deadlock)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("ok"), done.stdout + done.stderr
    return done.stdout


def test_del_that_calls_the_ledger_runs_after_the_lock() -> None:
    """The ledger holds the only reference to the blocks; their `__del__` calls back into
    the ledger when poll_split or register_many's refusal drops them."""
    run_child(
        """
        import kvdrain
        led = kvdrain.Ledger(16)
        seen = []
        class Blocks:
            def __del__(self):
                seen.append(len(led))
        led.register("r", Blocks(), 1)
        led.feed({"p": [b"r:1"]})
        done, others = led.poll_split()
        assert done == ["r"] and others == [] and seen == [0], (done, others, seen)
        try:
            led.register_many(["a", "\\ud800"], [Blocks(), Blocks()], 1)
        except kvdrain.KvdrainError:
            pass
        else:
            raise AssertionError("a lone surrogate was accepted")
        assert len(led) == 1 and len(seen) == 2, seen
        print("ok")
        """
    )


def test_del_that_takes_a_pool_lock_while_another_thread_polls() -> None:
    """A real engine's shape: the blocks' `__del__` returns them to a pool under a
    `threading.Lock`; another thread holds that lock while it calls `poll`."""
    run_child(
        """
        import threading
        import kvdrain
        led = kvdrain.Ledger(16)
        pool_lock = threading.Lock()
        in_del = threading.Event()
        pool = []
        class Blocks:
            def __init__(self, n):
                self.n = n
            def __del__(self):
                in_del.set()
                with pool_lock:
                    pool.append(self.n)
        def holder():
            with pool_lock:
                in_del.wait()
                led.poll()  # needs the engine lock
        led.register("r", Blocks(7), 1)
        led.feed({"p": [b"r:1"]})
        t = threading.Thread(target=holder)
        t.start()
        while not pool_lock.locked():
            pass
        done, _ = led.poll_split()
        t.join()
        assert done == ["r"] and pool == [7], (done, pool)
        print("ok")
        """
    )


def completions_then(exc: BaseException) -> Iterator[bytes]:
    yield b"r1:1"
    yield b"HB:x"
    yield b"r2:1"
    raise exc


@pytest.mark.parametrize("exc", [ValueError("broken iterable"), KeyboardInterrupt()])
def test_an_iterable_that_raises_loses_nothing_before_it(exc: BaseException) -> None:
    led = Ledger(16)
    led.register("r1", None, 1)
    led.register("r2", None, 1)
    led.register("r3", None, 1)
    with pytest.raises(type(exc)) as raised:
        led.feed({"a": [b"r3:1"], "p": completions_then(exc)})
    assert raised.value is exc  # the very exception, not a wrapper
    assert sorted(d.request_id for d in led.poll()) == ["r1", "r2", "r3"]
    counters = led.counters()
    assert counters["completions"] == 3 and counters["not_bytes"] == 0
    # The producer-bound message read before the error comes back on the exception.
    assert getattr(raised.value, "kvdrain_producer_bound") == [("p", b"HB:x")]


def test_an_items_iterable_that_raises_loses_nothing_before_it() -> None:
    class Pairs:
        def items(self) -> Iterator[tuple[str, list[bytes]]]:
            yield ("a", [b"r1:1"])
            raise KeyboardInterrupt

    led = Ledger(16)
    led.register("r1", None, 1)
    with pytest.raises(KeyboardInterrupt):
        led.feed(Pairs())  # type: ignore[arg-type]
    assert [d.request_id for d in led.poll()] == ["r1"]


def test_refused_registrations_use_up_no_agent_numbers() -> None:
    """70 000 refused registrations, each naming producers never seen before, leave named
    registration with a new producer working."""
    led = Ledger(16)
    led.register("taken", None, 1)
    for i in range(70_000):
        with pytest.raises(kvdrain.DuplicateRequestError):
            led.register("taken", None, [f"dup-{i}"])
    for i in range(1_000):
        names = [f"many-{i}-{k}" for k in range(led.max_edges + 1)]
        with pytest.raises(kvdrain.InvalidExpectError):
            led.register("r", None, names)
        with pytest.raises(kvdrain.InvalidExpectError):
            led.register("r", None, [f"twice-{i}", f"twice-{i}"])
    full = Ledger(1)
    full.register("only", None, 1)
    for i in range(70_000):
        with pytest.raises(kvdrain.FullError):
            full.register_many(["x"], [None], [f"full-{i}"])
    led.register("r", None, ["fresh-producer"])
    led.feed({"fresh-producer": [b"r:1"]})
    assert [(d.kind, d.request_id) for d in led.poll()] == [("completed", "r")]


def test_names_of_accepted_registrations_stay_after_a_later_refusal() -> None:
    led = Ledger(2)
    led.register("a", None, ["p0"])
    with pytest.raises(kvdrain.DuplicateRequestError):
        led.register("a", None, ["p0", "p1"])
    with pytest.raises(kvdrain.DuplicateRequestError):
        led.register_many(["b", "a"], [None, None], ["p1"])  # b accepted, a refused
    led.feed({"p0": [b"a:1"], "p1": [b"b:1"]})
    assert sorted(d.request_id for d in led.poll()) == ["a", "b"]


SURROGATE = "\ud800"


def test_lone_surrogates_raise_kvdrain_errors() -> None:
    led = Ledger(16)
    with pytest.raises(kvdrain.InvalidRequestIdError, match="UTF-8") as e:
        led.register(SURROGATE, None, 1)
    assert e.value.request_id == SURROGATE
    with pytest.raises(kvdrain.InvalidRequestIdError, match="UTF-8"):
        led.register_many(["ok", "x" + SURROGATE], [None, None], 1)
    assert len(led) == 1  # the one before it stays registered
    with pytest.raises(kvdrain.InvalidExpectError, match="UTF-8"):
        led.register("r", None, ["p", SURROGATE])
    with pytest.raises(kvdrain.InvalidRequestIdError, match="UTF-8"):
        led.abort(SURROGATE)
    with pytest.raises(kvdrain.InvalidArgumentError, match="UTF-8"):
        led.fence(SURROGATE)
    with pytest.raises(kvdrain.InvalidRequestIdError, match="UTF-8"):
        PushPlan(SURROGATE, p_tp=1, d_tp=1, d_agents=["D0"], tp_rank=0)
    # A surrogate in a feed key is a sender no registration named, not an error.
    led.feed({SURROGATE: [b"ok:1"]})
    assert [d.request_id for d in led.poll()] == ["ok"]


@pytest.mark.parametrize(
    "rid", ["", "HB", "HB:x", "PUSH_REG:x", "PUSH_FAIL:x", "PUSH_FAIL", "PUSH_CANCEL:x"]
)
def test_ids_that_can_never_complete_are_refused(rid: str) -> None:
    led = Ledger(16)
    with pytest.raises(kvdrain.InvalidRequestIdError) as e:
        led.register(rid, None, 1)
    assert e.value.request_id == rid
    with pytest.raises(kvdrain.InvalidRequestIdError):
        led.register_many(["fine", rid], [None, None], 1)
    assert len(led) == 1 and led.counters()["registered"] == 1
    with pytest.raises(kvdrain.InvalidRequestIdError):
        PushPlan(rid, p_tp=1, d_tp=1, d_agents=["D0"], tp_rank=0)


def test_ids_with_colons_and_near_prefixes_are_accepted() -> None:
    led = Ledger(16)
    ids = ["a:b", "HBx", "PUSH_REGx", "xHB:", "PUSH_FAILED:1", "PUSH_CANCELx"]
    for rid in ids:
        led.register(rid, None, 1)
        led.feed({"p": [f"{rid}:1".encode()]})
    assert [d.request_id for d in led.poll()] == ids


def test_out_of_range_ints_raise_kvdrain_errors() -> None:
    with pytest.raises(kvdrain.ConfigError, match="capacity"):
        Ledger(-1)
    with pytest.raises(kvdrain.ConfigError, match="deadline_ms"):
        Ledger(16, deadline_ms=-1)
    with pytest.raises(kvdrain.ConfigError, match="seed"):
        Ledger(16, seed=2**64)
    led = Ledger(16)
    with pytest.raises(kvdrain.InvalidArgumentError, match="deadline_ms"):
        led.register("r", None, 1, deadline_ms=-5)
    with pytest.raises(kvdrain.InvalidArgumentError, match="now_ms"):
        led.advance(-1)
    with pytest.raises(kvdrain.InvalidArgumentError, match="now_ms"):
        led.advance(2**64)
    with pytest.raises(kvdrain.TopologyError, match="p_tp"):
        PushPlan("r", p_tp=-1, d_tp=1, d_agents=["D0"], tp_rank=0)
    plan = PushPlan("r", p_tp=1, d_tp=1, d_agents=["D0"], tp_rank=0)
    for bad in (-1, 2**100):
        with pytest.raises(kvdrain.PlanError, match="d_rank"):
            plan.posted(bad)
        with pytest.raises(kvdrain.PlanError, match="d_rank"):
            plan.may_post(bad)
    assert len(led) == 0


def test_expect_that_is_not_a_count_says_so() -> None:
    led = Ledger(16)
    with pytest.raises(kvdrain.InvalidExpectError, match=str(2**100)):
        led.register("r", None, 2**100)
    with pytest.raises(kvdrain.InvalidExpectError, match="1..=64"):
        led.register("r", None, -3)
    with pytest.raises(kvdrain.InvalidExpectError, match="bool"):
        led.register("r", None, True)
    with pytest.raises(kvdrain.InvalidExpectError, match="bool"):
        led.register_many(["r"], [None], False)
    assert len(led) == 0


@pytest.mark.parametrize("value", [bytearray(b"r:1"), "r:1", memoryview(b"r:1")])
def test_a_bytes_like_or_str_value_is_one_message_not_a_sequence(value: object) -> None:
    led = Ledger(16)
    led.register("r", None, 1)
    led.feed({"p": value})  # type: ignore[dict-item]
    counters = led.counters()
    assert counters["not_bytes"] == 1 and counters["malformed"] == 0
    assert led.poll() == []
    led.feed({"p": [value, b"r:1"]})  # type: ignore[list-item]
    assert led.counters()["not_bytes"] == 2
    assert [d.request_id for d in led.poll()] == ["r"]


def test_one_bytes_value_is_one_message() -> None:
    led = Ledger(16)
    led.register("r", None, 1)
    led.feed({"p": b"r:1"})  # type: ignore[dict-item]
    assert [d.request_id for d in led.poll()] == ["r"]


BUILD_UNDER_A_LIMIT = """
import resource, sys
import kvdrain

def vm_size():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) << 10
    raise AssertionError("no VmSize")

soft, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (vm_size() + (int(sys.argv[1]) << 20), hard))
try:
    led = kvdrain.Ledger(65536)
except kvdrain.AllocError as e:
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    assert isinstance(e, MemoryError) and "ledger" in str(e), e
    print("alloc")
else:
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    led.register("r", None, 1)
    led.feed({"p": [b"r:1"]})
    assert [d.kind for d in led.poll()] == ["completed"]
    print("built")
"""


def test_no_memory_for_a_ledger_raises_alloc_error() -> None:
    """Under an address-space limit a little above what the interpreter uses, building a
    65 536-request ledger (13.8 MiB of tables, 5 MiB of keys, a construction thread
    with a 59 MiB stack) raises AllocError (a MemoryError) instead of aborting, whichever
    part does not fit; with room enough it is built."""
    outcomes = {}
    for headroom_mib in (4, 16, 40, 64, 72, 96, 160):
        try:
            done = subprocess.run(
                [sys.executable, "-c", BUILD_UNDER_A_LIMIT, str(headroom_mib)],
                capture_output=True,
                text=True,
                timeout=CHILD_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"building under a {headroom_mib} MiB limit hung")
        assert done.returncode == 0, (headroom_mib, done.returncode, done.stderr)
        outcomes[headroom_mib] = done.stdout.strip()
    assert outcomes[4] == "alloc" and outcomes[160] == "built", outcomes
    assert set(outcomes.values()) == {"alloc", "built"}, outcomes


def test_hammer_three_threads_hostile_inputs_and_finalizers() -> None:
    """A writer, an engine and a collector thread on one ledger with random and hostile
    inputs and finalizers that take locks (tests/unit/hammer_child.py), for
    KVDRAIN_HAMMER_SECONDS (20) in a child process: no deadlock, no exception but the
    documented ones, every decision sequence legal."""
    seconds = float(os.environ.get("KVDRAIN_HAMMER_SECONDS", "20"))
    child = pathlib.Path(__file__).with_name("hammer_child.py")
    try:
        done = subprocess.run(
            [sys.executable, str(child), str(seconds), "11"],
            capture_output=True,
            text=True,
            timeout=seconds + 60,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the hammer hung (deadlock)")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("ok"), done.stdout + done.stderr
    print(done.stdout)


def test_a_batch_longer_than_a_chunk_feeds_each_message_once() -> None:
    """A batch is read and fed in chunks of 65 536 messages: across chunk boundaries,
    and with an exception after them, every message is fed exactly once."""
    led = Ledger(16)
    led.register("r", None, 3)
    msgs = [b"x:1"] * 70_000 + [b"r:1", b"HB:a"] + [b"y:1"] * 70_000 + [b"r:1"]

    def gen() -> Iterator[bytes]:
        yield from msgs
        yield b"r:1"
        raise ValueError("after the chunks")

    with pytest.raises(ValueError) as e:
        led.feed({"q": [b"z:1"] * 65_535 + [b"HB:b"], "p": gen()})
    assert getattr(e.value, "kvdrain_producer_bound") == [("q", b"HB:b"), ("p", b"HB:a")]
    counters = led.counters()
    assert counters["unknown"] == 140_000 + 65_535 and counters["completions"] == 3
    assert [d.kind for d in led.poll()] == ["completed"]
