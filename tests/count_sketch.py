"""Count-Sketch: a linear, mergeable summary of a length-d vector in rows × cols floats, over
any framework's :class:`~gs_horovod.array_ops.ArrayOps`: the reference the tests check the
kernels' linearity and heavy hitters against (the engine calls the kernels directly).

For rows j = 0..r-1 with bucket hash b_j and sign hash s_j (see :mod:`gs_horovod.kernels.hashing`)::

    table[j, c] = Σ_{i : b_j(i) = c} s_j(i) · x_i                       (accumulate)
    x̂_i        = median_j s_j(i) · table[j, b_j(i)]                    (estimate)

The table is linear in x, so the sum of sketches is the sketch of the summed vectors: ranks
merge sketches with a plain sum-allreduce. Each estimate is off by at most ~‖x_tail‖₂/√cols
with probability growing in r; heavy hitters are the coordinates of largest |x̂_i|, found by a
pruned scan that never materialises the d estimates.
"""

from __future__ import annotations

from gs_horovod.array_ops import Array, ArrayOps
from gs_horovod.kernels.hashing import MAX_COLS, hash_keys


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
        self.keys = hash_keys(seed)

    @classmethod
    def zeros(cls, rows: int, cols: int, seed: int, ops: ArrayOps, like: Array) -> CountSketch:
        """An empty sketch whose table lives on ``like``'s device."""
        return cls(rows, cols, seed, ops, ops.zeros((rows, cols), like))

    def accumulate(self, vec: Array, offset: int = 0) -> CountSketch:
        """Adds ``vec`` (n,) f32 as coordinates offset..offset+n-1 of the sketched vector."""
        self.table = self.ops.sketch_accumulate(self.table, vec, self.keys, offset)
        return self

    def accumulate_at(self, idx: Array, vals: Array) -> CountSketch:
        """Adds the sparse vector with ``vals`` (n,) f32 at coordinates ``idx`` (n,) int64."""
        self.table = self.ops.sketch_accumulate_at(self.table, idx, vals, self.keys)
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

    def heavy_hitters(self, k: int, length: int) -> tuple[Array, Array]:
        """The k coordinates of [0, length) with the largest |estimate|: (indices (k,) int64
        ascending, estimates (k,) f32). Ranks with bitwise-equal tables get equal indices."""
        if not 1 <= k <= length:
            raise ValueError(f"k must be in [1, length={length}], got {k}")
        return self.ops.heavy_hitters(self.table, self.keys, length, k)
