"""Runs under ``torchrun`` (gloo, CPU): gs_hook inside DistributedDataParallel, one JSON per rank.

    torchrun --standalone --nproc_per_node 2 --no-python python tests/workers/ddp_scenarios.py OUT_DIR [NAME ...]
    horovodrun -np 2 -H localhost:2 --gloo python tests/workers/ddp_scenarios.py OUT_DIR horovod

NAME: a scenario (``exact_plain``, ``top_k``, ``compared_updates``, ``resume``, ``idioms``,
``powersgd_bytes``, ``nonfinite``, ``mismatch``) or a group (``all``, the default; ``quick``: all
but DDP's idioms, PowerSGD's bytes and the NaN), e.g. the resume alone:

    torchrun --standalone --nproc_per_node 2 --no-python python tests/workers/ddp_scenarios.py /tmp/out resume

The ``horovod`` mode feeds the same per-rank batches through ``hvd.DistributedOptimizer`` with
GsSketch and records its updates, for tests/test_ddp.py to compare with the hook's.
"""

import hashlib
import os
import sys
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from rank_result import write_result
from scenario import Scenarios, each

EXACT = dict(ratio=1.0, rows=1, width=1.0, candidates=1, exact=True, min_size=1)  # k = D: the dense mean
OPTIONS = dict(ratio=0.05, min_size=64)
EXCHANGES = ("sketch", "allgather", "sparse")  # named: at 2-3 ranks "auto" would pick the allgather
BUCKET_MB = 0.005  # small buckets: mlp()'s 6,922 parameters fall into 2 once DDP rebuilds them
# registered in the order they run; the last two leave their DDP models mid-step
SCENARIOS = Scenarios(quick=("exact_plain", "top_k", "compared_updates", "resume", "mismatch"))


class Mlp(torch.nn.Sequential):
    """32-64-64-10, tanh (no gradient is exactly 0); ``skip_last`` leaves the last layer out of
    the graph (its parameters unused)."""

    def forward(self, x: torch.Tensor, skip_last: bool = False) -> torch.Tensor:
        for layer in self[:-1]:
            x = layer(x)
        return x[:, :10] if skip_last else self[-1](x)


def mlp(seed: int) -> Mlp:
    torch.manual_seed(seed)
    return Mlp(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
               torch.nn.Linear(64, 10))


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch of a step, whatever ran before (and whichever launcher)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)


def flat(tensors: Any) -> torch.Tensor:
    return torch.cat([t.detach().float().reshape(-1) for t in tensors])


def digest(model: torch.nn.Module) -> str:
    return hashlib.sha256(flat(model.parameters()).numpy().tobytes()).hexdigest()


def grads(model: torch.nn.Module) -> torch.Tensor:
    """The parameters' .grad, flat (zeros where None): after DDP's backward, the update."""
    return flat(p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters())


def run(module: torch.nn.Module, model: torch.nn.Module, steps: range, rank: int, micro: int = 1,
        skip_last: Callable[[int], bool] = lambda i: False, autocast: bool = False) -> list[torch.Tensor]:
    """SGD (lr 0.1) steps of ``model`` (``module`` wrapped by DDP, or compiled);
    ``micro`` > 1 accumulates that many micro-batches under ``no_sync()`` first; ``skip_last(i)``
    leaves the last layer out of step i's graph. Returns each step's update."""
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    updates = []
    for i in steps:
        opt.zero_grad()
        for j in range(micro):
            x, y = batch(micro * i + j, rank)
            with (model.no_sync() if j < micro - 1 else torch.enable_grad()):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    h = model(x, skip_last=skip_last(i))
                F.cross_entropy(h.float(), y).backward()
        updates.append(grads(module))
        opt.step()
    return updates


def ddp(module: torch.nn.Module, state: Any = None, **kw: Any) -> Any:
    from torch.nn.parallel import DistributedDataParallel

    from gs_horovod.ddp import gs_hook

    model = DistributedDataParallel(module, bucket_cap_mb=BUCKET_MB, **kw)
    if state is not None:
        model.register_comm_hook(state, gs_hook)
    return model


def exact_equals_default(result: dict, rank: int, label: str, steps: int = 4, exchange: str = "auto",
                         **kw: Any) -> None:
    """k = D through gs_hook against DDP's default hook, same batches: max |Δ weights|."""
    from gs_horovod.ddp import GsState

    idiom = {k: kw.pop(k) for k in ("micro", "skip_last", "autocast") if k in kw}
    default, gs = mlp(0), mlp(0)
    run(default, ddp(default, **kw), range(steps), rank, **idiom)
    state = GsState(model=gs, **EXACT, exchange=exchange)
    run(gs, ddp(gs, state, **kw), range(steps), rank, **idiom)
    result[f"exact_{label}_max_abs_diff"] = (flat(default.parameters()) - flat(gs.parameters())).abs().max().item()
    result[f"exact_{label}_steps"] = state.stats.steps


@SCENARIOS
@each(EXCHANGES)
def exact_plain(result: dict, exchange: str, rank: int, out_dir: str) -> None:
    """k = D through gs_hook against DDP's default hook, 4 steps over 2 buckets."""
    exact_equals_default(result, rank, "plain", exchange=exchange)


@SCENARIOS
@each(EXCHANGES)
def top_k(result: dict, exchange: str, rank: int, out_dir: str) -> None:
    """Nonzeros of each step's update over all buckets together, and the bucket indices seen."""
    from gs_horovod.ddp import GsState, gs_hook

    calls: list[int] = []

    def counting(state: GsState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        calls.append(bucket.index())
        return gs_hook(state, bucket)

    for label, options in (("global", {"ratio": 0.02}), ("layer", {"ratio": 0.02, "scope": "layer"}),
                           ("fixed", {"k": 100})):
        module = mlp(1)
        model = ddp(module)  # apply="topk": exactly k applied (the allgather's own applies its whole union)
        model.register_comm_hook(GsState(model=module, min_size=1, exchange=exchange, apply="topk", **options),
                                 counting)
        calls.clear()
        updates = run(module, model, range(3), rank)
        result[f"topk_{label}_nonzeros"] = [int((u != 0).sum()) for u in updates]
        result[f"topk_{label}_per_tensor"] = [int((p.grad != 0).sum()) for p in module.parameters()]
        result[f"topk_{label}_digests"] = [hashlib.sha256(u.numpy().tobytes()).hexdigest() for u in updates]
        result[f"topk_{label}_buckets"] = sorted(set(calls))
    result["sizes"] = [p.numel() for p in mlp(1).parameters()]


@SCENARIOS
@each(EXCHANGES)
def compared_updates(result: dict, exchange: str, rank: int, out_dir: str) -> None:
    """3 steps' updates, for tests/test_ddp.py to compare with the Horovod adapter's (``horovod``)."""
    from gs_horovod.ddp import GsState

    module = mlp(2)
    state = GsState(model=module, **OPTIONS, exchange=exchange)
    result["updates"] = [u.tolist() for u in run(module, ddp(module, state), range(3), rank)]
    # the DDP model itself given as the model (its parameters named "module.<name>")
    from gs_horovod.ddp import gs_hook

    module = mlp(2)
    model = ddp(module)
    model.register_comm_hook(GsState(model=model, **OPTIONS, exchange=exchange), gs_hook)
    result["updates_ddp_as_model"] = [u.tolist() for u in run(module, model, range(3), rank)]


def horovod_updates(out_dir: str) -> None:
    """The same batches and options through hvd.DistributedOptimizer(compression=GsSketch)."""
    import horovod.torch as hvd

    from gs_horovod.torch import GsSketch

    hvd.init()
    torch.set_num_threads(1)
    result = {}
    for exchange in EXCHANGES:
        model = mlp(2)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(),
                                       compression=GsSketch(**OPTIONS, exchange=exchange))
        updates = []
        for i in range(3):
            opt.zero_grad()
            x, y = batch(i, hvd.rank())
            F.cross_entropy(model(x), y).backward()
            opt.synchronize()
            updates.append(grads(model).tolist())
            with opt.skip_synchronize():
                opt.step()
        result[exchange] = {"updates": updates}
    write_result(out_dir, hvd.rank(), result)


@SCENARIOS
@each(EXCHANGES)
def resume(result: dict, exchange: str, rank: int, out_dir: str, n: int = 3) -> None:
    """2n steps straight vs n steps, saved (rank 0 writes one file; and one file per rank),
    fresh model, DDP and GsState, n more steps; "not_loaded": the same without GsState's state."""

    from gs_horovod.ddp import GsState

    options = dict(OPTIONS, momentum=0.5, exchange=exchange)
    straight = mlp(3)
    straight_state = GsState(model=straight, **options)
    run(straight, ddp(straight, straight_state), range(2 * n), rank)
    result["straight"] = digest(straight)
    final = straight_state.local_state_dict()["tensors"]

    first = mlp(3)
    state = GsState(model=first, **options)
    run(first, ddp(first, state), range(n), rank)
    gathered, local = state.state_dict(), state.local_state_dict()
    path = os.path.join(out_dir, f"checkpoint_{exchange}.pt")
    if rank == 0:
        torch.save({"model": first.state_dict(), "gs": gathered}, path)
    torch.save(local, os.path.join(out_dir, f"local{rank}_{exchange}.pt"))
    dist.barrier()
    for label in ("gathered", "local", "not_loaded"):
        module = mlp(4)  # other weights: everything comes from the file
        module.load_state_dict(torch.load(path)["model"])
        fresh = GsState(model=module, **options)
        if label == "gathered":
            fresh.load_state_dict(torch.load(path)["gs"] if rank == 0 else None)
        elif label == "local":
            fresh.load_local_state_dict(torch.load(os.path.join(out_dir, f"local{rank}_{exchange}.pt")))
        run(module, ddp(module, fresh), range(n, 2 * n), rank)  # "gathered": restored at the first step
        result[f"{label}_resumed"] = digest(module)
        resumed = fresh.local_state_dict()["tensors"]  # each rank's own: the straight run's residuals
        result[f"{label}_own_residuals_back"] = [sorted(resumed), sorted(final), max(
            ((resumed[n]["residual"] - t["residual"]).abs().max().item() for n, t in final.items() if n in resumed),
            default=0.0)]  # the names resumed and straight, the largest difference of a residual


@SCENARIOS
def idioms(result: dict, rank: int, out_dir: str) -> None:
    """DDP's own idioms with k = D against the default hook; bf16 autocast and torch.compile."""
    from torch.nn.parallel import DistributedDataParallel

    from gs_horovod.ddp import GsState, gs_hook

    exact_equals_default(result, rank, "no_sync", micro=2)
    exact_equals_default(result, rank, "unused", skip_last=lambda i: i % 2 == 0 and rank == 0,
                         find_unused_parameters=True)
    exact_equals_default(result, rank, "static_graph", static_graph=True)
    exact_equals_default(result, rank, "autocast", autocast=True)
    module = mlp(7)
    initial = flat(module.parameters())
    run(module, ddp(module, GsState(model=module, **OPTIONS)), range(3), rank, autocast=True)
    result["autocast_gs_digest"] = digest(module)
    result["autocast_gs_nonfinite"] = int((~torch.isfinite(flat(module.parameters()))).sum())
    result["autocast_gs_moved"] = int((flat(module.parameters()) != initial).sum())  # coordinates that moved
    default, gs = mlp(0), mlp(0)
    run(default, DistributedDataParallel(default), range(3), rank)
    state = GsState(model=gs, **EXACT)
    try:
        model = DistributedDataParallel(gs)  # default buckets: Dynamo's DDPOptimizer wants the first smallest
        model.register_comm_hook(state, gs_hook)
        run(gs, torch.compile(model), range(3), rank)
        result["compile_max_abs_diff"] = (flat(default.parameters()) - flat(gs.parameters())).abs().max().item()
        result["compile_steps"] = state.stats.steps
    except Exception as e:  # noqa: BLE001 - the test reports why torch.compile did not run here
        result["compile_error"] = f"{type(e).__name__}: {str(e)[:400]}"


@SCENARIOS
def powersgd_bytes(result: dict, rank: int, out_dir: str) -> None:
    """gs_bench.methods.register_hook's count of PowerSGD's bytes against PowerSGDState's own element counts."""
    from gs_bench.methods import register_hook

    module = mlp(8)
    model = ddp(module)
    meter = register_hook("powersgd", model, module, rank=1)
    run(module, model, range(4), rank)
    state = model._comm_hooks[-1][1]  # the PowerSGDState register_hook made
    dense = sum(p.numel() for p in module.parameters())
    result["powersgd_counted_bytes"] = meter.per_step()[0] * 4
    result["powersgd_expected_bytes"] = 4 * (state.start_powerSGD_iter * dense + state.total_numel_after_compression)


@SCENARIOS
@each(("sketch",))  # the rule for every exchange: tests/test_gs_sgd.py on simulated ranks
def nonfinite(result: dict, exchange: str, rank: int, out_dir: str) -> None:
    """One NaN in one gradient on rank 1 at step 1, under nonfinite="raise" and "skip", and
    "skip" at the default density (step 1 dense, each bucket allreduced in float16 by its hook)."""
    from gs_horovod.ddp import GsState

    for mode, options in (("raise", OPTIONS), ("skip", OPTIONS), ("dense_skip", dict(min_size=64))):
        module = mlp(5)
        state = GsState(model=module, **options, nonfinite=mode.removeprefix("dense_"), exchange=exchange)
        model = ddp(module, state)
        run(module, model, range(1), rank)
        before = {n: t["residual"].clone() for n, t in state.local_state_dict()["tensors"].items()}
        params = flat(module.parameters())
        handle = module[2].weight.register_hook(
            lambda g: g.index_fill(0, torch.tensor([3]), float("nan")) if rank == 1 else g)
        try:
            result[f"nan_{mode}_update_nonzeros"] = int((run(module, model, range(1, 2), rank)[0] != 0).sum())
            result[f"nan_{mode}_error"] = None
        except FloatingPointError as e:
            result[f"nan_{mode}_error"] = str(e)
        handle.remove()
        after = state.local_state_dict()["tensors"]
        result[f"nan_{mode}_residual_change"] = max((after[n]["residual"] - r).abs().max().item()
                                                    for n, r in before.items())
        result[f"nan_{mode}_params_change"] = (flat(module.parameters()) - params).abs().max().item()
        result[f"nan_{mode}_skipped"] = state.stats.skipped
        result[f"nan_{mode}_level"] = state.stats.density


@SCENARIOS
def mismatch(result: dict, rank: int, out_dir: str) -> None:
    """Options that differ across ranks (the hash seed): every rank raises."""
    from gs_horovod.ddp import GsState

    module = mlp(6)
    try:
        run(module, ddp(module, GsState(model=module, **OPTIONS, seed=rank)), range(1), rank)
        result["mismatch_seed_error"] = None
    except ValueError as e:
        result["mismatch_seed_error"] = f"ValueError: {e}"


def main(out_dir: str, *names: str) -> None:
    if names == ("horovod",):
        horovod_updates(out_dir)
        return

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    result: dict = {"rank": rank, "size": dist.get_world_size()}
    result["scenarios"] = SCENARIOS.run(names, result, rank, out_dir)
    write_result(out_dir, rank, result)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
