"""Horovod elastic training of the MNIST-5k CNN with GsSketch, as Horovod's elastic examples
train (``hvd.elastic.run``, ``TorchState``, ``ElasticSampler``, ``state.commit()``), plus one
keyword: ``gs=compression`` makes each rank's residuals commit and roll back with the model.

    horovodrun -np 2 --min-np 1 --max-np 3 --host-discovery-script ./discover.sh \\
        python scripts/examples/train_elastic.py

``bash scripts/examples/elastic_demo.sh`` runs it with a worker killed part-way and a slot added
later. Rank 0 writes ``--progress`` (the global step, the ranks, each rank's pid and host) after
every commit, and at the end prints the summary and writes ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from data import MnistCNN, mnist5k
from torch.utils.data import DataLoader, TensorDataset

from gs_horovod.torch import GsSketch


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--compression", choices=["gs", "none"], default="gs")
    p.add_argument("--ratio", type=float, default=None,
                   help="gs: a fixed fraction of coordinates a step (default: GsSketch's ratio='auto')")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batches-per-commit", type=int, default=5)
    p.add_argument("--progress", default=None, help="rank 0 writes its progress here after each commit")
    p.add_argument("--json", default=None, help="rank 0 writes the summary here")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    x_train, y_train, x_test, y_test = map(torch.from_numpy, mnist5k())  # every rank: all 4,000
    dataset = TensorDataset(x_train, y_train)
    sampler = hvd.elastic.ElasticSampler(dataset, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    model = MnistCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    options = {} if args.ratio is None else {"ratio": args.ratio}
    compression = GsSketch(**options) if args.compression == "gs" else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)
    extra = {"gs": compression} if args.compression == "gs" else {}
    state = hvd.elastic.TorchState(model, optimizer, train_sampler=sampler, epoch=0, batch=0, step=0, **extra)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])

    def report(state: hvd.elastic.TorchState) -> None:
        workers = hvd.allgather_object((os.getpid(), os.environ.get("HOROVOD_HOSTNAME", "")))
        if hvd.rank() == 0 and args.progress:
            with open(args.progress + ".tmp", "w") as f:
                json.dump({"step": state.step, "epoch": state.epoch, "ranks": hvd.size(), "workers": workers}, f)
            os.replace(args.progress + ".tmp", args.progress)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.epoch < args.epochs:
            state.model.train()
            for batch, (x, y) in enumerate(loader, start=state.batch):
                state.batch = batch
                state.optimizer.zero_grad()
                F.cross_entropy(state.model(x), y).backward()
                state.optimizer.step()
                state.step += 1
                state.train_sampler.record_batch(batch, args.batch_size)
                if state.step % args.batches_per_commit == 0:
                    state.commit()
                    report(state)
            state.epoch, state.batch = state.epoch + 1, 0
            state.train_sampler.set_epoch(state.epoch)
            state.commit()

    start = time.perf_counter()
    train(state)
    if hvd.rank() == 0:
        model.eval()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        summary = {"compression": args.compression, "accuracy": accuracy, "resets": len(resets),
                   "ranks_at_end": hvd.size(), "ranks_after_each_reset": resets, "steps": state.step,
                   "seconds": time.perf_counter() - start,
                   "lost_residual": compression.stats.lost_residual if args.compression == "gs" else 0.0}
        print(f"held-out accuracy {accuracy:.4f}  resets seen {len(resets)} (ranks after each: {resets})  "
              f"ranks at the end {hvd.size()}  steps {state.step}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
