"""gs-SGD across the replicas of FSDP2 shards (HSDP layouts): the engine
(:mod:`gs_horovod.engine`) where FSDP's cross-replica all-reduce would be dense.

    mesh = init_device_mesh("cpu", (R, S), mesh_dim_names=("replicate", "shard"))   # "cuda": untested
    for block in model.blocks:
        fully_shard(block, mesh=mesh["shard"])              # shard within a node (1-D mesh)
    fully_shard(model, mesh=mesh["shard"])
    state = GsFsdpState(mesh.get_group("replicate"), model=model, ratio=0.01)
    register_fsdp_hooks(model, state)                        # replaces the dense replicate all-reduce

Where the step runs. FSDP2 calls each module's all-reduce hook (``set_all_reduce_hook``) with
its reduce-scatter output, before FSDP divides it, casts it to the parameters' dtype and
writes (or adds) it into each parameter's sharded ``.grad``, and, on a 1-D mesh, whatever
``set_requires_all_reduce`` says. So the hook does not touch the tensor: it notes whether the
module wants its gradients all-reduced in this backward and queues, once per backward, a
callback at the end of it. Autograd runs that callback after FSDP's own end-of-backward
callback (FSDP queues its own in every module's pre-backward, which comes before any of its
post-backwards), so every sharded ``.grad`` is final: divided, in its own dtype, accumulated
over micro-batches. The callback runs ONE engine step over every parameter's local shard of
``.grad`` (float32, keyed by parameter name, across every module at once: one global top-k
over this rank's shards) among the ranks of the replicate group, which hold the same shards,
and writes each update back into ``.grad`` in its dtype. A backward in which every module has
``set_requires_all_reduce(False)`` (a micro-batch being accumulated) runs no step.

Every rank of the job joins three small all-reduces of the default group per step: the
step's flags (a checkpoint restore, a rank out of step: :class:`~gs_horovod.checkpoint.CheckpointApi`),
the step's checks (NaN/Inf in any shard, a gradient not zeroed since the last update,
modules that disagree on ``set_requires_all_reduce``), and the step's outcome; so a problem on
any rank raises on every rank, in the same step, whichever replicate group it is in.
"""

from __future__ import annotations

import weakref
import zlib
from dataclasses import asdict
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from .checkpoint import DEFAULT_TIMEOUT, CheckpointApi, check_timeout
from .engine.config import GsConfig
from .engine.state import CommStats, EngineState
from .engine.step import GsSgd
from .kernels.hashing import HASH_VERSION
from .kernels.torch_ops import TorchOps
from .transports.dist import DistCollectives

OWNER = "GsFsdpState"


def _group_ranks(group: Optional[dist.ProcessGroup]) -> list[int]:
    """The global ranks of ``group`` (None: the default group), in group-rank order."""
    if group is None:
        return list(range(dist.get_world_size()))
    return dist.get_process_group_ranks(group)


def _param_group(module: FSDPModule) -> Any:
    """``module``'s FSDP parameter group (torch 2.13's ``FSDPParamGroup``), or None when it
    manages no parameter; a RuntimeError naming what is missing on another torch."""
    try:
        groups = module._get_fsdp_state()._fsdp_param_groups
    except AttributeError as error:
        raise RuntimeError(f"{OWNER} reads FSDP2's parameter groups (torch 2.13's FSDPState._fsdp_param_groups), "
                           f"which this torch {torch.__version__} does not have: {error}") from error
    if not groups:
        return None
    if not hasattr(groups[0], "all_reduce_grads"):
        raise RuntimeError(f"{OWNER} reads FSDP2's set_requires_all_reduce flag (torch 2.13's "
                           f"FSDPParamGroup.all_reduce_grads), which this torch {torch.__version__} does not have")
    return groups[0]


class GsFsdpState(CheckpointApi):
    """gs-SGD state of one FSDP2 model on one rank: options and per-shard state, the replicas
    of each shard reducing its gradient by one engine step over all of the model's shards::

        GsFsdpState(replicate_group=None, *, model, checkpoint_timeout=60.0, **options)

    Build it after ``fully_shard`` and hand it to :func:`register_fsdp_hooks`. Fields:

    - ``replicate_group``: the ranks holding the same shards as this one
      (``mesh.get_group("replicate")``; None: the default group, for an R × 1 layout).
    - ``model``: the module whose ``named_parameters()`` name the gradients (every parameter
      with ``requires_grad`` sharded by ``fully_shard`` on one 1-D mesh, the same on every
      rank). Keys are its parameter names; a parameter's residual lives on its own shard.
    - ``mesh``: (R, S): the replicate group's size and the shard mesh's; ``coordinate``: this
      rank's (index in the replicate group, index in the shard group). Checkpoints record both
      and refuse another (ValueError at load).
    - ``config``: the :class:`~gs_horovod.engine.config.GsConfig` of the keyword options (the
      options of ``GsSketch``: ``scope``, ``ratio``, ``k``, ``rows``, ``width``,
      ``candidates``, ``apply``, ``exchange``, ``prefilter``, ``sketch_dtype``, ``seed``,
      ``exact``, ``warmup_steps``, ``min_size``, ``momentum``, ``backend``, ``nonfinite``,
      ``check_every``), checked by name (TypeError listing the allowed ones), compared across
      every rank of the job with the mesh at the first step (ValueError on every rank if they
      differ). ``exchange="auto"`` picks for R ranks. ``min_size`` and ``k`` apply to the
      local shards (numbers of elements on this rank).
    - ``checkpoint_timeout``: seconds ``state_dict()`` (a collective of every rank) waits for
      every rank before it raises on the ranks that called it.
    - ``stats``: :class:`~gs_horovod.engine.state.CommStats`, the engine's payload bytes.
    - ``comm``: the :class:`~gs_horovod.transports.dist.DistCollectives` of the replicate
      group; its ``traffic`` counts what the engine hands it, one ``end_step()`` per step.
    - ``engine``: the :class:`~gs_horovod.engine.state.EngineState`: residual (D,) f32 and
      momentum (D,) f32 over this rank's shards, laid out by name, steps, warm-up.

    A NaN/Inf in any rank's shard raises ``FloatingPointError`` from ``backward()`` on every
    rank naming the parameters, with residuals as before the step (``nonfinite="skip"``: every
    rank's update is zero instead). Gradients must be zeroed (``optimizer.zero_grad()``)
    between updates: a ``.grad`` still holding the last update when the next backward adds to
    it raises RuntimeError on every rank.
    """

    save_idiom = "gs_state = state.state_dict()"

    def __init__(self, replicate_group: Optional[dist.ProcessGroup] = None, *, model: torch.nn.Module,
                 checkpoint_timeout: float = DEFAULT_TIMEOUT, **options: Any) -> None:
        if replicate_group is not None and not isinstance(replicate_group, dist.ProcessGroup):
            hint = "; pass mesh.get_group('replicate')" if hasattr(replicate_group, "get_group") else ""
            raise TypeError(f"{OWNER}(replicate_group=None, *, model, **options): replicate_group must be a "
                            f"torch.distributed.ProcessGroup or None, got {type(replicate_group).__name__}{hint}")
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be the torch.nn.Module fully_shard was applied to, got {type(model).__name__}")
        if not dist.is_initialized():
            raise RuntimeError(f"{OWNER} needs torch.distributed initialised (dist.init_process_group) first")
        self.model, self.replicate_group = model, replicate_group
        self.checkpoint_timeout = check_timeout(checkpoint_timeout)
        self.config = GsConfig.from_options(options, extra=("replicate_group", "model", "checkpoint_timeout"),
                                            owner=OWNER)
        self._params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        shard_ranks = self._shard_ranks()
        replicate_ranks = _group_ranks(replicate_group)
        rank, world = dist.get_rank(), dist.get_world_size()
        if rank not in replicate_ranks:
            raise ValueError(f"replicate_group {replicate_ranks} does not hold this rank ({rank})")
        if set(shard_ranks) & set(replicate_ranks) != {rank}:
            raise ValueError(f"replicate_group {replicate_ranks} must meet the shard mesh's ranks {shard_ranks} in "
                             f"this rank ({rank}) alone: pass mesh.get_group('replicate') of the mesh whose 'shard' "
                             "dimension fully_shard was given")
        if len(shard_ranks) * len(replicate_ranks) != world:
            raise ValueError(f"{OWNER} agrees on every step and checkpoints over the default group, so the mesh must "
                             f"span the job: replicate_group of {len(replicate_ranks)} × shard mesh of "
                             f"{len(shard_ranks)} ranks is not the world size {world}")
        self.mesh = (len(replicate_ranks), len(shard_ranks))
        self.coordinate = (replicate_ranks.index(rank), shard_ranks.index(rank))
        self._replicate_ranks = replicate_ranks
        self.stats = CommStats()
        ops = TorchOps(self.config.backend)
        self.comm = DistCollectives(replicate_group, ops)
        self._world = DistCollectives(None, ops)
        sizes = {n: p.to_local().numel() for n, p in self._params.items()}
        self.engine = EngineState(GsSgd(self.config, ops, self.comm), self.stats, sizes)
        self._task: Optional[int] = None  # the autograd graph task the end-of-backward callback is queued on
        self._reducing: list[str] = []  # this backward's modules that want the all-reduce
        self._accumulating: list[str] = []  # ... and those under set_requires_all_reduce(False)
        self._stale: set[str] = set()  # parameters whose .grad still held the last update when FSDP added to it
        self._written: dict[str, tuple[Any, int]] = {}  # name → (weakref to its local .grad, version after writing)
        self._checked = False  # the options, mesh and layout compared across ranks (at the first step)

    def __repr__(self) -> str:
        return f"{OWNER}({self.config}, mesh={self.mesh})"

    def _shard_ranks(self) -> list[int]:
        """The global ranks of the one 1-D mesh every trainable parameter is sharded on."""
        if not self._params:
            raise ValueError(f"{OWNER}: the model has no parameter with requires_grad")
        found: Optional[list[int]] = None
        for name, p in self._params.items():
            if not isinstance(p, DTensor):
                raise ValueError(f"{OWNER}: parameter {name!r} is not sharded by fully_shard; apply "
                                 "fully_shard(module, mesh=mesh['shard']) to every module, the root too")
            if p.device_mesh.ndim != 1:
                raise ValueError(f"{OWNER}: parameter {name!r} is sharded on a {p.device_mesh.ndim}-D mesh "
                                 f"{p.device_mesh.mesh_dim_names}: there FSDP all-reduces across replicas itself "
                                 "(native HSDP), densely; apply fully_shard(module, mesh=mesh['shard']) (1-D) and "
                                 "pass mesh.get_group('replicate')")
            ranks = _group_ranks(p.device_mesh.get_group())
            if found is not None and ranks != found:
                raise ValueError(f"{OWNER}: parameter {name!r} is sharded over ranks {ranks}, others over {found}; "
                                 "every module must use the same shard mesh")
            found = ranks
        return found

    # ------------------------------------------------------------------ during backward

    def _hook_for(self, module: FSDPModule, fqn: str) -> Callable[[torch.Tensor], None]:
        """The all-reduce hook of FSDP module ``module`` (named ``fqn``): records, never touches
        the reduce output nor raises (a raise inside FSDP's post-backward could leave ranks apart)."""
        group = _param_group(module)
        names = {id(p): n for n, p in self._params.items()}
        own = [names[id(fp.sharded_param)] for fp in group.fsdp_params if id(fp.sharded_param) in names]

        def hook(reduce_output: torch.Tensor) -> None:
            self._note_stale(own)
            task = torch._C._current_graph_task_id()
            if task != self._task:
                self._task, self._reducing, self._accumulating = task, [], []
                torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            (self._reducing if group.all_reduce_grads else self._accumulating).append(fqn or "<root>")

        return hook

    def _note_stale(self, names: list[str]) -> None:
        """Before FSDP writes into ``.grad``: the parameters whose ``.grad`` is still exactly the
        update this state wrote last (not zeroed since), so FSDP would add to it."""
        for name in names:
            grad, written = self._params[name].grad, self._written.get(name)
            if grad is not None and written is not None:
                local = grad._local_tensor
                if written[0]() is local and local._version == written[1]:
                    self._stale.add(name)

    def _end_of_backward(self) -> None:
        """Autograd's end-of-backward callback: one step unless every module accumulates."""
        self._task = None
        reducing, accumulating = self._reducing, self._accumulating
        self._reducing, self._accumulating = [], []
        if reducing:
            self._step(accumulating)

    # ------------------------------------------------------------------ the step

    def _step(self, accumulating: list[str]) -> None:
        """Flags, checks, one engine step over every local shard gradient, outcome, write-back."""
        stale, self._stale = sorted(self._stale), set()  # this step reports them, whether it raises or not
        if self._out_of_step:  # its state_dict() met the others' flags: they have raised already
            raise RuntimeError(self._out_of_step)
        flags = torch.full((1,), self.step_flag(), dtype=torch.float32, device=self._world.device)
        dist.all_reduce(flags)
        self.agree(float(flags[0]))
        layout_differs = False
        if not self._checked:
            layout_differs = self._check_options_and_layout()
        grads, local = self._local_grads()
        nonfinite = torch.stack([~torch.isfinite(g).all() for g in grads.values()]).to(torch.float32)
        checks = torch.tensor([float(nonfinite.any()), float(bool(stale)), float(bool(accumulating)),
                               float(layout_differs)], device=self._world.device)
        dist.all_reduce(checks)
        counts = checks.tolist()
        if counts[3]:
            raise ValueError(f"{OWNER}: the ranks of a replicate group hold different shards ({counts[3]:g} rank(s) "
                             f"found so; this rank holds shard {self.coordinate[1]} of {self.mesh[1]} with replicate "
                             f"ranks {self._replicate_ranks}): pass mesh.get_group('replicate') of the mesh whose "
                             "'shard' dimension fully_shard was given")
        self._checked = True
        if counts[1]:
            here = f" (here: {', '.join(map(repr, stale))})" if stale else ""
            raise RuntimeError(f"{OWNER}: on {counts[1]:g} rank(s) FSDP added this backward's gradient to a .grad that "
                               f"still held the last update{here}; call optimizer.zero_grad() after each "
                               "optimizer.step(), and accumulate micro-batches with set_requires_all_reduce(False)")
        if counts[2]:
            raise RuntimeError(f"{OWNER}: in this backward some FSDP modules want the all-reduce and others have "
                               f"set_requires_all_reduce(False) (here: {', '.join(accumulating) or 'none'}); the "
                               "step runs over every module at once: set it on the root (recurse=True)")
        if counts[0]:
            updates = self._nonfinite(grads, nonfinite)
        else:
            updates = self._engine_step(grads)
        self._write(updates, local)
        self.comm.traffic.end_step()

    def _check_options_and_layout(self) -> bool:
        """Until a step passed its checks: the options and mesh compared over every rank
        (ValueError on every rank if they differ) and whether this rank's replicate group holds
        one shard (an all-gather of (digest, shard index)); returns whether it does not."""
        digest = zlib.crc32(repr((self.config, HASH_VERSION, self.mesh)).encode())
        mine = torch.tensor([digest, self.coordinate[1]], dtype=torch.int64, device=self._world.device)
        every = [torch.empty_like(mine) for _ in range(self._world.size)]
        dist.all_gather(every, mine)
        every = [t.tolist() for t in every]
        if len({d for d, _ in every}) > 1:
            raise ValueError("GsSketch options differ across ranks (seed, sizes or modes must be equal on every rank, "
                             f"and the mesh): this rank has {self.config} with hash version {HASH_VERSION} on a "
                             f"{self.mesh[0]} × {self.mesh[1]} mesh")
        return any(every[r][1] != self.coordinate[1] for r in self._replicate_ranks)

    def _local_grads(self) -> tuple[dict[str, torch.Tensor], dict[str, Optional[torch.Tensor]]]:
        """(name → this rank's shard of ``.grad`` flat (d,) f32, zeros where ``.grad`` is None;
        name → the local tensor of ``.grad`` or None)."""
        grads, local = {}, {}
        for name, p in self._params.items():
            shard = None if p.grad is None else p.grad._local_tensor
            local[name] = shard
            if shard is None:
                grads[name] = torch.zeros(self.engine.sizes[name], dtype=torch.float32, device=p.device)
            else:
                grads[name] = shard.detach().reshape(-1).float()
        return grads, local

    def _nonfinite(self, grads: dict[str, torch.Tensor], nonfinite: torch.Tensor) -> dict[str, torch.Tensor]:
        """Some rank's shard holds NaN/Inf: raise on every rank naming the parameters (one
        all-reduce of per-parameter flags, on this path only), or zero updates (``"skip"``)."""
        if self.config.nonfinite == "raise":
            dist.all_reduce(nonfinite)
            names = ", ".join(repr(n) for n, f in zip(grads, nonfinite.tolist()) if f > 0)
            raise FloatingPointError(
                f"GsSketch: the gradient of {names} is NaN or infinite on at least one rank at step "
                f"{self.engine.steps}; residuals are left as before the step. {OWNER}(nonfinite='skip') "
                "skips such steps instead.")
        self.stats.steps += 1
        self.stats.skipped += 1
        return {n: torch.zeros_like(g) for n, g in grads.items()}

    def _engine_step(self, grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One engine step among the replicas; then the outcome over every rank, so a step that
        failed in one replicate group raises in all of them."""
        failure: Optional[Exception] = None
        try:
            updates = self.engine.step(grads)
        except Exception as error:  # every rank learns of it before it raises
            failure = error
        failed = torch.tensor([float(failure is not None)], device=self._world.device)
        dist.all_reduce(failed)
        if failure is not None:
            raise failure
        if failed.item():
            raise RuntimeError(f"{OWNER}: the gs-SGD step failed on {failed.item():g} rank(s) of another replicate "
                               "group; this rank's group finished the step (its residuals moved on), so resume from "
                               "a checkpoint")
        return updates

    def _write(self, updates: dict[str, torch.Tensor], local: dict[str, Optional[torch.Tensor]]) -> None:
        """Each update (d,) f32 into its parameter's sharded ``.grad`` in the grad's dtype (a
        new ``.grad`` where there was none and the update is not zero); then each written
        tensor's version, once all are written (FSDP's grads are views of one buffer per module,
        which share one version counter)."""
        written = []
        for name, p in self._params.items():
            update, shard = updates[name], local[name]
            if shard is None:
                if not bool(update.any()):
                    continue
                p.grad = DTensor.from_local(update.view(p.to_local().shape).to(p.dtype), p.device_mesh, p.placements,
                                            shape=p.shape, stride=p.stride())
                shard = p.grad._local_tensor
            else:
                shard.copy_(update.view(shard.shape))
            written.append((name, shard))
        self._written = {name: (weakref.ref(shard), shard._version) for name, shard in written}

    # ------------------------------------------------------------------ checkpoints

    def local_state_dict(self) -> dict[str, Any]:
        """Not collective: this rank's own state, for one file per rank. ``{"options",
        "world_size", "rank", "tensors": {name: {"residual", "momentum", "steps"}}}``: per
        compressed parameter its shard's residual and momentum (d,) f32 (momentum None when
        m = 0); "options" holds the mesh and this rank's coordinate in it."""
        return {"options": self._options(), "world_size": self._size(), "rank": self._rank(),
                "tensors": self.engine.tensors()}

    def _load(self, state: dict[str, Any]) -> None:
        self.engine.restore(state["tensors"])

    def _options(self) -> dict[str, Any]:
        return {**asdict(self.config), "keys": "names", "mesh": self.mesh, "mesh_coordinate": self.coordinate}

    def _checkpoint_comm(self) -> DistCollectives:
        return self._world


def register_fsdp_hooks(model: torch.nn.Module, state: GsFsdpState) -> None:
    """Sets ``state``'s all-reduce hook on every FSDP module of ``model`` (``state.model``) that
    manages parameters: their replicas' gradients are then reduced by one gs-SGD step per
    backward (see the module's docstring)."""
    if not isinstance(state, GsFsdpState):
        raise TypeError(f"state must be a GsFsdpState, got {type(state).__name__}")
    if model is not state.model:
        raise ValueError("register_fsdp_hooks(model, state): model must be the module state was built with "
                         "(GsFsdpState(..., model=model))")
    modules = [(fqn, m) for fqn, m in model.named_modules() if isinstance(m, FSDPModule)]
    if not modules:
        raise ValueError("register_fsdp_hooks: model has no FSDP module; apply fully_shard(module, mesh=...) first")
    for fqn, module in modules:
        if _param_group(module) is not None:
            module.set_all_reduce_hook(state._hook_for(module, fqn))

