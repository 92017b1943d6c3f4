"""Count-Sketch kernels in TensorFlow ops (graph-safe), bit for bit the hashes of :mod:`.hashing`."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from .hashing import GOLDEN, MASK32, MIX1, MIX2


def _mul32(x: tf.Tensor, m: int) -> tf.Tensor:
    lo = x * (m & 0xFFFF)
    hi = tf.bitwise.left_shift(tf.bitwise.bitwise_and(x * (m >> 16), 0xFFFF), 16)
    return tf.bitwise.bitwise_and(lo + hi, MASK32)


def _hash(lo: tf.Tensor, hi_mix: tf.Tensor, key: int) -> tf.Tensor:
    x = tf.bitwise.bitwise_and(tf.bitwise.bitwise_xor(lo, key) + hi_mix, MASK32)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 16))
    x = _mul32(x, MIX1)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 13))
    x = _mul32(x, MIX2)
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 16))


def _buckets_signs(keys: np.ndarray, cols: int, g: tf.Tensor) -> list[tuple[tf.Tensor, tf.Tensor]]:
    lo = tf.bitwise.bitwise_and(g, MASK32)
    hi_mix = tf.bitwise.bitwise_and(tf.bitwise.right_shift(g, 32) * GOLDEN, MASK32)
    out = []
    for key in keys.tolist():
        h = _hash(lo, hi_mix, key)
        sign = 1.0 - 2.0 * tf.cast(tf.bitwise.bitwise_and(h, 1), tf.float32)
        out.append((tf.bitwise.right_shift(h * cols, 32), sign))
    return out


def accumulate(table: tf.Tensor, vec: tf.Tensor, keys: np.ndarray, offset: int) -> tf.Tensor:
    g = tf.range(offset, offset + tf.cast(tf.size(vec), tf.int64), dtype=tf.int64)
    return accumulate_at(table, g, vec, keys)


def accumulate_at(table: tf.Tensor, idx: tf.Tensor, vals: tf.Tensor, keys: np.ndarray) -> tf.Tensor:
    cols = int(table.shape[1])
    hashes = _buckets_signs(keys, cols, tf.cast(idx, tf.int64))
    return table + tf.stack([tf.math.unsorted_segment_sum(s * vals, b, cols) for b, s in hashes])


def heavy_hitters(table: tf.Tensor, keys: np.ndarray, length: int, count: int, offset: int = 0) -> Any:
    rows, cols = int(table.shape[0]), int(table.shape[1])
    g = tf.range(offset, offset + length, dtype=tf.int64)
    est = tf.sort(tf.stack([tf.gather(table[j], b) * s
                            for j, (b, s) in enumerate(_buckets_signs(keys, cols, g))]), axis=0)
    est = est[rows // 2] if rows % 2 else (est[rows // 2 - 1] + est[rows // 2]) * 0.5
    idx = top_abs(est, count)
    return idx, tf.gather(est, idx)


def top_abs(x: tf.Tensor, count: int) -> tf.Tensor:
    mag = tf.where(tf.math.is_nan(x), tf.constant(np.inf, x.dtype), tf.abs(x))
    order = tf.argsort(mag, direction="DESCENDING", stable=True)[:count]
    return tf.sort(tf.cast(order, tf.int64))
