"""Runs under ``horovodrun``: checkpoints saved the Horovod way (rank 0 writes one file) and
the class form of GsSketch, on real ranks; one JSON per rank.

    horovodrun -np 2 -H localhost:2 --gloo python tests/workers/torch_checkpoints.py OUT_DIR [OTHER_CKPT]

OTHER_CKPT: a checkpoint written by a run with another number of ranks (its GsSketch state
must be refused on every rank). Rank 0 writes ``OUT_DIR/checkpoint.pt``.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict

import horovod.torch as hvd
import torch
from torch_reliability import step
from torch_scenarios import digest, digits_shard, distributed, mlp

from gs_horovod.torch import GsSketch

OPTIONS = dict(ratio=0.05, min_size=64, momentum=0.5)
N = 4


def load_gs(gs: GsSketch, ckpt: dict | None) -> str | None:
    """``gs.load_state_dict`` as every rank calls it; the error text, if any."""
    try:
        gs.load_state_dict(ckpt["gs"] if ckpt is not None else None)
    except ValueError as e:
        return str(e)
    return None


def resume(result: dict, x, y, path: str) -> None:
    """2N steps straight vs N steps, saved by rank 0 only, fresh objects, N more steps."""
    model = mlp(9)
    opt = distributed(model, "r.", GsSketch(**OPTIONS))
    for i in range(2 * N):
        step(model, opt, x, y, i)
    result["straight"] = digest(model)

    model = mlp(9)
    gs = GsSketch(**OPTIONS)
    opt = distributed(model, "r.", gs)
    for i in range(N):
        step(model, opt, x, y, i)
    gs_state = gs.state_dict()  # a collective: every rank calls it
    result["state_dict_is_none"] = gs_state is None
    if hvd.rank() == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "gs": gs_state}, path)
    own = {n: t["residual"].clone() for n, t in gs.local_state_dict()["tensors"].items()}

    # a fresh process would start here: new objects, only rank 0 reads the file
    hvd.barrier()
    ckpt = torch.load(path) if hvd.rank() == 0 else None
    model = mlp(123)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gs = GsSketch(**OPTIONS)
    opt = distributed(model, "r.", gs)
    if ckpt is not None:
        opt.load_state_dict(ckpt["opt"])
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    result["load_error"] = load_gs(gs, ckpt)
    restored = gs.local_state_dict()["tensors"]
    result["own_residuals_back"] = sorted(restored) == sorted(own) and all(
        torch.equal(restored[n]["residual"], r) for n, r in own.items())
    for i in range(N, 2 * N):
        step(model, opt, x, y, i)
    result["resumed"] = digest(model)

    # the old mistake, for contrast: rank 0's residuals loaded on every rank
    part0 = hvd.broadcast_object(ckpt["gs"]["ranks"][0] if ckpt is not None else None, root_rank=0, name="part0")
    model = mlp(123)
    model.load_state_dict(hvd.broadcast_object(ckpt["model"] if ckpt is not None else None, root_rank=0,
                                               name="model"))
    gs = GsSketch(**OPTIONS)
    part0["rank"] = hvd.rank()
    gs.load_local_state_dict(part0)
    opt = distributed(model, "r.", gs)
    for i in range(N, 2 * N):
        step(model, opt, x, y, i)
    result["rank0_everywhere"] = digest(model)

    result["wrong_options_error"] = load_gs(GsSketch(**{**OPTIONS, "ratio": 0.1, "seed": 3}), ckpt)
    result["local_state_to_collective_error"] = load_gs(
        GsSketch(**OPTIONS), {"gs": gs.local_state_dict()} if hvd.rank() == 0 else None)
    try:
        GsSketch(**OPTIONS).load_local_state_dict(ckpt["gs"] if ckpt is not None else gs.local_state_dict())
        result["local_gathered_error"] = None
    except ValueError as e:
        result["local_gathered_error"] = str(e)


def other_world_size(result: dict, path: str) -> None:
    ckpt = torch.load(path) if hvd.rank() == 0 else None
    result["world_size_error"] = load_gs(GsSketch(**OPTIONS), ckpt)


def summary(local: dict) -> dict:
    return {n: [float(t["residual"].abs().sum()), t["steps"]] for n, t in local["tensors"].items()}


def class_form(result: dict, x, y) -> None:
    """``compression=GsSketch`` (the class) against an instance with the same (default) options."""
    models = {"class": mlp(11), "instance": mlp(11)}
    instance = GsSketch()
    opts = {"class": distributed(models["class"], "c.", GsSketch),
            "instance": distributed(models["instance"], "c.", instance)}
    for form in ("class", "instance"):
        for i in range(3):
            step(models[form], opts[form], x, y, i)
    result["class_digest"], result["instance_digest"] = digest(models["class"]), digest(models["instance"])
    for form, gs in (("class", GsSketch), ("instance", instance)):
        state = gs.state_dict()
        result[f"{form}_stats"] = asdict(gs.stats)
        result[f"{form}_merge_stats"] = asdict(gs.merge_stats)
        result[f"{form}_gathered_ranks"] = None if state is None else len(state["ranks"])
        local = gs.local_state_dict()
        result[f"{form}_local"] = summary(local)
        gs.reset()
        result[f"{form}_after_reset"] = len(gs.local_state_dict()["tensors"])
        gs.load_state_dict(state)
        result[f"{form}_reloaded"] = summary(gs.local_state_dict())
        gs.load_local_state_dict(local)


def main(out_dir: str, other: str | None = None) -> None:
    hvd.init()
    torch.set_num_threads(1)
    x, y = digits_shard()
    result: dict = {"rank": hvd.rank(), "size": hvd.size()}
    resume(result, x, y, os.path.join(out_dir, "checkpoint.pt"))
    if other:
        other_world_size(result, other)
    class_form(result, x, y)
    with open(os.path.join(out_dir, f"rank{hvd.rank()}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
