"""The one protocol for every collective that gs-SGD's engine, its checkpoints and the
baselines issue, and what is written once on top of it.

Each transport implements :class:`Collectives` once, in a module of its own here:

- Horovod (``horovod.torch`` or ``horovod.tensorflow``): :class:`.horovod.HorovodCollectives`;
- ``transport="mpi"`` (mpi4py beside Horovod): :class:`.mpi.MpiCollectives`;
- torch.distributed (the DDP hook): :class:`.dist.DistCollectives`;
- P ranks in one process: :class:`.simulated.SimulatedComm`.

Every call counts its ``(kind, payload bytes)`` into ``traffic``
(:class:`~.collective_cost.Traffic`, the wire algorithm of :mod:`.collective_cost`), where it is sent, once; a
transport that runs inside a traced TensorFlow graph has ``traffic = None`` (its adapter's
graph counters count instead).
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

import numpy as np

from ..array_ops import Array, ArrayOps
from .collective_cost import Traffic


class Collectives(Protocol):
    """Collectives over ``size`` ranks (P) seen from ``rank``; every result is bitwise the same
    on every rank (``gather``: on rank 0). ``averages``: whether :meth:`allreduce` returns the
    mean (Horovod's op Average) or the sum (op Sum). ``allreduce_kind``: the
    :mod:`gs_horovod.transports.collective_cost` kind its allreduces run as ("allreduce": a ring; "tree": recursive
    doubling), which prices them in ``exchange="auto"``."""

    rank: int
    size: int
    averages: bool
    allreduce_kind: str
    traffic: Optional[Traffic]

    def allreduce(self, x: Array, name: str) -> Array:
        """x (n,) f32 or f16, averaged or summed over ranks as ``averages`` says."""

    def allreduce_sum(self, x: Array, name: str) -> Array:
        """x (n,) f32, int32 or int64 summed over ranks (integers: exactly), whatever the op."""

    def allgather(self, x: Array, name: str) -> Array:
        """Every rank's x (n_r,) concatenated in rank order ((P·n,) or (P, n) when every n_r is
        n), bits untouched; n_r may differ across ranks."""

    def alltoall(self, x: Array, splits: Array, name: str, kind: str = "alltoall") -> tuple[Array, Array]:
        """Sends x[Σ_{q<r} splits[q] : Σ_{q≤r} splits[q]] (bits untouched) to rank r, for splits
        (P,) int32 summing to len(x); returns (what every rank sent here, concatenated in rank
        order; the sizes received from each rank (P,) int32). ``kind``: the wire algorithm it
        is counted as (the harness's ``pairwise`` and ``gather`` are alltoalls with one receiver)."""

    def broadcast(self, x: Array, name: str) -> Array:
        """Rank 0's x (n,) on every rank (the others pass any (n,) of the same dtype)."""

    def same_on_every_rank(self, value: Any, name: str) -> Any:
        """Whether every rank holds the same int ``value`` in [0, 2^62) (a predicate)."""

    def from_host(self, x: np.ndarray) -> Array:
        """x as an array these collectives take (on their device), eagerly."""

    def to_host(self, x: Array) -> np.ndarray:
        """A result of these collectives as a NumPy array, eagerly."""


def half_prescaled(ops: ArrayOps, x: Array, size: int) -> Array:
    """x (n,) f16 divided by the ``size`` ranks in f32 and rounded back to f16: what every
    transport sums to average a float16 payload (the sketch), so that the f16 sum cannot
    overflow where the mean does not (Horovod's prescale does the same)."""
    return ops.cast(ops.cast(x, "float32") * (1.0 / size), "float16")


def count(traffic: Optional[Traffic], kind: str, x: Any, wire: Optional[float] = None) -> None:
    """Counts a collective of x's bytes (a torch tensor) into ``traffic`` (None: not counted)."""
    if traffic is not None:
        traffic.add(kind, x.numel() * x.element_size(), wire)
