"""Baselines gs-SGD is compared with, each built as its authors describe it, with gs-SGD's
selection kernel and small-tensor rule. Only the algorithms live here; which transport and
framework runs each (Horovod, DDP, simulated ranks) is :mod:`gs_bench.methods`.

Every method exchanges all gradients of a step at ``optimizer.step()`` through
:class:`~gs_bench.baselines.reducer.ReducerOptimizer`, one class per method:

- :class:`TopKAllgather`: local top-k + allgather of (index, value), DGC-style (Lin et al. 2018).
- :class:`GTopK`: global top-k by recursive doubling of sparse top-k sets (Shi et al. 2019).
- :class:`SketchedSGD` (Ivkin et al. 2019): whole-model sketches sent to rank 0, which picks
  candidates; their exact values in a second round; top-k of those.
- :class:`PowerSGD`: rank-r PowerSGD (Vogels et al. 2019) with error feedback.

``TopKAllgather``, ``GTopK`` and ``SketchedSGD`` take ``scope`` ("global": one selection over all
compressed coordinates, as GsSketch's default; "layer": per tensor). Every method keeps an
error-feedback residual and sends tensors under ``min_size`` elements exactly; its
``planned(shapes, ranks)`` gives one step's collectives from the shapes alone.
"""

from __future__ import annotations

from .algorithms import GTopK, PowerSGD, SketchedSGD, TopKAllgather
from .reducer import Reducer, ReducerOptimizer

__all__ = ["Reducer", "ReducerOptimizer", "GTopK", "PowerSGD", "SketchedSGD", "TopKAllgather"]
