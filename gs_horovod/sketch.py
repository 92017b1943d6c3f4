"""Count-Sketch: a linear, mergeable summary of a length-d vector in rows × cols floats.

For rows j = 0..r-1 with bucket hash b_j and sign hash s_j (see :mod:`gs_horovod.kernels.hashing`)::

    table[j, c] = Σ_{i : b_j(i) = c} s_j(i) · x_i                       (accumulate)
    x̂_i        = median_j s_j(i) · table[j, b_j(i)]                    (query)

The table is linear in x, so the sum of sketches is the sketch of the summed vectors: ranks
merge sketches with a plain sum-allreduce. Each estimate is off by at most ~‖x_tail‖₂/√cols
with probability growing in r; heavy hitters are the k coordinates of largest |x̂_i|.

The class is framework-agnostic: arrays and kernels come from an :class:`ArrayOps` object
(torch's lives in :mod:`gs_horovod.torch`); hash keys are plain NumPy int64.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from .kernels.hashing import MAX_COLS, row_keys

Array = Any  # a framework's tensor: torch.Tensor, tf.Tensor, ...


class ArrayOps(Protocol):
    """The few array operations the engine needs, for one framework."""

    def zeros(self, shape: tuple[int, ...], like: Array) -> Array:
        """float32 zeros of ``shape`` on ``like``'s device."""

    def sketch_accumulate(self, table: Array, vec: Array, keys: np.ndarray, offset: int) -> Array:
        """``table`` (rows, cols) f32 plus the sketch of ``vec`` (n,) f32; may update in place."""

    def sketch_query(self, table: Array, keys: np.ndarray, offset: int, length: int) -> Array:
        """Median-of-rows estimates (length,) f32 of coordinates offset..offset+length-1."""

    def top_abs(self, x: Array, k: int) -> Array:
        """int64 indices (k,) of the k largest |x|, ascending index order."""

    def take(self, x: Array, idx: Array) -> Array:
        """x[idx]."""

    def scatter_sub(self, x: Array, idx: Array, vals: Array) -> Array:
        """x with x[idx] -= vals (indices unique); may update in place."""

    def scatter(self, n: int, idx: Array, vals: Array) -> Array:
        """A new (n,) f32 vector, zero but for vals at idx."""

    def all_finite(self, x: Array) -> bool:
        """Whether no element of x is NaN or infinite."""


class CountSketch:
    """A rows × cols float32 Count-Sketch whose hashes come from ``seed``.

    Every rank that builds a sketch with the same (rows, cols, seed) hashes every coordinate
    the same way, so their tables can be summed. ``table`` is the framework's (rows, cols) f32.
    """

    def __init__(self, rows: int, cols: int, seed: int, ops: ArrayOps, table: Array) -> None:
        if not isinstance(rows, int) or rows < 1:
            raise ValueError(f"rows must be an int >= 1, got {rows!r}")
        if not isinstance(cols, int) or not 1 <= cols <= MAX_COLS:
            raise ValueError(f"cols must be an int in [1, {MAX_COLS}], got {cols!r}")
        if tuple(table.shape) != (rows, cols):
            raise ValueError(f"table must have shape ({rows}, {cols}), got {tuple(table.shape)}")
        self.rows, self.cols, self.seed = rows, cols, seed
        self.ops = ops
        self.table = table
        self.keys = row_keys(seed, rows)

    @classmethod
    def zeros(cls, rows: int, cols: int, seed: int, ops: ArrayOps, like: Array) -> CountSketch:
        """An empty sketch whose table lives on ``like``'s device."""
        return cls(rows, cols, seed, ops, ops.zeros((rows, cols), like))

    def accumulate(self, vec: Array, offset: int = 0) -> CountSketch:
        """Adds ``vec`` (n,) f32 as coordinates offset..offset+n-1 of the sketched vector."""
        self.table = self.ops.sketch_accumulate(self.table, vec, self.keys, offset)
        return self

    def merge(self, other: CountSketch) -> CountSketch:
        """The sketch of the sum of both sketched vectors (a new object)."""
        if (other.rows, other.cols, other.seed) != (self.rows, self.cols, self.seed):
            raise ValueError(
                "cannot merge Count-Sketches of different (rows, cols, seed): "
                f"{(self.rows, self.cols, self.seed)} vs {(other.rows, other.cols, other.seed)}"
            )
        return CountSketch(self.rows, self.cols, self.seed, self.ops, self.table + other.table)

    __add__ = merge

    def query(self, length: int, offset: int = 0) -> Array:
        """Estimates (length,) f32 of coordinates offset..offset+length-1."""
        return self.ops.sketch_query(self.table, self.keys, offset, length)

    def heavy_hitters(self, k: int, length: int) -> tuple[Array, Array]:
        """The k coordinates of [0, length) with the largest |estimate|.

        Returns (indices (k,) int64 ascending, estimates (k,) f32). Deterministic: ranks with
        bitwise-equal tables get equal indices.
        """
        if not 1 <= k <= length:
            raise ValueError(f"k must be in [1, length={length}], got {k}")
        est = self.query(length)
        idx = self.ops.top_abs(est, k)
        return idx, self.ops.take(est, idx)
