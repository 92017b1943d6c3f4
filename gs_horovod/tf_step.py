"""The engine step (:meth:`~gs_horovod.engine.step.GsSgd.step`) traced as graph code into
Horovod's ``allreduce_grads``, once per traced function, over every compressible gradient of it.

Compressible (:func:`compressible`): a dense float tensor of known shape, any float dtype
(taken as (d,) float32). The step, in order:

1. the guards (:class:`Guards`): a step traced before a Horovod elastic reset fails
   (``InvalidArgumentError`` at run time, before any collective); then the ranks' step flags
   are summed (4 bytes) and, only when one is set, ``agree`` (the compressor's
   :meth:`~gs_horovod.checkpoint.CheckpointApi.agree`: a restore, or RuntimeError when a rank
   is out of step) runs eagerly in a ``tf.py_function`` before any state is read;
2. one engine step over the gradients (NaN/Inf and options checks are the engine's); under
   ``ratio="auto"`` (:class:`MeasuredLevel`) the step is traced once per level of
   :data:`~gs_horovod.engine.density.CHOICES` and ``tf.switch_case`` runs the one the rule
   chose, timed with ``tf.timestamp``;
3. the new residuals, momenta, steps and the flat update (D + dense,) f32 assigned to the
   variables of :mod:`gs_horovod.tf_variables`; the bytes added to :class:`Counters`.

Each gradient's :class:`Ctx` says where its update lies in the flat update.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from .array_ops import ArrayOps
from .engine.config import GsConfig
from .engine.density import CHOICES, DENSE, Density
from .engine.plan import Plan
from .engine.state import CommStats
from .engine.step import GsSgd, StepResult
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


class MeasuredLevel:
    """``ratio="auto"`` in a traced step: the rule's :class:`~gs_horovod.engine.density.Density`
    (host Python, one per traced step and world, the same on every rank) steered from the graph
    by ``tf.py_function``s, so that it holds eagerly and inside a ``tf.function`` alike. In each
    step, in this order (each op depends on the one before, so every rank runs them alike):

        window    ``due``: whether the density's window is complete; where it is, its (5,) sums
                  are allgathered (a ``tf.cond`` every rank takes alike)
        decide    once every gradient is there (a value of each one is its input): the clock
                  read (compute: from the last step's end), the window decided where due
                  (:meth:`Density.decide`); returns the level's index in CHOICES
        step      ``tf.switch_case`` over that index: each branch the engine step of that
                  level's plan (every level lays the tensors out alike)
        observe   once the update is there (a value of it is its input): the clock read
                  (exchange: from decide), :meth:`Density.observe` (‖g‖ under ``critical``)

    The clock is the host's (``time.perf_counter``), read where an input's value had to be
    ready, as the torch adapters read it. ``ran``: the level of the last step; ``at``: the
    clock when it ended (0 before), for :class:`CommStats` across traced steps."""

    def __init__(self, config: GsConfig, named: list[tuple[str, int]], ranks: int, allreduce_kind: str) -> None:
        self.config, self.named, self.ranks, self.allreduce_kind = config, named, ranks, allreduce_kind
        self.density = Density()
        self.ended: Optional[float] = None  # the clock at the last step's end (None: the next step is not measured)
        self.begun = 0.0
        self.ran, self.at = 0.0, 0.0
        self._wires: dict[float, float] = {}

    def wire(self, level: float) -> float:
        """Wire bytes through the busiest rank of one step at ``level`` (:meth:`Plan.wire_bytes`)."""
        if level not in self._wires:
            self._wires[level] = Plan.wire_bytes(self.named, self.config, ranks=self.ranks,
                                                 allreduce_kind=self.allreduce_kind, level=level)
        return self._wires[level]

    def trace(self, comm: Collectives, steps: tf.Tensor, grads: list[tf.Tensor],
              run: Callable[[Plan], tuple[StepResult, dict[str, Any]]]) -> tuple[StepResult, dict[str, Any]]:
        """The traced step at the chosen level: ``run(plan)`` (the step and its counts) traced
        once per level; ``steps`` (int64) steps applied before this one, ``grads`` this rank's
        (d,) f32 gradients (at least one)."""
        cfg = self.config
        due = tf.py_function(lambda: self.density.due, [], tf.bool)
        every = tf.cond(due, lambda: comm.allgather(tf.py_function(self._window, [], tf.float32), "gs_horovod.density"),
                        lambda: tf.zeros([5 * comm.size], tf.float32))
        ready = tf.add_n([g[0] for g in grads])  # a value of every gradient
        index = tf.py_function(self._decide, [due, every, steps, ready], tf.int32)

        def branch(level: float) -> Callable[[], dict[str, Any]]:
            def at_level() -> dict[str, Any]:
                result, amounts = run(Plan.split(self.named, cfg, ranks=self.ranks,
                                                 allreduce_kind=self.allreduce_kind, level=level))
                momentum = result.momentum if cfg.momentum else tf.zeros([0])
                return {"result": result._replace(momentum=momentum, steps=tf.cast(result.steps, tf.int64),
                                                  applied=tf.convert_to_tensor(result.applied, tf.bool),
                                                  routed=tf.cast(result.routed, tf.int64),
                                                  gathered=tf.cast(result.gathered, tf.int64)),
                        "amounts": {f: tf.cast(amounts.get(f, 0), tf.int64) for f in CommStats.counted()}}
            return at_level

        out = tf.switch_case(index, [branch(level) for level in CHOICES])
        result = out["result"]
        norm = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(g)) for g in grads])) if cfg.critical else tf.constant(0.0)
        observed = tf.py_function(self._observe, [index, norm, result.applied, result.update[:1]], tf.bool)
        with tf.control_dependencies([observed]):
            result = tf.nest.map_structure(tf.identity, result)
        return result._replace(momentum=result.momentum if cfg.momentum else None), out["amounts"]

    def _window(self) -> np.ndarray:
        """This rank's window (5,) float32 (:meth:`Density.window`)."""
        return self.density.window().astype(np.float32)

    def _decide(self, due: tf.Tensor, every: tf.Tensor, steps: tf.Tensor, ready: tf.Tensor) -> int:
        """The step's start: the clock read and, where ``due``, the window decided from every
        rank's (P · 5,) ``every`` at ``steps`` applied; the level's index in CHOICES."""
        self.begun = time.perf_counter()
        if bool(due):
            gathered = every.numpy().reshape(self.ranks, 5)
            self.density.decide(lambda _: gathered, self.wire, self.config.budget_or_default, int(steps),
                                self.config.ramp, self.config.critical)
        return CHOICES.index(self.density.level)

    def _observe(self, index: tf.Tensor, norm: tf.Tensor, applied: tf.Tensor, update: tf.Tensor) -> bool:
        """The step's end (``update`` ready): the step at CHOICES[``index``] counted (‖g‖ ``norm``
        where ``applied``, else 0)."""
        ended = time.perf_counter()
        compute = None if self.ended is None else self.begun - self.ended
        self.density.observe(compute, ended - self.begun, None, float(norm) if bool(applied) else 0.0)
        self.ended, self.ran, self.at = ended, CHOICES[int(index)], ended
        return True


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
        self.levels: dict[str, MeasuredLevel] = {}  # under ratio="auto", by step key
        self.saved_levels: dict[str, dict[str, Any]] = {}  # restored Density states of steps not traced yet

    def level_states(self) -> dict[str, dict[str, Any]]:
        """Every traced step's :meth:`Density.state_dict` by step key (restored ones not traced yet
        included); empty unless ``ratio="auto"``."""
        return {**self.saved_levels, **{key: m.density.state_dict() for key, m in self.levels.items()}}

    def restore_levels(self, saved: dict[str, dict[str, Any]]) -> None:
        """Each step's density saved in ``saved`` (:meth:`level_states`) taken as its own (before
        its trace: at it); the others kept, as the torch adapters keep theirs."""
        for key, state in saved.items():
            if key in self.levels:
                self.levels[key].density = Density.from_state(state)
            else:
                self.saved_levels[key] = state

    def restart_levels(self) -> None:
        """Every density rule starts again (:meth:`Density.restart`); the next step is not measured."""
        for measured in self.levels.values():
            measured.density.restart()
            measured.ended = None
        self.saved_levels = {}

    def new_world(self) -> None:
        """A Horovod elastic reset: the density rule starts again, planned for the new ranks at
        the next trace."""
        self.levels, self.saved_levels = {}, {}

    def trace(self, grads: list, variables: list, comm: Collectives, agree: Callable[[float], None]) -> None:
        """Builds the step over every compressible gradient of ``grads`` (their ``variables``
        name them) on ``comm``; it becomes the one being traced."""
        cfg, ops = self.config, self.ops
        paths = [(variable_path(v), g) for g, v in zip(grads, variables) if g is not None and compressible(g)]
        named = dict(paths)
        if len(named) < len(paths):
            shared = sorted({p for p, _ in paths if sum(q == p for q, _ in paths) > 1})
            raise ValueError(f"GsSketch keeps each variable's residual under its name, and these variables share "
                             f"one: {', '.join(map(repr, shared))}; give each variable a unique name "
                             "(tf.Variable(..., name=...); Keras layers name theirs)")
        plan = Plan.split([(n, g.shape.num_elements()) for n, g in named.items()], cfg, ranks=comm.size,
                          allreduce_kind=comm.allreduce_kind, level=DENSE if cfg.adaptive else None)  # the layout
        states = [self.variables.variable(n, d) for n, d in zip(plan.names, plan.sizes)]
        key = f"{zlib.crc32(repr(plan.all_names).encode()):08x}"
        step = self.variables.step(key, plan.total + sum(plan.dense_sizes))
        with tf.control_dependencies([self.guards.agreed(comm, key, agree)]):  # a restore precedes every read
            warm = step.steps < cfg.warmup_steps  # read before the step assigns it
            sgd = GsSgd(cfg, ops, comm)
            flat = {n: tf.reshape(tf.cast(g, tf.float32), [-1]) for n, g in named.items()}
            residual = ops.concat([s.residual for s in states]) if states else tf.zeros([0])
            momentum = (ops.concat([s.momentum for s in states]) if states else tf.zeros([0])) if cfg.momentum else None

            def run(plan: Plan) -> tuple[StepResult, dict[str, Any]]:
                result = sgd.step(plan, [flat[n] for n in plan.names], residual, momentum, step.steps,
                                  tf.logical_not(step.checked), [flat[n] for n in plan.dense_names])
                return result, CommStats.amounts(plan, cfg, warm, tf.cast(result.applied, tf.int64),
                                                 (result.routed, result.gathered),
                                                 where=lambda c, w, x: tf.where(c, tf.cast(w, tf.int64),
                                                                                tf.cast(x, tf.int64)))

            if cfg.adaptive and flat:
                level = self.levels.get(key)
                if level is None or (level.ranks, level.allreduce_kind) != (comm.size, comm.allreduce_kind):
                    level = self.levels[key] = MeasuredLevel(cfg, list(zip(plan.all_names, plan.all_sizes)),
                                                             comm.size, comm.allreduce_kind)
                    if key in self.saved_levels:
                        level.density = Density.from_state(self.saved_levels.pop(key))
                result, amounts = level.trace(comm, step.steps, list(flat.values()), run)
            else:
                result, amounts = run(plan)
        # assignments are stateful: they run, and reads of step.update (same resource) follow them
        step.checked.assign(True)
        step.steps.assign(result.steps)
        step.update.assign(result.update)
        if states:
            for s, part in zip(states, tf.split(result.residual, list(plan.sizes))):
                s.residual.assign(part)
            for s, part in zip(states, tf.split(result.momentum, list(plan.sizes)) if cfg.momentum else []):
                s.momentum.assign(part)
        self.counters.add(amounts)
        self.grads = grads
        self.contexts = {id(named[n]): Ctx(step, o, named[n].shape, named[n].dtype)
                         for n, o in zip(plan.all_names, plan.all_offsets)}
