"""The plan of a step (:class:`Plan`): where each tensor sits in the step's vector, the groups
that are compressed together, the exchange that runs them at this P (``exchange="auto"``'s
rule, from what the exchanges declare), and the bytes one rank hands to collectives."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

from ..codecs import CODECS
from ..transports.collective_cost import ALLREDUCE_KINDS, total_wire_bytes
from .config import GsConfig, check_choice
from .density import DENSE
from .exchanges import EXCHANGES
from .exchanges.base import ExchangePlan, Group
from .payload import Payload, collectives_of


def starts_of(sizes: tuple[int, ...]) -> list[int]:
    """The offsets of pieces of ``sizes`` laid end to end."""
    out, start = [], 0
    for d in sizes:
        out.append(start)
        start += d
    return out


@dataclass(frozen=True)
class Plan:
    """Where each tensor of a step sits, and the groups that are compressed.

    names / sizes / offsets: the compressed tensors (sorted by name) in the step's vector of
    ``total`` = D coordinates; dense_names / dense_sizes: the tensors below ``min_size``, sent
    exactly (appended to the exact round, or averaged as they are); groups: see :class:`Group`;
    exchange: the name of the exchange (:data:`EXCHANGES`) the config chose for ``ranks`` (P)
    ranks; exact / apply: the config's for that exchange (:meth:`GsConfig.exact_for`,
    :meth:`GsConfig.apply_for`); allreduce_kind: the :mod:`gs_horovod.transports.collective_cost` kind the
    transport's allreduces run as (:data:`~gs_horovod.transports.collective_cost.ALLREDUCE_KINDS`),
    which prices them in :meth:`collectives` and "auto"; level: the density
    ``ratio="auto"`` chose (:mod:`~gs_horovod.engine.density`), None otherwise.
    """

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    offsets: tuple[int, ...]
    groups: tuple[Group, ...]
    total: int
    dense_names: tuple[str, ...] = ()
    dense_sizes: tuple[int, ...] = ()
    exchange: str = "sketch"
    exact: bool = True
    apply: str = "topk"
    ranks: int = 1
    allreduce_kind: str = "allreduce"
    level: Optional[float] = None

    @classmethod
    def build(cls, names: list[str], sizes: list[int], config: GsConfig, dense_names: tuple[str, ...] = (),
              dense_sizes: tuple[int, ...] = (), *, ranks: int, allreduce_kind: str = "allreduce",
              level: Optional[float] = None) -> Plan:
        """``names`` must be sorted (every rank lays tensors out alike); raises if k > a group.
        ``exchange="auto"`` plans every exchange with an ``auto_worth``
        (:class:`~gs_horovod.engine.exchanges.base.Exchange`) that can send the vector (one that
        sends pairs needs ``config.codec.holds(total)``), each with its exact round as
        :meth:`GsConfig.exact_for` says, and keeps the one of fewest wire bytes at P = ``ranks``
        divided by its worth, the allreduces priced as ``allreduce_kind`` (:meth:`collectives`
        through :func:`total_wire_bytes`; the first in :data:`EXCHANGES` on a tie): the rule that
        measured delivered mass per wire byte gives (docs/design.md, "Exchange by P"); where none
        can, the first exchange without a worth that can (the sketch: a vector too long for the
        int32 indices of ``wire="fp32"``). ``level`` (``ratio="auto"`` only): the fraction of
        each group sent; :data:`~gs_horovod.engine.density.DENSE` plans no group, every tensor
        sent in float16."""
        check_choice("allreduce_kind", allreduce_kind, ALLREDUCE_KINDS)
        if level is not None and not config.adaptive:
            raise ValueError(f"a density level ({level}) is chosen under ratio='auto' only")
        offsets, total = starts_of(tuple(sizes)), sum(sizes)
        if level == DENSE:
            return cls(tuple(names), tuple(sizes), tuple(offsets), (), total, tuple(dense_names), tuple(dense_sizes),
                       ranks=ranks, allreduce_kind=allreduce_kind, level=level)
        if config.scope == "global":
            spans = [(0, total, "all compressed tensors")] if total else []
        else:
            spans = list(zip(offsets, sizes, names))
        groups = []
        for first, size, name in spans:
            if config.k is not None and config.k > size:
                raise ValueError(f"k={config.k} exceeds the {size} elements of {name!r} (scope={config.scope!r}); "
                                 "raise min_size above k or use ratio")
            k = config.k_for(size, level)
            fed = min(size, config.prefilter * k) if config.prefilter else size
            groups.append(Group(first, size, k, config.cols_for(size, level), fed, min(size, config.candidates * k)))

        def planned(exchange: str) -> Plan:
            chosen = groups
            if EXCHANGES[exchange].sends_pairs:
                if not config.codec.holds(total):
                    unlimited = " and ".join(repr(name) for name, c in CODECS.items() if c.max_coordinates is None)
                    raise ValueError(f"exchange={exchange!r} with wire={config.wire!r} sends indices below "
                                     f"{config.codec.max_coordinates}: {total} coordinates is too many "
                                     f"(wire={unlimited} have no limit)")
                chosen = [replace(g, nominated=min(g.nominated, g.fed)) for g in groups]
            return cls(tuple(names), tuple(sizes), tuple(offsets), tuple(chosen), total, tuple(dense_names),
                       tuple(dense_sizes), exchange, config.exact_for(exchange), config.apply_for(exchange), ranks,
                       allreduce_kind, level)

        if config.exchange != "auto":
            return planned(config.exchange)
        runs = [x for x in EXCHANGES.values() if not x.sends_pairs or config.codec.holds(total)]
        worth = {x.name: x.auto_worth for x in runs if x.auto_worth is not None}
        if not worth:
            return planned(next(x.name for x in runs if x.auto_worth is None))
        best, best_wire = None, 0.0
        for name in worth:  # the fewest wire bytes / worth, compared as wire_a · worth_b <= wire_b · worth_a
            plan = planned(name)
            wire = total_wire_bytes(plan.collectives(config), ranks)
            if best is None or wire * worth[best.exchange] < best_wire * worth[name]:
                best, best_wire = plan, wire
        return best

    @classmethod
    def split(cls, named: list[tuple[str, int]], config: GsConfig, *, ranks: int,
              allreduce_kind: str = "allreduce", level: Optional[float] = None) -> Plan:
        """The plan of tensors given as (name, elements) on ``ranks`` ranks whose transport runs
        allreduces as ``allreduce_kind`` (:meth:`build`): those of at least ``min_size``
        elements are compressed, the others sent exactly; each kind sorted by name. The one
        place the ``min_size`` split is made."""
        named = sorted(named)
        big = [(n, d) for n, d in named if d >= config.min_size]
        small = [(n, d) for n, d in named if d < config.min_size]
        return cls.build([n for n, _ in big], [d for _, d in big], config, tuple(n for n, _ in small),
                         tuple(d for _, d in small), ranks=ranks, allreduce_kind=allreduce_kind, level=level)

    @classmethod
    def wire_bytes(cls, named: list[tuple[str, int]], config: GsConfig, *, ranks: int, allreduce_kind: str,
                   level: float) -> float:
        """Wire bytes through the busiest rank of one step of ``named`` at density ``level``
        (:meth:`split`'s plan, its :meth:`collectives` through :func:`total_wire_bytes`)."""
        plan = cls.split(named, config, ranks=ranks, allreduce_kind=allreduce_kind, level=level)
        return total_wire_bytes(plan.collectives(config), ranks)

    @property
    def dense_dtype(self) -> str:
        """The dtype a dense step sends: "float16" at the DENSE level, else "float32" (warm-up,
        nothing to compress)."""
        return "float16" if self.level == DENSE else "float32"

    @property
    def for_exchange(self) -> ExchangePlan:
        """What the exchange reads of this plan."""
        return ExchangePlan(self.groups, self.total, self.ranks, self.apply == "all" and not self.exact)

    @property
    def all_names(self) -> tuple[str, ...]:
        """The compressed tensors' names, then those sent exactly."""
        return self.names + self.dense_names

    @property
    def all_sizes(self) -> tuple[int, ...]:
        """Elements of each tensor of :attr:`all_names`, in its order."""
        return self.sizes + self.dense_sizes

    @property
    def all_offsets(self) -> tuple[int, ...]:
        """Offsets of every tensor (compressed, then dense) in a step's update, (D + dense,)."""
        return self.offsets + tuple(self.total + o for o in starts_of(self.dense_sizes))

    def payload_bytes(self, config: GsConfig, dense: bool = False, measured: Any = None) -> Payload:
        """The :class:`Payload` one rank hands to collectives in one step: a compressed step (the
        exchange's own fields, :meth:`Exchange.payload`, with the exact round and the small
        tensors), or with ``dense`` (warm-up, or nothing to compress) everything at 4 bytes.
        ``measured``: the bytes this rank handed to the step's collectives of data-dependent
        size, (alltoall, allgather) (:class:`~gs_horovod.engine.step.StepResult`), None for the
        planned bytes."""
        if dense or not self.groups:
            itemsize = 2 if self.level == DENSE else 4
            return Payload(dense=(self.total + sum(self.dense_sizes)) * itemsize)
        exact = sum(g.nominated for g in self.groups) * 4 if self.exact else 0
        own = EXCHANGES[self.exchange].payload(self.for_exchange, config, measured)
        return Payload(**own, exact=exact, dense=sum(self.dense_sizes) * 4)

    def collectives(self, config: GsConfig, dense: bool = False) -> list[tuple[str, float]]:
        """One step's (kind, payload bytes) collectives (:func:`collectives_of` of
        :meth:`payload_bytes`, the allreduces as ``allreduce_kind``)."""
        return collectives_of(self.payload_bytes(config, dense), self.allreduce_kind)
