"""Runs under ``horovodrun``: failure behaviour of GsSketch on real ranks, one JSON per rank.

    horovodrun -np 2 -H localhost:2 --gloo python tests/workers/torch_reliability.py OUT_DIR [NAME ...]

NAME: ``odd_shapes``, ``selection_checksum``, ``dense_skip``, ``nonfinite`` (none: all), e.g. the NaN/Inf one alone:

    horovodrun -np 2 -H localhost:2 --gloo python tests/workers/torch_reliability.py /tmp/out nonfinite

Every scenario runs for each exchange (its results under ``result[exchange]``). Faults are
injected into one known gradient (a NaN or an Inf on one rank) or, for the selection checksum,
into one rank's heavy-hitter choice (the sketch's); everything else is the real GsSketch inside
Horovod.
"""

from __future__ import annotations

import sys

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from rank_result import write_result
from scenario import Scenarios, each
from torch_scenarios import EXCHANGES, digest, digits_shard, distributed, flat, mlp

from gs_horovod.engine.exchanges import EXCHANGES as EXCHANGES_BY_NAME
from gs_horovod.torch import GsSketch


def batch(x: torch.Tensor, y: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same batches for a given step whatever ran before (for the resume check)."""
    g = torch.Generator().manual_seed(1000 * step + hvd.rank())
    idx = torch.randint(0, len(x), (32,), generator=g)
    return x[idx], y[idx]


def step(model, opt, x, y, i: int, poison: torch.nn.Parameter | None = None, value: float = float("nan")) -> None:
    """One SGD step; ``poison``: this parameter's gradient gets one ``value`` (NaN; before
    Horovod sees it)."""
    xb, yb = batch(x, y, i)
    handle = None
    if poison is not None:
        handle = poison.register_hook(lambda g: g.index_fill(0, torch.tensor([3]), value))
    opt.zero_grad()
    F.cross_entropy(model(xb), yb).backward()
    if handle is not None:
        handle.remove()
    opt.step()


SCENARIOS = Scenarios()


def residual_change(before: dict[str, torch.Tensor], after: dict) -> float:
    """The largest absolute change of any residual (NaN if one became NaN)."""
    changes = [(after[n]["residual"] - r).abs().max().item() if r.numel() else 0.0 for n, r in before.items()]
    return max(changes, default=0.0)


@SCENARIOS
@each(EXCHANGES)
def selection_checksum(out: dict, exchange: str, x, y) -> None:
    """check_every=1 on a healthy run must pass; one rank whose selection is every coordinate
    one off must make every rank raise. The fault: under the sketch, that rank's sketch
    nominates every candidate one coordinate off; under the pair exchanges (whose selection is
    the gathered pairs' on every rank), that rank's exchange returns its candidates one off,
    after every collective of the step (so the ranks stay in step until the check)."""
    model = mlp(8)
    opt = distributed(model, f"k.{exchange}.ok.", GsSketch(ratio=0.05, min_size=64, check_every=1,
                                                           exchange=exchange))
    try:
        for i in range(3):
            step(model, opt, x, y, i)
        out["check_every_clean_error"] = None
    except RuntimeError as e:
        out["check_every_clean_error"] = str(e)
    model = mlp(8)
    gs = GsSketch(ratio=0.05, min_size=64, check_every=2, exchange=exchange)
    skewed_exchange = None
    if hvd.rank() == 1 and exchange == "sketch":
        heavy_hitters = gs.ops.heavy_hitters

        def skewed(table, keys, length, count):
            idx, est = heavy_hitters(table, keys, length, count)
            return (idx + 1) % length, est

        gs.ops.heavy_hitters = skewed
    elif hvd.rank() == 1:
        skewed_exchange = EXCHANGES_BY_NAME[exchange]
        nominate = skewed_exchange.nominate

        def skewed_nominate(ctx, plan, a, fed):
            nominated = nominate(ctx, plan, a, fed)
            return nominated._replace(groups=[c._replace(idx=(c.idx + 1) % plan.total) for c in nominated.groups])

        skewed_exchange.nominate = skewed_nominate  # this process's exchange object: undone below
    opt = distributed(model, f"k.{exchange}.bad.", gs)
    try:
        for i in range(3):
            step(model, opt, x, y, i)
        out["check_every_error"] = None
    except RuntimeError as e:
        out["check_every_error"] = f"step {i}: {e}"
    finally:
        if skewed_exchange is not None:
            del skewed_exchange.nominate


class Odd(torch.nn.Module):
    """A 0-d parameter, an empty one, a float16 and two float32 ones."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(10)
        self.scale = torch.nn.Parameter(torch.tensor(1.0))
        self.fc = torch.nn.Linear(64, 10)
        self.bias16 = torch.nn.Parameter(torch.randn(10, dtype=torch.float16))
        self.empty = torch.nn.Parameter(torch.empty(0, 3))

    def forward(self, inp):
        return self.scale * self.fc(inp) + self.bias16.float() + self.empty.sum()


@SCENARIOS
@each(EXCHANGES)
def odd_shapes(out: dict, exchange: str, x, y) -> None:
    """A 0-d parameter, an empty one, fp16 and fp32 tensors in one model, with min_size=1."""

    model = Odd()
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    gs = GsSketch(ratio=0.5, min_size=1, exchange=exchange)
    opt = distributed(model, "o.", gs, lr=0.01)
    for i in range(3):
        step(model, opt, x, y, i)
    # how many coordinates of each parameter moved from its initial value; all finite
    out["odd_moved"] = {n: int((p.detach() != initial[n]).sum()) for n, p in model.named_parameters()}
    out["odd_nonfinite"] = int((~torch.isfinite(flat(model))).sum())
    out["odd_steps"] = {n: t["steps"] for n, t in gs.local_state_dict()["tensors"].items()}
    out["odd_dtypes"] = {n: str(p.grad.dtype) + str(tuple(p.grad.shape)) for n, p in model.named_parameters()}
    out["odd_digest"] = digest(model)


@SCENARIOS
@each(("sketch",))
def dense_skip(out: dict, exchange: str, x, y) -> None:
    """At the default density (steps 1-3 dense, each gradient handed to Horovod in float16): an
    +Inf planted in one gradient on rank 1 at step 2 under nonfinite="skip"; the Odd model, so
    float16 and float32 updates are handed out."""
    model = Odd()
    gs = GsSketch(min_size=1, nonfinite="skip", exchange=exchange)
    opt = distributed(model, "d.", gs, lr=0.01)
    changes, levels = [], []
    for i in range(4):
        params = flat(model).clone()
        step(model, opt, x, y, i, poison=model.fc.weight if i == 2 and hvd.rank() == 1 else None, value=float("inf"))
        changes.append((flat(model) - params).abs().max().item())
        levels.append(gs.stats.density)
    out["dense_skip_changes"], out["dense_skip_levels"] = changes, levels
    out["dense_skip_skipped"] = gs.stats.skipped
    out["dense_skip_nonfinite"] = int((~torch.isfinite(flat(model))).sum())
    out["dense_skip_dtypes"] = {n: str(p.grad.dtype) for n, p in model.named_parameters()}
    out["dense_skip_digest"] = digest(model)


# last: a raising step leaves Horovod's optimizer mid-step. The sketch alone: the rule for every
# exchange is asserted on simulated ranks (tests/test_gs_sgd.py), this the adapter's part of it.
@SCENARIOS
@each(("sketch",))
def nonfinite(out: dict, exchange: str, x, y) -> None:
    """A NaN (nonfinite="raise") or +Inf ("skip") planted in one gradient on rank 1 at step 1."""
    for mode, value in (("raise", float("nan")), ("skip", float("inf"))):
        model = mlp(7)
        gs = GsSketch(ratio=0.05, min_size=64, nonfinite=mode, exchange=exchange)
        opt = distributed(model, f"n.{exchange}.{mode}.", gs)
        step(model, opt, x, y, 0)
        before = gs.local_state_dict()["tensors"]
        residuals = {n: t["residual"].clone() for n, t in before.items()}
        steps = {n: t["steps"] for n, t in before.items()}
        params = flat(model).clone()
        try:
            step(model, opt, x, y, 1, poison=model[2].weight if hvd.rank() == 1 else None, value=value)
            out[f"nan_{mode}_error"] = None
        except FloatingPointError as e:
            out[f"nan_{mode}_error"] = str(e)
        after = gs.local_state_dict()["tensors"]
        out[f"nan_{mode}_residual_change"] = residual_change(residuals, after)
        out[f"nan_{mode}_steps"] = [steps, {n: t["steps"] for n, t in after.items()}]  # before, after
        out[f"nan_{mode}_skipped"] = gs.stats.skipped
        if mode == "skip":  # (after "raise" Horovod's optimizer itself is mid-step: the job ends)
            # the optimizer stepped with the zero update: the parameters did not move
            out["nan_skip_params_change"] = (flat(model) - params).abs().max().item()
            step(model, opt, x, y, 2)
            out["nan_skip_then_nonfinite"] = int((~torch.isfinite(flat(model))).sum())
            out["nan_skip_then_change"] = (flat(model) - params).abs().max().item()
            out["nan_skip_then_digest"] = digest(model)


def main(out_dir: str, *names: str) -> None:
    hvd.init()
    torch.set_num_threads(1)
    x, y = digits_shard()
    result: dict = {"rank": hvd.rank()}
    result["scenarios"] = SCENARIOS.run(names, result, x, y)
    write_result(out_dir, hvd.rank(), result)


if __name__ == "__main__":
    main(*sys.argv[1:])
