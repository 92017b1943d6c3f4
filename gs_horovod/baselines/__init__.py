"""Baselines gs-SGD is compared with, on real Horovod ranks (PyTorch).

Dense and FP16 are Horovod's own ``DistributedOptimizer`` with ``Compression.none`` /
``Compression.fp16``; gs-SGD is ``hvd.DistributedOptimizer(..., compression=GsSketch)``. The
others exchange all gradients of a step at ``optimizer.step()`` through
:class:`~gs_horovod.baselines.exchange.ExchangeOptimizer`, one class per method:

- ``topk``: local top-k + allgather of (index, value), DGC-style (Lin et al. 2018).
- ``gtopk``: global top-k by recursive doubling of sparse top-k sets (Shi et al. 2019).
- ``sketched``: Sketched-SGD's star (Ivkin et al. 2019): sketches sent to rank 0, which picks
  candidates; their exact values in a second round; top-k of those.
- ``powersgd``: rank-r PowerSGD (Vogels et al. 2019) with error feedback.

Every method keeps an error-feedback residual, counts the bytes each rank sends
(``stats``) and can say what it would send for any size (``bytes_per_step``).
"""

from .exchange import Exchange, ExchangeOptimizer
from .methods import GTopK, PowerSGD, SketchedSGD, TopKAllgather

METHODS = {"topk": TopKAllgather, "gtopk": GTopK, "sketched": SketchedSGD, "powersgd": PowerSGD}

__all__ = ["METHODS", "Exchange", "ExchangeOptimizer", "GTopK", "PowerSGD", "SketchedSGD", "TopKAllgather",
           "distributed_optimizer"]


def distributed_optimizer(method: str, optimizer, named_parameters, ratio: float = 0.01,
                          powersgd_rank: int = 4, **gs_options):
    """One switch over every method: returns (optimizer, bytes_per_step) for ``method`` in
    "gs" (GsSketch in Horovod's DistributedOptimizer, ``gs_options`` passed on), "none" and
    "fp16" (Horovod's), or a baseline of :data:`METHODS`. ``bytes_per_step()`` is the mean
    payload a rank has handed to collectives per step so far."""
    import horovod.torch as hvd

    from ..torch import GsSketch

    named = list(named_parameters)
    if method in METHODS:
        exchange = METHODS[method](ratio=ratio, **({"rank": powersgd_rank} if method == "powersgd" else {}))
        return ExchangeOptimizer(optimizer, named, exchange), lambda: exchange.bytes_sent / max(1, exchange.steps)
    if method == "gs":
        gs = GsSketch(ratio=ratio, **gs_options)
        opt = hvd.DistributedOptimizer(optimizer, named_parameters=named, compression=gs)
        return opt, lambda: gs.stats.total_bytes / max(1, gs.stats.steps)
    if method not in ("none", "fp16"):
        raise ValueError(f"method must be gs, none, fp16 or one of {sorted(METHODS)}, got {method!r}")
    dense = sum(p.numel() * p.element_size() for _, p in named) // (2 if method == "fp16" else 1)
    compression = hvd.Compression.fp16 if method == "fp16" else hvd.Compression.none
    return hvd.DistributedOptimizer(optimizer, named_parameters=named, compression=compression), lambda: dense
