"""vLLM's view of a receive in the ledger's terms (:mod:`kvdrain.vllm._topology`, no
vLLM): the block groups a registration holds, and what a rank expects of a producer
engine."""

from __future__ import annotations

from kvdrain.vllm._topology import block_groups, expected_edges


def test_block_groups_are_copies_of_every_shape_and_none_without_a_block() -> None:
    one = [4, 5]
    for given, want in (
        ((one,), [[4, 5]]),  # vLLM's BlockIds, one KV cache group
        (([1], [2, 3]), [[1], [2, 3]]),  # two groups
        (([], [7]), [[], [7]]),  # one group empty, the other not
        ([[1], (2, 3)], [[1], [2, 3]]),
        ([8, 9], [[8, 9]]),  # one flat list
        ((8, 9), [[8, 9]]),
        (([],), []),  # no block at all
        (([], []), []),
        ((), []),
        ([], []),
        (None, []),
    ):
        assert block_groups(given) == want, given
    groups = block_groups((one,))
    one.append(6)  # vLLM's list changes after the registration: the ledger's does not
    assert groups == [[4, 5]]


def test_a_rank_names_the_producer_agents_that_write_it_or_counts_them() -> None:
    agents: dict[tuple[int, int], str | bytes] = {(0, 0): "P0", (0, 1): b"P1"}
    assert expected_edges(d_rank=0, d_tp=1, p_tp=2, p_pp=1, mla=False, agents=agents) == [
        "P0",
        "P1",
    ]
    # No handshake yet, MLA, or an agent missing: vLLM's count.
    assert expected_edges(d_rank=0, d_tp=1, p_tp=2, p_pp=1, mla=False, agents=None) == 2
    assert expected_edges(d_rank=0, d_tp=1, p_tp=2, p_pp=1, mla=True, agents=agents) == 2
    del agents[(0, 1)]
    assert expected_edges(d_rank=0, d_tp=1, p_tp=2, p_pp=1, mla=False, agents=agents) == 2
