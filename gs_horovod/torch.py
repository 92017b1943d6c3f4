"""GsSketch for ``horovod.torch``: the gs-SGD engine (:mod:`gs_horovod.engine`) as a Horovod
compressor.

    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=GsSketch())          # defaults
    ...                            compression=GsSketch(ratio=0.001, scope="layer")

Horovod 0.28.1 calls ``compress(p.grad)`` for every gradient of a step before the first
``decompress`` (``synchronize()`` submits missing ones first). ``compress`` records the
gradient and hands Horovod this rank's step flag, one float (in an early dense step,
:meth:`EngineState.dense_ahead`, with the gradient in float16, so Horovod's allreduce overlaps
backward as with ``hvd.Compression.fp16``); the step's first ``decompress`` runs one engine
step over every recorded gradient, and each returns its tensor's update. State: one
:class:`~gs_horovod.engine.state.EngineState` per optimizer, keyed by parameter name
(:mod:`gs_horovod.torch_params`); docs/design.md gives the reasoning.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Optional

import horovod.torch as hvd
import torch
from horovod.torch.compression import Compressor
from horovod.torch.elastic.state import StateHandler, get_handler_registry

from .compressor import DefaultInstanceAttribute, DefaultInstanceMethod, GsSketchBase
from .elastic import ElasticGsState, Layout
from .engine.state import CommStats, EngineState
from .engine.step import GsSgd
from .kernels.torch_ops import TorchOps
from .torch_means import DenseMeans
from .torch_params import Params, calling_optimizer
from .transports.mpi import MergeStats, tree_allreduce_tensor


@dataclass(frozen=True)
class _Ctx:
    """What ``decompress`` needs of one gradient: its state and name, its shape and dtype, and
    whether its payload is the gradient itself in float16 (an early dense step)."""

    state: EngineState
    name: str
    shape: torch.Size
    dtype: torch.dtype
    early: bool = False


class GsSketch(GsSketchBase, Compressor):
    """gs-SGD compression for ``hvd.DistributedOptimizer`` (options:
    :class:`~gs_horovod.engine.config.GsConfig`; ``transport`` and ``comm``:
    :class:`~gs_horovod.compressor.GsSketchBase`). Float gradients of at least
    ``min_size`` elements go through the engine (in float32, whatever their dtype); others are
    allreduced as they are. ``stats`` counts the bytes this rank hands to collectives."""

    _hvd = hvd
    stats = DefaultInstanceAttribute()

    def __init__(self, transport: Optional[str] = None, comm: Any = None, **options: Any) -> None:
        super().__init__(transport, comm, **options)
        self.stats = CommStats()
        self._restored: dict[str, Any] = {}  # load_state_dict contents not yet bound
        self._states: weakref.WeakKeyDictionary[Any, tuple[EngineState, Params]] = weakref.WeakKeyDictionary()
        self._early_out: dict[EngineState, DenseMeans] = {}  # an early dense step's means

    def _make_ops(self) -> TorchOps:
        return TorchOps(self.config.backend)

    def _tree_allreduce(self, x: torch.Tensor, comms: Any, stats: MergeStats) -> torch.Tensor:
        return tree_allreduce_tensor(x, comms, stats)

    def _numpy_call(self, fn: Any, arrays: list[torch.Tensor], dtypes: list[str]) -> tuple[torch.Tensor, ...]:
        device = arrays[0].device
        out = fn(*(a.detach().cpu().numpy() for a in arrays))
        return tuple(torch.from_numpy(o).to(device) for o in (out if isinstance(out, tuple) else (out,)))

    @DefaultInstanceMethod
    def compress(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Optional[_Ctx]]:
        """Returns (payload, ctx): for a float tensor one float, this rank's step flag
        (:meth:`~gs_horovod.checkpoint.CheckpointApi.step_flag`: 0, or a restore or abort
        request; the gradient is recorded, and the exchange happens at the step's first
        decompress), followed in an early dense step by the gradient itself, (1 + d,) float16;
        for a sparse or non-float tensor the tensor itself with ctx None."""
        if tensor.is_sparse or not tensor.is_floating_point():
            self.stats.dense_bytes += tensor.numel() * tensor.element_size()
            return tensor, None
        state, name = self._state_of(tensor)
        grad = tensor.detach().reshape(-1)
        state.record(name, grad.float())
        if state.early and self.dense_rides_horovod:  # the flag in float16: an abort (65536) reads as inf
            payload = torch.empty(1 + grad.numel(), dtype=torch.float16, device=tensor.device)
            payload[0] = self.step_flag()
            payload[1:].copy_(grad)  # one copy, converting
            return payload, _Ctx(state, name, tensor.shape, tensor.dtype, True)
        flag = torch.full((1,), self.step_flag(), dtype=torch.float32, device=tensor.device)
        return flag, _Ctx(state, name, tensor.shape, tensor.dtype)

    @DefaultInstanceMethod
    def decompress(self, tensor: torch.Tensor, ctx: Optional[_Ctx]) -> torch.Tensor:
        """Returns a tensor of the gradient's shape, dtype and device: the step's update of
        this parameter (its exact mean below ``min_size``). The step's first decompress reads
        the flags Horovod merged (a rank-0 restore runs here, before the step, and turns an
        early dense step into an engine step); an early dense step ends in :class:`DenseMeans`."""
        if ctx is None:
            return tensor
        state = ctx.state
        if state.updates is None:  # the step's first decompress: its flags arrived
            self.agree(float(tensor[0]) * (state.sgd.comm.size if state.sgd.comm.averages else 1))
            if state.keep_early() and ctx.early:  # (not where the engine's collectives send it)
                self._early_out[state] = DenseMeans(state, tensor.device)
        if not (ctx.early and state.early):
            return state.update_of(ctx.name).view(ctx.shape).to(ctx.dtype)
        return self._early_out[state].put(ctx.name, tensor[1:], ctx.shape, ctx.dtype)

    @DefaultInstanceMethod
    def local_state_dict(self) -> dict[str, Any]:
        """Not collective: this rank's own state, for one file per rank. ``{"options",
        "world_size", "rank", "tensors": {name: {"residual", "momentum", "steps"}}}``: per
        parameter the residual and momentum (d,) f32 (momentum None when m = 0) and the steps
        of its optimizer (restored state not yet bound to an optimizer included)."""
        tensors = dict(self._restored)
        for state, _ in self._states.values():
            tensors.update(state.tensors())
        return {"options": self._options(), "world_size": hvd.size(), "rank": hvd.rank(), "tensors": tensors}

    @DefaultInstanceMethod
    def reset(self) -> None:
        """Forgets all per-parameter state (residuals, momentum, steps) and communicators. A
        state loaded but not yet restored is dropped. Under Horovod elastic, pass the compressor
        to ``hvd.elastic.TorchState(..., gs=compression)`` instead (:class:`GsSketchHandler`):
        it keeps what was committed."""
        self._states.clear()
        self._restored.clear()
        self._early_out.clear()
        self._connection = None
        self._forget_checkpoint_calls()

    def _load(self, state: dict[str, Any]) -> None:
        self._restored = dict(state["tensors"])
        for gs_state, params in self._states.values():
            self._restore(gs_state, params)

    def _roll_back(self, state: dict[str, Any]) -> None:
        tensors = dict(state["tensors"])
        for gs_state, params in self._states.values():
            gs_state.roll_back({name: tensors.pop(name) for name, _ in params.items if name in tensors})
        self._restored = tensors

    def _layout(self, state: dict[str, Any]) -> Layout:
        """name → (elements, has momentum, steps) of each tensor of ``state``."""
        return {name: (t["residual"].numel(), t["momentum"] is not None, int(t["steps"]))
                for name, t in state["tensors"].items()}

    def _residual_mass(self, state: dict[str, Any]) -> float:
        return ElasticGsState.mass([t["residual"].cpu().numpy() for t in state["tensors"].values()])

    def _rejoin(self, layout: Layout, lost_mass: float) -> None:
        held = set(self._restored)
        for saved in self._restored.values():  # a new world: every rank's density starts again
            saved.pop("density", None)
        for gs_state, _ in self._states.values():  # its collectives read the new ranks by themselves
            gs_state.checked = False
            gs_state.restart_density()
            held |= set(gs_state.tensors())
        for name, (d, momentum, steps) in layout.items():
            if name not in held:
                self._restored[name] = {"residual": torch.zeros(d), "momentum": torch.zeros(d) if momentum else None,
                                        "steps": steps}
        for gs_state, params in self._states.values():
            self._restore(gs_state, params)
        self.stats.lost_residual += lost_mass

    def _restore(self, state: EngineState, params: Params) -> None:
        """Hands ``state`` the restored tensors of its parameters."""
        state.restore({name: self._restored.pop(name) for name, _ in params.items if name in self._restored})

    def _describe(self, p: torch.Tensor) -> tuple[str, int, bool, int]:
        return str(id(p)), p.numel(), p.is_floating_point(), p.element_size()

    def _state_of(self, grad: torch.Tensor) -> tuple[EngineState, str]:
        """The state of the DistributedOptimizer compressing ``grad``, and its parameter's name:
        by the expected parameter of each known optimizer, else (first step, new order) by
        walking up to the calling optimizer."""
        for state, params in self._states.values():
            name = params.guess(grad)
            if name is not None:
                return state, name
        optimizer = calling_optimizer(self)
        if optimizer not in self._states:
            params = Params(optimizer)
            op = getattr(optimizer, "op", hvd.Adasum)  # Horovod's Adasum optimizer keeps no op
            sgd = GsSgd(self.config, self.ops, self._collectives(op, getattr(optimizer, "process_set", None)))
            state = EngineState(sgd, self.stats, {name: p.numel() for name, p in params.items})
            self._states[optimizer] = (state, params)
            self._restore(state, params)
        state, params = self._states[optimizer]
        return state, params.name_of(grad)


class _IsGsSketch(type):
    def __instancecheck__(cls, value: Any) -> bool:
        return isinstance(value, GsSketch) or (isinstance(value, type) and issubclass(value, GsSketch))


class GsSketchValue(metaclass=_IsGsSketch):
    """What Horovod's handler registry matches for :class:`GsSketchHandler`: a GsSketch instance
    or the class itself (``compression=GsSketch`` stands for its default instance)."""


class GsSketchHandler(StateHandler):
    """Horovod elastic state handler of a GsSketch: ``hvd.elastic.TorchState(model, optimizer,
    gs=compression)`` commits, rolls back and syncs each rank's residuals and momentum with the
    model (:class:`~gs_horovod.elastic.ElasticGsState`: ``save`` and ``sync`` are collective,
    ``restore`` is not); registered in Horovod's torch handler registry when this module is imported."""

    def __init__(self, value: Any) -> None:
        super().__init__(value)
        self.set_value(value)

    def save(self) -> None:
        self.elastic.save()

    def restore(self) -> None:
        self.elastic.restore()

    def sync(self) -> None:
        self.elastic.sync()

    def set_value(self, value: Any) -> None:
        """``state.gs = other``: the handler follows the new compressor (not collective)."""
        self.value, self.elastic = value, ElasticGsState(value.default() if isinstance(value, type) else value)


if not any(handler is GsSketchHandler for _, handler in get_handler_registry()):
    get_handler_registry().append((GsSketchValue, GsSketchHandler))
