"""The state of one optimizer (or one DDP model) on one rank, kept between steps, and the
adapter core written once: in the spirit of torch's ``PowerSGDState`` and GRACE's ``Memory``,
:class:`EngineState` records the step's gradients, runs one engine step over all of them and
hands out each tensor's slice of the update, so that an adapter only translates.

TensorFlow keeps the same quantities in graph variables instead: Horovod traces its step
inside a ``tf.function``, where a new residual must be assigned to a variable the trace
captured, not swapped for a new buffer as here. It shares the plan rule
(:meth:`Plan.split`), the accounting (:meth:`CommStats.amounts`), the restore check
(:func:`check_restored`) and the density rule (:class:`~gs_horovod.engine.density.Density`)
with this module.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, Callable, Optional

import numpy as np

from ..array_ops import Array, ArrayOps
from .config import GsConfig
from .density import DENSE, Density
from .payload import Payload
from .plan import Plan
from .step import GsSgd, Prior, StepResult

ByteCounts = make_dataclass("ByteCounts", [(f + "_bytes", int, field(default=0)) for f in Payload._fields])
ByteCounts.__module__ = __name__
ByteCounts.__doc__ = """Payload bytes by byte kind, cumulative: ``<kind>_bytes`` for each field of
:class:`~gs_horovod.engine.payload.Payload`, in its order (the byte kinds the exchanges declare,
then ``exact`` and ``dense``)."""


@dataclass
class CommStats(ByteCounts):
    """Payload bytes this rank handed to collectives, by byte kind (:class:`ByteCounts`, the
    fields of :class:`~gs_horovod.engine.payload.Payload`: ``sketch_bytes``, ``gather_bytes``,
    ``alltoall_bytes``, ``select_bytes`` as the exchanges declare them, ``exact_bytes``, and
    ``dense_bytes``: dense steps and tensors), and
    steps (cumulative); ``skipped``: steps dropped for NaN/Inf under nonfinite="skip";
    ``lost_residual``: Σ e² of the residuals that ranks removed by Horovod elastic resets held
    at their last commit (:mod:`gs_horovod.elastic`), gradient mass never applied;
    ``density``: under ``ratio="auto"`` the fraction of D the last step sent (1.0: dense in
    float16; :mod:`gs_horovod.engine.density`), 0 otherwise; ``density_changes``: how often
    it changed."""

    steps: int = 0
    skipped: int = 0
    lost_residual: float = 0.0
    density: float = 0.0
    density_changes: int = 0

    @classmethod
    def counted(cls) -> list[str]:
        """The fields a step adds to (:meth:`amounts`)."""
        return [f.name for f in fields(cls) if f.name not in ("lost_residual", "density", "density_changes")]

    @property
    def total_bytes(self) -> int:
        """Bytes handed to collectives so far, every byte kind together."""
        return sum(getattr(self, f + "_bytes") for f in Payload._fields)

    def per_step(self) -> Payload:
        """The mean :class:`~gs_horovod.engine.payload.Payload` of the steps so far."""
        steps = max(1, self.steps)
        return Payload(*(getattr(self, f + "_bytes") / steps for f in Payload._fields))

    @staticmethod
    def amounts(plan: Plan, config: GsConfig, dense: Any, applied: Any, measured: Any = None,
                where: Any = None) -> dict[str, Any]:
        """What one step of ``plan`` adds to each field: ``dense`` (a warm-up step), ``applied``
        and ``measured`` ((routed, gathered) bytes of a :class:`StepResult`, counted where the
        exchange's sizes depend on the data) as bools and ints, or as graph tensors with
        ``where`` (``tf.where``) choosing between the dense and the compressed bytes."""
        compressed, warm = plan.payload_bytes(config, False, measured), plan.payload_bytes(config, True)
        if where is None:
            chosen = warm if dense else compressed
        else:
            chosen = [where(dense, w, c) for w, c in zip(warm, compressed)]
        return {**{f + "_bytes": n for f, n in zip(Payload._fields, chosen)}, "steps": 1, "skipped": 1 - applied}

    def add(self, plan: Plan, config: GsConfig, dense: bool, applied: bool, measured: Any = None) -> None:
        """Counts one step of ``plan`` (:meth:`amounts`)."""
        for name, n in self.amounts(plan, config, dense, int(applied), measured).items():
            setattr(self, name, getattr(self, name) + n)


def sizes_of(grads: dict[str, Array]) -> list[tuple[str, int]]:
    """(name, d) of each recorded gradient (d,), in record order."""
    return [(n, int(g.shape[0])) for n, g in grads.items()]


def check_restored(name: str, saved: int, size: int) -> None:
    """Raises ValueError unless a saved residual of ``saved`` elements fits a tensor of ``size``."""
    if saved != size:
        raise ValueError(f"saved GsSketch state of {name!r} has {saved} elements, the tensor {size}")


class EngineState:
    """gs-SGD state of one optimizer (one set of tensors, one op and process set) on one rank.

    Fields:

    - ``sgd``: the :class:`GsSgd` that steps it (config, array ops, collectives).
    - ``plan``: the :class:`Plan` of the last step's tensors (None before the first): the
      ``min_size`` split, the order and offsets of the compressed tensors in the flat buffers.
    - ``residual``: e, (D,) f32, every compressed tensor's error-feedback residual, laid end to
      end in ``plan`` order (D = ``plan.total``); zero at the first step. The step's a = e + u
      is written into a new buffer which becomes the next ``residual`` in place: no per-tensor
      copies, no concatenation.
    - ``momentum``: u, (D,) f32 laid out alike, or None when ``config.momentum`` is 0.
    - ``steps``: steps applied (warm-up runs while ``steps < config.warmup_steps``).
    - ``checked``: whether the options were compared across ranks (at the first step).
    - ``grads`` / ``updates``: this step's recorded gradients (d,) f32 by name, and each
      tensor's view of its flat update (D + dense,) f32 by name, handed out once.
    - ``sizes``: the elements of every tensor that may appear, when known (restore checks).
    - ``pending``: restored per-tensor state not laid out yet, name → {"residual", "momentum",
      "steps"} as saved (any device; moved when laid out).
    - ``stats``: the :class:`CommStats` this state's steps count into (the adapter's).
    - ``density``: under ``ratio="auto"`` the :class:`~gs_horovod.engine.density.Density` that
      picks each step's level (None otherwise); ``clock``: the seconds it measures steps with
      (``time.perf_counter``; simulated ranks pass their modelled clock).
    - ``early``: whether this step's gradients may leave as they are recorded (:meth:`dense_ahead`
      at the step's first record): the adapter then finishes it with :meth:`mean_layout` and
      :meth:`take_means`.
    """

    def __init__(self, sgd: GsSgd, stats: CommStats, sizes: Optional[dict[str, int]] = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.sgd, self.stats, self.sizes = sgd, stats, dict(sizes or {})
        config = sgd.config
        self.density = Density() if config.adaptive else None
        self.clock = clock
        self._ended: Optional[float] = None  # the clock at the end of the last step
        self._recorded: Optional[float] = None  # the clock at the step's last record
        self._first: Optional[float] = None  # the clock at the step's first record
        self._zero = True  # residual and momentum are zero (no step yet, or a dense one last)
        self._wires: dict[tuple[Any, ...], float] = {}
        self.plan: Optional[Plan] = None
        self.residual: Any = None
        self.momentum: Any = None
        self.steps = 0
        self.checked = False
        self.grads: dict[str, Array] = {}
        self.updates: Optional[dict[str, Array]] = None
        self.pending: dict[str, dict[str, Any]] = {}
        self.early = False

    @property
    def ops(self) -> ArrayOps:
        """The engine's array operations."""
        return self.sgd.ops

    def record(self, name: str, grad: Array) -> None:
        """Records this step's gradient (d,) f32 of ``name``; the first record after the
        updates were handed out starts a new step (an unfinished one, e.g. raised, is dropped)."""
        if self.updates is not None:
            self.grads, self.updates = {}, None
        if not self.grads:
            self.early = self.dense_ahead()
            self._first = self._recorded = None
        self.grads[name] = grad
        if self.density is not None:
            self._recorded = self.clock()
            self._first = self._recorded if self._first is None else self._first

    def dense_ahead(self) -> bool:
        """Whether the next step sends every a = g as it is (the DENSE level of ``ratio="auto"``
        with residual and momentum zero and nothing restored pending): an adapter may then hand
        each gradient to its framework's float16 allreduce as backward produces it, overlapping
        the two, and finish the step with :meth:`mean_layout` and :meth:`take_means`."""
        density = self.density
        return density is not None and density.level == DENSE and not density.due and self._zero \
            and not self.pending

    def keep_early(self) -> bool:
        """After the step's flags were agreed (a restore may have handed residuals back): whether
        this step stays :attr:`early`; if not, the adapter runs the engine step instead, which
        sends a = e + g. Not collective: every rank agreed on the same flags."""
        self.early = self.early and self.dense_ahead()
        return self.early

    def mean_layout(self) -> tuple[int, dict[str, tuple[int, int]]]:
        """In an :attr:`early` step, once every gradient is recorded: lays out the DENSE plan and
        returns (n, name → (offset, d)), the places of the tensors' means in one (n,) f32 buffer
        (n = D + dense). The adapter casts each merged mean (float16) into its place as it
        arrives and hands the buffer to :meth:`take_means`. Marks the step's updates as being
        handed out (:attr:`updates` {}), so that the next :meth:`record` starts a new step."""
        like = next(iter(self.grads.values()))
        config, comm = self.sgd.config, self.sgd.comm
        self._lay_out(Plan.split(sizes_of(self.grads), config, ranks=comm.size, allreduce_kind=comm.allreduce_kind,
                                 level=DENSE), like)
        self.updates = {}
        plan = self.plan
        return plan.total + sum(plan.dense_sizes), {n: (o, d) for n, o, d in
                                                    zip(plan.all_names, plan.all_offsets, plan.all_sizes)}

    def take_means(self, mean: Array) -> dict[str, Array]:
        """An :attr:`early` step from ``mean`` (n,) f32 laid out by :meth:`mean_layout`, the
        ranks' mean (the sum under a summing op) of every recorded gradient: runs the step
        (:meth:`GsSgd.dense_from_mean`: checks, NaN/Inf rule, counts, density) and returns each
        tensor's update (d,) f32: its view of ``mean``, or zeros where the step was skipped."""
        plan, ended, self._ended = self.plan, self._ended, None
        begun = self._recorded
        with self.ops.own_threads():
            result = self.sgd.dense_from_mean(plan, mean, [self.grads[n] for n in plan.all_names],
                                                 Prior(self.residual, self.momentum, self.steps), not self.checked)
        return self._store(plan, sizes_of(self.grads), result, list(self.grads.values()), ended, begun, begun,
                           self._first)

    def update_of(self, name: str) -> Array:
        """The step's update (d,) f32 of ``name``; the first call runs the step over every
        recorded gradient."""
        if self.updates is None:
            self.updates = self.step(self.grads)
        return self.updates.pop(name)

    def step(self, grads: dict[str, Array]) -> dict[str, Array]:
        """One engine step over ``grads`` (name → (d,) f32); stores the new state unless the
        step was skipped; returns each tensor's update, a view of the step's flat update."""
        config, comm, density = self.sgd.config, self.sgd.comm, self.density
        like = next(iter(grads.values()))
        named = sizes_of(grads)
        begun = self.clock()
        if density is not None and density.due:  # a restored state may end a window here
            self._decide(named)
        level = None if density is None else density.level
        self._lay_out(Plan.split(named, config, ranks=comm.size, allreduce_kind=comm.allreduce_kind, level=level),
                      like)
        plan, ended, self._ended = self.plan, self._ended, None
        started = self.clock()
        with self.ops.own_threads():
            result = self.sgd.step(plan, [grads[n] for n in plan.names], self.residual, self.momentum,
                                      self.steps, not self.checked, [grads[n] for n in plan.dense_names])
        return self._store(plan, named, result, list(grads.values()), ended, begun, started)

    def skip(self, grads: dict[str, Array]) -> dict[str, Array]:
        """A step the adapter's guard dropped before any exchange (a NaN/Inf found on some rank
        under ``nonfinite="skip"``, every rank alike): counted as a step and as skipped, no
        bytes; the state is kept. Returns each tensor's zero update (d,) f32."""
        self.stats.steps += 1
        self.stats.skipped += 1
        return {n: self.ops.zeros_like(g) for n, g in grads.items()}

    def _store(self, plan: Plan, named: list[tuple[str, int]], result: StepResult, grads: list[Array],
               ended: Optional[float], begun: Optional[float], started: Optional[float],
               linked: Optional[float] = None) -> dict[str, Array]:
        """After a step of ``plan`` over ``grads``: the density's measurement (compute from the last
        step's end ``ended`` to ``begun``, exchange from ``started`` to now, the link from ``linked``,
        the first gradient of a step whose allreduces ran beside backward, to now; ‖g‖ under
        ``critical``, 0 for a skipped step) and, at a window's end, its next level (decided now, so
        that the next step's first record knows it); the counts; the new state unless the step was
        skipped. Returns each tensor's update, a view of the flat one."""
        config, density, ops = self.sgd.config, self.density, self.ops
        warm = self.steps < config.warmup_steps
        self.checked = True
        if density is not None:
            ops.wait(result.update)
            self._ended = self.clock()
            density.observe(None if ended is None or begun is None else begun - ended, self._ended - started,
                            None if linked is None else self._ended - linked,
                            self._norm(grads) if config.critical and bool(result.applied) else 0.0)
            if density.due:
                self._decide(named, int(result.steps))
            self.stats.density, self.stats.density_changes = plan.level, density.changes
        self.stats.add(plan, config, warm or not plan.groups, bool(result.applied), (result.routed, result.gathered))
        if result.applied:
            self.residual, self.momentum, self.steps = result.residual, result.momentum, result.steps
            self._zero = warm or not plan.groups
        return {n: ops.slice(result.update, o, d) for n, o, d in zip(plan.all_names, plan.all_offsets, plan.all_sizes)}

    def _decide(self, named: list[tuple[str, int]], steps: Optional[int] = None) -> None:
        """Ends the density's window (collective): its next level at ``steps`` applied (None: the
        steps so far, restored ones not laid out yet included)."""
        config = self.sgd.config
        if steps is None:
            steps = max([self.steps, *(saved["steps"] for saved in self.pending.values())])
        self.density.decide(self._share, lambda level: self._wire(named, level), config.budget_or_default,
                            steps, config.ramp, config.critical)

    def _norm(self, grads: list[Array]) -> float:
        """‖g‖ of this step's gradients ``grads`` (each (d,) f32), as a host float (one sync)."""
        return float(sum(self.ops.sum_squares(g) for g in grads)) ** 0.5

    def _share(self, local: np.ndarray) -> np.ndarray:
        """Every rank's ``local`` (n,) as (P, n) float32, the same on every rank (one allgather)."""
        comm = self.sgd.comm
        every = comm.to_host(comm.allgather(comm.from_host(local.astype(np.float32)), "gs_horovod.density"))
        return np.asarray(every).reshape(comm.size, -1)

    def _wire(self, named: list[tuple[str, int]], level: float) -> float:
        """Wire bytes through the busiest rank of one step of ``named`` at density ``level``."""
        comm, config = self.sgd.comm, self.sgd.config
        key = (tuple(named), level, comm.size, comm.allreduce_kind)
        if key not in self._wires:
            self._wires[key] = Plan.wire_bytes(named, config, ranks=comm.size, allreduce_kind=comm.allreduce_kind,
                                               level=level)
        return self._wires[key]

    def restart_density(self) -> None:
        """Starts the density rule again (a change of world; every rank alike). Not collective."""
        if self.density is not None:
            self.density.restart()
        self._ended, self._wires = None, {}

    def tensors(self) -> dict[str, dict[str, Any]]:
        """Per compressed tensor (and restored ones not laid out yet): {"residual" (d,) f32,
        "momentum" (d,) f32 or None, "steps", and under ``ratio="auto"`` "density" (its
        optimizer's :meth:`Density.state_dict`)}, copies."""
        return {**self.pending, **self._current()}

    def _current(self) -> dict[str, dict[str, Any]]:
        if self.plan is None:
            return {}
        ops, out = self.ops, {}
        density = {} if self.density is None else {"density": self.density.state_dict()}
        for n, o, d in zip(self.plan.names, self.plan.offsets, self.plan.sizes):
            momentum = None if self.momentum is None else ops.copy(ops.slice(self.momentum, o, d))
            out[n] = {"residual": ops.copy(ops.slice(self.residual, o, d)), "momentum": momentum, "steps": self.steps,
                      **density}
        return out

    def restore(self, tensors: dict[str, dict[str, Any]]) -> None:
        """Takes saved per-tensor state (as :meth:`tensors` gives it, arrays of this framework on
        any device, any float dtype); sizes are checked against the known ones now, the rest
        when laid out, where they are copied to the step's device in float32. A saved density
        (``ratio="auto"``) is taken as this state's; without one the density is kept."""
        self._zero = self._zero and not tensors
        for name, saved in tensors.items():
            residual = saved["residual"].reshape(-1)
            if name in self.sizes:
                check_restored(name, int(residual.shape[0]), self.sizes[name])
            momentum = None if saved["momentum"] is None else saved["momentum"].reshape(-1)
            self.pending[name] = {"residual": residual, "momentum": momentum, "steps": int(saved["steps"])}
        densities = [saved["density"] for saved in tensors.values() if saved.get("density") is not None]
        if self.density is not None and densities:  # one optimizer's: the same in every tensor
            self.density = Density.from_state(densities[0])
        if self.plan is not None:  # laid out again: the restored tensors over the current ones
            plan, self.pending = self.plan, {**self._current(), **self.pending}
            self.plan = None
            self._lay_out(plan, self.residual)

    def roll_back(self, tensors: dict[str, dict[str, Any]]) -> None:
        """Replaces every residual, momentum and the step count with ``tensors`` (as
        :meth:`tensors` gave them): tensors absent from it start from zero, and with none the
        steps are 0; a density absent from it starts again. Not collective."""
        self.plan, self.residual, self.momentum, self.steps, self.pending = None, None, None, 0, {}
        self.grads, self.updates, self._zero = {}, None, True
        self.restart_density()
        self.restore(tensors)

    def _lay_out(self, plan: Plan, like: Array) -> None:
        """Makes ``plan`` current: buffers of its size on ``like``'s device holding the state of
        every tensor kept from the previous plan or restored (zeros for the others)."""
        if plan == self.plan:
            return
        old = {**self._current(), **self.pending}
        ops = self.ops
        residuals, momenta = [], []
        for n, d in zip(plan.names, plan.sizes):
            saved = old.get(n)
            if saved is not None:
                check_restored(n, int(saved["residual"].shape[0]), d)
                self.steps = max(self.steps, saved["steps"])
            kept = None if saved is None else saved["momentum"]
            residuals.append(ops.zeros((d,), like) if saved is None else ops.moved(saved["residual"], like))
            momenta.append(ops.zeros((d,), like) if kept is None else ops.moved(kept, like))
        self.residual = ops.concat(residuals) if residuals else ops.zeros((0,), like)
        self.momentum = None
        if self.sgd.config.momentum:
            self.momentum = ops.concat(momenta) if momenta else ops.zeros((0,), like)
        self.pending = {n: s for n, s in self.pending.items() if n not in plan.names}
        self.plan = plan
