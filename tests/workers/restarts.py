"""Runs under ``torchrun --max-restarts 1``: a worker killed part-way, the group restarted by
torchrun, and the run resumed from its last checkpoint (tests/test_elastic.py starts it).

    torchrun --standalone --nproc_per_node 2 --max-restarts 1 tests/workers/restarts.py \\
        OUT_DIR {ddp,fsdp} KILL_AT STEPS [without_gs_state]

``ddp``: DistributedDataParallel with ``GsState`` and ``gs_hook``; ``fsdp``: FSDP2 on a 2 × 1
mesh (two replicas of one shard) with ``GsFsdpState`` across the replicas. SGD with momentum.
Every ``EVERY`` steps a checkpoint is written the way users write one: the model and the
optimizer by torch.distributed.checkpoint, the compressor's ``state_dict()`` (every rank) saved
by rank 0, then rank 0 points ``OUT_DIR/latest`` at it. At start a run loads ``latest`` if
there is one (the compressor's state on rank 0 alone). After step ``KILL_AT`` (0: never) of the
first attempt, rank 1 sends itself SIGKILL. ``without_gs_state``: the control, resuming without
the compressor's state. The process group is made with
:func:`gs_horovod.torchrun.init_process_group` (a restart reads no stale address). Each rank of
the attempt that finishes writes its result: the model's digest, the attempt, the step it
resumed from.

One scenario per launch: ``OUT_DIR {ddp,fsdp} KILL_AT STEPS [without_gs_state]`` (no scenario
names: a launch is one kill-and-restart story).
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from rank_result import write_result
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from gs_horovod.torchrun import init_process_group

EVERY = 3
OPTIONS = dict(ratio=0.05, min_size=64)


def mlp() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 10))


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)


def build(kind: str) -> tuple[torch.nn.Module, torch.nn.Module, Any]:
    """(the module trained, the module whose parameters are saved, the compressor's state)."""
    model = mlp()
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        from gs_horovod.ddp import GsState, gs_hook

        ddp = DistributedDataParallel(model)
        state = GsState(model=model, **OPTIONS)
        ddp.register_comm_hook(state, gs_hook)
        return ddp, model, state
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from gs_horovod.fsdp import GsFsdpState, register_fsdp_hooks

    mesh = init_device_mesh("cpu", (dist.get_world_size(), 1), mesh_dim_names=("replicate", "shard"))
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer, mesh=mesh["shard"])
    fully_shard(model, mesh=mesh["shard"])
    state = GsFsdpState(mesh.get_group("replicate"), model=model, **OPTIONS)
    register_fsdp_hooks(model, state)
    return model, model, state


def digest(model: torch.nn.Module) -> str:
    flat = [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().reshape(-1) for p in model.parameters()]
    return hashlib.sha256(torch.cat(flat).numpy().tobytes()).hexdigest()


def save(out: Path, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer, gs: Any) -> None:
    folder = out / f"step{step}"
    model_state, optim_state = get_state_dict(model, [opt])
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(folder))
    gs_state = gs.state_dict()  # every rank; rank 0 gets every rank's
    if dist.get_rank() == 0:
        torch.save({"gs": gs_state, "step": step}, folder / "gs.pt")
    dist.barrier()
    if dist.get_rank() == 0:
        (out / "latest.tmp").write_text(folder.name)
        os.replace(out / "latest.tmp", out / "latest")


def load(out: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, gs: Any, with_gs: bool) -> int:
    """The step the checkpoint in ``latest`` was taken at (0 and nothing loaded if none)."""
    if not (out / "latest").exists():
        return 0
    folder = out / (out / "latest").read_text()
    model_state, optim_state = get_state_dict(model, [opt])
    dcp.load({"model": model_state, "optim": optim_state}, checkpoint_id=str(folder))
    set_state_dict(model, [opt], model_state_dict=model_state, optim_state_dict=optim_state)
    saved = torch.load(folder / "gs.pt", weights_only=False)
    if dist.get_rank() == 0 and with_gs:
        gs.load_state_dict(saved["gs"])  # rank 0 alone, as Horovod's and torch's examples load
    return saved["step"]


def main(out_dir: str, kind: str, kill_at: int, steps: int, with_gs: bool) -> None:
    init_process_group("gloo")
    torch.set_num_threads(1)
    rank, attempt, out = dist.get_rank(), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")), Path(out_dir)
    net, model, gs = build(kind)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    start = load(out, model, opt, gs, with_gs)
    for step in range(start, steps):
        opt.zero_grad()
        x, y = batch(step, rank)
        F.cross_entropy(net(x), y).backward()
        opt.step()
        if (step + 1) % EVERY == 0:
            save(out, step + 1, model, opt, gs)
        if step + 1 == kill_at and rank == 1 and attempt == 0:
            os.kill(os.getpid(), signal.SIGKILL)
    write_result(out_dir, rank, {"rank": rank, "attempt": attempt, "resumed_from": start, "model": digest(model)})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:] != ["without_gs_state"])
