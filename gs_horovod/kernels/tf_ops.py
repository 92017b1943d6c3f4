"""Count-Sketch kernels in pure TensorFlow ops, and :class:`TfOps`, the engine's array operations
in TF ops. Graph-safe (usable inside ``tf.function`` with a static ``count``); the same contract
and bitwise the same hashes and tables as the NumPy reference, :mod:`.numba_cpu` and
:mod:`.torch_ops` (see :mod:`.hashing`)::

    accumulate(table, vec, keys, offset) -> table       # + sketch of vec (n,) f32 at offset..offset+n-1
    accumulate_at(table, idx, vals, keys) -> table      # + sketch of vals (n,) f32 at idx (n,) int64
    heavy_hitters(table, keys, length, count, offset=0) -> (idx (count,) int64 ascending, est (count,) f32)
    top_abs(x, count) -> idx (count,) int64 ascending

The hash runs in int64 ops (multiplication wraps mod 2^64, logical shifts by masking), which
TensorFlow has on every device, unlike some uint64 kernels. Additions go through
``tensor_scatter_nd_add``, which adds in index order onto the table, as ``index_add_`` and the
Numba kernels do. ``heavy_hitters`` computes every estimate (no pruning: one gather per row
and a sort over rows), so it holds O(rows · length) temporaries; ``top_abs`` uses ``top_k`` on
int32 keys of |x| and a tie fix by index.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Optional

import numpy as np
import tensorflow as tf

from ..array_ops import MessageCodec
from .hashing import M1, M2, M3, MASK32, NAN_KEY, to_int64

_M1, _M2, _M3 = to_int64(M1), to_int64(M2), to_int64(M3)
_DTYPES = {"float16": tf.float16, "float32": tf.float32}


def _srl(x: tf.Tensor, s: int) -> tf.Tensor:
    """Logical right shift of int64 bit patterns."""
    return tf.bitwise.bitwise_and(tf.bitwise.right_shift(x, tf.constant(s, tf.int64)), (1 << (64 - s)) - 1)


def hashes(g: tf.Tensor, keys: np.ndarray, rows: int, cols: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Buckets (rows, n) int64 and sign bits (rows, n) bool (True: -1) of coordinates g (n,) int64."""
    xor, band = tf.bitwise.bitwise_xor, tf.bitwise.bitwise_and
    z = xor(g, tf.constant(int(keys[0]), tf.int64))
    z = xor(z, _srl(z, 30)) * _M1
    z = xor(z, _srl(z, 27)) * _M2
    z = xor(z, _srl(z, 31))
    h1, h2 = band(z, MASK32), tf.bitwise.bitwise_or(_srl(z, 32), 1)
    w = xor(z, _srl(z, 29)) * _M3
    j = tf.range(rows, dtype=tf.int64)[:, None]
    buckets = tf.bitwise.right_shift(band(h1[None, :] + j * h2[None, :], MASK32) * cols, tf.constant(32, tf.int64))
    neg = band(tf.bitwise.right_shift(w[None, :], 63 - j), 1) != 0
    return buckets, neg


def accumulate_at(table: tf.Tensor, idx: tf.Tensor, vals: tf.Tensor, keys: np.ndarray) -> tf.Tensor:
    """``table`` (rows, cols) f32 plus the sketch of the sparse vector with ``vals`` (n,) f32 at
    global coordinates ``idx`` (n,) int64 in [0, 2^62), added in idx order."""
    rows, cols = int(table.shape[0]), int(table.shape[1])
    buckets, neg = hashes(tf.cast(idx, tf.int64), keys, rows, cols)
    vals = tf.cast(vals, tf.float32)
    signed = tf.where(neg, -vals[None, :], vals[None, :])
    row = tf.broadcast_to(tf.range(rows, dtype=tf.int64)[:, None], tf.shape(buckets))
    cells = tf.reshape(tf.stack([row, buckets], axis=-1), [-1, 2])
    return tf.tensor_scatter_nd_add(table, cells, tf.reshape(signed, [-1]))


def accumulate(table: tf.Tensor, vec: tf.Tensor, keys: np.ndarray, offset: int) -> tf.Tensor:
    """``table`` (rows, cols) f32 plus the sketch of ``vec`` (n,) f32 at coordinates offset..offset+n-1."""
    g = tf.range(offset, offset + tf.cast(tf.size(vec), tf.int64), dtype=tf.int64)
    return accumulate_at(table, g, vec, keys)


def _estimates(table: tf.Tensor, g: tf.Tensor, keys: np.ndarray) -> tf.Tensor:
    rows, cols = int(table.shape[0]), int(table.shape[1])
    buckets, neg = hashes(g, keys, rows, cols)
    v = tf.gather(table, buckets, batch_dims=1)
    est = tf.sort(tf.where(neg, -v, v), axis=0)
    return est[rows // 2] if rows % 2 else (est[rows // 2 - 1] + est[rows // 2]) * 0.5


def _abs_key(x: tf.Tensor) -> tf.Tensor:
    k = tf.bitwise.bitwise_and(tf.bitcast(tf.cast(x, tf.float32), tf.int32), 0x7FFFFFFF)
    return tf.where(k > 0x7F800000, tf.constant(NAN_KEY, tf.int32), k)


def _top_keys(key: tf.Tensor, count: int) -> tf.Tensor:
    """Positions (count,) int64 ascending of the ``count`` largest int32 keys, ties to smaller positions."""
    cut = tf.reduce_min(tf.math.top_k(key, count, sorted=False).values)
    above = tf.reshape(tf.where(key > cut), [-1])
    ties = tf.reshape(tf.where(key == cut), [-1])[: count - tf.size(above)]
    return tf.ensure_shape(tf.sort(tf.concat([above, ties], 0)), [count])


def top_abs(x: tf.Tensor, count: int) -> tf.Tensor:
    """Indices (count,) int64 ascending of the ``count`` largest |x| of x (n,) f32 (ties: smaller
    index; NaN above ±Inf above every finite value)."""
    return _top_keys(_abs_key(x), count)


def heavy_hitters(table: tf.Tensor, keys: np.ndarray, length: int, count: int,
                  offset: int = 0) -> tuple[tf.Tensor, tf.Tensor]:
    """The ``count`` coordinates of offset..offset+length-1 with the largest |median-of-rows
    estimate| (ties: smaller index): (idx (count,) int64 ascending in [0, length), est (count,) f32)."""
    if not 1 <= count <= length:
        raise ValueError(f"count must be in [1, length={length}], got {count}")
    est = _estimates(table, tf.range(offset, offset + length, dtype=tf.int64), keys)
    idx = _top_keys(_abs_key(est), count)
    return idx, tf.gather(est, idx)


class TfOps:
    """:class:`gs_horovod.array_ops.ArrayOps` for TensorFlow: pure TF ops, graph-safe."""

    def zeros(self, shape: tuple[int, ...], like: Any) -> tf.Tensor:
        return tf.zeros(shape, tf.float32)

    def zeros_like(self, x: tf.Tensor) -> tf.Tensor:
        return tf.zeros_like(x)

    def from_numpy(self, x: np.ndarray, like: Any = None) -> tf.Tensor:
        return tf.constant(x)

    def copy(self, x: tf.Tensor) -> tf.Tensor:
        return tf.identity(x)

    def moved(self, x: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
        with tf.device(like.device):
            return tf.identity(tf.cast(x, tf.float32))

    def own_threads(self) -> ContextManager[None]:
        """TensorFlow's thread pools are fixed at start-up."""
        return contextlib.nullcontext()

    def wait(self, x: tf.Tensor) -> None:
        """Eager TensorFlow returns computed tensors; a traced graph is not timed."""

    def concat(self, xs: list[tf.Tensor]) -> tf.Tensor:
        return xs[0] if len(xs) == 1 else tf.concat(xs, 0)

    def add_parts(self, base: tf.Tensor, parts: list[tf.Tensor]) -> tf.Tensor:
        return base + self.concat(parts)

    def slice(self, x: tf.Tensor, start: int, size: int) -> tf.Tensor:
        return x[start:start + size]

    def reshape(self, x: tf.Tensor, shape: tuple[int, ...]) -> tf.Tensor:
        return tf.reshape(x, shape)

    def stack(self, xs: list[tf.Tensor]) -> tf.Tensor:
        return tf.stack(xs)

    def dtype_name(self, x: tf.Tensor) -> str:
        return x.dtype.name

    def plus_minus(self, value: Any) -> tf.Tensor:
        value = tf.cast(value, tf.int64)
        return tf.stack([value, -value])

    def equal(self, a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
        return tf.equal(a, b)

    def cast(self, x: tf.Tensor, dtype: str) -> tf.Tensor:
        return tf.cast(x, _DTYPES[dtype])

    def take(self, x: tf.Tensor, idx: tf.Tensor) -> tf.Tensor:
        return tf.gather(x, idx)

    def scatter(self, n: int, idx: tf.Tensor, vals: tf.Tensor, like: Any,
                tail: Optional[tf.Tensor] = None) -> tf.Tensor:
        out = tf.scatter_nd(idx[:, None], vals, [n])
        return out if tail is None else tf.concat([out, tail], 0)

    def scatter_sub(self, x: tf.Tensor, idx: tf.Tensor, vals: tf.Tensor) -> tf.Tensor:
        return tf.tensor_scatter_nd_sub(x, idx[:, None], vals)

    def where(self, mask: tf.Tensor, a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
        return tf.where(mask, a, b)

    def isin_sorted(self, x: tf.Tensor, ref: tf.Tensor) -> tf.Tensor:
        pos = tf.minimum(tf.searchsorted(ref, x), tf.maximum(tf.size(ref, tf.int32) - 1, 0))
        return tf.equal(tf.gather(ref, pos), x)

    def all_finite(self, x: tf.Tensor) -> tf.Tensor:
        return tf.reduce_all(tf.math.is_finite(x))

    def not_finite(self, x: tf.Tensor) -> tf.Tensor:
        return 1.0 - tf.cast(self.all_finite(x), tf.float32)

    def sum_squares(self, x: tf.Tensor) -> tf.Tensor:
        return tf.reduce_sum(tf.square(tf.cast(x, tf.float32)))

    def logical_and(self, a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
        return tf.logical_and(a, b)

    def top_abs(self, x: tf.Tensor, count: int) -> tf.Tensor:
        return top_abs(x, count)

    def sketch_accumulate(self, table: tf.Tensor, vec: tf.Tensor, keys: np.ndarray, offset: int) -> tf.Tensor:
        return accumulate(table, vec, keys, offset)

    def sketch_accumulate_at(self, table: tf.Tensor, idx: tf.Tensor, vals: tf.Tensor, keys: np.ndarray) -> tf.Tensor:
        return accumulate_at(table, idx, vals, keys)

    def heavy_hitters(self, table: tf.Tensor, keys: np.ndarray, length: int, count: int) -> tuple[tf.Tensor, tf.Tensor]:
        return heavy_hitters(table, keys, length, count)

    def pairs(self, idx: tf.Tensor, vals: tf.Tensor) -> tf.Tensor:
        return tf.reshape(tf.stack([tf.bitcast(tf.cast(idx, tf.int32), tf.float32), vals], 1), [-1])

    def unpairs(self, buf: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        both = tf.reshape(buf, [-1, 2])
        return tf.cast(tf.bitcast(both[:, 0], tf.int32), tf.int64), both[:, 1]

    def wire_rounded(self, vals: tf.Tensor, codec: MessageCodec) -> tf.Tensor:
        return tf.ensure_shape(tf.numpy_function(codec.rounded_numba, [vals], tf.float32, stateful=False), vals.shape)

    def pack_pairs(self, idx: tf.Tensor, vals: tf.Tensor, counts: tf.Tensor, universe: int,
                   low: int, codec: MessageCodec) -> tuple[tf.Tensor, tf.Tensor]:
        """The codec's Numba kernels (the reference's bytes) through ``tf.numpy_function``."""
        buf, sizes = tf.numpy_function(lambda i, v, c: codec.encode_numba(i, v, c, universe, low),
                                       [idx, vals, counts], [tf.uint8, tf.int32], stateful=False)
        return tf.ensure_shape(buf, [None]), tf.ensure_shape(sizes, counts.shape)

    def unpack_pairs(self, buf: tf.Tensor, messages: int, universe: int,
                     low: int, codec: MessageCodec) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        idx, vals, counts = tf.numpy_function(lambda b: codec.decode_numba(b, universe, low), [buf],
                                              [tf.int64, tf.float32, tf.int32], stateful=False)
        return tf.ensure_shape(idx, [None]), tf.ensure_shape(vals, [None]), tf.ensure_shape(counts, [messages])

    def take_sorted(self, keys: tf.Tensor, vals: tf.Tensor, x: tf.Tensor, universe: int) -> tf.Tensor:
        keys = tf.concat([keys, tf.constant([np.iinfo(np.int64).max], tf.int64)], 0)  # a sentinel: never found
        vals = tf.concat([vals, tf.zeros([1], vals.dtype)], 0)
        pos = tf.searchsorted(keys, x)
        return tf.where(tf.equal(tf.gather(keys, pos), x), tf.gather(vals, pos), tf.zeros_like(x, vals.dtype))

    def union_sum(self, idx: tf.Tensor, vals: tf.Tensor, counts: tf.Tensor,
                  universe: int) -> tuple[tf.Tensor, tf.Tensor]:
        union, _ = tf.unique(tf.sort(idx))
        sums = tf.zeros(tf.shape(union), vals.dtype)
        vectors = int(counts.shape[0])
        counts = tf.cast(counts, tf.int64)
        for part, v in zip(tf.split(idx, counts, num=vectors), tf.split(vals, counts, num=vectors)):
            pos = tf.searchsorted(union, part)  # a vector's positions are distinct: no two writes collide
            sums = tf.tensor_scatter_nd_add(sums, pos[:, None], v)
        return union, sums

    def spans(self, x: tf.Tensor, starts: list[int]) -> list[tuple[tf.Tensor, tf.Tensor]]:
        edges = tf.concat([tf.searchsorted(x, tf.constant(starts, x.dtype)), tf.size(x)[None]], 0)
        return [(edges[g], edges[g + 1] - edges[g]) for g in range(len(starts))]

    def owner_of(self, idx: tf.Tensor, ranks: int, keys: np.ndarray) -> tf.Tensor:
        return hashes(idx, keys, 1, ranks)[0][0]

    def stable_order(self, x: tf.Tensor) -> tf.Tensor:
        return tf.cast(tf.argsort(x, stable=True), tf.int64)

    def bucket(self, x: tf.Tensor, edges: tf.Tensor) -> tf.Tensor:
        found = tf.searchsorted(edges, x, side="right", out_type=tf.int64) - 1
        return tf.clip_by_value(found, 0, tf.cast(tf.size(edges), tf.int64) - 2)

    def count(self, bins: tf.Tensor, n: int, mask: Optional[tf.Tensor] = None) -> tf.Tensor:
        bins = bins if mask is None else tf.boolean_mask(bins, mask)
        return tf.math.bincount(tf.cast(bins, tf.int32), minlength=n, maxlength=n, dtype=tf.int32)

    def pack_counts(self, counts: tf.Tensor, bits: int) -> tf.Tensor:
        lanes, n = 63 // bits, tf.size(counts)
        padded = tf.pad(tf.cast(counts, tf.int64), [[0, (n + lanes - 1) // lanes * lanes - n]])
        shifts = tf.range(lanes, dtype=tf.int64) * bits
        return tf.reduce_sum(tf.bitwise.left_shift(tf.reshape(padded, [lanes, -1]), shifts[:, None]), 0)

    def unpack_counts(self, words: tf.Tensor, bits: int, n: int) -> tf.Tensor:
        shifts = tf.range(63 // bits, dtype=tf.int64) * bits
        lanes = tf.bitwise.bitwise_and(tf.bitwise.right_shift(tf.cast(words, tf.int64)[None, :], shifts[:, None]),
                                       tf.constant((1 << bits) - 1, tf.int64))
        return tf.reshape(lanes, [-1])[:n]

    def abs_key(self, x: tf.Tensor) -> tf.Tensor:
        return tf.cast(_abs_key(x), tf.int64)

    def key_bits(self, key: tf.Tensor, shift: int, bits: int) -> tf.Tensor:
        return tf.bitwise.bitwise_and(tf.bitwise.right_shift(key, tf.constant(shift, tf.int64)),
                                      tf.constant((1 << bits) - 1, tf.int64))

    def radix_cut(self, counts: tf.Tensor, wanted: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        hist = tf.reshape(tf.cast(counts, tf.int64), [int(wanted.shape[0]), -1])
        from_top = tf.reverse(tf.cumsum(tf.reverse(hist, [1]), 1), [1])  # [g, b]: in bins b and above
        cut = tf.reduce_sum(tf.cast(from_top >= tf.cast(wanted, tf.int64)[:, None], tf.int64), 1) - 1
        beyond = tf.concat([from_top, tf.zeros_like(from_top[:, :1])], 1)
        return cut, tf.cast(tf.gather(beyond, cut + 1, batch_dims=1), tf.int32)

    def equal_at(self, a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
        return tf.equal(a, b)

    def keep_top(self, prefix: tf.Tensor, key: tf.Tensor, group: tf.Tensor, cut: tf.Tensor,
                 ties: tf.Tensor) -> tf.Tensor:
        at = tf.gather(cut, group)
        tied = tf.where(tf.equal(prefix, at))[:, 0]
        g = tf.gather(group, tied)
        order = tf.argsort(g * (1 << 32) + (0x7FFFFFFF - tf.gather(key, tied)), stable=True)
        g = tf.gather(g, order)
        rank = tf.range(tf.size(g, tf.int64), dtype=tf.int64) - tf.searchsorted(g, g, out_type=tf.int64)
        chosen = tf.gather(tied, tf.boolean_mask(order, rank < tf.cast(tf.gather(ties, g), tf.int64)))
        mask = tf.tensor_scatter_nd_update(prefix > at, chosen[:, None], tf.ones_like(chosen, tf.bool))
        return tf.where(mask)[:, 0]

    def host_int32(self, x: tf.Tensor) -> tf.Tensor:
        return tf.cast(x, tf.int32)

    def size_of(self, x: tf.Tensor) -> tf.Tensor:
        return tf.size(x, tf.int64)

    def count_of(self, n: Any) -> tf.Tensor:
        return tf.cast(n, tf.int64)

    def checksum(self, idx: tf.Tensor) -> tf.Tensor:
        """(Σ idx mod 2^40) · 2^21 + Σ (idx mod 65521)² mod 2^21: equal for equal idx."""
        low = tf.reduce_sum(tf.math.floormod(idx, 65521) ** 2) % (2**21)
        return (tf.reduce_sum(idx) % (2**40)) * (2**21) + low

    def join_names(self, names: tuple[str, ...], flags: tf.Tensor) -> tf.Tensor:
        quoted = tf.constant([repr(n) for n in names])
        return tf.strings.reduce_join(tf.boolean_mask(quoted, flags > 0), separator=", ")

    def cond(self, pred: Any, true_fn: Callable[[], Any], false_fn: Callable[[], Any]) -> Any:
        """``tf.cond``; a None leaf (no momentum) travels as a (0,) placeholder and comes back
        None, since ``tf.cond`` takes tensors only (both branches have None at the same leaves)."""
        if isinstance(pred, bool):
            return true_fn() if pred else false_fn()
        nones: list[bool] = []

        def placed(fn: Callable[[], Any]) -> Callable[[], Any]:
            def run() -> Any:
                out = fn()
                flat = tf.nest.flatten(out)
                nones[:] = [x is None for x in flat]
                return tf.nest.pack_sequence_as(out, [tf.zeros([0]) if x is None else x for x in flat])
            return run

        out = tf.cond(pred, placed(true_fn), placed(false_fn))
        return tf.nest.pack_sequence_as(out, [None if none else x for none, x in zip(nones, tf.nest.flatten(out))])

    def when(self, pred: Any, fn: Callable[[], Any]) -> Any:
        def run() -> tf.Tensor:
            with tf.control_dependencies([fn()]):
                return tf.constant(True)

        return self.cond(pred, run, lambda: tf.constant(True))

    def fail_unless(self, pred: Any, error: type, message: Callable[[], list[Any]]) -> Any:
        def text() -> tf.Tensor:
            return tf.strings.join([p if isinstance(p, tf.Tensor) and p.dtype == tf.string else tf.strings.as_string(p)
                                    if isinstance(p, (tf.Tensor, tf.Variable)) else str(p) for p in message()])

        pred = tf.convert_to_tensor(pred)
        return tf.debugging.Assert(pred, [tf.cond(pred, lambda: tf.constant(""), text)], name=error.__name__)

    def after(self, checks: list[Any], values: Any) -> Any:
        with tf.control_dependencies(checks):
            return tf.nest.map_structure(lambda x: None if x is None else tf.identity(x), values)
