"""The gs-SGD state of one optimizer on one rank, kept between steps: in the spirit of torch's
``PowerSGDState`` and GRACE's ``Memory``, one object that owns what :class:`GsSgd.step`
returns, the layout and the accounting, so that an adapter only records gradients and hands
out updates.

TensorFlow keeps the same quantities in graph variables (Horovod traces the step inside a
``tf.function``); it uses the layout rule (:meth:`Layout.split`), the accounting
(:meth:`Layout.payload_bytes`) and the restore check (:func:`check_restored`) from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .array_ops import Array, ArrayOps
from .gs_sgd import GsConfig, GsSgd, Layout, Payload


@dataclass
class CommStats:
    """Payload bytes this rank handed to collectives, by collective (the fields of
    :class:`~gs_horovod.gs_sgd.Payload`: the sketch merge, the allgather, the sparse exchange's
    alltoall and threshold rounds, the exact round, dense steps and tensors), and steps
    (cumulative); ``skipped``: steps dropped for NaN/Inf under nonfinite="skip"."""

    sketch_bytes: int = 0
    gather_bytes: int = 0
    alltoall_bytes: int = 0
    select_bytes: int = 0
    exact_bytes: int = 0
    dense_bytes: int = 0
    steps: int = 0
    skipped: int = 0

    @property
    def total_bytes(self) -> int:
        return sum(getattr(self, f + "_bytes") for f in Payload._fields)

    def per_step(self) -> Payload:
        """The mean :class:`~gs_horovod.gs_sgd.Payload` of the steps so far."""
        steps = max(1, self.steps)
        return Payload(*(getattr(self, f + "_bytes") / steps for f in Payload._fields))

    def add(self, layout: Layout, config: GsConfig, dense: bool, applied: bool, gathered: int = 0) -> None:
        """Counts one step of ``layout`` (``dense``: a warm-up step); ``gathered``: the pairs
        this rank put into the sparse exchange's allgather, counted instead of the plan."""
        for f, n in zip(Payload._fields, layout.payload_bytes(config, dense, gathered)):
            setattr(self, f + "_bytes", getattr(self, f + "_bytes") + n)
        self.steps += 1
        self.skipped += 0 if applied else 1


def check_restored(name: str, saved: int, size: int) -> None:
    """Raises ValueError unless a saved residual of ``saved`` elements fits a tensor of ``size``."""
    if saved != size:
        raise ValueError(f"saved GsSketch state of {name!r} has {saved} elements, the tensor {size}")


class GsState:
    """gs-SGD state of one optimizer (one set of tensors, one op and process set) on one rank.

    Fields:

    - ``engine``: the :class:`GsSgd` that steps it (config, array ops, collectives).
    - ``layout``: the :class:`Layout` of the last step's tensors (None before the first): the
      ``min_size`` split, the order and offsets of the compressed tensors in the flat buffers.
    - ``residual``: e, (D,) f32, every compressed tensor's error-feedback residual, laid end to
      end in ``layout`` order (D = ``layout.total``); zero at the first step. The step's a = e + u
      is written into a new buffer which becomes the next ``residual`` in place: no per-tensor
      copies, no concatenation.
    - ``momentum``: u, (D,) f32 laid out alike, or None when ``config.momentum`` is 0.
    - ``steps``: steps applied (warm-up runs while ``steps < config.warmup_steps``).
    - ``checked``: whether the options were compared across ranks (at the first step).
    - ``grads`` / ``update``: this step's recorded gradients (d,) f32 by name, and its flat
      update (D + dense,) f32 with each tensor's view by name (``updates``), handed out once.
    - ``sizes``: the elements of every tensor that may appear, when known (restore checks).
    - ``pending``: restored per-tensor state not laid out yet, name → (residual, momentum, steps).
    - ``stats``: the :class:`CommStats` this state's steps count into (the compressor's).
    """

    def __init__(self, engine: GsSgd, stats: CommStats, sizes: Optional[dict[str, int]] = None) -> None:
        self.engine, self.stats, self.sizes = engine, stats, dict(sizes or {})
        self.layout: Optional[Layout] = None
        self.residual: Any = None
        self.momentum: Any = None
        self.steps = 0
        self.checked = False
        self.grads: dict[str, Array] = {}
        self.updates: Optional[dict[str, Array]] = None
        self.pending: dict[str, tuple[Array, Optional[Array], int]] = {}

    @property
    def ops(self) -> ArrayOps:
        return self.engine.ops

    def record(self, name: str, grad: Array) -> None:
        """Records this step's gradient (d,) f32 of ``name``; the first record after the
        updates were handed out starts a new step (an unfinished one, e.g. raised, is dropped)."""
        if self.updates is not None:
            self.grads, self.updates = {}, None
        self.grads[name] = grad

    def update_of(self, name: str) -> Array:
        """The step's update (d,) f32 of ``name``; the first call runs the step over every
        recorded gradient."""
        if self.updates is None:
            self.updates = self.step(self.grads)
        return self.updates.pop(name)

    def step(self, grads: dict[str, Array]) -> dict[str, Array]:
        """One engine step over ``grads`` (name → (d,) f32); stores the new state unless the
        step was skipped; returns each tensor's update, a view of the step's flat update."""
        config = self.engine.config
        like = next(iter(grads.values()))
        named = [(n, int(g.shape[0])) for n, g in grads.items()]
        comm = self.engine.comm
        self._lay_out(Layout.split(named, config, ranks=comm.size, allreduce_kind=comm.allreduce_kind), like)
        layout = self.layout
        warm = self.steps < config.warmup_steps
        result = self.engine.step(layout, [grads[n] for n in layout.names], self.residual, self.momentum,
                                  self.steps, not self.checked, [grads[n] for n in layout.dense_names])
        self.checked = True
        self.stats.add(layout, config, warm or not layout.groups, bool(result.applied), result.gathered)
        if result.applied:
            self.residual, self.momentum, self.steps = result.residual, result.momentum, result.steps
        ops = self.ops
        return {n: ops.slice(result.update, o, d)
                for n, o, d in zip(layout.all_names, layout.all_offsets, layout.all_sizes)}

    def tensors(self) -> dict[str, dict[str, Any]]:
        """Per compressed tensor (and restored ones not laid out yet): {"residual" (d,) f32,
        "momentum" (d,) f32 or None, "steps"}, copies."""
        return {**self.pending_tensors(), **self._current()}

    def pending_tensors(self) -> dict[str, dict[str, Any]]:
        return {n: {"residual": r, "momentum": m, "steps": s} for n, (r, m, s) in self.pending.items()}

    def _current(self) -> dict[str, dict[str, Any]]:
        if self.layout is None:
            return {}
        ops, out = self.ops, {}
        for n, o, d in zip(self.layout.names, self.layout.offsets, self.layout.sizes):
            momentum = None if self.momentum is None else ops.copy(ops.slice(self.momentum, o, d))
            out[n] = {"residual": ops.copy(ops.slice(self.residual, o, d)), "momentum": momentum, "steps": self.steps}
        return out

    def restore(self, tensors: dict[str, dict[str, Any]]) -> None:
        """Takes saved per-tensor state (as :meth:`tensors` gives it, arrays of this framework on
        any device); sizes are checked against the known ones now, the rest when laid out."""
        for name, saved in tensors.items():
            residual = saved["residual"].reshape(-1)
            if name in self.sizes:
                check_restored(name, int(residual.shape[0]), self.sizes[name])
            momentum = None if saved["momentum"] is None else saved["momentum"].reshape(-1)
            self.pending[name] = (residual, momentum, int(saved["steps"]))
        if self.layout is not None:
            layout, self.layout = self.layout, None
            self._lay_out(layout, self.residual)

    def _lay_out(self, layout: Layout, like: Array) -> None:
        """Makes ``layout`` current: buffers of its size on ``like``'s device holding the state of
        every tensor kept from the previous layout or restored (zeros for the others)."""
        if layout == self.layout:
            return
        old = {**self._current(), **self.pending_tensors()}
        ops = self.ops
        residuals, momenta = [], []
        for n, d in zip(layout.names, layout.sizes):
            saved = old.get(n)
            if saved is not None:
                check_restored(n, int(saved["residual"].shape[0]), d)
                self.steps = max(self.steps, saved["steps"])
            residuals.append(ops.zeros((d,), like) if saved is None else saved["residual"])
            kept = None if saved is None else saved["momentum"]
            momenta.append(ops.zeros((d,), like) if kept is None else kept)
        self.residual = ops.concat(residuals) if residuals else ops.zeros((0,), like)
        self.momentum = None
        if self.engine.config.momentum:
            self.momentum = ops.concat(momenta) if momenta else ops.zeros((0,), like)
        self.pending = {n: s for n, s in self.pending.items() if n not in layout.names}
        self.layout = layout
