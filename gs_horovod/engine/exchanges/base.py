"""The interface every exchange implements (:class:`Exchange`), what it is given
(:class:`Context`: arrays, collectives, options, wire format, hash keys; :class:`ExchangePlan`:
the plan's groups), what it declares (:class:`Collective`), what it returns
(:class:`Nominated`), and the rank-ordered union sum the pair exchanges share.

This module imports nothing of the engine: the step, the plan and the options import the
exchanges, never the other way round."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Protocol

from ...array_ops import Array, ArrayOps
from ...transports.protocol import Collectives

if TYPE_CHECKING:
    from ...codecs import PairCodec


@dataclass(frozen=True)
class Group:
    """A run of coordinates [start, start + size) of the step's vector, selected together:
    ``k`` applied, ``cols`` sketch columns, ``fed`` coordinates each rank feeds the exchange
    (L·k, or size without pre-filter), ``nominated`` coordinates the exchange nominates (m·k,
    m the option ``candidates``; at most L·k under the exchanges that send pairs)."""

    start: int
    size: int
    k: int
    cols: int
    fed: int
    nominated: int


class ExchangePlan(NamedTuple):
    """What an exchange reads of a step's plan: its ``groups``, the length ``total`` = D of the
    step's vector, the number of ``ranks`` P, and ``whole``: whether the step applies every
    candidate's estimate as it is (``apply="all"`` without the exact round), so that an exchange
    may nominate more than m·k (the allgather nominates its whole union)."""

    groups: tuple[Group, ...]
    total: int
    ranks: int
    whole: bool = False


class Options(Protocol):
    """The options an exchange reads (:class:`~gs_horovod.engine.config.GsConfig` is one):
    sketch ``rows``, ``sketch_dtype`` ("float16" or "float32"), and the wire format ``codec``."""

    rows: int
    sketch_dtype: str

    @property
    def codec(self) -> PairCodec: ...


class Context(NamedTuple):
    """What an exchange works with on one rank: array ``ops``, the collectives ``comm`` (P =
    ``comm.size`` ranks), the ``config`` (:class:`Options`), the wire format ``codec`` of the
    pairs (``config.codec``), and the sketch hash ``keys``
    (:func:`gs_horovod.kernels.hashing.hash_keys` of the seed, the same on every rank)."""

    ops: ArrayOps
    comm: Collectives
    config: Options
    codec: PairCodec
    keys: Any


class Collective(NamedTuple):
    """One collective an exchange issues at each compressed step: ``name``, the name it hands
    the transport; ``kind``, how the cost model prices it
    (:mod:`gs_horovod.transports.collective_cost`: "allgather", "alltoall", or "allreduce" for
    the transport's allreduce, a ring or a tree as the plan's ``allreduce_kind`` says);
    ``counts``: the :class:`~gs_horovod.engine.payload.Payload` field (and
    :class:`~gs_horovod.engine.state.CommStats` ``<counts>_bytes``) its bytes are counted in.
    Collectives of one exchange that share a field carry equal shares of it."""

    name: str
    kind: str
    counts: str


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

    Declared by each exchange:

    - ``name``: the ``exchange=`` option;
    - ``collectives``: the :class:`Collective` s it issues at each step, in issue order (the
      step's exact round and small tensors are the step's own: "exact" and "dense");
    - ``sends_pairs``: it sends (index, value) pairs of the pre-filtered sets in the wire format
      (:mod:`gs_horovod.codecs`), so every rank computes them, a group nominates at most what it
      feeds, and a vector of the format's ``max_coordinates`` or more cannot be sent;
    - ``exact_by_default``: whether the exact round runs unless the options say otherwise;
    - ``auto_worth``: under ``exchange="auto"``, what one of its wire bytes is worth against the
      others' (delivered gradient mass, measured): "auto" runs, of the exchanges with a worth that
      can send the step's vector, the one with the fewest wire bytes / worth (the first of
      :data:`~gs_horovod.engine.exchanges.EXCHANGES` on a tie), and the first without a worth
      only where none of them can.
    """

    name: str
    collectives: tuple[Collective, ...] = ()
    sends_pairs: bool = False
    exact_by_default: bool = False
    auto_worth: Optional[float] = None

    @property
    def byte_kinds(self) -> tuple[str, ...]:
        """The payload fields its collectives count into, in issue order, each once."""
        return tuple(dict.fromkeys(c.counts for c in self.collectives))

    def default_apply(self, exact: bool) -> str:
        """What is applied when ``apply`` is not given: the top k of the candidates."""
        return "topk"

    def payload(self, plan: ExchangePlan, config: Options, measured: Optional[tuple[Any, Any]]) -> dict[str, int]:
        """The bytes one rank hands to this exchange's collectives in one step, by byte kind (its
        :attr:`byte_kinds`: fields of :class:`~gs_horovod.engine.payload.Payload`; the exact
        round and the small tensors are the step's); ``measured``: (:attr:`Nominated.routed`,
        :attr:`Nominated.gathered`), or None for the planned bytes."""
        raise NotImplementedError

    def nominate(self, ctx: Context, plan: ExchangePlan, a: Array, fed: list[Array]) -> Nominated:
        """Each group's candidates from a (D,) f32 and ``fed``, each group's pre-filtered
        indices (L·k,) int64 in the step's vector (empty: no pre-filter, every coordinate),
        issuing :attr:`collectives` through ``ctx.comm`` (collective: every rank calls it)."""
        raise NotImplementedError


def union_sum(ctx: Context, idx: Array, vals: Array, counts: Array, universe: int) -> tuple[Array, Array]:
    """(union (u,) int64 ascending, s (u,) f32): the coordinates of every rank's pairs (rank
    r's ``counts[r]`` pairs, in rank order, each rank's indices distinct and below
    ``universe``) and their sums added in rank order, divided by P when the transport's
    ``allreduce`` averages (as it would)."""
    union, sums = ctx.ops.union_sum(idx, vals, counts, universe)
    return union, sums / ctx.comm.size if ctx.comm.averages else sums
