"""gs-SGD across the replicas of FSDP2 shards (HSDP layouts): the engine
(:mod:`gs_horovod.engine`) where FSDP's cross-replica all-reduce would be dense.

    mesh = init_device_mesh("cpu", (R, S), mesh_dim_names=("replicate", "shard"))   # "cuda": untested
    for block in model.blocks:
        fully_shard(block, mesh=mesh["shard"])              # shard within a node (1-D mesh)
    fully_shard(model, mesh=mesh["shard"])
    state = GsFsdpState(mesh.get_group("replicate"), model=model, ratio=0.01)
    register_fsdp_hooks(model, state)                        # replaces the dense replicate all-reduce

Each FSDP module's all-reduce hook leaves its tensor alone: it notes whether the module wants
the all-reduce in this backward and queues, once per backward, a callback at its end, when
every sharded ``.grad`` is final (divided, in its dtype, accumulated). The callback runs ONE
engine step over every parameter's local shard of ``.grad`` (float32, keyed by name: one
global top-k over this rank's shards) among the replicate group, and writes each update back
into ``.grad`` in its dtype. A backward in which every module has
``set_requires_all_reduce(False)`` runs no step. Every rank of the job joins the step's
guard (:mod:`gs_horovod.engine.guard`) over the default group: flags, checks (NaN/Inf in any
shard, a ``.grad`` not zeroed since the last update, modules that disagree on
``set_requires_all_reduce``), outcome; a problem on any rank raises on every rank in the same
step. docs/design.md ("FSDP2 across replicas") gives the reasoning; :mod:`gs_horovod.fsdp_torch`
holds the torch internals it reads.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from . import fsdp_torch as internals
from .checkpoint import DEFAULT_TIMEOUT, CheckpointApi, check_timeout
from .engine.config import GsConfig
from .engine.guard import nonfinite_parts, options_differ
from .engine.state import CommStats, EngineState
from .engine.step import GsSgd
from .fsdp_mesh import OWNER, layout, mixed_layout
from .kernels.torch_ops import TorchOps
from .transports.dist import DistCollectives


class GsFsdpState(CheckpointApi):
    """gs-SGD state of one FSDP2 model on one rank: options and per-shard state, the replicas
    of each shard reducing its gradient by one engine step over all of the model's shards::

        GsFsdpState(replicate_group=None, *, model, checkpoint_timeout=60.0, **options)

    Build it after ``fully_shard`` and hand it to :func:`register_fsdp_hooks`. Fields:

    - ``replicate_group``: the ranks holding this rank's shards (``mesh.get_group("replicate")``;
      None: the default group, for an R × 1 layout); layout rules: :mod:`gs_horovod.fsdp_mesh`.
    - ``model``: the module whose ``named_parameters()`` (those with ``requires_grad``, the same
      on every rank) key the gradients; a parameter's residual lives on its own shard.
    - ``mesh``: (R, S), the replicate group's size and the shard mesh's; ``coordinate``: this
      rank's (replicate index, shard index). Checkpoints record both and refuse another.
    - ``config``: the :class:`~gs_horovod.engine.config.GsConfig` of the keyword options (those
      of ``GsSketch``; TypeError naming the allowed ones), compared with the mesh across every
      rank at the first step (ValueError on every rank if they differ). ``exchange="auto"``
      picks for R ranks; ``min_size`` and ``k`` count the local shards' elements.
    - ``checkpoint_timeout``: seconds ``state_dict()`` (a collective of every rank) waits.
    - ``stats``: :class:`~gs_horovod.engine.state.CommStats`; ``comm``: the
      :class:`~gs_horovod.transports.dist.DistCollectives` of the replicate group.
    - ``engine``: the :class:`~gs_horovod.engine.state.EngineState` over this rank's shards.

    A NaN/Inf in any rank's shard raises ``FloatingPointError`` from ``backward()`` on every
    rank naming the parameters, residuals as before the step (``nonfinite="skip"``: every
    rank's update is zero). A ``.grad`` not zeroed (``optimizer.zero_grad()``) since the last
    update when the next backward adds to it raises RuntimeError on every rank.
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
        internals.require(OWNER)
        self.model, self.replicate_group = model, replicate_group
        self.checkpoint_timeout = check_timeout(checkpoint_timeout)
        self.config = GsConfig.from_options(options, extra=("replicate_group", "model", "checkpoint_timeout"),
                                            owner=OWNER)
        self._params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self.mesh, self.coordinate, self._replicate_ranks = layout(self._params, replicate_group)
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

    def _hook_for(self, group: Any, fqn: str) -> Callable[[torch.Tensor], None]:
        """The all-reduce hook of the FSDP module ``fqn`` (parameter group ``group``): records,
        never touches the reduce output nor raises (a raise inside FSDP could leave ranks apart)."""
        names = {id(p): n for n, p in self._params.items()}
        own = [names[id(p)] for p in internals.group_params(group) if id(p) in names]

        def hook(reduce_output: torch.Tensor) -> None:
            # FSDP is about to add to a .grad still holding the update written last
            self._stale.update(n for n in own if internals.unchanged(self._params[n].grad, self._written.get(n)))
            task = internals.graph_task()
            if task != self._task:
                self._task, self._reducing, self._accumulating = task, [], []
                internals.at_end_of_backward(self._end_of_backward)
            (self._reducing if internals.wants_all_reduce(group) else self._accumulating).append(fqn or "<root>")

        return hook

    def _end_of_backward(self) -> None:
        """Autograd's end-of-backward callback: one step unless every module accumulates."""
        self._task = None
        reducing, accumulating = self._reducing, self._accumulating
        self._reducing, self._accumulating = [], []
        if reducing:
            self._step(accumulating)

    def _agree(self, values: list[float]) -> list[float]:
        """``values`` summed over every rank of the job (one all-reduce of the default group)."""
        summed = torch.tensor(values, dtype=torch.float32, device=self._world.device)
        dist.all_reduce(summed)
        return summed.tolist()

    def _step(self, accumulating: list[str]) -> None:
        """The guard over every rank (flags; options and layout at the first step; checks), one
        engine step over every local shard gradient among the replicas, its outcome over every
        rank, write-back."""
        stale, self._stale = sorted(self._stale), set()  # this step reports them, whether it raises or not
        if self._out_of_step:  # its state_dict() met the others' flags: they have raised already
            raise RuntimeError(self._out_of_step)
        self.agree(self._agree([self.step_flag()])[0])
        layout_differs = False if self._checked else self._check_options_and_layout()
        grads, local = internals.local_grads(self._params, self.engine.sizes)
        nonfinite = torch.stack([~torch.isfinite(g).all() for g in grads.values()]).to(torch.float32)
        counts = self._agree([float(nonfinite.any()), float(bool(stale)), float(bool(accumulating)),
                              float(layout_differs)])
        if counts[3]:
            raise ValueError(mixed_layout(counts[3], self.coordinate, self.mesh, self._replicate_ranks))
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
        if not counts[0]:
            updates = self._engine_step(grads)
        elif self.config.nonfinite == "skip":
            updates = self.engine.skip(grads)
        else:  # name the parameters NaN/Inf on any rank: one all-reduce of per-parameter flags
            anywhere = self._agree(nonfinite.tolist())
            names = ", ".join(repr(n) for n, f in zip(grads, anywhere) if f > 0)
            raise FloatingPointError("".join(map(str, nonfinite_parts(names, self.engine.steps, owner=OWNER))))
        self._written = internals.write_grads(self._params, updates, local)
        self.comm.traffic.end_step()

    def _check_options_and_layout(self) -> bool:
        """The options digest with the mesh compared over every rank (ValueError on every rank if
        it differs; one all-gather of (digest, shard index)); returns whether this rank's
        replicate group holds more than one shard."""
        mine = torch.tensor([self.config.digest(self.mesh), self.coordinate[1]], dtype=torch.int64,
                            device=self._world.device)
        every = [torch.empty_like(mine) for _ in range(self._world.size)]
        dist.all_gather(every, mine)
        every = [t.tolist() for t in every]
        if len({d for d, _ in every}) > 1:
            raise ValueError(options_differ(self.config, self.mesh))
        return any(every[r][1] != self.coordinate[1] for r in self._replicate_ranks)

    def _engine_step(self, grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One engine step among the replicas; then its outcome over every rank, so a step that
        failed in one replicate group raises in all of them."""
        failure: Optional[Exception] = None
        try:
            updates = self.engine.step(grads)
        except Exception as error:  # every rank learns of it before it raises
            failure = error
        failed = self._agree([float(failure is not None)])[0]
        if failure is not None:
            raise failure
        if failed:
            raise RuntimeError(f"{OWNER}: the gs-SGD step failed on {failed:g} rank(s) of another replicate "
                               "group; this rank's group finished the step (its residuals moved on), so resume from "
                               "a checkpoint")
        return updates

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
        group = internals.param_group(module)
        if group is not None:
            module.set_all_reduce_hook(state._hook_for(group, fqn))
