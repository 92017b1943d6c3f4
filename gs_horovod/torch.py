"""GsSketch for ``horovod.torch``: the gs-SGD engine (:mod:`gs_horovod.gs_sgd`) as a Horovod
compressor.

    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=GsSketch())          # defaults
    ...                            compression=GsSketch(ratio=0.001, scope="layer")

How it plugs into Horovod 0.28.1 (``horovod/torch/optimizer.py``): for each gradient the
optimizer calls ``compress(p.grad)``, allreduces the returned tensor under the parameter's
name, then in ``synchronize()`` calls ``decompress(result, ctx)`` for every gradient and sets
``p.grad`` to what it returns. Every ``compress`` of a step comes before its first
``decompress`` (``synchronize()`` submits missing gradients first), so GsSketch's ``compress``
only records the gradient and hands Horovod one float to allreduce; the first ``decompress``
of the step runs the whole engine step over all recorded gradients (one sketch merge, one
exact round, issued in name order on every rank) and each ``decompress`` returns its slice.

Per-parameter state is keyed by the parameter's name in the ``DistributedOptimizer`` that
calls us, found once from the calling frame and then by ``p.grad is tensor``. Keys therefore
survive ``zero_grad(set_to_none=True)``, parameters without gradients in some steps (Horovod
submits zeros for them) and ``backward_passes_per_step > 1``.
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import horovod.torch as hvd
import numpy as np
import torch
from horovod.torch.compression import Compressor

from .compressor import (
    Checkpoints,
    DefaultInstance,
    DefaultInstanceAttribute,
    DefaultInstanceMethod,
    check_merge,
    config_from,
)
from .gs_sgd import CommStats, GsConfig, GsSgd, Layout
from .kernels.torch_ops import TorchOps
from .mpi import MergeStats


class HorovodCollectives:
    """:class:`gs_horovod.gs_sgd.Collectives` over Horovod's allreduce (blocking, named)."""

    def __init__(self, op: Any, process_set: Any) -> None:
        self.op, self.process_set = op, process_set

    def allreduce(self, x: torch.Tensor, name: str) -> torch.Tensor:
        if x.dtype == torch.float16 and self.op == hvd.Average:  # sum x/P: a float16 sum of P x could overflow
            return hvd.allreduce(x, op=hvd.Sum, prescale_factor=1.0 / self.process_set.size(), name=name,
                                 process_set=self.process_set)
        return hvd.allreduce(x, op=self.op, name=name, process_set=self.process_set)

    def same_on_every_rank(self, value: int, name: str) -> bool:
        both = hvd.allreduce(torch.tensor([value, -value], dtype=torch.int64), op=hvd.Min, name=name,
                             process_set=self.process_set)
        return int(both[0]) == -int(both[1])


class MpiCollectives(HorovodCollectives):
    """Sketch merge and exact round by :func:`gs_horovod.mpi.tree_allreduce` over mpi4py
    (recursive doubling); the tiny checks stay on Horovod."""

    def __init__(self, op: Any, process_set: Any, comms: Any, stats: MergeStats) -> None:
        super().__init__(op, process_set)
        self.comms, self.stats = comms, stats

    def allreduce(self, x: torch.Tensor, name: str) -> torch.Tensor:
        from .mpi import tree_allreduce_tensor

        size = self.comms.comm.Get_size()
        if self.op == hvd.Average:
            x = (x.float() / size).to(x.dtype) if x.dtype == torch.float16 else x
            total = tree_allreduce_tensor(x, self.comms, self.stats)
            return total if x.dtype == torch.float16 else total / size
        return tree_allreduce_tensor(x, self.comms, self.stats)


@dataclass
class _Binding:
    """gs-SGD state for the parameters of one DistributedOptimizer (its op and process set).

    residuals / momenta: (d,) f32 per parameter name; steps: steps applied; grads / dense: this
    step's recorded gradients (d,) f32 by name, to sketch / to send exactly (below min_size);
    updates: this step's results, handed out by decompress.
    """

    engine: GsSgd
    params: list[tuple[str, torch.nn.Parameter]]
    residuals: dict[str, torch.Tensor] = field(default_factory=dict)
    momenta: dict[str, torch.Tensor] = field(default_factory=dict)
    steps: int = 0
    checked: bool = False
    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    dense: dict[str, torch.Tensor] = field(default_factory=dict)
    updates: Optional[dict[str, torch.Tensor]] = None
    _layouts: dict[tuple, Layout] = field(default_factory=dict)
    _successor: dict[int, int] = field(default_factory=dict)
    _last: int = -1

    def begin_compress(self) -> None:
        """A compress after the step's updates were made starts a new step (if the last one
        did not finish, e.g. it raised, its bookkeeping is dropped)."""
        if self.updates is not None:
            self.grads, self.dense, self.updates = {}, {}, None

    def name_of(self, grad: torch.Tensor) -> str:
        """The name of the parameter whose ``.grad`` is ``grad``: the parameter that followed
        the previous one last time is tried first, so a static graph costs O(1) per call."""
        guess = self._successor.get(self._last)
        if guess is None or self.params[guess][1].grad is not grad:
            guess = next((i for i, (_, p) in enumerate(self.params) if p.grad is grad), None)
            if guess is None:
                raise KeyError(
                    f"GsSketch: a tensor of shape {tuple(grad.shape)} is not the .grad of any "
                    "parameter of the DistributedOptimizer that compresses it (sparse_as_dense=True "
                    "hands over a copy, which GsSketch cannot attribute)"
                )
            self._successor[self._last] = guess
        self._last = guess
        return self.params[guess][0]

    def run_step(self, stats: CommStats) -> None:
        """The engine step over every gradient recorded in this step; stores the new state
        (unless the step was skipped) and the updates by name."""
        config = self.engine.config
        names, dense_names = sorted(self.grads), sorted(self.dense)
        sizes = [self.grads[n].numel() for n in names]
        dense_sizes = [self.dense[n].numel() for n in dense_names]
        key = (*names, *sizes, None, *dense_names, *dense_sizes)
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = Layout.build(names, sizes, config, tuple(dense_names), tuple(dense_sizes))
        grads = [self.grads[n] for n in names]
        residuals = [self.residuals.get(n, None) for n in names]
        residuals = [torch.zeros_like(g) if r is None else r for g, r in zip(grads, residuals)]
        momenta = [self.momenta.get(n, torch.zeros_like(g)) for n, g in zip(names, grads)] if config.momentum else []
        dense = self.steps < config.warmup_steps
        check = not self.checked
        self.checked = True
        result = self.engine.step(layout, grads, residuals, momenta, self.steps, check,
                                  [self.dense[n] for n in dense_names])
        self.updates = dict(zip(layout.all_names, result.updates))
        if dense or not layout.groups:
            stats.dense_bytes += (layout.total + sum(dense_sizes)) * 4
        else:
            sketch, exact, dense_bytes = layout.payload_bytes(config)
            stats.sketch_bytes, stats.exact_bytes = stats.sketch_bytes + sketch, stats.exact_bytes + exact
            stats.dense_bytes += dense_bytes
        stats.steps += 1
        if not result.applied:
            stats.skipped += 1
            return
        self.residuals.update(zip(names, result.residuals))
        self.momenta.update(zip(names, result.momenta))
        self.steps = result.steps


@dataclass(frozen=True)
class _Ctx:
    binding: _Binding
    name: str
    shape: torch.Size
    dtype: torch.dtype


class GsSketch(DefaultInstance, Checkpoints, Compressor):
    """gs-SGD compression for ``hvd.DistributedOptimizer`` (options: :class:`GsConfig`).

    Floating-point gradients of at least ``min_size`` elements go through the engine (in
    float32, whatever their dtype); others are allreduced as they are. ``stats`` counts the
    bytes this rank hands to collectives.

    merge: ``"horovod"`` (default) merges with Horovod's allreduce; ``"mpi"`` runs the sketch
    merge and the exact round as :func:`gs_horovod.mpi.tree_allreduce` over ``comm`` (default:
    MPI's world, which must be Horovod's). It needs Horovod's MPI controller with
    MPI_THREAD_MULTIPLE (``hvd.mpi_threads_supported()``); ``merge_stats`` counts its traffic.
    """

    _hvd = hvd
    config = DefaultInstanceAttribute()
    merge = DefaultInstanceAttribute()
    stats = DefaultInstanceAttribute()
    merge_stats = DefaultInstanceAttribute()

    def __init__(self, merge: str = "horovod", comm: Any = None, **options: Any) -> None:
        check_merge(merge, comm)
        self.config: GsConfig = config_from(options, extra=("merge", "comm"))
        self.merge = merge
        self.ops = TorchOps(self.config.backend)
        self.stats = CommStats()
        self.merge_stats = MergeStats()
        self._comm = comm
        self._comms: Any = None  # gs_horovod.mpi.Communicators, made at the first MPI merge
        self._restored: dict[str, Any] = {}  # load_state_dict contents not yet bound
        self._bindings: weakref.WeakKeyDictionary[Any, _Binding] = weakref.WeakKeyDictionary()  # by optimizer

    def __repr__(self) -> str:
        return f"GsSketch(merge={self.merge!r}, {self.config})"

    @DefaultInstanceMethod
    def compress(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Optional[_Ctx]]:
        """Returns (payload, ctx): for a float tensor one zero float (the gradient is recorded;
        the real exchange happens at the step's first decompress: sketched from ``min_size``
        elements on, sent exactly below it); for a sparse or non-float tensor the tensor itself
        with ctx None."""
        if tensor.is_sparse or not tensor.is_floating_point():
            self.stats.dense_bytes += tensor.numel() * tensor.element_size()
            return tensor, None
        binding = self._binding()
        binding.begin_compress()
        name = binding.name_of(tensor)
        into = binding.grads if tensor.numel() >= self.config.min_size else binding.dense
        into[name] = tensor.detach().reshape(-1).float()
        return tensor.new_zeros(1, dtype=torch.float32), _Ctx(binding, name, tensor.shape, tensor.dtype)

    @DefaultInstanceMethod
    def decompress(self, tensor: torch.Tensor, ctx: Optional[_Ctx]) -> torch.Tensor:
        """Returns a tensor of the gradient's shape, dtype and device: the step's update of
        this parameter (its exact mean below ``min_size``)."""
        if ctx is None:
            return tensor
        binding = ctx.binding
        if binding.updates is None:
            binding.run_step(self.stats)
        return binding.updates.pop(ctx.name).view(ctx.shape).to(ctx.dtype)

    @DefaultInstanceMethod
    def local_state_dict(self) -> dict[str, Any]:
        """Not collective: this rank's own state, for one file per rank. ``{"options",
        "world_size", "rank", "tensors": {name: {"residual", "momentum", "steps"}}}``: per
        parameter the residual and momentum (d,) f32 (momentum None when m = 0) and the steps
        of its optimizer (restored state not yet bound to an optimizer included)."""
        tensors = dict(self._restored)
        for binding in self._bindings.values():
            for name, residual in binding.residuals.items():
                tensors[name] = {"residual": residual, "momentum": binding.momenta.get(name), "steps": binding.steps}
        return {"options": self._options(), "world_size": hvd.size(), "rank": hvd.rank(), "tensors": tensors}

    @staticmethod
    def _exchange(out: list[bytes]) -> list[bytes]:
        """Sends ``out[r]`` to rank r (one uint8 ``hvd.alltoall`` with splits); returns what each
        rank sent here, in rank order."""
        data = np.frombuffer(b"".join(out), dtype=np.uint8).copy()
        received, splits = hvd.alltoall(torch.from_numpy(data), splits=torch.tensor([len(b) for b in out],
                                        dtype=torch.int32), name="gs_horovod.checkpoint")
        ends = np.cumsum(splits.numpy())
        buf = received.numpy().tobytes()
        return [buf[end - n:end] for n, end in zip(splits.tolist(), ends.tolist())]

    @DefaultInstanceMethod
    def reset(self) -> None:
        """Forgets all per-parameter state (residuals, momentum, steps) and communicators.
        Call it from a Horovod elastic reset callback: residuals built for the old set of
        ranks do not belong to the new one."""
        self._bindings.clear()
        self._restored.clear()
        self._comms = None

    def _load(self, state: dict[str, Any]) -> None:
        self._restored = dict(state["tensors"])
        for binding in self._bindings.values():
            self._restore(binding)

    def _options(self) -> dict[str, Any]:
        return {**asdict(self.config), "merge": self.merge}

    def _restore(self, binding: _Binding) -> None:
        for name, p in binding.params:
            saved = self._restored.pop(name, None)
            if saved is None:
                continue
            if saved["residual"].numel() != p.numel():
                raise ValueError(f"saved GsSketch state of {name!r} has {saved['residual'].numel()} "
                                 f"elements, the parameter {p.numel()}")
            binding.residuals[name] = saved["residual"].to(p.device, torch.float32, copy=True).reshape(-1)
            if saved["momentum"] is not None:
                binding.momenta[name] = saved["momentum"].to(p.device, torch.float32, copy=True).reshape(-1)
            binding.steps = max(binding.steps, int(saved["steps"]))

    def _collectives(self, optimizer: Any) -> HorovodCollectives:
        if self.merge == "horovod":
            return HorovodCollectives(optimizer.op, optimizer.process_set)
        if self._comms is None:
            from .mpi import Communicators, horovod_world  # imports mpi4py, which initialises MPI

            self._comms = Communicators(horovod_world(hvd, self._comm).Dup())
        return MpiCollectives(optimizer.op, optimizer.process_set, self._comms, self.merge_stats)

    def _binding(self) -> _Binding:
        """The state of the DistributedOptimizer that is calling ``compress``."""
        optimizer = _calling_optimizer(self)
        binding = self._bindings.get(optimizer)
        if binding is None:
            if optimizer.op not in (hvd.Average, hvd.Sum):
                raise ValueError("GsSketch supports op=hvd.Average or hvd.Sum, not Adasum or others")
            if self.merge == "mpi" and optimizer.process_set.process_set_id != 0:
                raise ValueError("GsSketch(merge='mpi') merges over all ranks: use the global process set")
            params = sorted(((name, p) for p, name in optimizer._parameter_names.items()), key=lambda np_: np_[0])
            engine = GsSgd(self.config, self.ops, self._collectives(optimizer))
            binding = self._bindings[optimizer] = _Binding(engine, params)
            self._restore(binding)
        return binding



def _calling_optimizer(compressor: GsSketch) -> Any:
    """The Horovod DistributedOptimizer up the stack whose ``_compression`` is ``compressor``
    (or its class). Horovod does not pass the parameter to ``compress``; its optimizer's
    ``_allreduce_grad_async(self, p)`` / ``_grouped_allreduce_grad_async`` are our callers."""
    frame = sys._getframe(2)
    for _ in range(6):
        if frame is None:
            break
        candidate = frame.f_locals.get("self")
        owner = getattr(candidate, "_compression", None)
        if (owner is compressor or owner is type(compressor)) and hasattr(candidate, "_parameter_names"):
            return candidate
        frame = frame.f_back
    raise RuntimeError(
        "GsSketch compresses gradients inside hvd.DistributedOptimizer(..., compression=GsSketch); "
        "it was called from elsewhere (e.g. hvd.allreduce), where it cannot tell which "
        "parameter a tensor belongs to and so cannot keep its error-feedback residual"
    )
