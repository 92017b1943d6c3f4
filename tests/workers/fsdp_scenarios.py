"""Runs under ``torchrun`` (gloo, CPU): GsFsdpState on FSDP2 shards across replicas, one JSON per rank.

    torchrun --standalone --nproc_per_node 4 --no-python python tests/workers/fsdp_scenarios.py OUT_DIR 2x2 [NAME ...]
    torchrun --standalone --nproc_per_node 2 --no-python python tests/workers/fsdp_scenarios.py OUT_DIR 2x1,1x2 quick
    torchrun --standalone --nproc_per_node 4 --no-python python tests/workers/fsdp_scenarios.py OUT_DIR killed

NAME: a scenario (``recorded``, ``native``, ``top_k``, ``mixed_precision``, ``resume``,
``refusals``, ``nonfinite``) or a group (``all``, the default; ``quick``: all but the 2×2 mesh's
own: mixed precision, resume, refusals, the NaN), e.g. the NaN one alone:

    torchrun --standalone --nproc_per_node 4 --no-python python tests/workers/fsdp_scenarios.py /tmp/out 2x2 nonfinite

Each mesh R×S (replicate × shard) runs the scenarios under ``result[mesh]``; the records of
local shard gradients and updates let tests/test_fsdp.py recompute the updates in NumPy.
``killed``: rank 3 SIGKILLs itself inside its third step; torchrun must end the job.
"""

import hashlib
import os
import signal
import sys
import time
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from rank_result import write_result
from scenario import Scenarios
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from gs_horovod.fsdp import GsFsdpState, register_fsdp_hooks

# k = D under the allgather with its whole union and exact pairs: the exact mean
EXACT = dict(ratio=1.0, min_size=1, wire="fp32")
# exact pairs, recomputable in NumPy: top-k allgather (its whole union applied), and the sparse
# exchange (the top k of that union's sums, by their owners)
ALLGATHER = dict(ratio=0.05, exchange="allgather", apply="all", min_size=1, wire="fp32")
SPARSE = dict(ratio=0.05, exchange="sparse", min_size=1, wire="fp32")
OPTIONS = dict(ratio=0.05, min_size=64)
STEPS = 3
ALONE_TIMEOUT = 3.0  # checkpoint_timeout of the state whose state_dict() rank 0 calls alone
# each scenario(out, mesh, rank, out_dir, tag), in the order they run (the last ones leave a step unfinished)
SCENARIOS = Scenarios(quick=("recorded", "native", "top_k"))


class Poison(torch.autograd.Function):
    """Identity forward; backward puts NaN into row 3 of the gradient."""

    @staticmethod
    def forward(ctx: Any, w: torch.Tensor) -> torch.Tensor:
        return w.view_as(w)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.index_fill(0, torch.tensor([3]), float("nan"))


class PoisonableLinear(torch.nn.Linear):
    """A Linear whose weight gradient gets NaN in row 3 while ``poisoned``."""

    poisoned = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, Poison.apply(self.weight) if self.poisoned else self.weight, self.bias)


def mlp(seed: int, dtype: torch.dtype = torch.float32) -> torch.nn.Sequential:
    """32-64-64-10, tanh: 6,922 parameters; '2' can poison its weight gradient."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), PoisonableLinear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 10)).to(dtype)


def shard(model: torch.nn.Sequential, mesh: DeviceMesh, **kw: Any) -> torch.nn.Sequential:
    """fully_shard on each Linear and the root (``mesh``: 1-D for gs, 2-D for native HSDP)."""
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer, mesh=mesh, **kw)
    return fully_shard(model, mesh=mesh, **kw)


def batch(step: int, rank: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 32, generator=g).to(dtype), torch.randint(0, 10, (16,), generator=g)


def train(model: torch.nn.Module, steps: range, rank: int, micro: int = 1, zero_grad: bool = True,
          dtype: torch.dtype = torch.float32, after_backward: Optional[Callable[[], None]] = None) -> None:
    """SGD (lr 0.1) steps; ``micro`` > 1 accumulates that many micro-batches, all but the last
    under ``set_requires_all_reduce(False)``."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in steps:
        if zero_grad:
            opt.zero_grad()
        for j in range(micro):
            model.set_requires_all_reduce(j == micro - 1)
            x, y = batch(micro * i + j, rank, dtype)
            F.cross_entropy(model(x).float(), y).backward()
        if after_backward is not None:
            after_backward()
        opt.step()


def measured(model: torch.nn.Module, steps: range, rank: int, measure: Callable[[torch.nn.Module], Any],
             **kw: Any) -> list[Any]:
    """:func:`train`, returning ``measure(model)`` after each step's backward (its update in ``.grad``)."""
    seen: list[Any] = []
    train(model, steps, rank, after_backward=lambda: seen.append(measure(model)), **kw)
    return seen


def full(model: torch.nn.Module) -> torch.Tensor:
    """Every parameter gathered whole, flat, f32."""
    return torch.cat([p.full_tensor().detach().float().reshape(-1) for p in model.parameters()])


def digest(model: torch.nn.Module) -> str:
    return hashlib.sha256(full(model).numpy().tobytes()).hexdigest()


def local_grads(model: torch.nn.Module) -> dict[str, list[float]]:
    return {n: ([] if p.grad is None else p.grad.to_local().float().reshape(-1).tolist())
            for n, p in model.named_parameters()}


def gs(model: torch.nn.Module, mesh: DeviceMesh, **options: Any) -> GsFsdpState:
    state = GsFsdpState(mesh.get_group("replicate"), model=model, **options)
    register_fsdp_hooks(model, state)
    return state


def caught(fn: Callable[[], Any]) -> Optional[str]:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test reads which error each rank raised
        return f"{type(e).__name__}: {e}"
    return None


def record(out: dict, label: str, mesh: DeviceMesh, rank: int, options: dict) -> None:
    """STEPS steps with every engine input (local shard gradients, f32 by name) and every
    written update recorded, for a NumPy recomputation."""
    model = shard(mlp(1), mesh["shard"])
    state = gs(model, mesh, **options)
    inputs: list[dict[str, list[float]]] = []
    engine_step = state.engine.step

    def recording(grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        inputs.append({n: g.tolist() for n, g in grads.items()})
        return engine_step(grads)

    state.engine.step = recording
    updates = measured(model, range(STEPS), rank, local_grads)
    out[label] = {"inputs": inputs, "updates": updates, "steps": state.stats.steps,
                  "exchange": state.engine.plan.exchange, "traffic_steps": state.comm.traffic.steps}


def against_native(out: dict, label: str, mesh: DeviceMesh, rank: int, steps: int = 4, micro: int = 1,
                   dtype: torch.dtype = torch.float32, **kw: Any) -> None:
    """k = D through GsFsdpState against FSDP's native HSDP (the 2-D mesh), same batches: max |Δ weights|."""
    native = shard(mlp(0, dtype), mesh, **kw)
    train(native, range(steps), rank, micro=micro, dtype=dtype)
    model = shard(mlp(0, dtype), mesh["shard"], **kw)
    state = gs(model, mesh, **EXACT)
    dtypes = measured(model, range(steps), rank, lambda m: {str(p.grad.dtype) for p in m.parameters()},
                      micro=micro, dtype=dtype)
    out[label] = {"max_abs_diff": (full(native) - full(model)).abs().max().item(), "steps": state.stats.steps,
                  "grad_dtypes": sorted(set().union(*dtypes)), "nonfinite": int((~torch.isfinite(full(model))).sum())}


@SCENARIOS
def recorded(out: dict, mesh: DeviceMesh, rank: int, out_dir: str, tag: str) -> None:
    """The engine's inputs and updates (:func:`record`) under k = D, the allgather and the sparse exchange."""
    for label, options in (("exact", EXACT), ("allgather", ALLGATHER), ("sparse", SPARSE)):
        record(out, label, mesh, rank, options)


@SCENARIOS
def native(out: dict, mesh: DeviceMesh, rank: int, out_dir: str, tag: str) -> None:
    """k = D against native HSDP, one micro-batch a step and two."""
    against_native(out, "native", mesh, rank)
    against_native(out, "accumulate", mesh, rank, micro=2)


@SCENARIOS
def top_k(out: dict, mesh: DeviceMesh, rank: int, out_dir: str, tag: str) -> None:
    """Nonzeros of this rank's update over all modules' shards, at scope global and layer."""
    for scope in ("global", "layer"):
        model = shard(mlp(2), mesh["shard"])
        state = gs(model, mesh, ratio=0.02, min_size=1, exchange="allgather", apply="topk", scope=scope)
        nonzeros = measured(model, range(STEPS), rank,
                            lambda m: {n: int((p.grad.to_local() != 0).sum()) for n, p in m.named_parameters()})
        out[f"topk_{scope}"] = {"nonzeros": nonzeros, "steps": state.stats.steps, "digest": digest(model),
                                "sizes": {n: p.to_local().numel() for n, p in model.named_parameters()}}


@SCENARIOS
def mixed_precision(out: dict, mesh: DeviceMesh, rank: int, out_dir: str, tag: str) -> None:
    """bf16 compute with f32 or bf16 reduction, and a bf16 model, k = D against native HSDP; the
    default options under bf16 compute: finite, every rank's weights alike."""
    for reduce in ("float32", "bfloat16"):
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=getattr(torch, reduce))
        against_native(out, f"bf16_reduce_{reduce}", mesh, rank, mp_policy=policy)
    against_native(out, "bf16_model", mesh, rank, dtype=torch.bfloat16)
    model = shard(mlp(3), mesh["shard"], mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    initial = {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}
    state = gs(model, mesh, **OPTIONS)
    train(model, range(STEPS), rank)
    out["bf16_gs"] = {"digest": digest(model), "nonfinite": int((~torch.isfinite(full(model))).sum()),
                      "steps": state.stats.steps,  # and how many coordinates of each parameter moved
                      "moved": {n: int((p.full_tensor() != initial[n]).sum()) for n, p in model.named_parameters()}}


@SCENARIOS
def resume(out: dict, mesh: DeviceMesh, rank: int, out_dir: str, tag: str, n: int = 3) -> None:
    """2n steps straight vs n steps, then the model by DCP and GsFsdpState's state beside it
    (rank 0's gathered file, and one file per rank), fresh objects, n more steps."""
    options = dict(OPTIONS, momentum=0.5)
    straight = shard(mlp(4), mesh["shard"])
    straight_state = gs(straight, mesh, **options)
    train(straight, range(2 * n), rank)
    out["straight"] = digest(straight)
    final = straight_state.local_state_dict()["tensors"]

    first = shard(mlp(4), mesh["shard"])
    state = gs(first, mesh, **options)
    train(first, range(n), rank)
    folder = os.path.join(out_dir, f"dcp_{tag}")
    dcp.save({"model": first.state_dict()}, checkpoint_id=folder)
    gathered = state.state_dict()
    if rank == 0:
        torch.save(gathered, os.path.join(folder, "gs_state.pt"))
    torch.save(state.local_state_dict(), os.path.join(folder, f"gs_rank{rank}.pt"))
    dist.barrier()
    for label in ("gathered", "local", "not_loaded"):
        model = shard(mlp(5), mesh["shard"])  # other weights: everything comes from the checkpoint
        weights = {"model": model.state_dict()}
        dcp.load(weights, checkpoint_id=folder)
        model.load_state_dict(weights["model"])
        fresh = gs(model, mesh, **options)
        if label == "gathered":
            fresh.load_state_dict(torch.load(os.path.join(folder, "gs_state.pt")) if rank == 0 else None)
        elif label == "local":
            fresh.load_local_state_dict(torch.load(os.path.join(folder, f"gs_rank{rank}.pt")))
        train(model, range(n, 2 * n), rank)
        out[f"{label}_resumed"] = digest(model)
        resumed = fresh.local_state_dict()["tensors"]
        out[f"{label}_own_residuals_back"] = [sorted(resumed), sorted(final), max(
            ((resumed[k]["residual"] - t["residual"]).abs().max().item() for k, t in final.items() if k in resumed),
            default=0.0)]  # the names resumed and straight, the largest difference of a residual
    saved = torch.load(os.path.join(folder, f"gs_rank{rank}.pt"))
    other = shard(mlp(5), mesh["shard"])
    out["other_options_error"] = caught(lambda: gs(other, mesh, **dict(options, seed=1)).load_local_state_dict(saved))
    flat = init_device_mesh("cpu", (1, dist.get_world_size()), mesh_dim_names=("replicate", "shard"))
    other = shard(mlp(5), flat["shard"])
    out["other_mesh_error"] = caught(lambda: gs(other, flat, **options).load_local_state_dict(saved))


@SCENARIOS
def refusals(out: dict, mesh: DeviceMesh, rank: int, out_dir: str, tag: str) -> None:
    """Options that differ across ranks; a .grad not zeroed between updates; modules that
    disagree on set_requires_all_reduce; a replicate group across shards: each raises on every
    rank. Rank 0 calling state_dict() alone raises there, and the next step on every rank."""
    model = shard(mlp(7), mesh["shard"])
    gs(model, mesh, **OPTIONS, seed=rank)
    out["mismatch_seed_error"] = caught(lambda: train(model, range(1), rank))
    model = shard(mlp(7), mesh["shard"])
    gs(model, mesh, **OPTIONS)
    out["stale_error"] = caught(lambda: train(model, range(2), rank, zero_grad=False))
    model = shard(mlp(7), mesh["shard"])
    gs(model, mesh, **OPTIONS)

    def mixed() -> None:
        model[2].set_requires_all_reduce(False, recurse=False)
        x, y = batch(0, rank)
        F.cross_entropy(model(x), y).backward()

    out["mixed_error"] = caught(mixed)
    crossed = [dist.new_group(ranks) for ranks in ([0, 3], [1, 2])]  # each holds shard 0 and shard 1
    model = shard(mlp(7), mesh["shard"])
    register_fsdp_hooks(model, GsFsdpState(crossed[0 if rank in (0, 3) else 1], model=model, **OPTIONS))
    out["layout_error"] = caught(lambda: train(model, range(1), rank))
    model = shard(mlp(7), mesh["shard"])
    state = gs(model, mesh, **OPTIONS, checkpoint_timeout=ALONE_TIMEOUT)
    train(model, range(2), rank)
    if rank == 0:  # the others go on into the next step: rank 1 waits for it in FSDP's all-gather
        start = time.monotonic()
        out["alone_save_error"] = caught(state.state_dict)
        out["alone_save_seconds"] = time.monotonic() - start
    out["next_step_error"] = caught(lambda: train(model, range(2, 3), rank))


@SCENARIOS
def nonfinite(out: dict, mesh: DeviceMesh, rank: int, out_dir: str, tag: str) -> None:
    """NaN in row 3 of '2.weight''s gradient on the last rank alone, at step 1 (so in one
    shard, one replicate group), under nonfinite="raise" and "skip"."""
    last = dist.get_world_size() - 1
    for mode in ("raise", "skip"):
        model = shard(mlp(6), mesh["shard"])
        state = gs(model, mesh, **OPTIONS, nonfinite=mode)
        train(model, range(1), rank)
        before = {k: t["residual"].clone() for k, t in state.local_state_dict()["tensors"].items()}
        model[2].poisoned = rank == last
        updates: list[float] = []

        def poisoned_step(model: torch.nn.Module = model, updates: list[float] = updates) -> None:
            updates += measured(model, range(1, 2), rank,
                                lambda m: sum(float(p.grad.to_local().abs().sum()) for p in m.parameters()))

        error = caught(poisoned_step)
        after = state.local_state_dict()["tensors"]
        grad = model[2].weight.grad  # the raise left FSDP's (this rank's shard of the shard-group mean) there
        out[f"nan_{mode}"] = {
            "error": error, "update_abs_sum": updates, "skipped": state.stats.skipped,
            "nan_in_own_shard": mode == "raise" and bool(torch.isnan(grad.to_local()).any()),
            "residual_change": max((after[k]["residual"] - r).abs().max().item() for k, r in before.items())}
        model[2].poisoned = False
        if mode == "skip":  # trains on
            train(model, range(2, 3), rank)
            out["nan_skip"]["then_nonfinite"] = int((~torch.isfinite(full(model))).sum())


def killed(out_dir: str) -> None:
    """2×2; rank 3 SIGKILLs itself inside its third step (its flags not yet sent); the others
    wait in that step's collectives until torchrun's agent stops them."""
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    model = shard(mlp(0), mesh["shard"])
    state = gs(model, mesh, **OPTIONS)
    step = state._step

    def step_or_die(accumulating: list[str]) -> None:
        if rank == 3 and state.stats.steps == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        step(accumulating)

    state._step = step_or_die
    train(model, range(1000), rank)
    write_result(out_dir, rank, {"rank": rank, "finished": True})  # not reached: the job is torn down


def main(out_dir: str, meshes: str, *names: str) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    if meshes == "killed":
        killed(out_dir)
        return
    rank = dist.get_rank()
    result: dict = {"rank": rank, "size": dist.get_world_size()}
    for label in meshes.split(","):
        replicas, shards = (int(n) for n in label.split("x"))
        mesh = init_device_mesh("cpu", (replicas, shards), mesh_dim_names=("replicate", "shard"))
        out = result[label] = {"replicate_ranks": dist.get_process_group_ranks(mesh.get_group("replicate")),
                               "shard_ranks": dist.get_process_group_ranks(mesh.get_group("shard"))}
        out["scenarios"] = SCENARIOS.run(names, out, mesh, rank, out_dir, label)
    write_result(out_dir, rank, result)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
