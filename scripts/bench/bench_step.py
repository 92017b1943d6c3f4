"""Time of one optimizer step through Horovod's DistributedOptimizer per compressor, and what
Horovod's per-parameter allreduce costs GsSketch on top of its own exchange.

    horovodrun -np 2 -H localhost:2 --gloo python scripts/bench/bench_step.py --out docs/bench_step.json

Each rank fills every parameter's ``.grad`` with its own fixed random values (no forward or
backward: only the exchange and the adapters are timed) and runs ``opt.step()`` of SGD wrapped
in ``hvd.DistributedOptimizer`` with each compressor, the compressors taking turns step by step
so drift hits all alike; the median over ``--steps`` steps, on rank 0, after ``--warmup``:

- ``dense``: ``hvd.Compression.none`` (the gradient itself is allreduced);
- ``gs``: ``GsSketch(ratio=--ratio)`` at its other defaults (records each gradient, allreduces
  one float per parameter through Horovod, runs the engine step at the first decompress);
- ``one float``: a compressor that allreduces one float per parameter and returns zeros: the
  part of GsSketch's step that Horovod's per-parameter allreduce costs.

Models: one parameter of 5,000,000 elements; the MNIST-5k CNN (8 tensors, 824,458 elements);
the LSTM LM at hidden 512 (5 tensors, 1.77M). Prints a table; ``--out`` writes the medians.
Runs against any gs_horovod that has ``GsSketch`` (put another checkout first on PYTHONPATH to
time an older adapter).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import horovod.torch as hvd
import torch
from horovod.torch.compression import Compressor

from gs_bench.workloads import LstmLM, MnistCNN
from gs_horovod.torch import GsSketch


class OneFloat(Compressor):
    """Sends one float per parameter through Horovod and returns zeros of the gradient's shape."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        return tensor.new_zeros(1), (tensor.shape, tensor.dtype)

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: tuple) -> torch.Tensor:
        return torch.zeros(ctx[0], dtype=ctx[1])


def models() -> dict[str, torch.nn.Module]:
    single = torch.nn.Module()
    single.weight = torch.nn.Parameter(torch.zeros(5_000_000))
    return {"one 5M tensor": single, "MNIST CNN": MnistCNN(), "LSTM LM h512": LstmLM(hidden=512)}


def time_steps(model: torch.nn.Module, compressors: dict[str, object], steps: int, warmup: int) -> dict[str, float]:
    """Median seconds of ``opt.step()`` per compressor, the compressors taking turns."""
    gen = torch.Generator().manual_seed(hvd.rank())
    grads = [torch.randn(p.shape, generator=gen) for p in model.parameters()]
    opts = {}
    for label, compression in compressors.items():
        opts[label] = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                               named_parameters=model.named_parameters(),
                                               compression=compression)
    times: dict[str, list[float]] = {label: [] for label in compressors}
    for i in range(warmup + steps):
        for label, opt in opts.items():
            for p, g in zip(model.parameters(), grads):
                p.grad = g.clone()
            hvd.barrier()
            start = time.perf_counter()
            opt.step()
            if i >= warmup:
                times[label].append(time.perf_counter() - start)
    return {label: statistics.median(t) for label, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ratio", type=float, default=0.001)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out")
    args = p.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    rows = {}
    for name, model in models().items():
        compressors = {"dense": hvd.Compression.none, "gs": GsSketch(ratio=args.ratio), "one float": OneFloat}
        rows[name] = {"params": sum(q.numel() for q in model.parameters()),
                      "tensors": len(list(model.parameters())),
                      **time_steps(model, compressors, args.steps, args.warmup)}
    if hvd.rank() != 0:
        return
    print(f"{hvd.size()} ranks, ratio {args.ratio}, median of {args.steps} steps (seconds per opt.step())")
    print("| model | tensors | elements | dense | gs | gs / dense | one float per tensor |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['tensors']} | {r['params']:,} | {r['dense']:.4f} | {r['gs']:.4f} | "
              f"{r['gs'] / r['dense']:.2f} | {r['one float']:.4f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"ranks": hvd.size(), "ratio": args.ratio, "steps": args.steps, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
