"""Horovod elastic training (``hvd.elastic.run``): each rank's compressor state committed and
rolled back with the model, written once for the Horovod adapters.

Horovod's elastic state (``TorchState``, ``TensorFlowKerasState``) keeps the model and the
optimizer; after a reset it broadcasts rank 0's copy to every rank. The compressor's residual
and momentum are per rank, so :class:`ElasticGsState` keeps each rank's own:

- ``save()`` (at ``state.commit()``, a collective): a copy of this rank's state, and every
  rank's residual mass Σ e² keyed by a per-process id, so that the survivors of a failure know
  what the ranks they lost held.
- ``restore()`` (after a failure, on the survivors, before the reset): this rank's state as
  committed, steps included; nothing of the uncommitted steps stays in a residual, since the
  model rolls back to the same commit.
- ``sync()`` (after every reset that adds a rank or follows a failure, a collective on the new
  set of ranks): options compared again at the next step; a joining rank takes rank 0's step
  counts and starts every tensor from zero residual and momentum, while the others keep theirs
  (their steps already agree: they committed, or rolled back, together).

The collectives read the ranks from Horovod at each call, so every step after any reset (also a
graceful removal, where Horovod skips the sync) plans for the new P (``exchange="auto"``).

A removed rank takes its residual with it: the gradient it had accumulated but not yet sent is
never applied (error feedback delays; this loses). Its mass at the last commit is added to
``CommStats.lost_residual`` on every rank at the next sync (a graceful removal, without a sync,
is not counted).

The adapter provides what :class:`ElasticAdapter` lists.
"""

from __future__ import annotations

import pickle
import uuid
from typing import Any, Protocol

import numpy as np

from .checkpoint import CheckpointCollectives, exchange_bytes

Layout = Any
"""What a joining rank needs of rank 0's state after a reset, in the adapter's own form: each
compressed tensor's size, whether it has momentum, and the step counts."""


class ElasticAdapter(Protocol):
    """What a Horovod adapter gives :class:`ElasticGsState`."""

    def local_state_dict(self) -> dict[str, Any]:
        """This rank's state (copies), as its checkpoints save it."""

    def _commit_arrival(self) -> None:
        """Raises on this rank unless every rank commits at the same point (a deadline)."""

    def _checkpoint_comm(self) -> CheckpointCollectives:
        """Collectives over every rank of the current world."""

    def _roll_back(self, state: dict[str, Any]) -> None:
        """Replaces this rank's state with ``state`` (a :meth:`local_state_dict`), steps included."""

    def _layout(self, state: dict[str, Any]) -> Layout:
        """The :data:`Layout` of a :meth:`local_state_dict`."""

    def _residual_mass(self, state: dict[str, Any]) -> float:
        """Σ e² over the residuals of a :meth:`local_state_dict`."""

    def _rejoin(self, layout: Layout, lost_mass: float) -> None:
        """After a reset: collectives for the new world, options compared again at the next step,
        steps and missing tensors (zeros) from rank 0's ``layout``; ``lost_mass`` counted."""

    def _forget_checkpoint_calls(self) -> None:
        """Checkpoint calls counted anew, nothing to restore, in step (a new world)."""


def share(comm: CheckpointCollectives, value: Any) -> list[Any]:
    """Collective: every rank's picklable ``value``, in rank order, on every rank."""
    out = [pickle.dumps(value)] * comm.size
    return [pickle.loads(part) for part in exchange_bytes(comm, out)]


class ElasticGsState:
    """One rank's compressor state as Horovod elastic state (the module docstring).

    Fields: ``adapter`` (the compressor), ``process_id`` (this process's id, the same across
    resets), ``committed`` (this rank's :meth:`ElasticAdapter.local_state_dict` at the last
    commit; at construction before any), ``committed_mass`` (process id → Σ e² at the last
    commit, every rank's; empty before the first commit)."""

    def __init__(self, adapter: ElasticAdapter) -> None:
        self.adapter = adapter
        self.process_id = uuid.uuid4().hex
        self.committed = adapter.local_state_dict()
        self.committed_mass: dict[str, float] = {}

    def save(self) -> None:
        """Collective (``state.commit()`` on every rank): copies this rank's state and shares its
        residual mass. A commit on some ranks only raises RuntimeError on them within the
        compressor's ``checkpoint_timeout``, and the next step raises on every rank."""
        self.adapter._commit_arrival()
        self.committed = self.adapter.local_state_dict()
        masses = share(self.adapter._checkpoint_comm(), (self.process_id, self.adapter._residual_mass(self.committed)))
        self.committed_mass = dict(masses)

    def restore(self) -> None:
        """Not collective: this rank's state as committed."""
        self.adapter._roll_back(self.committed)

    def sync(self) -> None:
        """Collective over the new world: see the module docstring."""
        comm = self.adapter._checkpoint_comm()
        present = share(comm, self.process_id)
        mine = self.adapter._layout(self.committed) if comm.rank == 0 else None
        layout: Layout = share(comm, mine)[0]
        lost = sum(mass for pid, mass in self.committed_mass.items() if pid not in present)
        self.committed_mass = {pid: m for pid, m in self.committed_mass.items() if pid in present}
        self.adapter._forget_checkpoint_calls()
        self.adapter._rejoin(layout, lost)

    @staticmethod
    def mass(residuals: list[np.ndarray]) -> float:
        """Σ e² over ``residuals`` (host arrays), in float64."""
        return float(sum(np.square(r, dtype=np.float64).sum() for r in residuals))
