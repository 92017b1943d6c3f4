"""Data-parallel training of a CNN on real MNIST digits with gs-SGD: under Horovod, GsSketch as the
``compression`` of ``hvd.DistributedOptimizer``; under torchrun, ``gs_hook`` as DDP's
communication hook.

    horovodrun -np 2 -H localhost:2 --gloo python scripts/examples/train_torch.py
    torchrun --standalone --nproc_per_node 2 scripts/examples/train_torch.py

``--ratio R`` fixes the fraction of coordinates sent a step (default: GsSketch's ``ratio="auto"``).
The benchmark harness's version, with every baseline and the byte counts: scripts/bench/train_torch.py.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F
from data import MnistCNN, mnist5k


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ratio", type=float, help="k / d (default: GsSketch's ratio='auto')")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    return p.parse_args(argv)


def main() -> None:
    args = parse_args()
    options = {} if args.ratio is None else {"ratio": args.ratio}
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = MnistCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    if "RANK" in os.environ:  # torchrun: DistributedDataParallel with gs-SGD as its communication hook
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        from gs_horovod.ddp import GsState, gs_hook
        from gs_horovod.torchrun import init_process_group

        init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        net = DistributedDataParallel(model)
        net.register_comm_hook(GsState(model=model, **options), gs_hook)
    else:  # horovodrun: GsSketch as the DistributedOptimizer's compression
        import horovod.torch as hvd

        from gs_horovod.torch import GsSketch

        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=GsSketch(**options))
        net = model

    x_train, y_train, x_test, y_test = map(torch.from_numpy, mnist5k(rank, size))
    steps = len(x_train) // args.batch_size  # the same on every rank: 4,000 images split evenly
    for epoch in range(args.epochs):
        order = torch.randperm(len(x_train))
        for step in range(steps):
            batch = order[step * args.batch_size:(step + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(net(x_train[batch]), y_train[batch])
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        if rank == 0:
            print(f"epoch {epoch + 1}  loss {loss.item():.4f}  held-out accuracy {accuracy:.4f}", flush=True)
    if "RANK" in os.environ:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
