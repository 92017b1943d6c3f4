"""HSDP training of a CNN on real MNIST digits with FSDP2: shard within a group of ranks,
replicate across groups, the cross-replica reduction by gs-SGD or dense.

    torchrun --standalone --nproc_per_node 4 scripts/examples/train_fsdp.py --compression gs
    torchrun --standalone --nproc_per_node 4 scripts/examples/train_fsdp.py --compression none

The job's ranks form an R × S mesh (``--replicas R``, S = ranks / R): ``fully_shard`` on each
layer and the root over the S ranks of a row. ``--compression gs``: FSDP on the 1-D shard mesh,
``gs_horovod.fsdp.GsFsdpState`` across the R replicas of each shard (GsSketch's options as
``--ratio``, ``--gs NAME=VALUE``, ...; those not given keep GsSketch's defaults).
``--compression none``: plain HSDP, FSDP on the 2-D mesh, its own dense all-reduce.

Data: MNIST-5k (``gs_bench.workloads.mnist5k``), 1,000 held out, the other 4,000 split across
all R·S ranks (each rank its own batch). Model: ``gs_bench.workloads.MnistCNN`` (824,458
parameters). Every epoch reports the mean loss and the held-out accuracy; at the end, the bytes
a rank handed to the cross-replica collectives per step, counted as they receive them (gs: the
``DistCollectives``' traffic of the replicate group, the engine's payload beside it; none:
each FSDP module's reduce output as its all-reduce hook receives it after FSDP's all-reduce),
and on the wire (ring all-reduce among R).
"""

from __future__ import annotations

import argparse
import math
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from gs_bench.cli import Report, demo_arguments, method_options
from gs_bench.workloads import MnistCNN, mnist5k
from gs_horovod.fsdp import GsFsdpState, register_fsdp_hooks
from gs_horovod.transports.wire import Traffic

EPOCHS = 10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = demo_arguments(__doc__, ["gs", "none"])
    p.add_argument("--replicas", type=int, default=2, help="R: the mesh's replicas; S = ranks / R shard each")
    args = p.parse_args(argv)
    if args.epochs is None:
        args.epochs = EPOCHS
    return args


def shard(model: MnistCNN, mesh: Any) -> MnistCNN:
    """fully_shard on each conv and linear layer, then the root, over ``mesh``."""
    for layer in (*model.features, *model.classifier):
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


class NativeAllReduceCount:
    """Counts plain HSDP's own cross-replica all-reduce: each FSDP module's reduce output, as its
    all-reduce hook receives it once FSDP's all-reduce is done; ``traffic`` as a transport's."""

    def __init__(self, model: torch.nn.Module, replicas: int) -> None:
        self.traffic = Traffic(replicas)
        for module in model.modules():
            if isinstance(module, FSDPModule) and any(True for _ in module.parameters(recurse=False)):
                module.set_all_reduce_hook(self.received)

    def received(self, reduce_output: torch.Tensor) -> None:
        self.traffic.add("allreduce", reduce_output.numel() * reduce_output.element_size())


def distribute(args: argparse.Namespace, model: MnistCNN, replicas: int,
               shards: int) -> tuple[Traffic, Callable[[], None], Callable[[], str]]:
    """Shards ``model`` for ``args.compression``: (the cross-replica traffic, what ends a step
    in it, a closing line)."""
    mesh = init_device_mesh("cpu", (replicas, shards), mesh_dim_names=("replicate", "shard"))
    ratio, options = method_options(args)
    if args.compression == "none":
        count = NativeAllReduceCount(shard(model, mesh), replicas)
        return count.traffic, count.traffic.end_step, lambda: ""
    shard(model, mesh["shard"])
    state = GsFsdpState(mesh.get_group("replicate"), model=model,
                        **({} if ratio is None else {"ratio": ratio}), **options)
    register_fsdp_hooks(model, state)
    return state.comm.traffic, lambda: None, lambda: (
        f"  engine payload      {state.stats.total_bytes / max(1, state.stats.steps):,.0f} bytes/step (CommStats); "
        f"exchange {state.engine.plan.exchange!r} among {replicas} replicas")


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    if args.replicas < 1 or size % args.replicas:
        raise SystemExit(f"--replicas must divide the {size} ranks, got {args.replicas}")
    try:
        return train(args, rank, size)
    finally:
        dist.destroy_process_group()


def mean_over_ranks(value: float, size: int) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item()) / size


def train(args: argparse.Namespace, rank: int, size: int) -> dict:
    """One rank's training; rank 0's Report result."""
    torch.manual_seed(args.seed)  # the same initial weights on every rank: fully_shard keeps each rank's shard
    torch.set_num_threads(1)
    x_train, y_train, x_test, y_test = map(torch.from_numpy, mnist5k(rank, size))
    replicas, shards = args.replicas, size // args.replicas

    model = MnistCNN(args.hidden)
    traffic, end_step, closing = distribute(args, model, replicas, shards)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)

    steps_per_epoch = math.ceil(len(x_train) / args.batch_size)
    t = torch.tensor([steps_per_epoch])
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    steps_per_epoch = int(t.item())
    shard_bytes = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    g = torch.Generator().manual_seed(args.seed + rank)
    report = Report(args, rank, size, shard_bytes, traffic.per_step, steps_per_epoch, args.epochs)
    for epoch in report.periods():
        model.train()
        order = torch.randperm(len(x_train), generator=g)
        total = 0.0
        for step in range(steps_per_epoch):
            batch = order[step * args.batch_size:(step + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x_train[batch]), y_train[batch])
            loss.backward()
            end_step()
            optimizer.step()
            total += loss.item()
            report.step()
        train_loss = mean_over_ranks(total / steps_per_epoch, size)
        model.eval()
        with torch.no_grad():  # every rank runs it: FSDP all-gathers the weights
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        report.record(epoch, train_loss, accuracy)
    result = report.finish()
    line = closing()
    if rank == 0:
        print(f"  mesh                {replicas} replicas × {shards} shards; dense = this rank's shard, "
              f"{shard_bytes:,} bytes{chr(10) + line if line else ''}", flush=True)
    return result


if __name__ == "__main__":
    main()
