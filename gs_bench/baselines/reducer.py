"""The frame every baseline shares: residuals, the small-tensor rule, scopes, the optimizer."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import torch

from gs_horovod.engine import SCOPES, count_for
from gs_horovod.kernels import torch_ops
from gs_horovod.transports.collective_cost import Collective
from gs_horovod.transports.protocol import Collectives


@dataclass(frozen=True)
class Span:
    """Coordinates [start, start + size) of the step's vector selected together, k of them."""

    start: int
    size: int
    k: int


class Reducer:
    """A gradient exchange with error feedback, for all gradients of a step at once, written as
    its authors describe it, with gs-SGD's selection kernel (``top_abs``) and rules.

    ``reduce(named, comm)`` takes [(name, grad)] in name order (every rank the same) and
    returns the averaged updates, same shapes and dtypes. Tensors with fewer than ``min_size``
    elements are averaged exactly in one allreduce (gs-SGD's rule); the others, flattened to
    f32 and concatenated into the step's vector of D coordinates, are error-fed (a = e + g) and
    handed to :meth:`_reduce` as spans: one span of all D (``scope="global"``, k =
    ceil(ratio · D)) or one per tensor (``"layer"``, k = ceil(ratio · d) each). ``_reduce``
    writes the averaged update into a zero (D,) buffer and returns what of a left this rank as
    (indices, values), then e ← a − sent in place; or it subtracts what was sent from a itself
    and returns None. No other (D,) temporary is made.
    """

    def __init__(self, ratio: float = 0.01, scope: str = "global", min_size: int = 1024,
                 backend: str = "auto") -> None:
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise ValueError(f"ratio must be a number in (0, 1], got {ratio!r}")
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
        if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 1:
            raise ValueError(f"min_size must be an int >= 1, got {min_size!r}")
        self.ratio, self.scope, self.min_size, self.backend = ratio, scope, min_size, backend
        self.residual: Optional[torch.Tensor] = None
        self.shapes: dict[str, tuple[int, ...]] = {}

    def spans(self, sizes: list[int]) -> list[Span]:
        """The spans of compressed tensors of ``sizes`` elements, in order."""
        if self.scope == "global":
            total = sum(sizes)
            return [Span(0, total, count_for(self.ratio, total))] if total else []
        out, start = [], 0
        for d in sizes:
            out.append(Span(start, d, count_for(self.ratio, d)))
            start += d
        return out

    def top_abs(self, x: torch.Tensor, count: int) -> torch.Tensor:
        """Indices (count,) int64 ascending of the count largest |x| (the project's kernel)."""
        return torch_ops.top_abs(self.backend, x, count)

    def reduce(self, named: list[tuple[str, torch.Tensor]], comm: Collectives) -> list[torch.Tensor]:
        big = [(n, g) for n, g in named if g.numel() >= self.min_size]
        small = [(n, g) for n, g in named if g.numel() < self.min_size]
        self.shapes = {n: tuple(g.shape) for n, g in big}
        out: dict[str, torch.Tensor] = {}
        if small:
            flat = torch.cat([g.detach().reshape(-1).float() for _, g in small])
            mean = comm.allreduce_sum(flat, "baseline.small") / comm.size
            out.update(zip([n for n, _ in small], torch.split(mean, [g.numel() for _, g in small])))
        if big:
            a = torch.cat([g.detach().reshape(-1).float() for _, g in big])
            if self.residual is not None:
                if self.residual.numel() != a.numel():
                    raise ValueError(f"the compressed gradients changed size: {a.numel()} elements, the residual "
                                     f"has {self.residual.numel()}")
                a += self.residual
            update = torch.zeros_like(a)
            sent = self._reduce([n for n, _ in big], a, self.spans([g.numel() for _, g in big]), update, comm)
            if sent is not None:
                idx, vals = sent
                a.index_add_(0, idx, vals, alpha=-1)
            self.residual = a
            out.update(zip([n for n, _ in big], torch.split(update, [g.numel() for _, g in big])))
        comm.traffic.end_step()
        return [out[n].view_as(g).to(g.dtype) for n, g in named]

    def _reduce(self, names: list[str], a: torch.Tensor, spans: list[Span], update: torch.Tensor,
                  comm: Collectives) -> Any:
        raise NotImplementedError

    def planned(self, shapes: list[tuple[int, ...]], ranks: int) -> list[Collective]:
        """The (kind, payload bytes) collectives of one step for gradients of ``shapes``, as
        :meth:`reduce` issues them (:mod:`gs_horovod.transports.collective_cost` turns them into wire bytes)."""
        sizes = [math.prod(s) for s in shapes]
        small = sum(d for d in sizes if d < self.min_size)
        head = [("allreduce", 4.0 * small)] if small else []
        big = [s for s, d in zip(shapes, sizes) if d >= self.min_size]
        return head + (self._planned(big, ranks) if big else [])

    def _planned(self, shapes: list[tuple[int, ...]], ranks: int) -> list[Collective]:
        raise NotImplementedError


class ReducerOptimizer:
    """Wraps an optimizer: ``step()`` first replaces every gradient by the reducer's result
    (in parameter-name order on every rank), then steps the wrapped optimizer. No overlap
    with the backward pass (Horovod's DistributedOptimizer overlaps; these baselines do not)."""

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters: Iterable[tuple[str, Any]],
                 reducer: Reducer, comm: Collectives) -> None:
        self._optimizer = optimizer
        self._named = sorted(named_parameters, key=lambda t: t[0])
        self.reducer, self.comm = reducer, comm

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> Any:
        named = []
        for name, p in self._named:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            named.append((name, p.grad))
        for (_, p), update in zip(self._named, self.reducer.reduce(named, self.comm)):
            p.grad.copy_(update)
        return self._optimizer.step(closure)
