"""P ranks in one process: one thread per rank, each running the real gs-SGD engine, with
collectives that meet at a barrier. Every rank reduces the same buffers in the same order, so
results are bitwise identical on every rank, as Horovod's allreduce guarantees."""

from __future__ import annotations

import threading
import zlib
from typing import Any, Callable

import numpy as np


class ThreadCollectives:
    """:class:`gs_horovod.gs_sgd.Collectives` for rank ``rank`` of a :class:`Ranks` group;
    averages (or sums) in float64 and returns the input's dtype and framework."""

    def __init__(self, group: Ranks, rank: int, average: bool = True) -> None:
        self.group, self.rank, self.average = group, rank, average
        self.names: list[str] = []

    def allreduce(self, x: Any, name: str) -> Any:
        self.names.append(name)
        parts = self.group.exchange(self.rank, np.asarray(x))
        total = np.sum([p.astype(np.float64) for p in parts], axis=0)
        out = (total / len(parts) if self.average else total).astype(parts[0].dtype)
        return self.group.wrap(out)

    def same_on_every_rank(self, value: Any, name: str) -> bool:
        parts = self.group.exchange(self.rank, np.asarray(int(value)))
        return all(int(p) == int(parts[0]) for p in parts)


class Ranks:
    """Runs ``fn(rank, collectives)`` on ``size`` threads and returns their results in rank
    order (re-raising the first exception). ``wrap`` turns a NumPy result into the framework's
    array (``torch.from_numpy`` by default)."""

    def __init__(self, size: int, wrap: Callable[[np.ndarray], Any] | None = None) -> None:
        import torch

        self.size = size
        self.wrap = wrap or torch.from_numpy
        self._barrier = threading.Barrier(size)
        self._slots: list[Any] = [None] * size

    def exchange(self, rank: int, x: np.ndarray) -> list[np.ndarray]:
        self._slots[rank] = np.array(x, copy=True)
        self._barrier.wait()
        parts = list(self._slots)
        self._barrier.wait()
        return parts

    def run(self, fn: Callable[[int, ThreadCollectives], Any], average: bool = True) -> list[Any]:
        results: list[Any] = [None] * self.size
        errors: list[BaseException] = []

        def main(rank: int) -> None:
            try:
                results[rank] = fn(rank, ThreadCollectives(self, rank, average))
            except BaseException as e:  # noqa: BLE001 - re-raised below
                errors.append(e)
                self._barrier.abort()

        threads = [threading.Thread(target=main, args=(r,)) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results


def digest(x: Any) -> int:
    return zlib.crc32(np.asarray(x).tobytes())
