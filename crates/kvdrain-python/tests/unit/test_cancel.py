"""``PUSH_CANCEL:``, the consumer's word that it gave a request up: the exact bytes, the
parse back, and what the consumer's own ledger does when one reaches it."""

from __future__ import annotations

import pytest

import kvdrain
from kvdrain import Ledger, encode_cancel, parse_cancel


def test_golden_bytes() -> None:
    assert encode_cancel("cmpl-42-0") == bytes.fromhex(
        "505553485f43414e43454c3a" "636d706c2d34322d30"
    )
    assert encode_cancel("cmpl-42-0") == b"PUSH_CANCEL:cmpl-42-0"


@pytest.mark.parametrize("rid", ["r", "a:b:2", "cmpl-uuid-0-deadbeef", "\u00fc:\u00f1", "HB:x"])
def test_every_id_reads_back_whole(rid: str) -> None:
    assert parse_cancel(encode_cancel(rid)) == rid


@pytest.mark.parametrize(
    "message",
    [
        b"PUSH_CANCEL:",  # no id
        b"PUSH_CANCEL:r\xff",  # not UTF-8
        b"PUSH_FAIL:r:1",
        b"r:1",
        b"HB:r",
        b"PUSH_REG:\x81\xa1x",
        b"push_cancel:r",
        b"",
        "PUSH_CANCEL:r",  # not bytes
        None,
        7,
    ],
)
def test_anything_else_is_none_and_never_raises(message: object) -> None:
    assert parse_cancel(message) is None


def test_an_empty_id_is_refused() -> None:
    with pytest.raises(kvdrain.InvalidRequestIdError):
        encode_cancel("")


def test_a_ledger_hands_a_cancel_back_as_producer_bound() -> None:
    """A rank that is a consumer and a producer: the cancel is not a notice for its
    ledger; the feed gives it back with the other producer-bound messages, and a tracked
    request with the same id is untouched."""
    led = Ledger(64)
    led.register("r", blocks=[1], expect=1)
    back = led.feed({"d0": [encode_cancel("r"), b"HB:p-r"]})
    assert back == [("d0", b"PUSH_CANCEL:r"), ("d0", b"HB:p-r")]
    assert led.counters()["not_for_consumer"] == 2
    assert led.poll() == []
    led.feed({"p0": [b"r:1"]})
    assert [d.kind for d in led.poll()] == ["completed"]


def test_a_completion_that_would_read_as_a_cancel_cannot_be_planned() -> None:
    """Ids whose completion would start with ``PUSH_CANCEL:`` are refused where vLLM's
    ids enter the producer side, as those that would read as ``PUSH_FAIL:`` are."""
    with pytest.raises(kvdrain.InvalidRequestIdError):
        kvdrain.PushPlan("PUSH_CANCEL:x", p_tp=1, d_tp=1, d_agents=["D0"], tp_rank=0)
