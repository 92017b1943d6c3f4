"""Collectives the baselines and the cost-model sweeps issue beyond the engine's, written once
over any :class:`~gs_horovod.transports.protocol.Collectives` (torch tensors): alltoalls with
one receiver, counted as the wire algorithm they stand for."""

from __future__ import annotations

from typing import Any, Optional

from gs_horovod.transports.protocol import Collectives


def _one_receiver(comm: Collectives, x: Any, dest: int, name: str, kind: str) -> Any:
    import torch

    splits = torch.tensor([x.numel() if r == dest else 0 for r in range(comm.size)], dtype=torch.int32)
    return comm.alltoall(x, splits, name, kind=kind)[0]


def pairwise(comm: Collectives, x: Any, partner: int, name: str) -> Any:
    """Swaps the torch tensor x (n,) with ``partner``, which swaps an (n,) back: the partner's
    x. One alltoall with one non-empty split, counted as one ``pairwise`` exchange."""
    return _one_receiver(comm, x, partner, name, "pairwise")


def gather(comm: Collectives, x: Any, name: str) -> Optional[Any]:
    """The torch tensor x (n,) of every rank as (P, n) on rank 0, None on the others: one
    alltoall into rank 0, counted as a ``gather`` (a star)."""
    got = _one_receiver(comm, x, 0, name, "gather")
    return got.view(comm.size, -1) if comm.rank == 0 else None
