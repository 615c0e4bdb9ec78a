"""The closed receives' memory (:mod:`kvdrain.vllm._closed_ids`, no vLLM): how long an id
is kept, how much is held, and a question asked while the engine thread closes."""

from __future__ import annotations

import sys
import threading

import pytest

from kvdrain.vllm._closed_ids import ClosedIds


@pytest.mark.parametrize("asked_every", [1, 7, 1_000, None])
def test_an_id_is_kept_for_at_least_kept_later_closes_and_the_memory_is_bounded(
    asked_every: int | None,
) -> None:
    kept = 64
    ids = ClosedIds(kept)
    closed: list[str] = []
    for i in range(1_000):
        rid = f"r{i}"
        ids.close(rid)
        closed.append(rid)
        if asked_every is not None and i % asked_every == 0:
            assert "never" not in ids
            # The newest `kept + 1`: the id itself and `kept` closes after it.
            assert all(r in ids for r in closed[-kept - 1 :])
        assert len(ids) <= 3 * kept + 3  # the deque (kept + 1), two sets (kept + 1 each)
    assert all(r in ids for r in closed[-kept - 1 :])
    assert len(ids) <= 2 * kept + 2  # all moved into the sets by the question
    if asked_every == 1:
        assert closed[-3 * kept] not in ids  # the sets forget


def test_an_id_closed_again_is_kept_from_its_last_close() -> None:
    ids = ClosedIds(4)
    ids.close("a")
    for i in range(3):
        ids.close(f"x{i}")
        assert "a" in ids  # moved into the sets
    ids.close("a")
    for i in range(4):
        ids.close(f"y{i}")
    assert "a" in ids


def test_kept_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ClosedIds(0)


def test_every_id_closed_before_a_question_is_found_while_the_closer_runs() -> None:
    # One thread closes (the engine thread); four ask (writer threads), each about one of
    # the two ids closed last before its question began: most often still in the deque,
    # which another asker may be emptying at that moment.
    kept, total = 16, 100_000
    ids = ClosedIds(kept)
    done = [0]  # ids closed so far, written by the closer after each close
    missed: list[tuple[int, int]] = []
    stop = threading.Event()

    def closer() -> None:
        for i in range(total):
            ids.close(f"r{i}")
            done[0] = i + 1
        stop.set()

    def asker(seed: int) -> None:
        n = seed
        while not stop.is_set():
            upto = done[0]
            if upto == 0:
                continue
            i = upto - 1 - (n & 1)
            n += 1
            # Missed: not found, and not `kept` closes old when the answer came.
            if i >= 0 and f"r{i}" not in ids and done[0] - i <= kept:
                missed.append((i, done[0]))

    threads = [threading.Thread(target=closer)] + [
        threading.Thread(target=asker, args=(s,)) for s in range(4)
    ]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the threads interleave between bytecodes, not every 5 ms
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not missed, missed[:5]
