"""Runs under ``horovodrun``: failure behaviour of GsSketch on real ranks, one JSON per rank.

    horovodrun -np 2 -H localhost:2 --gloo python tests/workers/torch_reliability.py OUT_DIR

Faults are injected into one known gradient (a NaN on one rank) or, for the selection
checksum, into one rank's heavy-hitter choice; everything else is the real GsSketch inside
Horovod.
"""

from __future__ import annotations

import sys

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from rank_result import write_result
from torch_scenarios import digest, digits_shard, distributed, flat, mlp

from gs_horovod.torch import GsSketch


def batch(x: torch.Tensor, y: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same batches for a given step whatever ran before (for the resume check)."""
    g = torch.Generator().manual_seed(1000 * step + hvd.rank())
    idx = torch.randint(0, len(x), (32,), generator=g)
    return x[idx], y[idx]


def step(model, opt, x, y, i: int, poison: torch.nn.Parameter | None = None) -> None:
    """One SGD step; ``poison``: this parameter's gradient gets one NaN (before Horovod sees it)."""
    xb, yb = batch(x, y, i)
    handle = None
    if poison is not None:
        handle = poison.register_hook(lambda g: g.index_fill(0, torch.tensor([3]), float("nan")))
    opt.zero_grad()
    F.cross_entropy(model(xb), yb).backward()
    if handle is not None:
        handle.remove()
    opt.step()


def nonfinite(result: dict, x, y) -> None:
    for mode in ("raise", "skip"):
        model = mlp(7)
        gs = GsSketch(ratio=0.05, min_size=64, nonfinite=mode)
        opt = distributed(model, f"n.{mode}.", gs)
        step(model, opt, x, y, 0)
        residuals = {n: t["residual"].clone() for n, t in gs.local_state_dict()["tensors"].items()}
        params = flat(model).clone()
        try:
            step(model, opt, x, y, 1, poison=model[2].weight if hvd.rank() == 1 else None)
            result[f"nan_{mode}_error"] = None
        except FloatingPointError as e:
            result[f"nan_{mode}_error"] = str(e)
        after = gs.local_state_dict()["tensors"]
        result[f"nan_{mode}_residuals_unchanged"] = all(torch.equal(after[n]["residual"], r)
                                                        for n, r in residuals.items())
        result[f"nan_{mode}_params_unchanged"] = bool(torch.equal(flat(model), params))
        result[f"nan_{mode}_skipped"] = gs.stats.skipped
        if mode == "skip":  # (after "raise" Horovod's optimizer itself is mid-step: the job ends)
            step(model, opt, x, y, 2)
            result["nan_skip_then_finite"] = bool(torch.isfinite(flat(model)).all())
            result["nan_skip_then_digest"] = digest(model)


def selection_checksum(result: dict, x, y) -> None:
    model = mlp(8)
    opt = distributed(model, "k.ok.", GsSketch(ratio=0.05, min_size=64, check_every=1))
    for i in range(3):
        step(model, opt, x, y, i)
    result["check_every_clean"] = True
    model = mlp(8)
    gs = GsSketch(ratio=0.05, min_size=64, check_every=2, exchange="sketch")
    if hvd.rank() == 1:  # this rank's sketch nominates every candidate one coordinate off
        heavy_hitters = gs.ops.heavy_hitters

        def skewed(table, keys, length, count):
            idx, est = heavy_hitters(table, keys, length, count)
            return (idx + 1) % length, est

        gs.ops.heavy_hitters = skewed
    opt = distributed(model, "k.bad.", gs)
    try:
        for i in range(3):
            step(model, opt, x, y, i)
        result["check_every_error"] = None
    except RuntimeError as e:
        result["check_every_error"] = f"step {i}: {e}"


def odd_shapes(result: dict, x, y) -> None:
    """A 0-d parameter, an empty one, fp16 and fp32 tensors in one model, with min_size=1."""

    class Odd(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(10)
            self.scale = torch.nn.Parameter(torch.tensor(1.0))
            self.fc = torch.nn.Linear(64, 10)
            self.bias16 = torch.nn.Parameter(torch.randn(10, dtype=torch.float16))
            self.empty = torch.nn.Parameter(torch.empty(0, 3))

        def forward(self, inp):
            return self.scale * self.fc(inp) + self.bias16.float() + self.empty.sum()

    model = Odd()
    gs = GsSketch(ratio=0.5, min_size=1)
    opt = distributed(model, "o.", gs, lr=0.01)
    for i in range(3):
        step(model, opt, x, y, i)
    result["odd_steps"] = {n: t["steps"] for n, t in gs.local_state_dict()["tensors"].items()}
    result["odd_dtypes"] = {n: str(p.grad.dtype) + str(tuple(p.grad.shape)) for n, p in model.named_parameters()}
    result["odd_digest"] = digest(model)


def main(out_dir: str) -> None:
    hvd.init()
    torch.set_num_threads(1)
    x, y = digits_shard()
    result: dict = {"rank": hvd.rank()}
    nonfinite(result, x, y)
    selection_checksum(result, x, y)
    odd_shapes(result, x, y)
    write_result(out_dir, hvd.rank(), result)


if __name__ == "__main__":
    main(sys.argv[1])
