"""The collective cost model: bytes on the wire, one function per collective algorithm, written
once: what every method's byte count, the equal-bytes comparisons and the step-time model
(``scripts/bench/cost_model.py``) use. (Not the pair codec that ``wire=`` chooses.)

A collective is a ``(kind, n)`` pair, n = the payload bytes one rank contributes:

- ``allreduce``  ring (reduce-scatter + allgather): 2(P−1) rounds of n/P
- ``tree``       recursive-doubling allreduce: ⌈log2 P⌉ rounds of n
- ``allgather``  ring: P−1 rounds of n
- ``alltoall``   pairwise exchange: P−1 rounds of n/P (n/P to each other rank, n/P from each)
- ``pairwise``   one exchange with one partner (a recursive-doubling round): 1 round of n
- ``gather``     star, every rank to rank 0: rank 0 receives (P−1)·n
- ``broadcast``  binomial tree from rank 0: ⌈log2 P⌉ rounds of n through rank 0

``wire_bytes`` is what the busiest rank sends plus receives; ``rounds`` the bytes its link
carries in each round in turn (the cost model charges α + bytes/β per round).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

KINDS = ("allreduce", "tree", "allgather", "alltoall", "pairwise", "gather", "broadcast")
ALLREDUCE_KINDS = ("allreduce", "tree")
"""The kinds a transport's allreduces can run as (its ``allreduce_kind``): a ring, recursive doubling."""
Collective = tuple[str, float]


def rounds(kind: str, nbytes: float, ranks: int) -> list[float]:
    """The bytes of each round the busiest rank's link carries in turn for one collective."""
    P = ranks
    if kind not in KINDS:
        raise ValueError(f"collective kind must be one of {KINDS}, got {kind!r}")
    if P <= 1:
        return []
    if kind == "allreduce":
        return [nbytes / P] * (2 * (P - 1))
    if kind in ("tree", "broadcast"):
        return [nbytes] * math.ceil(math.log2(P))
    if kind == "allgather":
        return [nbytes] * (P - 1)
    if kind == "alltoall":
        return [nbytes / P] * (P - 1)
    if kind == "pairwise":
        return [nbytes]
    return [(P - 1) * nbytes]  # gather


def wire_bytes(kind: str, nbytes: float, ranks: int) -> float:
    """Bytes sent plus received by the busiest rank for one collective of ``nbytes`` per rank:
    allreduce 4(P−1)/P·n, tree 2⌈log2 P⌉·n, allgather 2(P−1)·n, alltoall 2(P−1)/P·n (balanced:
    see :meth:`Traffic.add` for a measured one), pairwise 2n, gather (P−1)·n (received by rank
    0), broadcast ⌈log2 P⌉·n (sent by rank 0)."""
    one_way = sum(rounds(kind, nbytes, ranks))
    return one_way if kind in ("gather", "broadcast") else 2 * one_way


def total_wire_bytes(collectives: list[Collective], ranks: int) -> float:
    """:func:`wire_bytes` summed over a step's collectives."""
    return sum(wire_bytes(kind, n, ranks) for kind, n in collectives)


@dataclass
class Traffic:
    """The collectives a rank issued, counted as it issues them.

    steps: steps finished (``end_step``); payload / wire: cumulative payload bytes handed to
    collectives and :func:`wire_bytes` through this rank's busiest position; last_step: the
    (kind, n) collectives of the last finished step, in order (the cost model's input);
    even_wire: the wire bytes had every collective been split evenly (:func:`wire_bytes`), so
    ``wire / even_wire`` is what uneven alltoall loads cost; worst_over_even: the largest
    such ratio of one collective (1 if none was measured)."""

    ranks: int
    steps: int = 0
    payload: float = 0.0
    wire: float = 0.0
    last_step: list[Collective] = field(default_factory=list)
    even_wire: float = 0.0
    worst_over_even: float = 1.0
    _current: list[Collective] = field(default_factory=list)

    def add(self, kind: str, nbytes: float, wire: Optional[float] = None) -> None:
        """Counts one collective of ``nbytes`` payload; ``wire``: its measured bytes through the
        busiest rank when the transport knows them (an alltoall's uneven loads), else
        :func:`wire_bytes`."""
        self._current.append((kind, float(nbytes)))
        self.payload += nbytes
        even = wire_bytes(kind, nbytes, self.ranks)
        self.even_wire += even
        if wire is not None and even > 0:
            self.worst_over_even = max(self.worst_over_even, wire / even)
        self.wire += even if wire is None else wire

    def end_step(self) -> None:
        """Closes the step: the collectives counted since the last call become ``last_step``."""
        self.last_step, self._current = self._current, []
        self.steps += 1

    def per_step(self) -> tuple[float, float]:
        """(payload, wire) bytes per finished step, mean so far."""
        steps = max(1, self.steps)
        return self.payload / steps, self.wire / steps
