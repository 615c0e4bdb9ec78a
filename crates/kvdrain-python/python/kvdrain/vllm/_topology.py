"""Who writes which rank, in vLLM's names (vLLM-free).

The one rule for which producer ranks write a consumer rank is the core's
(``Topology::producers_of``, bound as :func:`kvdrain.producers_of`); this module turns
vLLM's view of a request (its block ids, its remote engine's agents by ``(pp_stage,
tp_rank)``, the producer's TP and PP sizes) into what the ledger registers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvdrain import TopologyError, producers_of

__all__ = ["agent_name", "block_groups", "expected_edges"]


def agent_name(agent: str | bytes) -> str:
    """A remote agent's name as ``str``: NIXL's Python API returns the names it loads
    (``add_remote_agent``) as ``bytes``, and keys notification batches by ``str``."""
    if isinstance(agent, bytes):
        return agent.decode("utf-8", "replace")
    return agent


def block_groups(block_ids: object) -> list[list[int]]:
    """``BlockIds`` (one list per KV cache group, or one flat list) as lists of ints;
    none at all (``[]``) when it holds no block."""
    # vLLM's own shape first, a tuple of lists (most often one): this runs once per
    # receive registered, and a comprehension costs more than the copy itself.
    if type(block_ids) is tuple and len(block_ids) == 1 and type(block_ids[0]) is list:
        return [block_ids[0][:]] if block_ids[0] else []
    # list and tuple next: an ABC's isinstance is the slowest step of a registration.
    if not block_ids or not isinstance(block_ids, (list, tuple, Sequence)):
        return []
    if isinstance(block_ids[0], int):
        return [list(block_ids)]
    groups = [list(g) for g in block_ids]
    return groups if any(groups) else []


def expected_edges(
    *,
    d_rank: int,
    d_tp: int,
    p_tp: int,
    p_pp: int,
    mla: bool,
    agents: Mapping[tuple[int, int], str | bytes] | None,
) -> int | list[str]:
    """What consumer rank ``d_rank`` waits for from one producer engine: the producer
    agents that write it (named edges: each must send exactly one notice) when the
    handshake gave every one of them (``agents``, by ``(pp_stage, tp_rank)``) and the
    layout is one vLLM writes rank to rank; else vLLM's count, ``p_pp × max(1, p_tp //
    d_tp)`` (MLA, no handshake yet, or a layout the core refuses)."""
    count = p_pp * max(1, p_tp // d_tp)
    if mla or agents is None:
        return count
    try:
        ranks = producers_of(d_rank, p_tp=p_tp, d_tp=d_tp, p_pp=p_pp)
    except TopologyError:
        return count
    names = [agents.get(rank) for rank in ranks]
    named = [agent_name(n) for n in names if n is not None]
    if len(named) != len(names) or len(set(named)) != count:
        return count
    return named
