"""GsSketch for ``horovod.tensorflow`` (and ``horovod.tensorflow.keras``): the gs-SGD engine
(:mod:`gs_horovod.gs_sgd`) in TF ops.

    tape = hvd.DistributedGradientTape(tape, compression=GsSketch())        # defaults
    opt = hvd.DistributedOptimizer(opt, compression=GsSketch(ratio=0.01))   # tf-keras

Horovod builds its gradient allreduces inside a ``tf.function`` (``allreduce_grads(grads,
vars)``), each in its own ``tf.cond`` branch, so everything here is graph code and state
lives in ``tf.Variable``s (created once, outside any function, by ``tf.init_scope``). The
first ``compress`` of a step finds ``allreduce_grads`` up the stack with every gradient and
variable, runs the whole engine step there (one sketch merge, one exact round), stores the new
residuals and writes every update into one flat variable; each ``compress`` then hands
Horovod one float, and each ``decompress`` reads its slice of that variable (TensorFlow orders
the reads after the write: they use the same resource).

State (residual and momentum per variable path, and per optimizer the step count) is tracked
by this ``tf.Module``: ``tf.train.Checkpoint(..., compression=gs)`` saves this rank's (one
file per rank); ``state_dict()`` / ``load_state_dict()`` gather every rank's on rank 0 and
hand it back, for Horovod's one file written by rank 0. ``merge="mpi"`` runs the sketch merge and the exact round as
:func:`gs_horovod.mpi.tree_allreduce` over mpi4py (``tf.numpy_function``).
"""

from __future__ import annotations

import re
import sys
import zlib
from dataclasses import asdict, dataclass
from typing import Any, Optional

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from horovod.tensorflow.compression import Compressor

from .compressor import (
    Checkpoints,
    DefaultInstance,
    DefaultInstanceAttribute,
    DefaultInstanceMethod,
    DefaultInstanceProperty,
    check_merge,
    config_from,
)
from .gs_sgd import CommStats, GsConfig, GsSgd, Layout
from .kernels.tf_ops import TfOps
from .mpi import MergeStats


class HorovodCollectives:
    """:class:`gs_horovod.gs_sgd.Collectives` over Horovod's TF allreduce."""

    def __init__(self, op: Any, process_set: Any) -> None:
        self.op, self.process_set = op, process_set

    def allreduce(self, x: tf.Tensor, name: str) -> tf.Tensor:
        if x.dtype == tf.float16 and self.op == hvd.Average:  # sum x/P: a float16 sum of P x could overflow
            return hvd.allreduce(x, op=hvd.Sum, prescale_factor=1.0 / self.process_set.size(), name=_op_name(name),
                                 process_set=self.process_set)
        return hvd.allreduce(x, op=self.op, name=_op_name(name), process_set=self.process_set)

    def same_on_every_rank(self, value: Any, name: str) -> tf.Tensor:
        value = tf.cast(value, tf.int64)
        both = hvd.allreduce(tf.stack([value, -value]), op=hvd.Min, name=_op_name(name), process_set=self.process_set)
        return tf.equal(both[0], -both[1])


class MpiCollectives(HorovodCollectives):
    """Sketch merge and exact round by :func:`gs_horovod.mpi.tree_allreduce` (mpi4py, run
    through ``tf.numpy_function``); the tiny checks stay on Horovod."""

    def __init__(self, op: Any, process_set: Any, comms: Any, stats: MergeStats) -> None:
        super().__init__(op, process_set)
        self.comms, self.stats = comms, stats

    def allreduce(self, x: tf.Tensor, name: str) -> tf.Tensor:
        from .mpi import tree_allreduce

        size = self.comms.comm.Get_size()
        average = self.op == hvd.Average
        if average and x.dtype == tf.float16:
            x = tf.cast(tf.cast(x, tf.float32) / size, tf.float16)

        def reduce(buf: np.ndarray) -> np.ndarray:
            total = tree_allreduce(buf, self.comms, self.stats)
            return total / np.asarray(size, total.dtype) if average and total.dtype != np.float16 else total

        return tf.ensure_shape(tf.numpy_function(reduce, [x], x.dtype, stateful=True), x.shape)


class _StepState(tf.Module):
    """Per optimizer (a set of variables): steps applied, whether the options were compared,
    and the step's flat update (D,) f32 that each decompress reads its slice of."""

    def __init__(self, total: int, name: str) -> None:
        super().__init__(name=name)
        self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps")
        self.checked = tf.Variable(False, trainable=False, name="checked")
        self.update = tf.Variable(tf.zeros([total]), trainable=False, name="update")


class _VariableState(tf.Module):
    """Residual (d,) f32 and momentum (d,) f32 (when m > 0) of one variable."""

    def __init__(self, d: int, momentum: bool, name: str) -> None:
        super().__init__(name=_sanitize(name))
        self.residual = tf.Variable(tf.zeros([d], tf.float32), trainable=False, name="residual")
        self.momentum = tf.Variable(tf.zeros([d], tf.float32), trainable=False, name="momentum") if momentum else None


class _Counters:
    """:class:`CommStats` as int64 variables that the graph adds to. A plain object, so that
    tf.Module does not track them: they are not state to checkpoint."""

    def __init__(self) -> None:
        with tf.init_scope():
            self.values = {name: tf.Variable(0, dtype=tf.int64, trainable=False, name=name)
                           for name in ("sketch_bytes", "exact_bytes", "dense_bytes", "steps", "skipped")}

    def add(self, **amounts: Any) -> None:
        for name, amount in amounts.items():
            self.values[name].assign_add(tf.cast(amount, tf.int64))


@dataclass(frozen=True)
class _Ctx:
    step: _StepState
    offset: int
    shape: tf.TensorShape
    dtype: tf.DType


class _Restored:
    """What load_state_dict gave for states not created yet: per variable path (residual,
    momentum or None) as arrays, per step key the steps. A plain object (not tracked)."""

    def __init__(self) -> None:
        self.states: dict[str, tuple[np.ndarray, Optional[np.ndarray]]] = {}
        self.steps: dict[str, int] = {}


class _Traced:
    """The ``grads`` list of the ``allreduce_grads`` being traced and each gradient's ctx by id."""

    grads: Optional[list] = None
    contexts: dict[int, _Ctx] = {}


class GsSketch(DefaultInstance, Checkpoints, Compressor, tf.Module):
    """gs-SGD compression for Horovod's TensorFlow and Keras integrations
    (options: :class:`gs_horovod.gs_sgd.GsConfig`; ``backend`` is always TF ops here)."""

    _hvd = hvd
    config = DefaultInstanceAttribute()
    merge = DefaultInstanceAttribute()
    merge_stats = DefaultInstanceAttribute()

    def __init__(self, merge: str = "horovod", comm: Any = None, **options: Any) -> None:
        tf.Module.__init__(self, name="gs_sketch")
        check_merge(merge, comm)
        self.config: GsConfig = config_from(options, extra=("merge", "comm"))
        self.merge = merge
        self.ops = TfOps()
        self.merge_stats = MergeStats()
        self._comm = comm
        self._comms: Any = None
        self.states: dict[str, _VariableState] = {}  # by variable path: tracked by tf.Module
        self.steps: dict[str, _StepState] = {}  # by a digest of the optimizer's variable paths
        self._traced = _Traced()  # a plain object: tf.Module would wrap (copy) a list or dict
        self._counters = _Counters()
        self._restored = _Restored()  # load_state_dict contents for states not created yet

    def __repr__(self) -> str:
        return f"GsSketch(merge={self.merge!r}, {self.config})"

    @DefaultInstanceMethod
    @tf.autograph.experimental.do_not_convert
    def compress(self, tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        """Returns (payload, ctx): one float for a float tensor of known shape (its update was
        computed with the step's other gradients: sketched from ``min_size`` elements on, sent
        exactly below it); others as they are, with ctx None."""
        if not tensor.dtype.is_floating or tensor.shape.num_elements() is None:
            self._counters.add(dense_bytes=tf.size(tensor, tf.int64) * tensor.dtype.size)
            return tensor, None
        grads, variables, op, process_set = _calling_step(tensor)
        if self._traced.grads is not grads:
            self._traced.grads, self._traced.contexts = grads, self._step(grads, variables, op, process_set)
        return tf.zeros([1]), self._traced.contexts[id(tensor)]

    @DefaultInstanceMethod
    @tf.autograph.experimental.do_not_convert
    def decompress(self, tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        """The variable's update, reshaped and cast back to the gradient's shape and dtype."""
        if ctx is None:
            return tensor
        n = ctx.shape.num_elements()
        return tf.cast(tf.reshape(ctx.step.update[ctx.offset:ctx.offset + n], ctx.shape), ctx.dtype)

    @DefaultInstanceProperty
    def stats(self) -> CommStats:
        """Bytes this rank handed to collectives and steps run (read from the graph's counters)."""
        return CommStats(**{name: int(v.numpy()) for name, v in self._counters.values.items()})

    @DefaultInstanceMethod
    def local_state_dict(self) -> dict[str, Any]:
        """Not collective: this rank's own state as numpy arrays, for one file per rank.
        ``{"options", "world_size", "rank", "variables": {path: {"residual", "momentum"}},
        "steps": {key: steps}}`` (momentum None when m = 0; state loaded but not created yet
        included). ``tf.train.Checkpoint(compression=gs)`` per rank saves the same state."""
        variables = {path: {"residual": r, "momentum": m} for path, (r, m) in self._restored.states.items()}
        for path, st in self.states.items():
            variables[path] = {"residual": st.residual.numpy(),
                               "momentum": None if st.momentum is None else st.momentum.numpy()}
        steps = {**self._restored.steps, **{key: int(st.steps.numpy()) for key, st in self.steps.items()}}
        return {"options": self._options(), "world_size": hvd.size(), "rank": hvd.rank(),
                "variables": variables, "steps": steps}

    @staticmethod
    def _exchange(out: list[bytes]) -> list[bytes]:
        """Sends ``out[r]`` to rank r (one uint8 ``hvd.alltoall`` with splits, eagerly); returns
        what each rank sent here, in rank order."""
        data = tf.constant(np.frombuffer(b"".join(out), dtype=np.uint8))
        received, splits = hvd.alltoall(data, splits=tf.constant([len(b) for b in out], tf.int32),
                                        name="gs_horovod.checkpoint")
        buf, sizes = received.numpy().tobytes(), splits.numpy().tolist()
        ends = np.cumsum(sizes).tolist()
        return [buf[end - n:end] for n, end in zip(sizes, ends)]

    @DefaultInstanceMethod
    def reset(self) -> None:
        """Zeroes every residual, momentum and step count (eagerly) and drops loaded state not
        yet used: the variables stay, as Horovod's traced step holds them. Call it from a
        Horovod elastic reset callback."""
        self._restored = _Restored()
        for st in self.states.values():
            st.residual.assign(tf.zeros_like(st.residual))
            if st.momentum is not None:
                st.momentum.assign(tf.zeros_like(st.momentum))
        for step in self.steps.values():
            step.steps.assign(0)
            step.checked.assign(False)

    def _options(self) -> dict[str, Any]:
        return {**asdict(self.config), "merge": self.merge}

    def _load(self, state: dict[str, Any]) -> None:
        pending = _Restored()
        for path, saved in state["variables"].items():
            residual = np.asarray(saved["residual"], np.float32).reshape(-1)
            momentum = None if saved["momentum"] is None else np.asarray(saved["momentum"], np.float32).reshape(-1)
            st = self.states.get(path)
            if st is None:
                pending.states[path] = (residual, momentum)
                continue
            if residual.size != st.residual.shape.num_elements():
                raise ValueError(f"saved GsSketch state of {path!r} has {residual.size} elements, "
                                 f"the variable {st.residual.shape.num_elements()}")
            st.residual.assign(residual)
            if st.momentum is not None and momentum is not None:
                st.momentum.assign(momentum)
        for key, steps in state["steps"].items():
            if key in self.steps:
                self.steps[key].steps.assign(int(steps))
            else:
                pending.steps[key] = int(steps)
        self._restored = pending

    @DefaultInstanceMethod
    def bytes_per_step(self, variables: list[Any]) -> int:
        """Bytes one rank hands to collectives per step for gradients of ``variables``, once
        warm-up is over: the sketch and the exact round for the compressed ones, the dense
        size for the others."""
        floats = sorted((_path(v), v.shape.num_elements()) for v in variables if v.dtype.is_floating)
        compressed = [(n, d) for n, d in floats if d >= self.config.min_size]
        dense = [(n, d) for n, d in floats if d < self.config.min_size]
        others = sum(v.shape.num_elements() * v.dtype.size for v in variables if not v.dtype.is_floating)
        layout = Layout.build([n for n, _ in compressed], [d for _, d in compressed], self.config,
                              tuple(n for n, _ in dense), tuple(d for _, d in dense))
        if not layout.groups:
            return others + 4 * (layout.total + sum(layout.dense_sizes))
        return others + sum(layout.payload_bytes(self.config))

    def _step(self, grads: list, variables: list, op: Any, process_set: Any) -> dict[int, _Ctx]:
        """Builds the engine step over every compressible gradient of ``grads`` (this trace);
        returns each one's ctx by id."""
        cfg = self.config
        floats = sorted(((_path(v), g) for g, v in zip(grads, variables)
                         if g is not None and not isinstance(g, tf.IndexedSlices) and g.dtype.is_floating
                         and g.shape.num_elements() is not None), key=lambda t: t[0])
        picked = [(n, g) for n, g in floats if g.shape.num_elements() >= cfg.min_size]
        dense = [(n, g) for n, g in floats if g.shape.num_elements() < cfg.min_size]
        names = [n for n, _ in picked]
        layout = Layout.build(names, [g.shape.num_elements() for _, g in picked], cfg,
                              tuple(n for n, _ in dense), tuple(g.shape.num_elements() for _, g in dense))
        states = [self._state(n, d) for n, d in zip(names, layout.sizes)]
        key = f"{zlib.crc32(repr(layout.all_names).encode()):08x}"
        step = self.steps.get(key)
        if step is None:
            with tf.init_scope():
                step = self.steps[key] = _StepState(layout.total + sum(layout.dense_sizes), "step_" + key)
                if key in self._restored.steps:
                    step.steps.assign(self._restored.steps.pop(key))
        warm = step.steps < cfg.warmup_steps  # read before the step assigns it
        engine = GsSgd(cfg, self.ops, self._collectives(op, process_set))
        flat = [tf.reshape(tf.cast(g, tf.float32), [-1]) for _, g in picked + dense]
        result = engine.step(layout, flat[:len(picked)], [s.residual for s in states],
                             [s.momentum for s in states] if cfg.momentum else [], step.steps,
                             tf.logical_not(step.checked), flat[len(picked):])
        # assignments are stateful: they run, and reads of step.update (same resource) follow them
        step.checked.assign(True)
        step.steps.assign(result.steps)
        step.update.assign(self.ops.concat(result.updates))
        for s, residual in zip(states, result.residuals):
            s.residual.assign(residual)
        for s, momentum in zip(states, result.momenta):
            s.momentum.assign(momentum)
        dense_total = (layout.total + sum(layout.dense_sizes)) * 4
        if layout.groups:
            sketch, exact, dense_bytes = layout.payload_bytes(cfg)
            self._counters.add(sketch_bytes=tf.where(warm, 0, sketch), exact_bytes=tf.where(warm, 0, exact),
                               dense_bytes=tf.where(warm, dense_total, dense_bytes))
        else:
            self._counters.add(dense_bytes=dense_total)
        self._counters.add(steps=1, skipped=1 - tf.cast(result.applied, tf.int64))
        offsets = np.cumsum([0, *layout.all_sizes])
        return {id(g): _Ctx(step, int(offset), g.shape, g.dtype) for (_, g), offset in zip(picked + dense, offsets)}

    def _collectives(self, op: Any, process_set: Any) -> HorovodCollectives:
        if op not in (hvd.Average, hvd.Sum):
            raise ValueError("GsSketch supports op=hvd.Average or hvd.Sum, not Adasum or others")
        if self.merge == "horovod":
            return HorovodCollectives(op, process_set)
        if self._comms is None:
            from .mpi import Communicators, horovod_world  # imports mpi4py, which initialises MPI

            self._comms = Communicators(horovod_world(hvd, self._comm).Dup())
        return MpiCollectives(op, process_set, self._comms, self.merge_stats)

    def _state(self, name: str, d: int) -> _VariableState:
        st = self.states.get(name)
        if st is None:
            with tf.init_scope():
                st = self.states[name] = _VariableState(d, bool(self.config.momentum), name)
                saved = self._restored.states.pop(name, None)
                if saved is not None:
                    if saved[0].size != d:
                        raise ValueError(f"saved GsSketch state of {name!r} has {saved[0].size} elements, "
                                         f"the variable {d}")
                    st.residual.assign(saved[0])
                    if st.momentum is not None and saved[1] is not None:
                        st.momentum.assign(saved[1])
        return st



def _path(var: Any) -> str:
    return getattr(var, "path", None) or var.name


def _sanitize(name: str) -> str:
    return re.sub(r"\W", "_", name)


def _op_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", name)


def _calling_step(grad: tf.Tensor) -> tuple[list, list, Any, Any]:
    """(grads, vars, op, process_set) of the Horovod ``allreduce_grads(grads, vars)`` up the
    stack whose ``grads`` hold ``grad``; ``allreduce(tensor, ..., op, process_set)`` below it
    has the reduction op and process set."""
    frame = sys._getframe(2)
    op: Optional[Any] = None
    process_set: Optional[Any] = None
    for _ in range(60):  # autograph puts its own frames between Horovod's functions
        if frame is None:
            break
        local = frame.f_locals
        name = frame.f_code.co_name.removeprefix("tf__")  # autograph-converted copies
        if op is None and name == "allreduce" and "op" in local:
            op, process_set = local["op"], local.get("process_set")
        if name == "allreduce_grads" and "grads" in local and local.get("vars") is not None:
            if any(g is grad for g in local["grads"]):
                return local["grads"], local["vars"], op, process_set
        frame = frame.f_back
    raise RuntimeError(
        "GsSketch compresses gradients inside Horovod's DistributedGradientTape or DistributedOptimizer; "
        "called from elsewhere (e.g. hvd.allreduce) it cannot tell which variable a tensor belongs to "
        "and so cannot keep its error-feedback residual"
    )
