"""Data-parallel training of an MLP on scikit-learn's handwritten digits with Horovod.

    horovodrun -np 2 -H localhost:2 --gloo python scripts/train_torch.py --compression gs

Each rank trains on its shard of the 1,437 training images (8×8, 10 classes) and every
epoch reports the mean loss, the accuracy on the 360 held-out images and the bytes this rank
handed to gradient collectives per step. ``--compression none`` is the dense baseline.
"""

from __future__ import annotations

import argparse
import math

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from demo_common import Report, demo_arguments, digits_shard

from gs_horovod.baselines import METHODS, distributed_optimizer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = demo_arguments(__doc__, ["gs", "none", "fp16", *METHODS])
    p.add_argument("--powersgd-rank", type=int, default=4)
    p.add_argument("--merge", choices=["horovod", "mpi"], default="horovod",
                   help="gs: merge sketches with Horovod's allreduce or gs_horovod's MPI tree (needs --mpi)")
    return p.parse_args(argv)


def make_model(hidden: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(64, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden // 2), torch.nn.ReLU(),
        torch.nn.Linear(hidden // 2, 10),
    )


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    x_train, y_train, x_test, y_test = map(torch.from_numpy, digits_shard(hvd.rank(), hvd.size()))

    model = make_model(args.hidden)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    gs_options = dict(merge=args.merge, rows=args.rows, width=args.width, exact=args.exact,
                      warmup_steps=args.warmup_steps, seed=args.seed)
    optimizer, bytes_per_step = distributed_optimizer(
        args.compression, optimizer, model.named_parameters(),
        ratio=args.ratio, powersgd_rank=args.powersgd_rank, **gs_options)

    steps_per_epoch = math.ceil(len(x_train) / args.batch_size)
    steps_per_epoch = hvd.allreduce(torch.tensor(steps_per_epoch), op=hvd.Min, name="steps").item()
    dense_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    g = torch.Generator().manual_seed(args.seed + hvd.rank())
    report = Report(args, hvd.rank(), hvd.size(), dense_bytes, bytes_per_step, steps_per_epoch)
    for epoch in report:
        model.train()
        order = torch.randperm(len(x_train), generator=g)
        total = 0.0
        for step in range(steps_per_epoch):
            batch = order[step * args.batch_size:(step + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x_train[batch]), y_train[batch])
            loss.backward()
            optimizer.step()
            total += loss.item()
        train_loss = hvd.allreduce(torch.tensor(total / steps_per_epoch), name="loss").item()
        model.eval()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        report.epoch(epoch, train_loss, accuracy)
    return report.finish()


if __name__ == "__main__":
    main()
