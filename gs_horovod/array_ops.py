"""The array operations the gs-SGD engine needs from a framework: :class:`ArrayOps`, which
``gs_horovod.kernels.torch_ops.TorchOps`` and ``gs_horovod.kernels.tf_ops.TfOps`` implement."""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol

import numpy as np

Array = Any  # a framework's tensor: torch.Tensor, tf.Tensor, ...


class ArrayOps(Protocol):
    """The array operations the engine needs, for one framework. Arrays are 1-D unless said;
    ``idx`` arrays are int64. Predicates are Python bools (torch) or bool tensors (TF)."""

    def zeros(self, shape: tuple[int, ...], like: Array) -> Array:
        """float32 zeros of ``shape`` on ``like``'s device."""

    def zeros_like(self, x: Array) -> Array: ...

    def from_numpy(self, x: np.ndarray) -> Array:
        """The framework's array (on the host) holding x."""

    def copy(self, x: Array) -> Array:
        """A copy of x that later in-place updates of x do not change."""

    def concat(self, xs: list[Array]) -> Array: ...

    def add_parts(self, base: Array, parts: list[Array]) -> Array:
        """A new (n,) f32: base (n,) plus the pieces (d_i,) f32 laid end to end (Σ d_i = n),
        without concatenating them first."""

    def slice(self, x: Array, start: int, size: int) -> Array: ...

    def reshape(self, x: Array, shape: tuple[int, ...]) -> Array: ...

    def stack(self, xs: list[Array]) -> Array: ...

    def dtype_name(self, x: Array) -> str:
        """x's dtype as NumPy names it ("float16", "float32", ...)."""

    def plus_minus(self, value: Any) -> Array:
        """(2,) int64: [value, -value] (value an int or a scalar tensor)."""

    def equal(self, a: Array, b: Array) -> Any:
        """Predicate: the 0-d a equals b."""

    def cast(self, x: Array, dtype: str) -> Array:
        """x as "float16" or "float32"."""

    def take(self, x: Array, idx: Array) -> Array:
        """x[idx]."""

    def scatter(self, n: int, idx: Array, vals: Array, like: Array, tail: Optional[Array] = None) -> Array:
        """A new (n + len(tail),) f32 vector: zero but for vals at idx in [0, n), then ``tail``."""

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

    def pack_pairs(self, idx: Array, vals: Array) -> Array:
        """(2n,) f32: idx (n,) int64 in [0, 2^31) as int32 bit patterns, then vals (n,) f32 (for
        one allgather; no arithmetic may touch the first half)."""

    def unpack_pairs(self, rows: Array) -> tuple[Array, Array]:
        """(idx (P, n) int64, vals (P, n) f32) of rows (P, 2n) f32, each row a :meth:`pack_pairs`."""

    def columns(self, x: Array, start: int, size: int) -> Array:
        """x[:, start:start + size] of a 2-D x."""

    def union_sum(self, idx: Array, vals: Array) -> tuple[Array, Array]:
        """(union (u,) int64 ascending, sums (u,) f32) of the sparse vectors given by rows of
        ``idx`` (P, n) int64 (each row distinct) and ``vals`` (P, n) f32: sums[j] = Σ_r vals[r, i]
        over the rows r holding union[j] at i, added in row order (the same bits everywhere)."""

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
