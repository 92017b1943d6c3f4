"""Runs under ``horovodrun``: gs-SGD scenarios on real Horovod ranks, one JSON file per rank.

    horovodrun -np 2 -H localhost:2 --gloo python tests/workers/torch_scenarios.py OUT_DIR

The pytest side (tests/test_horovod_torch.py) reads the files and asserts.
"""

from __future__ import annotations

import hashlib
import sys

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from rank_result import write_result
from sklearn.datasets import load_digits

from gs_horovod.torch import GsSketch


def mlp(seed: int, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)
    ).to(dtype)


def digits_shard() -> tuple[torch.Tensor, torch.Tensor]:
    x, y = load_digits(return_X_y=True)
    x = torch.from_numpy(x.astype(np.float32) / 16.0)
    y = torch.from_numpy(y)
    return x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]


def distributed(model: torch.nn.Module, prefix: str, compression, lr: float = 0.1, **kw):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    return hvd.DistributedOptimizer(
        opt, named_parameters=[(prefix + n, p) for n, p in model.named_parameters()], compression=compression, **kw
    )


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])


def digest(model: torch.nn.Module) -> str:
    return hashlib.sha256(flat(model).numpy().tobytes()).hexdigest()


def train(model, opt, x, y, steps: int, batch: int = 32, unused_every: int = 0) -> list[float]:
    """SGD steps on (x, y); with ``unused_every`` the last layer is skipped on those steps,
    so its parameters get no gradient (a dynamic graph)."""
    g = torch.Generator().manual_seed(1234 + hvd.rank())
    losses = []
    for step in range(steps):
        idx = torch.randint(0, len(x), (batch,), generator=g)
        opt.zero_grad()  # torch >= 2.0: set_to_none=True
        h = model[:-1](x[idx].to(next(model.parameters()).dtype))
        if unused_every and step % unused_every == 0:
            out = h[:, :10]  # model[-1] unused: its grads stay None on this rank
        else:
            out = model[-1](h)
        loss = F.cross_entropy(out.float(), y[idx])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def evaluate(model, x, y) -> tuple[float, float]:
    with torch.no_grad():
        out = model(x)
        loss = hvd.allreduce(F.cross_entropy(out, y), name="eval.loss").item()
        acc = hvd.allreduce((out.argmax(1) == y).float().mean(), name="eval.acc").item()
    return loss, acc


def mpi_merge(result: dict, x: torch.Tensor, y: torch.Tensor) -> None:
    """merge="mpi": sketches merged by gs_horovod.mpi.tree_allreduce instead of Horovod."""
    dense, gs = mlp(0), mlp(0)
    train(dense, distributed(dense, "m.dense.", hvd.Compression.none), x, y, steps=5)
    compression = GsSketch(merge="mpi", ratio=1.0, rows=1, width=1.0, exact=True, min_size=1)
    train(gs, distributed(gs, "m.gs.", compression), x, y, steps=5)
    result["mpi_k_equals_d_max_abs_diff"] = (flat(dense) - flat(gs)).abs().max().item()
    model = mlp(1)
    compression = GsSketch(merge="mpi", ratio=0.05, min_size=64, exchange="sketch")
    opt = distributed(model, "m.d.", compression)
    digests = []
    for _ in range(10):
        train(model, opt, x, y, steps=1)
        digests.append(digest(model))
    result["mpi_digests"] = digests
    result["mpi_merge_calls"] = compression.merge_stats.calls
    result["mpi_merge_bytes"] = compression.merge_stats.bytes_sent
    result["mpi_payload_bytes"] = compression.stats.sketch_bytes + compression.stats.exact_bytes


def convergence(result: dict, x: torch.Tensor, y: torch.Tensor) -> None:
    """(e) 600 steps of gs-SGD (k = 2 % of each tensor) against dense, same SGD and data."""
    curves = {}
    for label, compression in (("dense", hvd.Compression.none), ("gs", GsSketch(ratio=0.02, min_size=64))):
        model = mlp(2)
        train(model, distributed(model, f"e.{label}.", compression), x, y, steps=600)
        curves[label] = evaluate(model, x, y)
        if label == "gs":
            result["gs_bytes_per_step"] = compression.stats.total_bytes / compression.stats.steps
    result["dense_loss_acc"], result["gs_loss_acc"] = curves["dense"], curves["gs"]
    result["dense_bytes_per_step"] = sum(p.numel() * 4 for p in mlp(2).parameters())


def main(out_dir: str, scenarios: str = "all") -> None:
    hvd.init()
    torch.set_num_threads(1)
    x, y = digits_shard()
    result: dict = {"rank": hvd.rank(), "size": hvd.size()}

    # (c) k = d with the exact round is dense allreduce: same parameters after 5 steps.
    dense, gs = mlp(0), mlp(0)
    train(dense, distributed(dense, "c.dense.", hvd.Compression.none), x, y, steps=5)
    train(gs, distributed(gs, "c.gs.", GsSketch(ratio=1.0, rows=1, width=1.0, exact=True, min_size=1)), x, y, steps=5)
    result["k_equals_d_max_abs_diff"] = (flat(dense) - flat(gs)).abs().max().item()

    # (d) every rank applies the identical update each step, with and without the second round.
    for exact in (True, False):
        model = mlp(1)
        opt = distributed(model, f"d.{exact}.", GsSketch(ratio=0.05, exact=exact, min_size=64))
        digests = []
        for _ in range(10):
            train(model, opt, x, y, steps=1)
            digests.append(digest(model))
        result[f"digests_exact_{exact}"] = digests

    if hvd.mpi_enabled():
        mpi_merge(result, x, y)
    else:
        model = mlp(4)
        opt = distributed(model, "g.", GsSketch(merge="mpi", ratio=0.05, min_size=64))
        try:
            train(model, opt, x, y, steps=1)
        except RuntimeError as e:
            result["mpi_merge_under_gloo_error"] = str(e)

    if scenarios == "all":
        convergence(result, x, y)

    # State keys survive set_to_none, a layer without gradients every 3rd step, and
    # backward_passes_per_step = 2; bf16 gradients are sketched in f32 and returned in bf16.
    model = mlp(3, torch.bfloat16)
    gs = GsSketch(ratio=0.1, min_size=64)
    opt = distributed(model, "s.", gs, backward_passes_per_step=2)
    g = torch.Generator().manual_seed(99 + hvd.rank())
    for step in range(6):
        opt.zero_grad()  # torch >= 2.0: set_to_none=True
        for _ in range(2):
            idx = torch.randint(0, len(x), (16,), generator=g)
            h = model[:-1](x[idx].bfloat16())
            out = h[:, :10] if step % 3 == 0 else model[-1](h)
            F.cross_entropy(out.float(), y[idx]).backward()
        opt.step()
    result["state_steps"] = {name: st["steps"] for name, st in gs.local_state_dict()["tensors"].items()}
    result["bf16_grad_dtypes"] = sorted({str(p.grad.dtype) for p in model.parameters()})
    result["bf16_params_finite"] = bool(torch.isfinite(flat(model)).all())
    result["bf16_digest"] = digest(model)

    # Last, as they abandon their optimizers mid-step: options that differ across ranks.
    for label, options in (("seed", {"seed": hvd.rank()}), ("rows", {"rows": 3 + 2 * hvd.rank()})):
        model = mlp(5)
        opt = distributed(model, f"x.{label}.", GsSketch(ratio=0.05, min_size=64, **options))
        try:
            train(model, opt, x, y, steps=1)
            result[f"mismatch_{label}_error"] = None
        except Exception as e:  # noqa: BLE001 - the test reads which error each rank saw
            result[f"mismatch_{label}_error"] = f"{type(e).__name__}: {e}"

    write_result(out_dir, hvd.rank(), result)
    hvd.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
