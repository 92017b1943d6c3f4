"""P ranks in one process, for tests and benchmarks: one thread per rank, and exactly one
thread running at a time.

A rank runs until it reaches a collective, deposits its part and hands the turn to the next
rank; the last rank to arrive completes the collective and hands the turn back to rank 0. So
every rank computes exactly what it would on its own process (collectives reduce in rank
order, identically on every rank), and the time a rank holds the turn outside collectives
(their reductions included) is its own compute, uncontended
(``SimulatedRanks.compute_seconds``). :class:`SimulatedComm` is
:class:`~gs_horovod.transports.protocol.Collectives` for the engine (``allreduce`` averages; torch or
TensorFlow arrays) and the baselines (torch tensors) alike.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional, TypeVar

import numpy as np
import torch

from .collective_cost import Traffic, rounds, wire_bytes

T = TypeVar("T")


class _Aborted(Exception):
    """Another rank raised; this one stops at its next collective."""


class SimulatedRanks:
    """Runs ``fn(rank, comm)`` for ``size`` ranks (:meth:`run`) and returns the results in rank
    order, re-raising the first rank's exception. ``comms[r]``: rank r's :class:`SimulatedComm`,
    the same in every run (its traffic accumulates over runs, so an engine built on it once
    serves every step); ``compute_seconds[r]``: the time rank r held the turn (its computation
    outside collectives), accumulated over runs. ``link``: (latency seconds, bytes per second)
    of the modelled link, which :meth:`SimulatedComm.clock` charges each collective on (None:
    collectives take no time)."""

    def __init__(self, size: int, link: Optional[tuple[float, float]] = None) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        if link is not None and (link[0] < 0 or link[1] <= 0):
            raise ValueError(f"link must be (latency >= 0 s, bandwidth > 0 bytes/s), got {link}")
        self.size, self.link = size, link
        self.compute_seconds = [0.0] * size
        self._cv = threading.Condition()
        self._turn = 0
        self._slots: list[Any] = [None] * size
        self._done: list[Any] = []
        self._failed = False
        self.comms = [SimulatedComm(self, r) for r in range(size)]

    def _wait_turn(self, rank: int) -> None:
        self._cv.wait_for(lambda: self._turn == rank or self._failed)
        if self._failed:
            raise _Aborted

    def _pass_turn(self, rank: int) -> None:
        self._turn = (rank + 1) % self.size
        self._cv.notify_all()

    def deposit(self, rank: int, x: Any) -> list[Any]:
        """Deposits rank's x; returns every rank's x in rank order once all have deposited."""
        with self._cv:
            self._slots[rank] = x
            if rank == self.size - 1:
                self._done, self._slots = self._slots, [None] * self.size
            self._pass_turn(rank)
            self._wait_turn(rank)
            return list(self._done)

    def run(self, fn: Callable[[int, SimulatedComm], T]) -> list[T]:
        """``fn(rank, comm)`` on every rank, one thread each taking turns; returns the results
        in rank order, or re-raises the first rank's error (the other ranks stop at their next
        collective)."""
        results: list[Any] = [None] * self.size
        errors: list[BaseException] = []
        self._turn, self._failed = 0, False

        def main(rank: int) -> None:
            comm = self.comms[rank]
            try:
                with self._cv:
                    self._wait_turn(rank)
                comm.started = time.perf_counter()
                results[rank] = fn(rank, comm)
                with self._cv:
                    self.compute_seconds[rank] += time.perf_counter() - comm.started
                    self._pass_turn(rank)
            except _Aborted:
                pass
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                with self._cv:
                    errors.append(e)
                    self._failed = True
                    self._cv.notify_all()

        threads = [threading.Thread(target=main, args=(r,), daemon=True) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results


def _as_torch(x: Any) -> tuple[torch.Tensor, Callable[[torch.Tensor], Any]]:
    """x as a torch tensor, and the function that turns a result back into x's framework."""
    if isinstance(x, torch.Tensor):
        return x, lambda t: t
    import tensorflow as tf

    return torch.from_numpy(np.array(x)), lambda t: tf.constant(t.numpy())


class SimulatedComm:
    """Collectives of rank ``rank`` of a :class:`SimulatedRanks` group, over torch tensors;
    sums in rank order in the input's dtype (f32 inputs: f32 arithmetic), as one ring would."""

    def __init__(self, group: SimulatedRanks, rank: int) -> None:
        self.group, self.rank, self.size = group, rank, group.size
        self.averages = True  # allreduce returns the mean
        self.allreduce_kind = "allreduce"  # counted as a ring
        self.traffic = Traffic(group.size)
        self.names: list[str] = []
        self.started = 0.0  # when this rank's current stretch of compute began
        self.link_seconds = 0.0  # the modelled link's seconds of every collective so far

    def clock(self) -> float:
        """This rank's modelled seconds: its own compute (the turn held, this stretch included)
        plus the link's seconds of its collectives: each round of a collective
        (:func:`~gs_horovod.transports.collective_cost.rounds`) costs latency + bytes / bandwidth."""
        return self.group.compute_seconds[self.rank] + time.perf_counter() - self.started + self.link_seconds

    def _count(self, kind: str, nbytes: float, wire: Optional[float] = None) -> None:
        """Counts one collective into ``traffic`` and, on a modelled link, into ``link_seconds``
        (a measured ``wire`` scales the rounds' bytes as uneven loads do)."""
        self.traffic.add(kind, nbytes, wire)
        if self.group.link is not None:
            latency, bandwidth = self.group.link
            each = rounds(kind, nbytes, self.size)
            even = wire_bytes(kind, nbytes, self.size)
            scale = wire / even if wire is not None and even > 0 else 1.0
            self.link_seconds += latency * len(each) + sum(each) * scale / bandwidth

    def _all(self, x: torch.Tensor, name: str) -> list[torch.Tensor]:
        self.group.compute_seconds[self.rank] += time.perf_counter() - self.started
        self.names.append(name)
        return self.group.deposit(self.rank, x.clone())

    def _resume(self, result: Any) -> Any:
        self.started = time.perf_counter()
        return result

    @staticmethod
    def _sum(parts: list[torch.Tensor]) -> torch.Tensor:
        total = parts[0].clone()
        for p in parts[1:]:
            total += p
        return total

    def allreduce(self, x: Any, name: str) -> Any:
        """The engine's collective: x (n,) f32 or f16, a torch or TensorFlow array, averaged over
        ranks in f32 (as Horovod's Average), returned in x's dtype and framework."""
        t, back = _as_torch(x)
        self._count("allreduce", t.numel() * t.element_size())
        parts = self._all(t, name)
        return self._resume(back((self._sum([p.float() for p in parts]) / self.size).to(t.dtype)))

    def same_on_every_rank(self, value: Any, name: str) -> bool:
        parts = self._all(torch.tensor(int(value), dtype=torch.int64), name)
        return self._resume(all(int(p) == int(parts[0]) for p in parts))

    def values(self, value: float, name: str) -> list[float]:
        """Every rank's number ``value`` in rank order: bookkeeping (a mean loss, a step count),
        not counted as traffic."""
        return self._resume([float(p) for p in self._all(torch.tensor(float(value), dtype=torch.float64), name)])

    def allgather(self, x: Any, name: str) -> Any:
        """Every rank's x (n_r,) concatenated in rank order, a torch or TensorFlow array as x is;
        counted as this rank's payload, on the wire as a ring allgather of the mean n_r."""
        t, back = _as_torch(x)
        parts = self._all(t, name)
        mean = sum(p.numel() * p.element_size() for p in parts) / self.size
        self._count("allgather", t.numel() * t.element_size(), wire=wire_bytes("allgather", mean, self.size))
        return self._resume(back(torch.cat(parts)))

    def allreduce_sum(self, x: Any, name: str) -> Any:
        """x (n,) summed over ranks in rank order, in x's dtype (integer counts: exactly)."""
        t, back = _as_torch(x)
        self._count("allreduce", t.numel() * t.element_size())
        return self._resume(back(self._sum(self._all(t, name))))

    def alltoall(self, x: Any, splits: Any, name: str, kind: str = "alltoall") -> tuple[Any, Any]:
        """Rank r's part of every rank's x, by each rank's ``splits`` (P,); returns (the parts sent
        here in rank order, their sizes (P,) int32). Counted with the bytes the busiest rank
        really sent and received (a rank's part to itself stays off the wire)."""
        t, back = _as_torch(x)
        sizes, _ = _as_torch(splits)
        self.group.compute_seconds[self.rank] += time.perf_counter() - self.started
        self.names.append(name)
        deposited = self.group.deposit(self.rank, (t.clone(), sizes.to("cpu", torch.int64).clone()))
        table = torch.stack([s for _, s in deposited])  # [sender, receiver]: elements
        own = table.diagonal()
        load = (table.sum(1) - own + table.sum(0) - own) * t.element_size()
        self._count(kind, t.numel() * t.element_size(), wire=float(load.max()))
        starts = table.cumsum(1) - table
        mine = [part[int(starts[r, self.rank]):int(starts[r, self.rank] + table[r, self.rank])]
                for r, (part, _) in enumerate(deposited)]
        return self._resume((back(torch.cat(mine)), back(table[:, self.rank].to(torch.int32))))

    def broadcast(self, x: torch.Tensor, name: str) -> torch.Tensor:
        self._count("broadcast", x.numel() * x.element_size())
        return self._resume(self._all(x, name)[0])

    def from_host(self, x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x)

    def to_host(self, x: Any) -> np.ndarray:
        return np.asarray(x)
