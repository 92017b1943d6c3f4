"""The collectives the baselines issue, and Horovod's implementation of them (PyTorch).

Every call records its ``(kind, payload bytes)`` in ``traffic`` (:class:`gs_horovod.wire.Traffic`),
so bytes are counted where they are sent, once, with the algorithm of :mod:`gs_horovod.wire`.
:class:`gs_horovod.simulated.SimulatedComm` implements the same protocol for P ranks in one
process.
"""

from __future__ import annotations

from typing import Optional, Protocol

import torch

from ..wire import Traffic


class Comm(Protocol):
    """Collectives over ``size`` ranks, seen from ``rank``; results are identical on every rank
    (``gather``: on rank 0)."""

    rank: int
    size: int
    traffic: Traffic

    def allreduce_sum(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """x (n,) f32 summed over ranks."""

    def allgather(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """x (n,) from every rank (equal n), as (size, n) in rank order."""

    def pairwise(self, x: torch.Tensor, partner: int, name: str) -> torch.Tensor:
        """Swaps x (n,) with ``partner`` (which swaps an (n,) back): the partner's x."""

    def gather(self, x: torch.Tensor, name: str) -> Optional[torch.Tensor]:
        """x (n,) of every rank as (size, n) on rank 0; None on the others."""

    def broadcast(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """Rank 0's x (n,) on every rank (the others pass any (n,) of the same dtype)."""


def _nbytes(x: torch.Tensor) -> int:
    return x.numel() * x.element_size()


class HorovodComm:
    """:class:`Comm` over ``horovod.torch``: ring allreduce and allgather, ``alltoall`` with one
    non-empty split for the pairwise swap and the gather, ``broadcast`` from rank 0."""

    def __init__(self) -> None:
        import horovod.torch as hvd

        self.hvd = hvd
        self.rank, self.size = hvd.rank(), hvd.size()
        self.traffic = Traffic(self.size)

    def allreduce_sum(self, x: torch.Tensor, name: str) -> torch.Tensor:
        self.traffic.add("allreduce", _nbytes(x))
        return self.hvd.allreduce(x, op=self.hvd.Sum, name=name)

    def allgather(self, x: torch.Tensor, name: str) -> torch.Tensor:
        self.traffic.add("allgather", _nbytes(x))
        return self.hvd.allgather(x, name=name).view(self.size, -1)

    def _to(self, x: torch.Tensor, dest: int, name: str) -> torch.Tensor:
        splits = torch.tensor([x.numel() if r == dest else 0 for r in range(self.size)], dtype=torch.int32)
        return self.hvd.alltoall(x, splits=splits, name=name)[0]

    def pairwise(self, x: torch.Tensor, partner: int, name: str) -> torch.Tensor:
        self.traffic.add("pairwise", _nbytes(x))
        return self._to(x, partner, name)

    def gather(self, x: torch.Tensor, name: str) -> Optional[torch.Tensor]:
        self.traffic.add("gather", _nbytes(x))
        got = self._to(x, 0, name)
        return got.view(self.size, -1) if self.rank == 0 else None

    def broadcast(self, x: torch.Tensor, name: str) -> torch.Tensor:
        self.traffic.add("broadcast", _nbytes(x))
        return self.hvd.broadcast(x, root_rank=0, name=name)
