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

__all__ = ["METHODS", "Exchange", "ExchangeOptimizer", "GTopK", "PowerSGD", "SketchedSGD", "TopKAllgather"]
