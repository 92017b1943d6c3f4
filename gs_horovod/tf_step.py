"""The engine step (:meth:`~gs_horovod.engine.step.GsSgd.step`) traced as graph code into
Horovod's ``allreduce_grads``, once per traced function, over every compressible gradient of it.

Compressible (:func:`compressible`): a dense float tensor of known shape, any float dtype
(taken as (d,) float32). The step, in order:

1. the guards (:class:`Guards`): a step traced before a Horovod elastic reset fails
   (``InvalidArgumentError`` at run time, before any collective); then the ranks' step flags
   are summed (4 bytes) and, only when one is set, ``agree`` (the compressor's
   :meth:`~gs_horovod.checkpoint.CheckpointApi.agree`: a restore, or RuntimeError when a rank
   is out of step) runs eagerly in a ``tf.py_function`` before any state is read;
2. one engine step over the gradients (NaN/Inf and options checks are the engine's);
3. the new residuals, momenta, steps and the flat update (D + dense,) f32 assigned to the
   variables of :mod:`gs_horovod.tf_variables`; the bytes added to :class:`Counters`.

Each gradient's :class:`Ctx` says where its update lies in the flat update.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Callable, Optional

import tensorflow as tf

from .array_ops import ArrayOps
from .engine.config import GsConfig
from .engine.plan import Plan
from .engine.state import CommStats
from .engine.step import GsSgd
from .tf_horovod import variable_path
from .tf_variables import StepState, Variables
from .transports.protocol import Collectives


def compressible(tensor: Any) -> bool:
    """Whether the engine takes ``tensor``: dense, floating, of a known number of elements."""
    return (not isinstance(tensor, tf.IndexedSlices) and tensor.dtype.is_floating
            and tensor.shape.num_elements() is not None)


@dataclass(frozen=True)
class Ctx:
    """One gradient's update: ``step.update[offset:offset + shape.num_elements()]``, in ``dtype``."""

    step: StepState
    offset: int
    shape: tf.TensorShape
    dtype: tf.DType

    def update(self) -> tf.Tensor:
        """The update, reshaped and cast back to the gradient's shape and dtype."""
        n = self.shape.num_elements()
        return tf.cast(tf.reshape(self.step.update[self.offset:self.offset + n], self.shape), self.dtype)


class Counters:
    """:class:`CommStats` as int64 variables that the graph adds to. A plain object, so that
    tf.Module does not track them: they are not state to checkpoint."""

    def __init__(self) -> None:
        with tf.init_scope():
            self.values = {name: tf.Variable(0, dtype=tf.int64, trainable=False, name=name)
                           for name in CommStats.counted()}

    def add(self, amounts: dict[str, Any]) -> None:
        """Adds ``amounts`` (field → int or int tensor) in the graph being built (or eagerly)."""
        for name, amount in amounts.items():
            self.values[name].assign_add(tf.cast(amount, tf.int64))


class Guards:
    """What every traced step reads before any state: this rank's step flag
    (:meth:`~gs_horovod.checkpoint.CheckpointApi.step_flag`, float32) and how many elastic
    resets this rank has joined (``generation``; int64 in ``world``, compared with the count the
    step was traced at, so that a step traced for other ranks raises instead of running
    collectives sized for them). A plain object: not state to checkpoint."""

    def __init__(self) -> None:
        self.generation = 0
        with tf.init_scope():
            self.flag = tf.Variable(0.0, trainable=False, name="step_flag")
            self.world = tf.Variable(0, dtype=tf.int64, trainable=False, name="world_generation")

    def new_world(self) -> None:
        """An elastic reset: steps traced before it raise."""
        self.generation += 1
        self.world.assign(self.generation)

    def agreed(self, comm: Collectives, key: str, agree: Callable[[float], None]) -> tf.Tensor:
        """A bool tensor that every read of state must depend on: the world checked, the flags
        summed over ranks, and ``agree(flags)`` run eagerly where they are not 0."""
        traced_for = tf.constant(self.generation, tf.int64)
        same_world = tf.debugging.assert_equal(self.world, traced_for, message=(
            "GsSketch: this step was traced before a Horovod elastic reset, for the ranks of that time; build the "
            "tf.function of the training step (or the DistributedOptimizer) again after a reset, e.g. in a reset "
            "callback"))
        with tf.control_dependencies([same_world]):
            flags = comm.allreduce_sum(tf.reshape(self.flag, [1]), f"gs_horovod.flags.{key}")[0]

        def eagerly(flags: tf.Tensor) -> bool:
            agree(float(flags.numpy()))
            return True

        return tf.cond(flags > 0, lambda: tf.py_function(eagerly, [flags], tf.bool), lambda: tf.constant(True))


class TracedStep:
    """The step of one compressor's optimizers, traced into each ``allreduce_grads``:
    ``grads`` is the list of the one being traced (None before), ``contexts`` its gradients'
    :class:`Ctx` by ``id``."""

    def __init__(self, config: GsConfig, ops: ArrayOps, variables: Variables) -> None:
        self.config, self.ops, self.variables = config, ops, variables
        self.counters = Counters()
        self.guards = Guards()
        self.grads: Optional[list] = None
        self.contexts: dict[int, Ctx] = {}

    def trace(self, grads: list, variables: list, comm: Collectives, agree: Callable[[float], None]) -> None:
        """Builds the step over every compressible gradient of ``grads`` (their ``variables``
        name them) on ``comm``; it becomes the one being traced."""
        cfg, ops = self.config, self.ops
        named = {variable_path(v): g for g, v in zip(grads, variables) if g is not None and compressible(g)}
        plan = Plan.split([(n, g.shape.num_elements()) for n, g in named.items()], cfg, ranks=comm.size,
                          allreduce_kind=comm.allreduce_kind)
        states = [self.variables.variable(n, d) for n, d in zip(plan.names, plan.sizes)]
        key = f"{zlib.crc32(repr(plan.all_names).encode()):08x}"
        step = self.variables.step(key, plan.total + sum(plan.dense_sizes))
        with tf.control_dependencies([self.guards.agreed(comm, key, agree)]):  # a restore precedes every read
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
        self.counters.add(CommStats.amounts(plan, cfg, warm, tf.cast(result.applied, tf.int64),
                                            (result.routed, result.gathered),
                                            where=lambda c, w, x: tf.where(c, tf.cast(w, tf.int64),
                                                                           tf.cast(x, tf.int64))))
        self.grads = grads
        self.contexts = {id(named[n]): Ctx(step, o, named[n].shape, named[n].dtype)
                         for n, o in zip(plan.all_names, plan.all_offsets)}
