"""The interface every exchange implements (:class:`Exchange`), what it returns
(:class:`Nominated`), and the rank-ordered union sum the pair exchanges share."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Optional

from ...array_ops import Array
from ..payload import Payload

if TYPE_CHECKING:
    from ..config import GsConfig
    from ..plan import Plan
    from ..step import GsSgd


class Nominees(NamedTuple):
    """One group's candidates, the coordinates its exchange nominated: ``idx`` (m·k,) int64
    ascending (in the step's vector), ``est`` (m·k,) f32 their estimates (the merged sketch's,
    or exact partial sums)."""

    idx: Array
    est: Array


class Nominated(NamedTuple):
    """What an exchange returns: ``groups``, one :class:`Nominees` per plan group; ``finite``,
    a predicate, false when a merged payload held NaN/Inf (the same on every rank); ``sent``:
    what this rank gave to each candidate (m·k,) f32, the groups' candidates laid end to end,
    when it is not simply a at the candidates it fed (a wire format that rounds what it sends),
    else None; ``routed`` / ``gathered``: the bytes this rank handed to an alltoall / an
    allgather of data-dependent size, counted by the adapters (0 where the plan fixes them)."""

    groups: list[Nominees]
    finite: Any
    sent: Optional[Array]
    routed: Any
    gathered: Any


class Exchange:
    """How the ranks agree on each group's candidates from every rank's error-fed vector a.

    ``name``: the ``exchange=`` option; ``sends_pairs``: it sends (index, value) pairs of the
    pre-filtered sets in the wire format (:mod:`gs_horovod.codecs`), so every rank computes
    them, a group nominates at most what it feeds, and a vector of the format's
    ``max_coordinates`` or more cannot be sent; ``exact_by_default``: whether the exact round
    runs unless the options say otherwise."""

    name: str
    sends_pairs: bool = False
    exact_by_default: bool = False

    def default_apply(self, exact: bool) -> str:
        """What is applied when ``apply`` is not given: the top k of the candidates."""
        return "topk"

    def payload(self, plan: Plan, config: GsConfig, measured: Optional[tuple[Any, Any]]) -> Payload:
        """This exchange's own fields of one step's :class:`Payload` (the exact round and the
        small tensors are the plan's); ``measured``: (:attr:`Nominated.routed`,
        :attr:`Nominated.gathered`), or None for the planned bytes."""
        raise NotImplementedError

    def nominate(self, sgd: GsSgd, plan: Plan, a: Array, fed: list[Array]) -> Nominated:
        """Each group's candidates from a (D,) f32 and ``fed``, each group's pre-filtered
        indices (L·k,) int64 in the step's vector (empty: no pre-filter, every coordinate)."""
        raise NotImplementedError


def union_sum(sgd: GsSgd, idx: Array, vals: Array, counts: Array) -> tuple[Array, Array]:
    """(union (u,) int64 ascending, s (u,) f32): the coordinates of every rank's pairs (rank
    r's ``counts[r]`` pairs, in rank order, each rank's indices distinct) and their sums added
    in rank order, divided by P when the transport's ``allreduce`` averages (as it would)."""
    union, sums = sgd.ops.union_sum(idx, vals, counts)
    return union, sums / sgd.comm.size if sgd.comm.averages else sums
