"""GsSketch for ``horovod.tensorflow`` (and ``horovod.tensorflow.keras``): the gs-SGD engine
(:mod:`gs_horovod.engine`) in TF ops.

    tape = hvd.DistributedGradientTape(tape, compression=GsSketch())        # defaults
    opt = hvd.DistributedOptimizer(opt, compression=GsSketch(ratio=0.01))   # tf-keras

Horovod builds its gradient allreduces inside a ``tf.function`` (``allreduce_grads(grads,
vars)``), each in its own ``tf.cond`` branch, so everything here is graph code and state lives
in ``tf.Variable``s (made once by ``tf.init_scope``). The first ``compress`` of a step finds
``allreduce_grads`` up the stack (:mod:`gs_horovod.tf_horovod`), traces the whole engine step
there (:mod:`gs_horovod.tf_step`), which stores the new residuals and writes every update into
one flat variable; each ``compress`` hands Horovod one float and each ``decompress`` reads its
slice (after the write: the same resource).

This ``tf.Module`` tracks the state (:mod:`gs_horovod.tf_variables`: residual and momentum per
variable path, steps per optimizer): ``tf.train.Checkpoint(..., compression=gs)`` saves this
rank's; ``state_dict()`` / ``load_state_dict()`` gather every rank's on rank 0 and hand it
back: each traced step starts with a 4-byte allreduce of the ranks' step flags and, only when
one is set (a state loaded on rank 0, or a rank out of step), runs the restore eagerly in a
``tf.py_function`` before any state is read. ``transport="mpi"`` runs its collectives through
``tf.numpy_function``. :class:`GsKerasState` and :class:`GsTensorFlowState` are Horovod
elastic's states with each rank's GsSketch state.

Why not the torch adapters' :class:`~gs_horovod.engine.state.EngineState`: it swaps in the
step's new residual buffer after each step, but a traced step must assign to the variables
its graph captured (and counts bytes into graph counters, :meth:`CommStats.amounts`).
"""

from __future__ import annotations

from typing import Any, Optional

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from horovod.tensorflow.compression import Compressor
from horovod.tensorflow.elastic import TensorFlowKerasState, TensorFlowState

from .compressor import DefaultInstanceMethod, DefaultInstanceProperty, GsSketchBase
from .elastic import ElasticGsState
from .engine.state import CommStats
from .kernels.tf_ops import TfOps
from .tf_horovod import STEP_SCOPE, calling_step, forget_traced_steps, variable_path
from .tf_step import Ctx, TracedStep, compressible
from .tf_variables import StepState, Variables, VariableState
from .transports.mpi import MergeStats


class GsSketch(GsSketchBase, Compressor, tf.Module):
    """gs-SGD compression for Horovod's TensorFlow and Keras integrations
    (options: :class:`gs_horovod.engine.config.GsConfig`; ``backend`` is always TF ops here)."""

    _hvd = hvd

    def __init__(self, transport: Optional[str] = None, comm: Any = None, **options: Any) -> None:
        tf.Module.__init__(self, name="gs_sketch")
        super().__init__(transport, comm, **options)
        self.states: dict[str, VariableState] = {}  # by variable path: tracked by tf.Module
        self.steps: dict[str, StepState] = {}  # by a digest of the optimizer's variable paths
        # plain objects below: tf.Module would wrap (copy) a list or dict, and they are not state to checkpoint
        self._variables = Variables(self.states, self.steps, bool(self.config.momentum))
        self._traced = TracedStep(self.config, self.ops, self._variables)
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
        if not compressible(tensor):
            self._traced.counters.add({"dense_bytes": tf.size(tensor, tf.int64) * tensor.dtype.size})
            return tensor, None
        grads, variables, op, process_set = calling_step(tensor)
        traced = self._traced
        if traced.grads is not grads:
            with tf.name_scope(STEP_SCOPE):
                traced.trace(grads, variables, self._collectives(op, process_set), self.agree)
        return tf.zeros([1]), traced.contexts[id(tensor)]

    @DefaultInstanceMethod
    @tf.autograph.experimental.do_not_convert
    def decompress(self, tensor: tf.Tensor, ctx: Optional[Ctx]) -> tf.Tensor:
        """The variable's update, reshaped and cast back to the gradient's shape and dtype."""
        return tensor if ctx is None else ctx.update()

    @DefaultInstanceProperty
    def stats(self) -> CommStats:
        """Bytes this rank handed to collectives and steps run (read from the graph's counters)."""
        last = max(self._traced.levels.values(), key=lambda m: m.at, default=None)  # the level that ran last
        density = {"density": last.ran, "density_changes": last.density.changes} if last else {}
        return CommStats(**{name: int(v.numpy()) for name, v in self._traced.counters.values.items()},
                         lost_residual=self._lost_residual, **density)

    @DefaultInstanceMethod
    def local_state_dict(self) -> dict[str, Any]:
        """Not collective: this rank's own state as numpy arrays, for one file per rank.
        ``{"options", "world_size", "rank", "variables": {path: {"residual", "momentum"}},
        "steps": {key: steps}, "density": {key: Density.state_dict()}}`` (momentum None when
        m = 0; density empty unless ``ratio="auto"``; state loaded but not created yet included).
        ``tf.train.Checkpoint(compression=gs)`` per rank saves the same state but the density
        (host Python, not a variable): a new process that restores one starts the rule again."""
        variables, steps = self._variables.local()
        return {"options": self._options(), "world_size": hvd.size(), "rank": hvd.rank(),
                "variables": variables, "steps": steps, "density": self._traced.level_states()}

    @DefaultInstanceMethod
    def reset(self) -> None:
        """Zeroes every residual, momentum and step count (eagerly), starts the density rule again
        (``ratio="auto"``) and drops loaded state not
        yet used: the variables stay, as Horovod's traced step holds them. Under Horovod
        elastic, use :class:`GsKerasState` instead: it keeps what was committed."""
        self._variables.clear()
        self._traced.restart_levels()
        self._forget_checkpoint_calls()

    def _load(self, state: dict[str, Any]) -> None:
        self._variables.load(state["variables"], state["steps"])
        self._traced.restore_levels(state.get("density", {}))

    def _roll_back(self, state: dict[str, Any]) -> None:
        self._variables.zero()
        self._load(state)

    def _layout(self, state: dict[str, Any]) -> dict[str, Any]:
        return Variables.layout(state["variables"], state["steps"])

    def _residual_mass(self, state: dict[str, Any]) -> float:
        return ElasticGsState.mass([np.asarray(v["residual"]) for v in state["variables"].values()])

    def _rejoin(self, layout: dict[str, Any], lost_mass: float) -> None:
        self._variables.rejoin(layout)
        self._lost_residual += lost_mass

    def _world_changed(self) -> None:
        """At every elastic reset (sync or not): steps traced for the old ranks raise, Horovod's
        cached allreduce functions built with this compressor are dropped, options are compared
        again at the next step, the density rule (``ratio="auto"``) starts again."""
        self._variables.uncheck()
        self._traced.guards.new_world()
        self._traced.new_world()
        forget_traced_steps(self)

    def _describe(self, v: Any) -> tuple[str, int, bool, int]:
        return variable_path(v), v.shape.num_elements(), v.dtype.is_floating, v.dtype.size

    def _flag_changed(self) -> None:
        self._traced.guards.flag.assign(self.step_flag())


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
