"""Count-Sketch: a linear, mergeable summary of a length-d vector in rows × cols floats, and
the array operations the gs-SGD engine needs from a framework.

For rows j = 0..r-1 with bucket hash b_j and sign hash s_j (see :mod:`gs_horovod.kernels.hashing`)::

    table[j, c] = Σ_{i : b_j(i) = c} s_j(i) · x_i                       (accumulate)
    x̂_i        = median_j s_j(i) · table[j, b_j(i)]                    (estimate)

The table is linear in x, so the sum of sketches is the sketch of the summed vectors: ranks
merge sketches with a plain sum-allreduce. Each estimate is off by at most ~‖x_tail‖₂/√cols
with probability growing in r; heavy hitters are the coordinates of largest |x̂_i|, found by a
pruned scan that never materialises the d estimates.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import numpy as np

from .kernels.hashing import MAX_COLS, hash_keys

Array = Any  # a framework's tensor: torch.Tensor, tf.Tensor, ...


class ArrayOps(Protocol):
    """The array operations the engine needs, for one framework. Arrays are 1-D unless said;
    ``idx`` arrays are int64. Predicates are Python bools (torch) or bool tensors (TF)."""

    def zeros(self, shape: tuple[int, ...], like: Array) -> Array:
        """float32 zeros of ``shape`` on ``like``'s device."""

    def zeros_like(self, x: Array) -> Array: ...

    def concat(self, xs: list[Array]) -> Array: ...

    def split(self, x: Array, sizes: tuple[int, ...]) -> list[Array]:
        """Consecutive pieces of x of the given sizes."""

    def slice(self, x: Array, start: int, size: int) -> Array: ...

    def reshape(self, x: Array, shape: tuple[int, ...]) -> Array: ...

    def stack(self, xs: list[Array]) -> Array: ...

    def cast(self, x: Array, dtype: str) -> Array:
        """x as "float16" or "float32"."""

    def take(self, x: Array, idx: Array) -> Array:
        """x[idx]."""

    def scatter(self, n: int, idx: Array, vals: Array, like: Array) -> Array:
        """A new (n,) f32 vector, zero but for vals at idx."""

    def scatter_sub(self, x: Array, idx: Array, vals: Array) -> Array:
        """x with x[idx] -= vals (indices unique); may update x in place."""

    def where(self, mask: Array, a: Array, b: Array) -> Array: ...

    def isin_sorted(self, x: Array, ref: Array) -> Array:
        """A bool mask: x[i] in ref (ref ascending)."""

    def all_finite(self, x: Array) -> Any:
        """Predicate: no element of x is NaN or infinite."""

    def not_finite(self, x: Array) -> Array:
        """A 0-d f32: 1 if x has a NaN or infinite element, else 0."""

    def logical_and(self, a: Any, b: Any) -> Any: ...

    def top_abs(self, x: Array, count: int) -> Array:
        """Indices (count,) ascending of the count largest |x| (NaN/Inf largest; ties: lower index)."""

    def sketch_accumulate(self, table: Array, vec: Array, keys: np.ndarray, offset: int) -> Array:
        """``table`` (rows, cols) f32 plus the sketch of ``vec`` (n,) f32 at coordinates offset..;
        may update in place."""

    def sketch_accumulate_at(self, table: Array, idx: Array, vals: Array, keys: np.ndarray) -> Array:
        """``table`` plus the sketch of the sparse vector with ``vals`` (n,) f32 at ``idx``."""

    def heavy_hitters(self, table: Array, keys: np.ndarray, length: int, count: int) -> tuple[Array, Array]:
        """(idx (count,) ascending, estimates (count,) f32): the count coordinates of [0, length)
        with the largest |median estimate| (ties: lower index), identical for equal tables."""

    def checksum(self, idx: Array) -> Any:
        """An int in [0, 2^62) summarising idx (equal for equal idx)."""

    def join_names(self, names: tuple[str, ...], flags: Array) -> Any:
        """The names whose flag is > 0, quoted and comma-separated (a str or string tensor)."""

    def cond(self, pred: Any, true_fn: Callable[[], Any], false_fn: Callable[[], Any]) -> Any:
        """``true_fn()`` if pred else ``false_fn()`` (both return the same structure)."""

    def when(self, pred: Any, fn: Callable[[], Any]) -> Any:
        """Runs ``fn`` (a check) if pred; returns a token for :meth:`after`."""

    def fail_unless(self, pred: Any, error: type, message: Callable[[], list[Any]]) -> Any:
        """Raises ``error`` with the joined ``message()`` parts unless pred (torch: now; TF: an
        assertion); returns a token for :meth:`after`."""

    def after(self, checks: list[Any], values: Any) -> Any:
        """``values`` (a nested tuple/list of arrays) once every check has passed."""


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
