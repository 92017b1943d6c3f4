"""GsSketch for ``horovod.tensorflow`` (and ``horovod.tensorflow.keras``): the gs-SGD engine
(:mod:`gs_horovod.engine`) in TF ops.

    tape = hvd.DistributedGradientTape(tape, compression=GsSketch())        # defaults
    opt = hvd.DistributedOptimizer(opt, compression=GsSketch(ratio=0.01))   # tf-keras

Horovod builds its gradient allreduces inside a ``tf.function`` (``allreduce_grads(grads,
vars)``), each in its own ``tf.cond`` branch, so everything here is graph code and state lives
in ``tf.Variable``s (made once by ``tf.init_scope``). The first ``compress`` of a step finds
``allreduce_grads`` up the stack, runs the whole engine step there, stores the new residuals
and writes every update into one flat variable; each ``compress`` hands Horovod one float and
each ``decompress`` reads its slice (after the write: the same resource).

This ``tf.Module`` tracks the state (residual and momentum per variable path, steps per
optimizer): ``tf.train.Checkpoint(..., compression=gs)`` saves this rank's; ``state_dict()`` /
``load_state_dict()`` gather every rank's on rank 0 and hand it back: each traced step starts
with a 4-byte allreduce of the ranks' step flags and, only when one is set (a state loaded on
rank 0, or a rank out of step), runs the restore eagerly in a ``tf.py_function`` before any
state is read. ``transport="mpi"`` runs its collectives through ``tf.numpy_function``.

Why not the torch adapters' :class:`~gs_horovod.engine.state.EngineState`: it swaps in the
step's new residual buffer after each step, but a traced step must assign to the variables
its graph captured (and counts bytes into graph counters, :meth:`CommStats.amounts`).
"""

from __future__ import annotations

import re
import sys
import zlib
from dataclasses import dataclass, field
from typing import Any, Optional

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from horovod.tensorflow.compression import Compressor
from horovod.tensorflow.elastic import TensorFlowKerasState, TensorFlowState

from .compressor import DefaultInstanceMethod, DefaultInstanceProperty, GsSketchBase
from .elastic import ElasticGsState
from .engine.plan import Plan
from .engine.state import CommStats, check_restored
from .engine.step import GsSgd
from .kernels.tf_ops import TfOps
from .transports.mpi import MergeStats

STEP_SCOPE = "HorovodAllreduce_gs_horovod"
"""The name scope of the engine's step: Horovod's TF ``hvd.elastic.run`` tells a lost peer (reset
and go on) from other errors by "HorovodAllreduce", "HorovodAllgather" or "HorovodBroadcast" in
the failing node's name (and drops any other UnknownError); the engine names its collectives
itself, so this scope puts the word in every one of them."""


class _StepState(tf.Module):
    """Per optimizer: steps applied, options compared, the flat update (D + dense,) f32."""

    def __init__(self, total: int, name: str) -> None:
        super().__init__(name=name)
        self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps")
        self.checked = tf.Variable(False, trainable=False, name="checked")
        self.update = tf.Variable(tf.zeros([total]), trainable=False, name="update")


class _VariableState(tf.Module):
    """Residual (d,) f32 and momentum (d,) f32 (when m > 0) of one variable."""

    def __init__(self, d: int, momentum: bool, name: str) -> None:
        super().__init__(name=re.sub(r"\W", "_", name))
        self.residual = tf.Variable(tf.zeros([d], tf.float32), trainable=False, name="residual")
        self.momentum = tf.Variable(tf.zeros([d], tf.float32), trainable=False, name="momentum") if momentum else None

    def load(self, path: str, residual: np.ndarray, momentum: Optional[np.ndarray]) -> None:
        """Assigns saved state of ``path`` (its size checked; momentum None: left as it is)."""
        check_restored(path, residual.size, self.residual.shape.num_elements())
        self.residual.assign(residual)
        if self.momentum is not None and momentum is not None:
            self.momentum.assign(momentum)


class _Counters:
    """:class:`CommStats` as int64 variables that the graph adds to. A plain object, so that
    tf.Module does not track them: they are not state to checkpoint."""

    def __init__(self) -> None:
        with tf.init_scope():
            self.values = {name: tf.Variable(0, dtype=tf.int64, trainable=False, name=name)
                           for name in CommStats.counted()}

    def add(self, amounts: dict[str, Any]) -> None:
        for name, amount in amounts.items():
            self.values[name].assign_add(tf.cast(amount, tf.int64))


class _Flag:
    """This rank's step flag (:meth:`~gs_horovod.checkpoint.CheckpointApi.step_flag`) as a
    float32 variable that every traced step reads. A plain object: not state to checkpoint."""

    def __init__(self) -> None:
        with tf.init_scope():
            self.value = tf.Variable(0.0, trainable=False, name="step_flag")


class _World:
    """How many elastic resets this rank has joined (:meth:`GsSketch._rejoin`), as an int64
    variable that every traced step compares with the count it was traced at: a step traced
    for another world raises instead of running collectives sized for it. A plain object."""

    def __init__(self) -> None:
        self.generation = 0
        with tf.init_scope():
            self.value = tf.Variable(0, dtype=tf.int64, trainable=False, name="world_generation")


@dataclass(frozen=True)
class _Ctx:
    step: _StepState
    offset: int
    shape: tf.TensorShape
    dtype: tf.DType


@dataclass
class _Restored:
    """What load_state_dict gave for states not created yet: per variable path (residual,
    momentum or None) as arrays, per step key the steps. A plain object (not tracked)."""

    states: dict[str, tuple[np.ndarray, Optional[np.ndarray]]] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)


class _Traced:
    """The ``grads`` list of the ``allreduce_grads`` being traced and each gradient's ctx by id."""

    grads: Optional[list] = None
    contexts: dict[int, _Ctx] = {}


class GsSketch(GsSketchBase, Compressor, tf.Module):
    """gs-SGD compression for Horovod's TensorFlow and Keras integrations
    (options: :class:`gs_horovod.engine.config.GsConfig`; ``backend`` is always TF ops here)."""

    _hvd = hvd

    def __init__(self, transport: Optional[str] = None, comm: Any = None, **options: Any) -> None:
        tf.Module.__init__(self, name="gs_sketch")
        super().__init__(transport, comm, **options)
        self.states: dict[str, _VariableState] = {}  # by variable path: tracked by tf.Module
        self.steps: dict[str, _StepState] = {}  # by a digest of the optimizer's variable paths
        self._traced = _Traced()  # a plain object: tf.Module would wrap (copy) a list or dict
        self._counters = _Counters()
        self._restored = _Restored()  # load_state_dict contents for states not created yet
        self._flag = _Flag()
        self._world = _World()
        self._lost_residual = 0.0

    def _make_ops(self) -> TfOps:
        return TfOps()

    def _tree_allreduce(self, x: tf.Tensor, comms: Any, stats: MergeStats) -> tf.Tensor:
        from .transports.mpi import tree_allreduce

        total = tf.numpy_function(lambda buf: tree_allreduce(buf, comms, stats), [x], x.dtype, stateful=True)
        return tf.ensure_shape(total, x.shape)

    def _numpy_call(self, fn: Any, arrays: list[tf.Tensor], dtypes: list[str]) -> tuple[tf.Tensor, ...]:
        out = tf.numpy_function(fn, arrays, [tf.as_dtype(d) for d in dtypes], stateful=True)
        return tuple(tf.ensure_shape(o, [None]) for o in out)

    @DefaultInstanceMethod
    @tf.autograph.experimental.do_not_convert
    def compress(self, tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        """Returns (payload, ctx): one float for a float tensor of known shape (its update was
        computed with the step's other gradients: sketched from ``min_size`` elements on, sent
        exactly below it); others as they are, with ctx None."""
        if not tensor.dtype.is_floating or tensor.shape.num_elements() is None:
            self._counters.add({"dense_bytes": tf.size(tensor, tf.int64) * tensor.dtype.size})
            return tensor, None
        grads, variables, op, process_set = _calling_step(tensor)
        if self._traced.grads is not grads:
            with tf.name_scope(STEP_SCOPE):
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
        return CommStats(**{name: int(v.numpy()) for name, v in self._counters.values.items()},
                         lost_residual=self._lost_residual)

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

    @DefaultInstanceMethod
    def reset(self) -> None:
        """Zeroes every residual, momentum and step count (eagerly) and drops loaded state not
        yet used: the variables stay, as Horovod's traced step holds them. Under Horovod
        elastic, use :class:`GsKerasState` instead: it keeps what was committed."""
        self._restored = _Restored()
        self._forget_checkpoint_calls()
        self._zero()
        for step in self.steps.values():
            step.checked.assign(False)

    def _zero(self) -> None:
        """Every residual, momentum and step count to zero (eagerly)."""
        for st in self.states.values():
            st.residual.assign(tf.zeros_like(st.residual))
            if st.momentum is not None:
                st.momentum.assign(tf.zeros_like(st.momentum))
        for step in self.steps.values():
            step.steps.assign(0)

    def _load(self, state: dict[str, Any]) -> None:
        pending = _Restored()
        for path, saved in state["variables"].items():
            residual = np.asarray(saved["residual"], np.float32).reshape(-1)
            momentum = None if saved["momentum"] is None else np.asarray(saved["momentum"], np.float32).reshape(-1)
            if path in self.states:
                self.states[path].load(path, residual, momentum)
            else:
                pending.states[path] = (residual, momentum)
        for key, steps in state["steps"].items():
            if key in self.steps:
                self.steps[key].steps.assign(int(steps))
            else:
                pending.steps[key] = int(steps)
        self._restored = pending

    def _roll_back(self, state: dict[str, Any]) -> None:
        self._zero()
        self._load(state)

    def _layout(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"variables": {path: (np.size(v["residual"]), v["momentum"] is not None)
                              for path, v in state["variables"].items()}, "steps": dict(state["steps"])}

    def _residual_mass(self, state: dict[str, Any]) -> float:
        return ElasticGsState.mass([np.asarray(v["residual"]) for v in state["variables"].values()])

    def _rejoin(self, layout: dict[str, Any], lost_mass: float) -> None:
        for path, (d, momentum) in layout.get("variables", {}).items():
            if path not in self.states and path not in self._restored.states:
                self._restored.states[path] = (np.zeros(d, np.float32), np.zeros(d, np.float32) if momentum else None)
        for key, steps in layout.get("steps", {}).items():
            if key in self.steps:
                self.steps[key].steps.assign(steps)
            else:
                self._restored.steps[key] = steps
        self._lost_residual += lost_mass

    def _world_changed(self) -> None:
        """At every elastic reset (sync or not): steps traced for the old ranks raise, Horovod's
        cached allreduce functions built with this compressor are dropped, options are compared
        again at the next step."""
        for step in self.steps.values():
            step.checked.assign(False)
        self._world.generation += 1
        self._world.value.assign(self._world.generation)
        _forget_traced_steps(self)

    def _describe(self, v: Any) -> tuple[str, int, bool, int]:
        return _path(v), v.shape.num_elements(), v.dtype.is_floating, v.dtype.size

    def _step(self, grads: list, variables: list, op: Any, process_set: Any) -> dict[int, _Ctx]:
        """Builds the engine step over every compressible gradient of ``grads`` (this trace);
        returns each one's ctx by id."""
        cfg, ops = self.config, self.ops
        named = {_path(v): g for g, v in zip(grads, variables)
                 if g is not None and not isinstance(g, tf.IndexedSlices) and g.dtype.is_floating
                 and g.shape.num_elements() is not None}
        comm = self._collectives(op, process_set)
        plan = Plan.split([(n, g.shape.num_elements()) for n, g in named.items()], cfg, ranks=comm.size,
                          allreduce_kind=comm.allreduce_kind)
        states = [self._state(n, d) for n, d in zip(plan.names, plan.sizes)]
        key = f"{zlib.crc32(repr(plan.all_names).encode()):08x}"
        step = self.steps.get(key)
        if step is None:
            with tf.init_scope():
                step = self.steps[key] = _StepState(plan.total + sum(plan.dense_sizes), "step_" + key)
                if key in self._restored.steps:
                    step.steps.assign(self._restored.steps.pop(key))
        traced_for = tf.constant(self._world.generation, tf.int64)
        same_world = tf.debugging.assert_equal(self._world.value, traced_for, message=(
            "GsSketch: this step was traced before a Horovod elastic reset, for the ranks of that time; build the "
            "tf.function of the training step (or the DistributedOptimizer) again after a reset, e.g. in a reset "
            "callback"))
        with tf.control_dependencies([same_world]):
            flags = comm.allreduce_sum(tf.reshape(self._flag.value, [1]), f"gs_horovod.flags.{key}")[0]
        agreed = tf.cond(flags > 0, lambda: tf.py_function(self._agree_eagerly, [flags], tf.bool),
                         lambda: tf.constant(True))
        with tf.control_dependencies([agreed]):  # a restore (eager, inside py_function) precedes every read
            warm = step.steps < cfg.warmup_steps  # read before the step assigns it
            sgd = GsSgd(cfg, ops, comm)
            flat = {n: tf.reshape(tf.cast(g, tf.float32), [-1]) for n, g in named.items()}
            residual = ops.concat([s.residual for s in states]) if states else tf.zeros([0])
            momentum = (ops.concat([s.momentum for s in states]) if states else tf.zeros([0])) if cfg.momentum else None
            result = sgd.step(plan, [flat[n] for n in plan.names], residual, momentum, step.steps,
                                 tf.logical_not(step.checked), [flat[n] for n in plan.dense_names])
        # assignments are stateful: they run, and reads of step.update (same resource) follow them
        step.checked.assign(True)
        step.steps.assign(result.steps)
        step.update.assign(result.update)
        if states:
            for s, part in zip(states, tf.split(result.residual, list(plan.sizes))):
                s.residual.assign(part)
            for s, part in zip(states, tf.split(result.momentum, list(plan.sizes)) if cfg.momentum else []):
                s.momentum.assign(part)
        self._counters.add(CommStats.amounts(plan, cfg, warm, tf.cast(result.applied, tf.int64),
                                             (result.routed, result.gathered),
                                             where=lambda c, w, x: tf.where(c, tf.cast(w, tf.int64),
                                                                            tf.cast(x, tf.int64))))
        return {id(named[n]): _Ctx(step, o, named[n].shape, named[n].dtype)
                for n, o in zip(plan.all_names, plan.all_offsets)}

    def _agree_eagerly(self, flags: tf.Tensor) -> bool:
        """:meth:`~gs_horovod.checkpoint.CheckpointApi.agree`, run eagerly from the traced step."""
        self.agree(float(flags.numpy()))
        return True

    def _flag_changed(self) -> None:
        self._flag.value.assign(self.step_flag())

    def _state(self, name: str, d: int) -> _VariableState:
        st = self.states.get(name)
        if st is None:
            with tf.init_scope():
                st = self.states[name] = _VariableState(d, bool(self.config.momentum), name)
                saved = self._restored.states.pop(name, None)
                if saved is not None:
                    st.load(name, *saved)
        return st



class ElasticStateMixin:
    """Makes a Horovod TensorFlow elastic state also commit, roll back and sync each rank's
    GsSketch state (:class:`~gs_horovod.elastic.ElasticGsState`); ``compression``: the GsSketch
    (instance or class) the training step passes to Horovod. After a reset, Horovod's cached
    allreduce functions built with it are dropped, so a step traced again (a ``tf.function``
    built again in a reset callback) plans for the new ranks; a step traced before the reset, or
    a DistributedOptimizer built before it, raises rather than run."""

    def __init__(self, *args: Any, compression: Any = None, **kwargs: Any) -> None:
        if not (isinstance(compression, GsSketch) or compression is GsSketch):
            raise TypeError(f"{type(self).__name__}: compression= must be the GsSketch the training step uses, "
                            f"got {compression!r}")
        self.compression = compression.default() if compression is GsSketch else compression
        self._gs = ElasticGsState(self.compression)
        super().__init__(*args, **kwargs)

    def save(self) -> None:
        self._gs.save()
        super().save()

    def restore(self) -> None:
        self._gs.restore()
        super().restore()

    def sync(self) -> None:
        self._gs.sync()
        super().sync()

    def reset(self) -> None:
        """Horovod calls it at every reset, also where it skips the sync (hosts removed gracefully)."""
        self.compression._world_changed()
        super().reset()


class GsKerasState(ElasticStateMixin, TensorFlowKerasState):
    """``hvd.elastic.TensorFlowKerasState`` with each rank's GsSketch state
    (:class:`ElasticStateMixin`): ``GsKerasState(model, optimizer, compression=gs, batch=0)``."""


class GsTensorFlowState(ElasticStateMixin, TensorFlowState):
    """``hvd.elastic.TensorFlowState`` with each rank's GsSketch state
    (:class:`ElasticStateMixin`): ``GsTensorFlowState(variables, compression=gs, batch=0)``."""


def _forget_traced_steps(compression: GsSketch) -> None:
    """Drops Horovod's cached ``allreduce_grads`` functions built with ``compression``
    (``horovod.tensorflow._make_cached_allreduce_grads_fn`` keeps one per argument tuple, traced
    once): the next DistributedGradientTape traces its step for the current world."""
    cached = hvd._make_cached_allreduce_grads_fn
    for cell in cached.__closure__ or ():
        cache = cell.cell_contents
        if isinstance(cache, dict):
            for key in [key for key in cache if any(arg is compression or arg is type(compression) for arg in key[0])]:
                del cache[key]


def _path(var: Any) -> str:
    return getattr(var, "path", None) or var.name


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
