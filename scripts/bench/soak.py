"""Soak: 5,000 GsSketch steps of the digits MLP on every rank, resident memory sampled.

    horovodrun -np 2 -H localhost:2 --gloo python scripts/bench/soak.py --steps 5000 --out docs/soak.json

Rank 0 prints RSS (MiB) every ``--every`` steps for each rank, the growth from the first
sample after ``--settle`` steps to the largest later one, and how many per-tensor states
GsSketch holds (which must stay the number of compressed parameters).
"""

from __future__ import annotations

import argparse
import json

import horovod.torch as hvd
import psutil
import torch
import torch.nn.functional as F

from gs_bench.workloads import digits_mlp, digits_shard
from gs_horovod.torch import GsSketch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (``scripts/check_docs.py`` parses every documented command with it)."""
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5000)
    p.add_argument("--every", type=int, default=500)
    p.add_argument("--settle", type=int, default=500, help="steps before the baseline sample")
    p.add_argument("--out")
    args = p.parse_args(argv)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    hvd.init()
    torch.set_num_threads(1)
    x, y = map(torch.from_numpy, digits_shard(hvd.rank(), hvd.size())[:2])
    torch.manual_seed(0)
    model = digits_mlp(64)
    gs = GsSketch(ratio=0.02, min_size=64)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), compression=gs)
    g = torch.Generator().manual_seed(hvd.rank())
    proc = psutil.Process()
    samples = []
    for done in range(args.every, args.steps + 1, args.every):
        for _ in range(args.every):
            batch = torch.randint(0, len(x), (32,), generator=g)
            opt.zero_grad()
            F.cross_entropy(model(x[batch]), y[batch]).backward()
            opt.step()
        rss = torch.tensor([proc.memory_info().rss / 2**20])
        samples.append({"step": done, "rss_mib": hvd.allgather(rss, name=f"rss{done}").tolist(),
                        "states": len(gs.local_state_dict()["tensors"])})
    if hvd.rank() == 0:
        base = next(s for s in samples if s["step"] >= args.settle)
        growth = [max(s["rss_mib"][r] for s in samples if s["step"] >= base["step"]) / base["rss_mib"][r] - 1
                  for r in range(hvd.size())]
        for s in samples:
            print(f"step {s['step']:6d}  RSS MiB per rank {[round(v, 1) for v in s['rss_mib']]}  "
                  f"tensor states {s['states']}")
        print(f"growth after step {base['step']}: " + ", ".join(f"rank {r} {100 * g:+.2f} %"
                                                                for r, g in enumerate(growth)))
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"samples": samples, "growth": growth, "steps": args.steps}, f, indent=1)


if __name__ == "__main__":
    main()
