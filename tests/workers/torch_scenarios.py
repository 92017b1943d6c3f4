"""Runs under ``horovodrun``: gs-SGD scenarios on real Horovod ranks, one JSON file per rank.

    horovodrun -np 2 -H localhost:2 --gloo python tests/workers/torch_scenarios.py OUT_DIR [NAME ...]

NAME: a scenario (``k_equals_d_avg``, ``exact_True``, ``warmup``, ``transport_mpi``, ...; an
unknown name lists them) or a group (``all``, the default; ``gloo``, ``mpi``, ``options``: see
:data:`SCENARIOS`), e.g. one scenario alone:

    horovodrun -np 2 -H localhost:2 --gloo python tests/workers/torch_scenarios.py /tmp/out warmup

Every exchange-dependent scenario runs once per exchange ("sketch", "allgather", "sparse",
named explicitly: at 2-3 ranks ``exchange="auto"`` would pick the allgather), its results under
``result[exchange]``; the bytes each step hands to Horovod are counted by
:class:`handed_over.HandedOver`. The pytest side (tests/test_horovod_torch.py) reads the files
and asserts.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import asdict
from typing import Any

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from handed_over import HandedOver, count_collectives
from rank_result import write_result
from scenario import Scenarios, each
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


EXCHANGES = ("sketch", "allgather", "sparse")
K_EQUALS_D = dict(ratio=1.0, rows=1, width=1.0, min_size=1, wire="fp32")  # every coordinate applied: the dense mean


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


def max_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return (flat(a) - flat(b)).abs().max().item()


def counted_run(out: dict, label: str, gs: GsSketch, steps: int, x, y, seed: int = 1, **kw: Any) -> None:
    """``steps`` steps of mlp(seed) with ``gs``: the digest after each, the bytes handed to
    Horovod by name (:class:`HandedOver`) and gs's own CommStats."""
    model = mlp(seed)
    opt = distributed(model, f"{label}.", gs, **kw)
    digests = []
    with HandedOver() as counted:
        for _ in range(steps):
            train(model, opt, x, y, steps=1)
            digests.append(digest(model))
    out[f"{label}_digests"] = digests
    out[f"{label}_counted"] = counted.engine()
    out[f"{label}_optimizer_bytes"] = counted.total("optimizer:")
    out[f"{label}_stats"] = asdict(gs.stats)


class Data:
    """This rank's shard of the digits, and the dense Horovod runs the exchanges are compared
    with, each trained when a scenario first asks for it: 5 steps of mlp(0) with op Average and
    Sum ("avg", "sum"), mlp(6) after 2 and 4 steps ("warmup2", "warmup4")."""

    def __init__(self) -> None:
        self.x, self.y = digits_shard()
        self.refs: dict[str, torch.Tensor] = {}

    def ref(self, label: str) -> torch.Tensor:
        if label not in self.refs and label in ("avg", "sum"):
            model = mlp(0)
            op = hvd.Average if label == "avg" else hvd.Sum
            train(model, distributed(model, f"c.{label}.dense.", hvd.Compression.none, lr=0.05, op=op), self.x, self.y,
                  steps=5)
            self.refs[label] = flat(model)
        elif label not in self.refs:
            model = mlp(6)
            opt = distributed(model, "w.dense.", hvd.Compression.none)
            for warm in ("warmup2", "warmup4"):
                train(model, opt, self.x, self.y, steps=2)
                self.refs[warm] = flat(model)
        return self.refs[label]


# "all": 2 ranks, gloo; "gloo": 3 ranks, all but the 600-step convergence runs; "mpi": under
# Horovod's MPI controller (every scenario costs several times more on oversubscribed cores) the
# adapter's core checks and transport="mpi"; "options": what "gloo" runs beyond "mpi", for one
# run under the MPI controller
CORE = ("k_equals_d_avg", "exact_True", "transport_mpi", "baselines", "kernels_used", "refusals", "mismatch")
OPTIONS = ("k_equals_d_sum", "exact_False", "candidates2", "apply_all", "prefilter0", "warmup", "dtypes", "groups")
SCENARIOS = Scenarios(gloo=CORE + OPTIONS, mpi=CORE, options=OPTIONS)


def k_equals_d(out: dict, exchange: str, data: Data, label: str, op) -> None:
    """k = D (each exchange with its own exact round or not) against dense with ``op``: 5 steps."""
    gs = mlp(0)
    compression = GsSketch(exchange=exchange, **K_EQUALS_D)
    train(gs, distributed(gs, f"c.{label}.gs.", compression, lr=0.05, op=op), data.x, data.y, steps=5)
    ref = data.ref(label)
    out[f"k_equals_d_{label}_max_abs_diff"] = (ref - flat(gs)).abs().max().item()
    out[f"k_equals_d_{label}_norms"] = [ref.norm().item(), flat(gs).norm().item()]
    out[f"k_equals_d_{label}_changed"] = max_diff(mlp(0), gs)


@SCENARIOS
@each(EXCHANGES)
def k_equals_d_avg(out: dict, exchange: str, data: Data) -> None:
    """k = D with op=hvd.Average against Horovod's dense Average."""
    k_equals_d(out, exchange, data, "avg", hvd.Average)


@SCENARIOS
@each(EXCHANGES)
def k_equals_d_sum(out: dict, exchange: str, data: Data) -> None:
    """k = D with op=hvd.Sum against Horovod's dense Sum."""
    k_equals_d(out, exchange, data, "sum", hvd.Sum)


def counted_scenario(label: str, steps: int, **options: Any) -> None:
    """Registers the scenario ``label``: ``steps`` counted steps (:func:`counted_run`) of
    GsSketch(ratio=0.05, min_size=64, **options) for each exchange."""

    def scenario(out: dict, exchange: str, data: Data) -> None:
        counted_run(out, label, GsSketch(ratio=0.05, min_size=64, exchange=exchange, **options), steps, data.x, data.y)

    scenario.__name__ = scenario.__qualname__ = label
    SCENARIOS(each(EXCHANGES)(scenario))


# with the exact round and without; options beyond the defaults on real ranks: more candidates
# (from a pre-filter as large: the exchanges that send pairs nominate from it), apply every
# delivered value, no pre-filter
counted_scenario("exact_True", 10, exact=True)
counted_scenario("exact_False", 10, exact=False)
counted_scenario("candidates2", 4, candidates=2, prefilter=2)
counted_scenario("apply_all", 4, apply="all")
counted_scenario("prefilter0", 4, prefilter=0)


@SCENARIOS
@each(EXCHANGES)
def warmup(out: dict, exchange: str, data: Data) -> None:
    """warmup_steps=2 against dense Horovod: equal after 2 steps, apart after 4."""
    model = mlp(6)
    gs = GsSketch(ratio=0.05, min_size=64, warmup_steps=2, exchange=exchange)
    opt = distributed(model, "w.gs.", gs)
    for label in ("warmup2", "warmup4"):
        train(model, opt, data.x, data.y, steps=2)
        out.setdefault("warmup_max_abs_diff", []).append((data.ref(label) - flat(model)).abs().max().item())
        out.setdefault("warmup_dense_bytes", []).append(gs.stats.dense_bytes)
    out["warmup_elements"] = sum(p.numel() for p in model.parameters())


@SCENARIOS
@each(EXCHANGES)
def dtypes(out: dict, exchange: str, data: Data) -> None:
    """State keys survive set_to_none, a layer without gradients every 3rd step, and
    backward_passes_per_step = 2; bf16 and fp64 gradients are compressed in f32 and returned in
    their own dtype."""
    x, y = data.x, data.y
    for label, dtype in (("bf16", torch.bfloat16), ("fp64", torch.float64)):
        model = mlp(3, dtype)
        start = flat(model)
        gs = GsSketch(ratio=0.1, min_size=64, exchange=exchange)
        opt = distributed(model, f"s.{label}.", gs, backward_passes_per_step=2)
        g = torch.Generator().manual_seed(99 + hvd.rank())
        for step in range(6):
            opt.zero_grad()  # torch >= 2.0: set_to_none=True
            for _ in range(2):
                idx = torch.randint(0, len(x), (16,), generator=g)
                h = model[:-1](x[idx].to(dtype))
                o = h[:, :10] if step % 3 == 0 else model[-1](h)
                F.cross_entropy(o.float(), y[idx]).backward()
            opt.step()
        out[f"{label}_state_steps"] = {name: st["steps"] for name, st in gs.local_state_dict()["tensors"].items()}
        out[f"{label}_grad_dtypes"] = sorted({str(p.grad.dtype) for p in model.parameters()})
        out[f"{label}_param_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
        out[f"{label}_nonfinite"] = int((~torch.isfinite(flat(model))).sum())
        out[f"{label}_changed"] = (flat(model) - start).abs().max().item()
        out[f"{label}_digest"] = digest(model)


@SCENARIOS
@each(EXCHANGES)
def groups(out: dict, exchange: str, data: Data) -> None:
    """Horovod's grouped allreduce (groups=2) gives the same model, bit for bit, as without."""
    for label, kw in (("plain", {}), ("grouped", {"groups": 2})):
        model = mlp(10)
        train(model, distributed(model, f"g.{label}.", GsSketch(ratio=0.05, min_size=64, exchange=exchange), **kw),
              data.x, data.y, steps=4)
        out[f"groups_{label}_digest"] = digest(model)
        out[f"groups_{label}_flat"] = flat(model)
    plain, grouped = out.pop("groups_plain_flat"), out.pop("groups_grouped_flat")
    out["groups_max_abs_diff"] = (plain - grouped).abs().max().item()


@SCENARIOS
def transport_mpi(result: dict, data: Data) -> None:
    """transport="mpi" under Horovod's MPI controller (:func:`mpi_merge`, each exchange); under
    gloo: refused at the first step."""
    if hvd.mpi_enabled():
        for exchange in EXCHANGES:
            mpi_merge(result.setdefault(exchange, {}), exchange, data.x, data.y)
        return
    model = mlp(4)
    opt = distributed(model, "u.", GsSketch(transport="mpi", ratio=0.05, min_size=64))
    try:
        train(model, opt, data.x, data.y, steps=1)
        result["mpi_merge_under_gloo_error"] = None
    except RuntimeError as e:
        result["mpi_merge_under_gloo_error"] = str(e)


def mpi_merge(out: dict, exchange: str, x, y) -> None:
    """transport="mpi": the engine's merges by gs_horovod.transports.mpi (tree allreduce, Alltoallv,
    Allgatherv) instead of Horovod; bytes counted at the engine's collectives."""
    from handed_over import Counter

    dense, gs = mlp(0), mlp(0)
    train(dense, distributed(dense, "m.dense.", hvd.Compression.none), x, y, steps=5)
    train(gs, distributed(gs, "m.gs.", GsSketch(transport="mpi", exchange=exchange, **K_EQUALS_D)), x, y, steps=5)
    out["mpi_k_equals_d_max_abs_diff"] = max_diff(dense, gs)
    model = mlp(1)
    compression = GsSketch(transport="mpi", ratio=0.05, min_size=64, exchange=exchange)
    counted = Counter()
    count_collectives(compression, counted)
    opt = distributed(model, "m.d.", compression)
    digests = []
    for _ in range(10):
        train(model, opt, x, y, steps=1)
        digests.append(digest(model))
    out["mpi_digests"] = digests
    out["mpi_merge_calls"] = compression.merge_stats.calls
    out["mpi_merge_bytes"] = compression.merge_stats.bytes_sent
    out["mpi_counted"] = counted.engine()
    out["mpi_stats"] = asdict(compression.stats)
    if exchange == "sketch":  # the comm option: MPI's world given explicitly trains the same model
        from mpi4py import MPI

        model = mlp(1)
        opt = distributed(model, "m.comm.", GsSketch(transport="mpi", comm=MPI.COMM_WORLD, ratio=0.05, min_size=64,
                                                      exchange=exchange))
        for _ in range(10):  # the batches of the run above (train() starts its sampler again)
            train(model, opt, x, y, steps=1)
        out["mpi_comm_digest"] = digest(model)


@SCENARIOS
def convergence(result: dict, data: Data) -> None:
    """600 steps of gs-SGD (k = 2 % of the model's coordinates) with each exchange, and of dense
    Horovod from the same model."""
    x, y = data.x, data.y
    for exchange in EXCHANGES:
        model = mlp(2)
        compression = GsSketch(ratio=0.02, min_size=64, exchange=exchange)
        train(model, distributed(model, f"e.{exchange}.", compression), x, y, steps=600)
        out = result.setdefault(exchange, {})
        out["gs_loss_acc"] = evaluate(model, x, y)
        out["gs_bytes_per_step"] = compression.stats.total_bytes / compression.stats.steps
    model = mlp(2)
    train(model, distributed(model, "e.dense.", hvd.Compression.none), x, y, steps=600)
    result["dense_loss_acc"] = evaluate(model, x, y)
    result["dense_bytes_per_step"] = sum(p.numel() * 4 for p in mlp(2).parameters())


@SCENARIOS
def baselines(result: dict, data: Data) -> None:
    """Every method of the registry (gs_bench.methods), 3 steps: its meter's payload per
    step against the bytes handed to Horovod (by the method's own collectives, or by Horovod's
    DistributedOptimizer for dense, fp16 and gs)."""
    from gs_bench.methods import METHODS, distributed_optimizer

    for method in METHODS:
        if method == "gtopk" and hvd.size() & (hvd.size() - 1):
            continue  # recursive doubling: a power of two ranks only
        options = {} if method in ("none", "fp16") else {"min_size": 64}
        if method == "powersgd":
            options["rank"] = 2
        elif method not in ("none", "fp16"):
            options["ratio"] = 0.05
        model = mlp(12)
        ratio = options.pop("ratio", None)
        opt, meter = distributed_optimizer(method, torch.optim.SGD(model.parameters(), lr=0.1),
                                           [(f"b.{method}.{n}", p) for n, p in model.named_parameters()],
                                           ratio=ratio, **options)
        with HandedOver() as counted:
            train(model, opt, data.x, data.y, steps=3)
        result[f"baseline_{method}"] = {"meter_payload_per_step": meter.per_step()[0],
                                        "counted_per_step": counted.total() / 3,
                                        "optimizer_per_step": counted.total("optimizer:") / 3,
                                        "engine_checks_per_step": sum(counted.by_name.get(n, 0) for n in
                                                                      ("gs_horovod.options",)) / 3,
                                        "parameters": len(list(model.parameters())),
                                        "nonfinite": int((~torch.isfinite(flat(model))).sum())}


@SCENARIOS
def kernels_used(result: dict, data: Data) -> None:
    """Which backend's sketch kernels ran for CPU tensors under backend="auto" (the default):
    every kernel call of gs_horovod.kernels.torch_ops counted by backend, 2 steps of the sketch."""
    from gs_horovod.kernels import torch_ops

    used: set[str] = set()
    saved = {b: dict(kernels) for b, kernels in torch_ops._KERNELS.items()}

    def counted(backend: str, fn: Any) -> Any:
        def call(*args: Any, **kw: Any) -> Any:
            used.add(backend)
            return fn(*args, **kw)
        return call

    for backend, kernels in torch_ops._KERNELS.items():
        for name, fn in list(kernels.items()):
            kernels[name] = counted(backend, fn)
    try:
        model = mlp(13)
        train(model, distributed(model, "k.", GsSketch(ratio=0.05, min_size=64, exchange="sketch")), data.x, data.y,
              steps=2)
    finally:
        for backend, kernels in saved.items():
            torch_ops._KERNELS[backend].update(kernels)
    result["auto_backends_used"] = sorted(used)


# Last, as they abandon their optimizers mid-step: Adasum and GsSketch outside an optimizer,
# then options that differ across ranks.
@SCENARIOS
def refusals(result: dict, data: Data) -> None:
    """hvd.Adasum refused; GsSketch outside a DistributedOptimizer refused."""
    model = mlp(11)
    opt = distributed(model, "a.", GsSketch(ratio=0.05, min_size=64), op=hvd.Adasum)
    try:
        train(model, opt, data.x, data.y, steps=1)
        result["adasum_error"] = None
    except Exception as e:  # noqa: BLE001 - the test reads which error it was
        result["adasum_error"] = f"{type(e).__name__}: {e}"
    try:
        hvd.allreduce(torch.ones(2000), name="outside", compression=GsSketch())
        result["outside_optimizer_error"] = None
    except RuntimeError as e:
        result["outside_optimizer_error"] = str(e)


@SCENARIOS
def mismatch(result: dict, data: Data) -> None:
    """Options that differ across ranks (the hash seed, the sketch's rows): every rank raises."""
    for label, options in (("seed", {"seed": hvd.rank()}), ("rows", {"rows": 3 + 2 * hvd.rank()})):
        model = mlp(5)
        opt = distributed(model, f"x.{label}.", GsSketch(ratio=0.05, min_size=64, exchange="sketch", **options))
        try:
            train(model, opt, data.x, data.y, steps=1)
            result[f"mismatch_{label}_error"] = None
        except Exception as e:  # noqa: BLE001 - the test reads which error each rank saw
            result[f"mismatch_{label}_error"] = f"{type(e).__name__}: {e}"


def main(out_dir: str, *names: str) -> None:
    hvd.init()
    torch.set_num_threads(1)
    result: dict = {"rank": hvd.rank(), "size": hvd.size()}
    result["scenarios"] = SCENARIOS.run(names, result, Data())
    write_result(out_dir, hvd.rank(), result)
    hvd.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
