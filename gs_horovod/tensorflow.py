"""GsSketch for ``horovod.tensorflow`` (and ``horovod.tensorflow.keras``): gs-SGD in TF ops.

    tape = hvd.DistributedGradientTape(tape, compression=GsSketch)          # defaults
    opt = hvd.DistributedOptimizer(opt, compression=GsSketch(ratio=0.01))   # Keras / TF1

Horovod builds its gradient allreduces inside a ``tf.function``, so everything here is graph
code: per-variable state lives in ``tf.Variable``s (created once, outside any function, by
``tf.init_scope``), and the per-step logic is TF ops, so it runs the same eagerly and in
``@tf.function``. The sketch is :class:`gs_horovod.sketch.CountSketch` over :class:`TfOps`,
whose hashes are bit for bit those of the torch backends.

Horovod hands ``compress`` only the gradient; its caller ``allreduce_grads(grads, vars)`` has
the variables, so GsSketch finds the variable of a gradient there (by identity, at trace
time) and keys state by its ``.ref()``. Names for the exact round and checkpoints come from
the variable's path (``var.path`` in Keras 3, else ``var.name``).

Semantics match the torch GsSketch (:class:`gs_horovod.gs_sgd.GsConfig`); differences: the
exact round is one allreduce per variable (TF runs Horovod ops asynchronously, so their order
does not matter), ``IndexedSlices`` go Horovod's allgather way uncompressed unless the
optimizer is given ``sparse_as_dense=True``, and ``merge="mpi"`` is torch-only.
"""

from __future__ import annotations

import re
import sys
from typing import Any, Optional

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from horovod.tensorflow.compression import Compressor

from .compressor import DefaultInstance, DefaultInstanceMethod, config_from
from .kernels.hashing import GOLDEN, MASK32, MIX1, MIX2
from .sketch import CountSketch


def _mul32(x: tf.Tensor, m: int) -> tf.Tensor:
    """(x * m) mod 2^32 for int64 x in [0, 2^32), without overflow (as kernels/torch_ops.py)."""
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


def _buckets_signs(keys: np.ndarray, cols: int, offset: int, n: Any) -> list[tuple[tf.Tensor, tf.Tensor]]:
    g = tf.range(offset, offset + tf.cast(n, tf.int64), dtype=tf.int64)
    lo = tf.bitwise.bitwise_and(g, MASK32)
    hi_mix = tf.bitwise.bitwise_and(tf.bitwise.right_shift(g, 32) * GOLDEN, MASK32)
    out = []
    for key in keys.tolist():
        h = _hash(lo, hi_mix, key)
        sign = 1.0 - 2.0 * tf.cast(tf.bitwise.bitwise_and(h, 1), tf.float32)
        out.append((tf.bitwise.right_shift(h * cols, 32), sign))
    return out


class TfOps:
    """:class:`gs_horovod.sketch.ArrayOps` for TensorFlow: pure TF ops, graph-safe."""

    def zeros(self, shape: tuple[int, ...], like: Any) -> tf.Tensor:
        return tf.zeros(shape, tf.float32)

    def sketch_accumulate(self, table: tf.Tensor, vec: tf.Tensor, keys: np.ndarray, offset: int) -> tf.Tensor:
        cols = int(table.shape[1])
        hashes = _buckets_signs(keys, cols, offset, tf.size(vec))
        return table + tf.stack([tf.math.unsorted_segment_sum(s * vec, b, cols) for b, s in hashes])

    def sketch_query(self, table: tf.Tensor, keys: np.ndarray, offset: int, length: int) -> tf.Tensor:
        rows, cols = int(table.shape[0]), int(table.shape[1])
        est = tf.sort(tf.stack([tf.gather(table[j], b) * s
                                for j, (b, s) in enumerate(_buckets_signs(keys, cols, offset, length))]), axis=0)
        return est[rows // 2] if rows % 2 else (est[rows // 2 - 1] + est[rows // 2]) * 0.5

    def top_abs(self, x: tf.Tensor, k: int) -> tf.Tensor:
        return tf.sort(tf.cast(tf.math.top_k(tf.abs(x), k, sorted=False).indices, tf.int64))

    def take(self, x: tf.Tensor, idx: tf.Tensor) -> tf.Tensor:
        return tf.gather(x, idx)

    def scatter_sub(self, x: tf.Tensor, idx: tf.Tensor, vals: tf.Tensor) -> tf.Tensor:
        return tf.tensor_scatter_nd_sub(x, idx[:, None], vals)

    def scatter(self, n: int, idx: tf.Tensor, vals: tf.Tensor) -> tf.Tensor:
        return tf.scatter_nd(idx[:, None], vals, [n])

    def all_finite(self, x: tf.Tensor) -> tf.Tensor:
        return tf.reduce_all(tf.math.is_finite(x))


class _VariableState(tf.Module):
    """Residual (d,) f32, momentum (d,) f32 (when m > 0) and steps (int64) of one variable."""

    def __init__(self, d: int, momentum: bool, name: str) -> None:
        super().__init__(name=re.sub(r"\W", "_", name))
        self.residual = tf.Variable(tf.zeros([d], tf.float32), trainable=False, name="residual")
        self.momentum = tf.Variable(tf.zeros([d], tf.float32), trainable=False, name="momentum") if momentum else None
        self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps")


class GsSketch(DefaultInstance, Compressor, tf.Module):
    """gs-SGD compression for Horovod's TensorFlow and Keras integrations
    (options: :class:`gs_horovod.gs_sgd.GsConfig`; ``backend`` is always TF ops here).

    Track it in a ``tf.train.Checkpoint(..., compression=gs)`` to save and restore the
    per-variable residuals, momentum and step counts (restored when first created).
    """


    def __init__(self, **options: Any) -> None:
        tf.Module.__init__(self, name="gs_sketch")
        self.config = config_from(options)
        if self.config.check_every:
            raise ValueError("check_every is not supported by the TensorFlow GsSketch yet")
        self.ops = TfOps()
        self.states: dict[str, _VariableState] = {}  # by variable path: tracked by tf.Module

    def __repr__(self) -> str:
        return f"GsSketch({self.config})"

    @DefaultInstanceMethod
    @tf.autograph.experimental.do_not_convert
    def compress(self, tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        """Returns (payload, ctx): the flattened sketch table (or a_t during warm-up) of the
        error-fed gradient; non-float or small tensors pass through with ctx None."""
        if not tensor.dtype.is_floating or tensor.shape.num_elements() is None \
                or tensor.shape.num_elements() < self.config.min_size:
            return tensor, None
        var, op = _calling_variable(tensor)
        cfg = self.config
        d = tensor.shape.num_elements()
        if cfg.k is not None and cfg.k > d:
            raise ValueError(f"k={cfg.k} exceeds the {d} elements of tensor {_path(var)!r}; "
                             "raise min_size above k or use ratio")
        st = self._state(var, d)
        g = tf.reshape(tf.cast(tensor, tf.float32), [-1])
        u = g
        if st.momentum is not None:
            u = st.momentum * cfg.momentum + g
        acc = st.residual + u
        rows, cols = cfg.rows, cfg.cols_for(d)

        def sketch() -> tf.Tensor:
            table = CountSketch.zeros(rows, cols, cfg.seed, self.ops, acc).accumulate(acc).table
            return tf.reshape(table, [-1])

        warm = st.steps < cfg.warmup_steps
        payload = tf.cond(warm, lambda: tf.identity(acc), sketch) if cfg.warmup_steps else sketch()
        return payload, (var, op, st, acc, u, warm, tensor.shape, tensor.dtype)

    @DefaultInstanceMethod
    @tf.autograph.experimental.do_not_convert
    def decompress(self, tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        """The merged update, reshaped and cast back to the gradient's shape and dtype; the
        variable's residual, momentum and step count are updated by the same ops."""
        if ctx is None:
            return tensor
        var, op, st, acc, u, warm, shape, dtype = ctx
        cfg = self.config
        d = shape.num_elements()
        rows, cols = cfg.rows, cfg.cols_for(d)

        def commit(residual: tf.Tensor, momentum: Optional[tf.Tensor]) -> list[Any]:
            ops = [st.residual.assign(residual), st.steps.assign_add(1)]
            if st.momentum is not None:
                ops.append(st.momentum.assign(momentum))
            return ops

        def dense() -> tf.Tensor:
            with tf.control_dependencies(commit(tf.zeros([d]), tf.zeros([d]) if st.momentum is not None else None)):
                return tf.identity(tensor)

        def sketched() -> tf.Tensor:
            sketch = CountSketch(rows, cols, cfg.seed, self.ops, tf.reshape(tensor, [rows, cols]))
            idx, est = sketch.heavy_hitters(cfg.k_for(d), d)
            local = tf.gather(acc, idx)
            values = hvd.allreduce(local, op=op, name=f"gs_exact_{_sanitize(_path(var))}") if cfg.exact else est
            momentum = None if st.momentum is None else self.ops.scatter_sub(u, idx, tf.gather(u, idx))
            with tf.control_dependencies(commit(self.ops.scatter_sub(acc, idx, local), momentum)):
                return self.ops.scatter(d, idx, values)

        def update() -> tf.Tensor:
            return tf.cond(warm, dense, sketched) if cfg.warmup_steps else sketched()

        finite = self.ops.all_finite(tensor)
        if cfg.nonfinite == "skip":
            out = tf.cond(finite, update, lambda: tf.zeros([d]))
        else:
            check = tf.debugging.Assert(finite, [f"GsSketch: the gradient of {_path(var)!r} is NaN or infinite on "
                                                 "at least one rank; residuals are left as before the step. "
                                                 "GsSketch(nonfinite='skip') skips such updates instead."])
            with tf.control_dependencies([check]):
                out = update()
        return tf.cast(tf.reshape(out, shape), dtype)

    def bytes_per_step(self, variables: list[Any]) -> int:
        """Bytes one rank hands to collectives per step for gradients of ``variables``, once
        warm-up is over: rows·cols (+ k with the exact round) float32 per compressed variable,
        the dense size for the others."""
        total = 0
        for v in variables:
            d = v.shape.num_elements()
            if v.dtype.is_floating and d >= self.config.min_size:
                total += 4 * self.config.payload_numel(d)
            else:
                total += d * v.dtype.size
        return total

    def _state(self, var: tf.Variable, d: int) -> _VariableState:
        key = _path(var)
        st = self.states.get(key)
        if st is None:
            with tf.init_scope():
                st = _VariableState(d, bool(self.config.momentum), key)
            self.states[key] = st
        return st


def _path(var: Any) -> str:
    return getattr(var, "path", None) or var.name


def _sanitize(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", name)


def _calling_variable(grad: tf.Tensor) -> tuple[Any, Any]:
    """(variable, op) for ``grad``: Horovod's ``allreduce_grads(grads, vars)`` is up the stack
    with the variables; ``allreduce(tensor, ..., op)`` below it has the reduction op."""
    frame = sys._getframe(2)
    op = None
    for _ in range(60):  # autograph puts its own frames between Horovod's functions
        if frame is None:
            break
        local = frame.f_locals
        name = frame.f_code.co_name.removeprefix("tf__")  # autograph-converted copies
        if op is None and name == "allreduce" and "op" in local:
            op = local["op"]
        if name == "allreduce_grads" and "grads" in local and local.get("vars") is not None:
            for g, v in zip(local["grads"], local["vars"]):
                if g is grad:
                    if op not in (hvd.Average, hvd.Sum):
                        raise ValueError("GsSketch supports op=hvd.Average or hvd.Sum, not Adasum or others")
                    return v, op
        frame = frame.f_back
    raise RuntimeError(
        "GsSketch compresses gradients inside Horovod's DistributedGradientTape or DistributedOptimizer; "
        "called from elsewhere (e.g. hvd.allreduce) it cannot tell which variable a tensor belongs to "
        "and so cannot keep its error-feedback residual"
    )
