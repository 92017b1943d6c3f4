"""GsSketch for ``horovod.torch``: gs-SGD as a Horovod compressor.

    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=GsSketch)            # defaults
    ...                            compression=GsSketch(ratio=0.001, rows=5, exact=True)

How it plugs into Horovod 0.28.1 (``horovod/torch/optimizer.py``): for each gradient the
optimizer calls ``compress(p.grad)``, allreduces (averages) the returned tensor under the
parameter's name, then in ``synchronize()`` calls ``decompress(result, ctx)`` and sets
``p.grad`` to what it returns. ``compress`` returns the Count-Sketch of the error-fed
gradient, so Horovod's allreduce merges sketches; ``decompress`` finds the heavy hitters.

Per-parameter state (residual, momentum, step) is keyed by the parameter's name in the
``DistributedOptimizer`` that calls us, found once from the calling frame and then by
``p.grad is tensor``. Keys therefore survive ``zero_grad(set_to_none=True)`` (new grad
tensors each step), parameters without gradients in some steps (Horovod submits zeros for
them) and ``backward_passes_per_step > 1`` (Horovod compresses once, after the last pass).

The exact second round is one allreduce per step of all selected values, issued at the last
``decompress`` of the step in name order, so every rank issues it identically whatever order
Horovod hands the tensors back in; tensors returned earlier in the step are filled in place
(they already are ``p.grad``'s storage) before ``synchronize()`` returns.
"""

from __future__ import annotations

import sys
import weakref
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import horovod.torch as hvd
import numpy as np
import torch
from horovod.torch.compression import Compressor

from .compressor import DefaultInstance, DefaultInstanceMethod, config_from
from .gs_sgd import CommStats, GsSgd, MergeStats, Selection, TensorState
from .kernels import torch_ops

_NOT_ALLREDUCIBLE = (torch.bfloat16,)  # floating dtypes horovod.torch 0.28.1 cannot allreduce


class TorchOps:
    """:class:`gs_horovod.sketch.ArrayOps` for torch tensors, with the chosen sketch kernels."""

    def __init__(self, backend: str = "auto") -> None:
        self.backend = backend

    def zeros(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        return torch.zeros(shape, dtype=torch.float32, device=like.device)

    def sketch_accumulate(self, table: torch.Tensor, vec: torch.Tensor, keys: np.ndarray, offset: int) -> torch.Tensor:
        torch_ops.accumulate(self.backend, table, vec.contiguous(), keys, offset)
        return table

    def sketch_query(self, table: torch.Tensor, keys: np.ndarray, offset: int, length: int) -> torch.Tensor:
        out = torch.empty(length, dtype=torch.float32, device=table.device)
        torch_ops.query(self.backend, table.contiguous(), keys, offset, out)
        return out

    def top_abs(self, x: torch.Tensor, k: int) -> torch.Tensor:
        return torch.topk(x.abs(), k, sorted=False).indices.sort().values

    def take(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return x[idx]

    def scatter_sub(self, x: torch.Tensor, idx: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
        return x.index_add_(0, idx, vals, alpha=-1)

    def scatter(self, n: int, idx: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
        return torch.zeros(n, dtype=torch.float32, device=vals.device).index_copy_(0, idx, vals)

    def all_finite(self, x: torch.Tensor) -> bool:
        return bool(torch.isfinite(x).all())


@dataclass
class _Pending:
    name: str
    selection: Selection
    out: torch.Tensor  # the tensor decompress returned; becomes p.grad's storage


@dataclass
class _Binding:
    """gs-SGD state for the parameters of one DistributedOptimizer (its op and process set)."""

    op: Any
    process_set: Any
    engine: GsSgd
    params: list[tuple[str, torch.nn.Parameter]]
    checked: bool = False  # options compared across ranks (at the first decompress)
    steps: int = 0  # steps finished
    in_flight: int = 0  # compressed, not yet decompressed, in this step
    decoding: bool = False  # a decompress of this step has happened
    selection_sum: int = 0  # order-free checksum of this step's selections (check_every)
    pending: list[_Pending] = field(default_factory=list)
    unmerged: dict[str, torch.Tensor] = field(default_factory=dict)  # merge="mpi": local tables
    merged: dict[str, torch.Tensor] = field(default_factory=dict)  # merge="mpi": mean tables
    _successor: dict[int, int] = field(default_factory=dict)
    _last: int = -1

    def begin_compress(self) -> None:
        """A compress after a decompress starts a new step: if the last one did not finish
        (an exception left tensors undecompressed), its bookkeeping is dropped."""
        if self.decoding:
            self.in_flight, self.decoding, self.selection_sum = 0, False, 0
            self.pending.clear()
            self.unmerged.clear()
            self.merged.clear()

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


PASSTHROUGH, DENSE, SKETCH = "passthrough", "dense", "sketch"


@dataclass(frozen=True)
class _Ctx:
    binding: _Binding
    name: str
    shape: torch.Size
    dtype: torch.dtype
    mode: str  # PASSTHROUGH (below min_size), DENSE (warm-up) or SKETCH


class GsSketch(DefaultInstance, Compressor):
    """gs-SGD compression for ``hvd.DistributedOptimizer`` (options: :class:`GsConfig`).

    Floating-point gradients of at least ``min_size`` elements are sketched (in float32,
    whatever their dtype); others are allreduced as they are. ``stats`` counts the bytes this
    rank hands to collectives.

    merge: ``"horovod"`` (default) lets Horovod's allreduce merge the sketches, fused with
    the other tensors; ``"mpi"`` merges all sketches of a step in one recursive-doubling
    :func:`gs_horovod.mpi.tree_allreduce` over ``comm`` (default: MPI's world, which must be
    Horovod's), and runs the exact round there too. It needs Horovod's MPI controller with
    MPI_THREAD_MULTIPLE (``hvd.mpi_threads_supported()``): our collectives run on their own
    duplicated communicator while Horovod's background thread uses MPI. ``merge_stats``
    counts its bytes and rounds.
    """

    MERGES = ("horovod", "mpi")

    def __init__(self, merge: str = "horovod", comm: Any = None, **options: Any) -> None:
        if merge not in self.MERGES:
            raise ValueError(f"merge must be one of {self.MERGES}, got {merge!r}")
        if comm is not None and merge != "mpi":
            raise ValueError("comm is used by merge='mpi' only")
        self.config = config_from(options, extra=("merge", "comm"))
        self.merge = merge
        self.ops = TorchOps(self.config.backend)
        self.stats = CommStats()
        self.merge_stats = MergeStats()
        self._comm = comm
        self._comms: Any = None  # gs_horovod.mpi.Communicators, made at the first MPI merge
        self._restored: dict[str, dict[str, Any]] = {}  # load_state_dict entries not yet bound
        self._bindings: weakref.WeakKeyDictionary[Any, _Binding] = weakref.WeakKeyDictionary()  # by optimizer

    def __repr__(self) -> str:
        return f"GsSketch(merge={self.merge!r}, {self.config})"

    @DefaultInstanceMethod
    def compress(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Optional[_Ctx]]:
        """Returns (payload, ctx): the float32 sketch table (rows, cols) of the error-fed
        gradient; during warm-up a_t itself; for a float tensor below ``min_size`` the tensor
        (as float32 if Horovod cannot allreduce its dtype, e.g. bf16); for a sparse or
        non-float tensor the tensor itself with ctx None."""
        if tensor.is_sparse or not tensor.is_floating_point():
            self.stats.dense_bytes += tensor.numel() * tensor.element_size()
            return tensor, None
        binding = self._binding()
        binding.begin_compress()
        name = binding.name_of(tensor)
        binding.in_flight += 1
        if tensor.numel() < self.config.min_size:
            payload = tensor.float() if tensor.dtype in _NOT_ALLREDUCIBLE else tensor
            self.stats.dense_bytes += payload.numel() * payload.element_size()
            return payload, _Ctx(binding, name, tensor.shape, tensor.dtype, PASSTHROUGH)
        mode = SKETCH if binding.engine.uses_sketch(name) else DENSE
        payload = binding.engine.encode(name, tensor.detach().reshape(-1).float())
        if mode == DENSE:
            self.stats.dense_bytes += payload.numel() * 4
        else:
            self.stats.sketch_bytes += payload.numel() * 4
            if self.merge == "mpi":  # merged at the step's first decompress; Horovod gets 1 element
                binding.unmerged[name] = payload
                payload = payload.new_zeros(1)
        return payload, _Ctx(binding, name, tensor.shape, tensor.dtype, mode)

    @DefaultInstanceMethod
    def decompress(self, tensor: torch.Tensor, ctx: Optional[_Ctx]) -> torch.Tensor:
        """Returns a new tensor of the gradient's shape, dtype and device: the merged top-k
        update (or the dense mean during warm-up or below ``min_size``)."""
        if ctx is None:
            return tensor
        binding = ctx.binding
        if not binding.checked:
            self._check_same_options(binding)
        binding.in_flight -= 1
        binding.decoding = True
        if ctx.mode == SKETCH and self.merge == "mpi":
            if binding.unmerged:
                self._merge_over_mpi(binding)
            tensor = binding.merged.pop(ctx.name)
        if not bool(torch.isfinite(tensor).all()):  # the merge is identical on every rank
            out = self._non_finite(binding, ctx, tensor.device)
        elif ctx.mode == PASSTHROUGH:
            out = tensor.to(ctx.dtype)
        elif ctx.mode == DENSE:
            binding.engine.commit_dense(ctx.name)
            out = tensor.view(ctx.shape).to(ctx.dtype)
        else:
            selection = binding.engine.select(ctx.name, tensor)
            if self.config.check_every and binding.steps % self.config.check_every == 0:
                data = ctx.name.encode() + selection.indices.cpu().numpy().tobytes()
                binding.selection_sum = (binding.selection_sum + zlib.crc32(data)) % 2**62
            if self.config.exact:
                out = torch.zeros(ctx.shape, dtype=ctx.dtype, device=tensor.device)
                binding.pending.append(_Pending(ctx.name, selection, out))
            else:
                update = binding.engine.apply(ctx.name, selection, selection.estimates)
                out = update.view(ctx.shape).to(ctx.dtype)
        if binding.in_flight == 0:
            self._finish_step(binding)
        return out

    def _non_finite(self, binding: _Binding, ctx: _Ctx, device: torch.device) -> torch.Tensor:
        """A merged gradient with NaN/Inf: the step of this tensor is dropped on every rank
        (residual as before it); raise, or with nonfinite="skip" return a zero update."""
        local_finite = binding.engine.discard(ctx.name) if ctx.mode != PASSTHROUGH else None
        if self.config.nonfinite == "skip":
            self.stats.skipped += 1
            return torch.zeros(ctx.shape, dtype=ctx.dtype, device=device)
        here = "" if local_finite is None else f" (this rank's was {'finite' if local_finite else 'NOT finite'})"
        raise FloatingPointError(
            f"GsSketch: the gradient of {ctx.name!r} is NaN or infinite on at least one rank at step "
            f"{binding.steps}{here}; residuals are left as before the step. "
            "GsSketch(nonfinite='skip') skips such updates instead."
        )

    def state_dict(self) -> dict[str, Any]:
        """``{"options": ..., "tensors": {name: {"residual", "momentum", "steps"}}}``: per
        parameter the residual and momentum (d,) f32 tensors (momentum None when m = 0) and
        how many steps it was compressed. Save it beside the model's and optimizer's."""
        return {
            "options": self._options(),
            "tensors": {
                name: {"residual": st.residual, "momentum": st.momentum, "steps": st.steps}
                for binding in self._bindings.values()
                for name, st in binding.engine.states.items()
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores what :meth:`state_dict` saved, now or, for parameters not seen yet, when
        their optimizer first compresses. The options must be the ones it was saved with."""
        if state.get("options") != self._options():
            raise ValueError(f"GsSketch state was saved with options {state.get('options')}, not {self._options()}")
        self._restored = dict(state["tensors"])
        for binding in self._bindings.values():
            self._restore(binding)

    def reset(self) -> None:
        """Forgets all per-parameter state (residuals, momentum, steps) and communicators.
        Call it from a Horovod elastic reset callback: residuals built for the old set of
        ranks do not belong to the new one."""
        self._bindings.clear()
        self._restored.clear()
        self._comms = None

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
            momentum = saved["momentum"]
            binding.engine.states[name] = TensorState(
                saved["residual"].to(p.device, torch.float32, copy=True),
                None if momentum is None else momentum.to(p.device, torch.float32, copy=True),
                int(saved["steps"]),
            )
            binding.steps = max(binding.steps, int(saved["steps"]))

    def _finish_step(self, binding: _Binding) -> None:
        """Last decompress of the step: one exact-round allreduce for every pending tensor,
        and the selection checksum every ``check_every`` steps."""
        self.stats.steps += 1
        checking = self.config.check_every and binding.steps % self.config.check_every == 0
        binding.steps += 1
        binding.decoding = False
        if checking:
            self._check_same_selections(binding)
        if not binding.pending:
            return
        pending = sorted(binding.pending, key=lambda p: p.name)
        binding.pending = []
        local = torch.cat([p.selection.local for p in pending])
        self.stats.exact_bytes += local.numel() * 4
        if self.merge == "mpi":
            exact = self._mpi_allreduce(local, binding.op)
        else:
            exact = hvd.allreduce(local, name="gs_horovod.exact", op=binding.op, process_set=binding.process_set)
        for p, values in zip(pending, torch.split(exact, [len(p.selection.indices) for p in pending])):
            update = binding.engine.apply(p.name, p.selection, values)
            p.out.copy_(update.view(p.out.shape))

    def _check_same_selections(self, binding: _Binding) -> None:
        total, binding.selection_sum = binding.selection_sum, 0
        if not _same_on_every_rank(total, "gs_horovod.selections", binding.process_set):
            raise RuntimeError(
                f"GsSketch: ranks selected different heavy hitters at step {binding.steps - 1} "
                "(checked because check_every is set); their models are diverging"
            )

    def _check_same_options(self, binding: _Binding) -> None:
        """One allreduce (min of [h, −h]) of a digest of the options at the first step: ranks
        whose seeds, sizes or modes differ would hash or select differently and diverge silently,
        so every rank raises the same error instead."""
        digest = zlib.crc32(repr((self.config, self.merge)).encode())
        binding.checked = True
        if not _same_on_every_rank(digest, "gs_horovod.options", binding.process_set):
            raise ValueError(
                "GsSketch options differ across ranks (seed, sizes or modes must be equal on every rank); "
                f"this rank has merge={self.merge!r}, {self.config}"
            )

    def _merge_over_mpi(self, binding: _Binding) -> None:
        """All sketch tables of the step, in name order, merged by one tree allreduce."""
        names = sorted(binding.unmerged)
        tables = [binding.unmerged.pop(n) for n in names]
        total = self._mpi_allreduce(torch.cat([t.reshape(-1) for t in tables]), binding.op)
        for name, table, merged in zip(names, tables, torch.split(total, [t.numel() for t in tables])):
            binding.merged[name] = merged.view(table.shape)

    def _mpi_allreduce(self, flat: torch.Tensor, op: Any) -> torch.Tensor:
        """Sum (or mean, for ``op`` Average) of ``flat`` over ranks by tree_allreduce."""
        from .mpi import Communicators, tree_allreduce_tensor  # imports mpi4py, which initialises MPI

        if self._comms is None:
            self._comms = Communicators(_mpi_comm(self._comm).Dup())
        total = tree_allreduce_tensor(flat, self._comms, self.merge_stats)
        return total / self._comms.comm.Get_size() if op == hvd.Average else total

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
            binding = _Binding(optimizer.op, optimizer.process_set, GsSgd(self.config, self.ops), params)
            self._bindings[optimizer] = binding
            self._restore(binding)
        return binding


def _same_on_every_rank(value: int, name: str, process_set: Any) -> bool:
    """Whether every rank holds the same ``value`` (0 <= value < 2^62): one allreduce of the
    minimum of [value, −value], i.e. of the minimum and minus the maximum."""
    both = hvd.allreduce(torch.tensor([value, -value], dtype=torch.int64), op=hvd.Min, name=name,
                         process_set=process_set)
    return int(both[0]) == -int(both[1])


def _mpi_comm(comm: Any) -> Any:
    """``comm`` (or MPI's world), checked to span Horovod's ranks with thread support."""
    try:
        threads = hvd.mpi_enabled() and hvd.mpi_threads_supported()
    except ValueError:  # raised under the Gloo controller
        threads = False
    if not threads:
        raise RuntimeError(
            "GsSketch(merge='mpi') needs Horovod's MPI controller with MPI_THREAD_MULTIPLE "
            "(launch with horovodrun --mpi or mpirun, and leave HOROVOD_MPI_THREADS_DISABLE unset); "
            "use merge='horovod' under Gloo"
        )
    from mpi4py import MPI

    comm = MPI.COMM_WORLD if comm is None else comm
    if comm.Get_size() != hvd.size() or comm.Get_rank() != hvd.rank():
        raise RuntimeError(
            f"GsSketch(merge='mpi'): the MPI communicator (rank {comm.Get_rank()} of {comm.Get_size()}) "
            f"is not Horovod's (rank {hvd.rank()} of {hvd.size()})"
        )
    return comm


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
