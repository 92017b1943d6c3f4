"""Runs under ``horovodrun``: every baseline exchange on real ranks, one JSON per rank."""

from __future__ import annotations

import json
import os
import sys

import horovod.torch as hvd
import torch
from torch_scenarios import digest, digits_shard, distributed, flat, mlp, train

from gs_horovod.baselines import METHODS, ExchangeOptimizer


def main(out_dir: str) -> None:
    hvd.init()
    torch.set_num_threads(1)
    x, y = digits_shard()
    result: dict = {"rank": hvd.rank(), "size": hvd.size()}
    dense = mlp(0)
    train(dense, distributed(dense, "dense.", hvd.Compression.none), x, y, steps=3)
    for name, cls in METHODS.items():
        # k = d (or a rank as large as the matrices): every method must equal dense allreduce
        full = cls(ratio=1.0, rank=64) if name == "powersgd" else cls(ratio=1.0)
        model = mlp(0)
        train(model, ExchangeOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                       full), x, y, steps=3)
        result[f"{name}_full_max_abs_diff"] = (flat(model) - flat(dense)).abs().max().item()
        # compressed: identical on every rank; bytes counted = bytes predicted from the sizes
        exchange = cls(ratio=0.05, rank=2) if name == "powersgd" else cls(ratio=0.05)
        model = mlp(1)
        opt = ExchangeOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), exchange)
        train(model, opt, x, y, steps=4)
        result[f"{name}_digest"] = digest(model)
        named = sorted(model.named_parameters())
        sizes = [(p.shape[0], p.numel() // p.shape[0]) if p.dim() >= 2 else p.numel() for _, p in named] \
            if name == "powersgd" else [p.numel() for _, p in named]
        result[f"{name}_bytes_counted"] = exchange.bytes_sent / exchange.steps
        result[f"{name}_bytes_predicted"] = exchange.bytes_per_step(sizes, hvd.size())
    with open(os.path.join(out_dir, f"rank{hvd.rank()}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
