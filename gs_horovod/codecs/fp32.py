"""``wire="fp32"``: each pair as an int32 index and a float32 value, interleaved in a float32
buffer (:meth:`~gs_horovod.array_ops.ArrayOps.pairs`, the framework's own ops): 8 bytes a
pair, no header, values exact; indices must lie below 2^31."""

from __future__ import annotations

from typing import Any

from ..array_ops import Array, ArrayOps
from ..transports.protocol import Collectives
from .base import PairCodec


class Fp32(PairCodec):
    name = "fp32"
    lossless = True
    max_coordinates = 2**31

    def planned_bytes(self, pairs: int, messages: int, universe: int) -> int:
        return 8 * pairs

    def rounded(self, ops: ArrayOps, vals: Array) -> Array:
        return vals

    def allgather(self, ops: ArrayOps, comm: Collectives, idx: Array, vals: Array, universe: int, expected: int,
                  name: str) -> tuple[Array, Array, Any]:
        got_idx, got_vals = ops.unpairs(ops.reshape(comm.allgather(ops.pairs(idx, vals), name), (-1,)))
        return got_idx, got_vals, 8 * ops.size_of(idx)

    def alltoall(self, ops: ArrayOps, comm: Collectives, idx: Array, vals: Array, counts: Array, universe: int,
                 expected: int, name: str) -> tuple[Array, Array, Array, Any]:
        received, got = comm.alltoall(ops.pairs(idx, vals), counts * 2, name)  # two floats a pair
        got_idx, got_vals = ops.unpairs(received)
        return got_idx, got_vals, got // 2, 8 * ops.size_of(idx)
