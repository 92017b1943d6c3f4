"""Baselines gs-SGD is compared with, on real Horovod ranks (PyTorch), each built as its
authors describe it, with gs-SGD's selection kernel and small-tensor rule.

Dense and FP16 are Horovod's own ``DistributedOptimizer`` with ``Compression.none`` /
``Compression.fp16``; gs-SGD is ``hvd.DistributedOptimizer(..., compression=GsSketch)``. The
others exchange all gradients of a step at ``optimizer.step()`` through
:class:`~gs_horovod.baselines.exchange.ExchangeOptimizer`, one class per method:

- ``topk``: local top-k + allgather of (index, value), DGC-style (Lin et al. 2018).
- ``gtopk``: global top-k by recursive doubling of sparse top-k sets (Shi et al. 2019).
- ``sketched``: Sketched-SGD (Ivkin et al. 2019): whole-model sketches sent to rank 0, which
  picks candidates; their exact values in a second round; top-k of those.
- ``powersgd``: rank-r PowerSGD (Vogels et al. 2019) with error feedback.

``topk``, ``gtopk`` and ``sketched`` take ``scope`` ("global": one selection over all
compressed coordinates, as GsSketch's default; "layer": per tensor). Every method keeps an
error-feedback residual and sends tensors under ``min_size`` elements exactly.
:func:`distributed_optimizer` switches over all of them and returns a :class:`Meter` of the
bytes each rank sends (payload and wire bytes through the busiest rank, :mod:`gs_horovod.wire`).
"""

from __future__ import annotations

from typing import Any, Callable

from ..gs_sgd import collectives_of
from ..state import CommStats
from ..wire import Collective, Traffic, total_wire_bytes
from .exchange import Exchange, ExchangeOptimizer
from .methods import GTopK, PowerSGD, SketchedSGD, TopKAllgather

METHODS: dict[str, type[Exchange]] = {"topk": TopKAllgather, "gtopk": GTopK, "sketched": SketchedSGD,
                                      "powersgd": PowerSGD}
ALL_METHODS = ("gs", "none", "fp16", *METHODS)

__all__ = ["ALL_METHODS", "METHODS", "Exchange", "ExchangeOptimizer", "GTopK", "Meter",
           "PowerSGD", "SketchedSGD", "TopKAllgather", "distributed_optimizer"]


class Meter:
    """Bytes one rank sends per step, mean so far: ``per_step()`` → (payload handed to
    collectives, wire bytes through the busiest rank); ``collectives()`` → one step's (kind,
    payload bytes) list, for the cost model."""

    def __init__(self, ranks: int, collectives: Callable[[], list[Collective]],
                 per_step: Callable[[], tuple[float, float]] | None = None) -> None:
        self.ranks, self._collectives, self._per_step = ranks, collectives, per_step

    def collectives(self) -> list[Collective]:
        return self._collectives()

    def per_step(self) -> tuple[float, float]:
        if self._per_step is not None:
            return self._per_step()
        step = self.collectives()
        return sum(n for _, n in step), total_wire_bytes(step, self.ranks)

    @classmethod
    def of_traffic(cls, traffic: Traffic) -> Meter:
        """The meter of a baseline's counted traffic: means over every step so far."""
        return cls(traffic.ranks, lambda: traffic.last_step, traffic.per_step)

    @classmethod
    def of_gs(cls, stats: CommStats, ranks: int, kind: str = "allreduce") -> Meter:
        """gs-SGD's meter from its :class:`CommStats`: per step (means so far) its collectives
        as :func:`gs_horovod.gs_sgd.collectives_of` lays them out, the allreduces as ``kind``."""
        return cls(ranks, lambda: collectives_of(stats.per_step(), kind))

    @classmethod
    def dense(cls, parameters: list[Any], ranks: int, itemsize: int | None = None) -> Meter:
        """One allreduce of every parameter's gradient, at ``itemsize`` bytes an element (None:
        each parameter's own)."""
        nbytes = float(sum(p.numel() * (itemsize or p.element_size()) for p in parameters))
        return cls(ranks, lambda: [("allreduce", nbytes)])


def distributed_optimizer(method: str, optimizer: Any, named_parameters: Any, ratio: float | None = None,
                          **options: Any) -> tuple[Any, Meter]:
    """(optimizer, :class:`Meter`) for ``method`` in :data:`ALL_METHODS`: "gs" (GsSketch in
    Horovod's DistributedOptimizer with ``ratio`` and ``options``), "none" and "fp16"
    (Horovod's), or a baseline of :data:`METHODS` (``options`` are its constructor's:
    scope, min_size, rank, rows, width, p2). ``ratio`` None: the method's default (PowerSGD
    takes none)."""
    import horovod.torch as hvd

    from ..compressor import HorovodCollectives
    from ..kernels.torch_ops import TorchOps
    from ..torch import GsSketch

    named = list(named_parameters)
    ratio_arg = {} if ratio is None else {"ratio": ratio}
    if method in METHODS:
        if method == "powersgd" and ratio is not None:
            raise ValueError(f"PowerSGD takes no ratio (its rank sets the size), got ratio={ratio}")
        exchange = METHODS[method](**ratio_arg, **options)
        comm = HorovodCollectives(hvd, TorchOps(), hvd.Sum, hvd.global_process_set, Traffic(hvd.size()))
        return ExchangeOptimizer(optimizer, named, exchange, comm), Meter.of_traffic(comm.traffic)
    if method == "gs":
        gs = GsSketch(**ratio_arg, **options)
        opt = hvd.DistributedOptimizer(optimizer, named_parameters=named, compression=gs)
        return opt, Meter.of_gs(gs.stats, hvd.size(), "tree" if options.get("merge") == "mpi" else "allreduce")
    if method not in ("none", "fp16"):
        raise ValueError(f"method must be one of {ALL_METHODS}, got {method!r}")
    if options or ratio is not None:
        raise ValueError(f"method {method!r} takes no ratio or options, got ratio={ratio}, {options}")
    compression = hvd.Compression.fp16 if method == "fp16" else hvd.Compression.none
    return (hvd.DistributedOptimizer(optimizer, named_parameters=named, compression=compression),
            Meter.dense([p for _, p in named], hvd.size(), 2 if method == "fp16" else None))
