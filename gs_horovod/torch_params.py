"""Which parameter a gradient handed to ``horovod.torch``'s compressor belongs to. Horovod
calls ``compress(p.grad)`` without the parameter; GsSketch keys its state by the parameter's
name in the ``DistributedOptimizer`` that calls it, found from the calling frame once and then
by ``p.grad is tensor``. Keys therefore survive ``zero_grad(set_to_none=True)``, parameters
without gradients in some steps (Horovod submits zeros for them) and
``backward_passes_per_step > 1``."""

from __future__ import annotations

import sys
from typing import Any, Optional

import torch


class Params:
    """The named parameters of one DistributedOptimizer, sorted by name, and the lookup of the
    parameter whose ``.grad`` a tensor is: the parameter that followed the previous one last
    time is tried first, so a static graph costs O(1) per call."""

    def __init__(self, optimizer: Any) -> None:
        self.items = sorted(((name, p) for p, name in optimizer._parameter_names.items()), key=lambda item: item[0])
        self._successor: dict[int, int] = {}
        self._last = -1

    def guess(self, grad: torch.Tensor) -> Optional[str]:
        """The name if the expected parameter's ``.grad`` is ``grad``, else None."""
        guess = self._successor.get(self._last)
        if guess is None or self.items[guess][1].grad is not grad:
            return None
        self._last = guess
        return self.items[guess][0]

    def name_of(self, grad: torch.Tensor) -> str:
        """The name of the parameter whose ``.grad`` is ``grad`` (a scan; learns the order)."""
        found = next((i for i, (_, p) in enumerate(self.items) if p.grad is grad), None)
        if found is None:
            raise KeyError(f"GsSketch: a tensor of shape {tuple(grad.shape)} is not the .grad of any parameter of "
                           "the DistributedOptimizer that compresses it (sparse_as_dense=True hands over a copy, "
                           "which GsSketch cannot attribute)")
        self._successor[self._last] = found
        self._last = found
        return self.items[found][0]



def calling_optimizer(compressor: Any) -> Any:
    """The Horovod DistributedOptimizer up the stack whose ``_compression`` is ``compressor``
    (or its class). Horovod does not pass the parameter to ``compress``; its optimizer's
    ``_allreduce_grad_async(self, p)`` / ``_grouped_allreduce_grad_async`` are our callers."""
    frame = sys._getframe(2)
    for _ in range(6):
        if frame is None:
            break
        candidate = frame.f_locals.get("self")
        owner = getattr(candidate, "_compression", None)
        if (owner is compressor or owner is type(compressor)) and hasattr(candidate, "_parameter_names"):
            return candidate
        frame = frame.f_back
    raise RuntimeError(
        "GsSketch compresses gradients inside hvd.DistributedOptimizer(..., compression=GsSketch); "
        "it was called from elsewhere (e.g. hvd.allreduce), where it cannot tell which "
        "parameter a tensor belongs to and so cannot keep its error-feedback residual"
    )
