"""The frame every exchange-at-step baseline shares: residuals, byte counts, the optimizer."""

from __future__ import annotations

from typing import Any, Iterable

import torch


class Exchange:
    """A gradient exchange with error feedback, for all gradients of a step at once.

    ``exchange(named)`` takes [(name, grad)] in name order (every rank the same) and returns
    the averaged updates, same shapes; subclasses implement ``_exchange`` on a = e + g (the
    error-fed gradient, flattened f32) and return (update, sent) where ``sent`` is what of a
    left this rank (e ← a − sent). ``bytes_sent`` counts the payload this rank handed to
    collectives (its own contribution, as ``GsSketch.stats`` does); ``bytes_per_step`` gives the
    same figure from the sizes alone, and ``wire_bytes`` the traffic through the busiest rank.
    """

    def __init__(self, ratio: float) -> None:
        if not 0 < ratio <= 1:
            raise ValueError(f"ratio must be in (0, 1], got {ratio}")
        self.ratio = ratio
        self.residuals: dict[str, torch.Tensor] = {}
        self.bytes_sent = 0
        self.steps = 0

    def k_for(self, d: int) -> int:
        return max(1, int(round(self.ratio * d)))

    def exchange(self, named: list[tuple[str, torch.Tensor]]) -> list[torch.Tensor]:
        accs = []
        for name, g in named:
            e = self.residuals.get(name)
            accs.append(g.detach().reshape(-1).float() + (e if e is not None else 0.0))
        updates, sent = self._exchange([n for n, _ in named], accs)
        for (name, _), a, s in zip(named, accs, sent):
            self.residuals[name] = a - s
        self.steps += 1
        return [u.view_as(g).to(g.dtype) for u, (_, g) in zip(updates, named)]

    def _exchange(self, names: list[str], accs: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        raise NotImplementedError

    def bytes_per_step(self, sizes: list[int], ranks: int) -> int:
        """Payload bytes one rank hands to collectives per step, tensors of ``sizes`` elements."""
        raise NotImplementedError

    def wire_bytes(self, sizes: list[int], ranks: int) -> float:
        """Bytes sent plus received per step by the busiest rank, under the algorithm each
        collective uses (ring allreduce/allgather, recursive doubling, star)."""
        raise NotImplementedError


class ExchangeOptimizer:
    """Wraps an optimizer: ``step()`` first replaces every gradient by the exchange's result
    (in parameter-name order on every rank), then steps the wrapped optimizer. No overlap
    with the backward pass (Horovod's DistributedOptimizer overlaps; these baselines do not)."""

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters: Iterable[tuple[str, Any]],
                 exchange: Exchange) -> None:
        self._optimizer = optimizer
        self._named = sorted(named_parameters, key=lambda t: t[0])
        self.exchange = exchange

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> Any:
        named = []
        for name, p in self._named:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            named.append((name, p.grad))
        for (_, p), update in zip(self._named, self.exchange.exchange(named)):
            p.grad.copy_(update)
        return self._optimizer.step(closure)
