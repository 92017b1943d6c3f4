"""gs-SGD as a DDP communication hook: the engine (:mod:`gs_horovod.engine`) without Horovod.

    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(GsState(), gs_hook)                                  # defaults
    ddp.register_comm_hook(GsState(model=model, ratio=0.001, scope="layer"), gs_hook)

``GsState(process_group=None, model=None, **options)`` reads like torch's ``PowerSGDState``.
DDP calls the hook once per gradient bucket, in bucket order, and waits for the futures only
after the last bucket's hook ran. ``gs_hook`` records each bucket's gradients under their keys
and returns a pending future; the ``is_last()`` bucket runs ONE engine step over every
recorded gradient (one exchange over the whole gradient vector, whatever the buckets) and
completes every pending future with its bucket's updates. Keys are the same on every rank,
whatever bucket DDP puts a tensor in (it rebuilds the buckets after the first iteration): a
parameter's name in ``model.named_parameters()`` when a model is given, else its place in the
order DDP's first step hands gradients over.

(No ``from __future__ import annotations`` here: DDP compares ``gs_hook``'s annotations with
``dist.GradBucket`` and ``torch.futures.Future[torch.Tensor]`` themselves.)
"""

from dataclasses import asdict
from typing import Any, Optional

import torch
import torch.distributed as dist

from .checkpoint import DEFAULT_TIMEOUT, CheckpointApi, check_timeout
from .engine.config import GsConfig
from .engine.state import CommStats, EngineState
from .engine.step import GsSgd
from .kernels.torch_ops import TorchOps
from .torch_means import DenseMeans
from .transports.dist import DistCollectives


class GsState(CheckpointApi):
    """The hook state of :func:`gs_hook`, as ``PowerSGDState`` is ``powerSGD_hook``'s: options
    and per-rank state for every gradient of one DDP model (one instance per model)::

        GsState(process_group=None, model=None, checkpoint_timeout=60.0, **options)

    Fields:

    - ``process_group``: the group the hook reduces over (None: the default group); DDP's own.
    - ``model``: None, or the module whose ``named_parameters()`` name the gradients (the DDP
      wrapper or the module it wraps; the same on every rank; only parameters with
      ``requires_grad`` are hooked). ``keys`` says how gradients are keyed.
    - ``keys``: ``"names"`` (with a model: a parameter's name, whatever bucket DDP puts it in)
      or ``"order"`` (without: ``"#00000"``, ``"#00001"``, ... in the order DDP's first step
      hands the gradients over, its initial buckets in bucket order, a fixed function of the
      module's parameter order; kept by parameter identity through DDP's bucket rebuild).
      Checkpoints record it and refuse the other (ValueError at load).
    - ``config``: the :class:`~gs_horovod.engine.config.GsConfig` built from the keyword options (the
      options of ``GsSketch``: ``scope``, ``ratio``, ``k``, ``rows``, ``width``, ``candidates``,
      ``apply``, ``exchange``, ``prefilter``, ``sketch_dtype``, ``seed``, ``exact``,
      ``warmup_steps``, ``min_size``, ``momentum``, ``backend``, ``nonfinite``,
      ``check_every``), checked by name (TypeError listing the allowed ones), compared across
      ranks at the first step (ValueError on every rank if they differ).
    - ``checkpoint_timeout``: seconds ``state_dict()`` (a collective) waits for every rank
      before it raises on the ranks that called it.
    - ``stats``: :class:`~gs_horovod.engine.state.CommStats`, the bytes this rank hands to collectives.
    - ``comm``: the :class:`~gs_horovod.transports.dist.DistCollectives` of ``process_group``.
    - ``engine``: the :class:`~gs_horovod.engine.state.EngineState`: flat residual e (D,) f32
      and momentum (D,) f32 laid out by key, steps, warm-up. Gradients of ``min_size``
      elements and more are compressed (in f32, whatever their dtype), the others averaged
      exactly in the exact round.
    - ``pending``: this step's buckets waiting for the last one: (future, keys, dtype, early),
      early being (float16 buffer, work) of the bucket's own allreduce in an early dense step.

    Where the whole step goes dense anyway (``ratio="auto"`` at its DENSE level with zero
    residuals, :meth:`EngineState.dense_ahead`), each bucket's gradients are allreduced in
    float16 (scaled by 1/P first) as the bucket arrives, overlapping backward as torch's
    ``fp16_compress_hook`` does; the last bucket then runs the step's checks on the means.

    Each step starts with one 4-byte allreduce of the ranks' step flags, issued at the first
    bucket and awaited at the last (a restore from :meth:`load_state_dict` on rank 0, or a rank
    out of step). A NaN/Inf on any rank fails every bucket's future on every rank
    (``backward()`` raises, naming the tensors) and leaves residuals as before the step
    (``nonfinite="skip"``: the step's update is zero instead).
    """

    save_idiom = "gs_state = state.state_dict()"

    def __init__(self, process_group: Optional[dist.ProcessGroup] = None, model: Optional[torch.nn.Module] = None,
                 checkpoint_timeout: float = DEFAULT_TIMEOUT, **options: Any) -> None:
        if process_group is not None and not isinstance(process_group, dist.ProcessGroup):
            hint = "; pass the module as model=" if isinstance(process_group, torch.nn.Module) else ""
            raise TypeError("GsState(process_group=None, model=None, **options): process_group must be a "
                            f"torch.distributed.ProcessGroup or None, got {type(process_group).__name__}{hint}")
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module or None, got {type(model).__name__}")
        if not dist.is_initialized():
            raise RuntimeError("GsState needs torch.distributed initialised (dist.init_process_group) first")
        self.model, self.process_group = model, process_group
        self.keys = "order" if model is None else "names"
        self.checkpoint_timeout = check_timeout(checkpoint_timeout)
        self.config = GsConfig.from_options(options, extra=("process_group", "model", "checkpoint_timeout"),
                                            owner="GsState")
        self.stats = CommStats()
        named = [] if model is None else [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self._names = {id(p): n for n, p in named}
        self._params = dict(named)
        ops = TorchOps(self.config.backend)
        self.comm = DistCollectives(process_group, ops)
        self.engine = EngineState(GsSgd(self.config, ops, self.comm), self.stats, {n: p.numel() for n, p in named})
        self.pending: list[tuple[torch.futures.Future, list[str], torch.dtype, Any]] = []
        self._flags: Optional[tuple[torch.Tensor, Any]] = None  # this step's flags allreduce: (tensor, work)

    def __repr__(self) -> str:
        return f"GsState({self.config})"

    def hook(self, bucket: dist.GradBucket) -> torch.futures.Future:
        """Records ``bucket``'s gradients (the step's first bucket issues the flags allreduce);
        on the last bucket, steps and completes every future."""
        if not self.pending:
            if self._out_of_step:  # its state_dict() met the others' flags: they have raised already
                raise RuntimeError(self._out_of_step)
            flags = torch.full((1,), self.step_flag(), dtype=torch.float32, device=self.comm.device)
            self._flags = (flags, dist.all_reduce(flags, group=self.process_group, async_op=True))
        names, grads = [], []
        for p, grad in zip(bucket.parameters(), bucket.gradients()):
            name = self._key_of(p)
            grads.append(grad.detach().reshape(-1).float())
            self.engine.record(name, grads[-1])
            names.append(name)
        early = None
        if self.engine.early:  # the whole step goes dense: this bucket's mean in float16 now, overlapping backward
            early = self.comm.allreduce_async(torch.cat(grads))
        buffer = bucket.buffer()
        future = torch.futures.Future(devices=[buffer.device] if buffer.is_cuda else None)
        self.pending.append((future, names, buffer.dtype, early))
        if bucket.is_last():
            self._finish()
        return future

    def _key_of(self, p: torch.nn.Parameter) -> str:
        """``p``'s key: its name, or (no model, first step) the next ``#NNNNN`` in order."""
        name = self._names.get(id(p))
        if name is not None:
            return name
        if self.model is not None or self.engine.plan is not None:
            owner = "the model GsState was built with" if self.model is not None else "the first step's buckets"
            raise KeyError(f"GsState: a gradient of shape {tuple(p.shape)} belongs to no parameter of {owner}; "
                           "pass the model DDP wraps (model=), or the same parameters every step")
        name = self._names[id(p)] = f"#{len(self._names):05d}"
        self._params[name] = p
        self.engine.sizes[name] = p.numel()
        return name

    def _finish(self) -> None:
        """The step's flags (a restore runs here), then one engine step over all recorded
        gradients; each future gets its bucket's updates (flat, the bucket's dtype). If either
        raises, the error propagates out of this (the last) hook, so ``backward()`` raises it,
        and the earlier buckets' futures hold it."""
        pending, (flags, work), engine = self.pending, self._flags, self.engine
        self.pending, self._flags = [], None
        try:
            work.wait()
            self.agree(float(flags[0]))
            if engine.keep_early():
                means, updates = DenseMeans(engine, flags.device), {}
                for _, names, _, (half, reduced) in pending:
                    reduced.wait()
                    sizes = [int(engine.grads[n].shape[0]) for n in names]
                    for name, mean in zip(names, torch.split(half, sizes)):
                        updates[name] = means.put(name, mean, mean.shape, torch.float32)
            else:
                updates = {n: engine.update_of(n) for _, names, _, _ in pending for n in names}
        except Exception as error:
            for future, *_ in pending:
                future.set_exception(error)
            raise
        for future, names, dtype, _ in pending:
            future.set_result(torch.cat([updates[n].to(dtype) for n in names]))

    def local_state_dict(self) -> dict[str, Any]:
        """Not collective: this rank's own state, for one file per rank. ``{"options",
        "world_size", "rank", "tensors": {name: {"residual", "momentum", "steps"}}}``: per
        compressed parameter the residual and momentum (d,) f32 (momentum None when m = 0)."""
        return {"options": self._options(), "world_size": self._size(), "rank": self._rank(),
                "tensors": self.engine.tensors()}

    def _load(self, state: dict[str, Any]) -> None:
        self.engine.restore(state["tensors"])

    def _options(self) -> dict[str, Any]:
        return {**asdict(self.config), "keys": self.keys}

    def _checkpoint_comm(self) -> DistCollectives:
        return self.comm


def gs_hook(state: GsState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The DDP communication hook: ``ddp_model.register_comm_hook(GsState(...), gs_hook)``.
    Returns a future of ``bucket.buffer()``'s shape and dtype, completed when the step's last
    bucket arrives: the mean over ranks of the selected coordinates (zeros elsewhere) and the
    exact mean of the tensors below ``min_size``."""
    return state.hook(bucket)

