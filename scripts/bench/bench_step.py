"""Time of one optimizer step through Horovod's DistributedOptimizer per compressor, and what
Horovod's per-parameter allreduce costs GsSketch on top of its own exchange.

    horovodrun -np 2 -H localhost:2 --gloo python scripts/bench/bench_step.py --repeats 5 --out F.json

Each rank fills every parameter's ``.grad`` with its own fixed random values (no forward or
backward: only the exchange and the adapters are timed) and runs ``opt.step()`` of SGD wrapped
in ``hvd.DistributedOptimizer`` with each compressor, the compressors taking turns step by step
so drift hits all alike; the median over ``--steps`` steps, on rank 0, after ``--warmup``, and
that whole measurement ``--repeats`` times (the thread settings taking turns within a repeat):
the table gives the median of the repeats' medians and their range.

- ``dense``: ``hvd.Compression.none`` (the gradient itself is allreduced);
- ``gs``: ``GsSketch(ratio=--ratio)`` at its other defaults (records each gradient, allreduces
  one float per parameter through Horovod, runs the engine step at the first decompress);
- ``one float``: a compressor that allreduces one float per parameter and returns zeros: the
  part of GsSketch's step that Horovod's per-parameter allreduce costs.

``--level dense`` times the default density's dense level instead (``ratio="auto"`` held
there by ``budget=1e6``: each gradient handed to Horovod in float16, the mean cast into one
buffer, :class:`~gs_horovod.torch_means.DenseMeans`) against ``hvd.Compression.fp16``, in the
``dense`` column.

Thread settings (``--threads``): ``default`` leaves torch's intra-op count as the process
started with it (one thread per core per rank unless OMP_NUM_THREADS is set; horovodrun sets
none) and the engine's Numba kernels take their share of the node (``gs_horovod.threads``);
``one`` is ``torch.set_num_threads(1)`` in every rank (the kernels follow it). The counts in force
are recorded with the times. Run it on an otherwise idle machine: with other jobs on the
cores the ratios are not results.

Models: one parameter of 5,000,000 elements; the MNIST-5k CNN (8 tensors, 824,458 elements);
the LSTM LM at hidden 512 (7 tensors, 1.77M). Prints a table per thread setting; ``--out``
writes every repeat's medians and the thread counts (``scripts/bench/report.py`` tabulates them).
Runs against any gs_horovod that has ``GsSketch``. To time an older adapter, check it out in
this tree and run it there: the venv's editable install of the checkout is found before
PYTHONPATH, so another checkout put first on PYTHONPATH is not what runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import horovod.torch as hvd
import torch
from horovod.torch.compression import Compressor

from gs_bench.runs import code_version
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
    return dict(zip(MODEL_NAMES, (single, MnistCNN(), LstmLM(hidden=512))))


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


THREAD_SETTINGS = ("default", "one")


def set_threads(setting: str, startup: int) -> dict[str, object]:
    """Applies a ``--threads`` setting and returns the counts it puts in force (torch's intra-op
    threads, what the engine's rule gives Numba, and the facts the rule read)."""
    from gs_horovod import threads

    torch.set_num_threads(startup if setting == "default" else 1)
    return {"torch": torch.get_num_threads(), "numba": threads.numba_threads(), "cores": threads.cores(),
            "local_size": threads.local_size(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "NUMBA_NUM_THREADS": os.environ.get("NUMBA_NUM_THREADS")}


def summary(values: list[float]) -> tuple[float, float, float]:
    """(median, min, max) of the repeats' medians."""
    return statistics.median(values), min(values), max(values)


def table(result: dict) -> str:
    """Per thread setting: each model's dense (or FP16), gs and one-float seconds per
    ``opt.step()`` as median [min–max] over the repeats (each a median over the steps), and gs ÷
    dense per repeat."""
    lines, dense = [], {"fp16": "FP16"}.get(result.get("dense"), "dense")
    for setting, counts in result["threads"].items():
        lines += [f"{result['ranks']} ranks, ratio {result['ratio']}, threads '{setting}' (torch {counts['torch']}, "
                  f"Numba {counts['numba']}); seconds per opt.step(): median [min–max] over {result['repeats']} "
                  f"repeats of the median of {result['steps']} steps", "",
                  f"| model | tensors | elements | {dense} | gs | gs / {dense} | one float per tensor |",
                  "|---|---|---|---|---|---|---|"]
        for name, row in result["rows"].items():
            times = row["times"][setting]
            cells = [f"{m:.4f} [{lo:.4f}–{hi:.4f}]" for m, lo, hi in
                     (summary(times[c]) for c in ("dense", "gs", "one float"))]
            ratio = summary([g / d for g, d in zip(times["gs"], times["dense"])])
            lines.append(f"| {name} | {row['tensors']} | {row['params']:,} | {cells[0]} | {cells[1]} "
                         f"| {ratio[0]:.2f} [{ratio[1]:.2f}–{ratio[2]:.2f}] | {cells[2]} |")
        lines.append("")
    return "\n".join(lines).strip()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (``scripts/check_docs.py`` parses every documented command with it)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ratio", type=float, default=0.001)
    p.add_argument("--level", choices=("sparse", "dense"), default="sparse",
                   help="'sparse': GsSketch(ratio=--ratio) against Compression.none; 'dense': the default "
                        "density at its dense level against Compression.fp16")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5, help="times the whole measurement is repeated")
    p.add_argument("--threads", nargs="+", choices=THREAD_SETTINGS, default=list(THREAD_SETTINGS),
                   help="'default': torch's start-up count, the engine's share for Numba; 'one': one per rank")
    p.add_argument("--models", nargs="+", help="a subset of the models, by name")
    p.add_argument("--out")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.steps < 1:
        p.error("--repeats and --steps must be at least 1")
    unknown = set(args.models or ()) - set(MODEL_NAMES)
    if unknown:
        p.error(f"unknown models {sorted(unknown)}; known: {list(MODEL_NAMES)}")
    return args


MODEL_NAMES = ("one 5M tensor", "MNIST CNN", "LSTM LM h512")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    hvd.init()
    startup = torch.get_num_threads()
    chosen = {name: m for name, m in models().items() if not args.models or name in args.models}
    rows = {name: {"params": sum(q.numel() for q in model.parameters()), "tensors": len(list(model.parameters())),
                   "times": {s: {"dense": [], "gs": [], "one float": []} for s in args.threads}}
            for name, model in chosen.items()}
    counts: dict[str, dict] = {}
    for repeat in range(args.repeats):
        order = args.threads[repeat % len(args.threads):] + args.threads[:repeat % len(args.threads)]
        for setting in order:
            counts[setting] = set_threads(setting, startup)
            for name, model in chosen.items():
                dense, gs = ((hvd.Compression.fp16, GsSketch(budget=1e6)) if args.level == "dense"
                             else (hvd.Compression.none, GsSketch(ratio=args.ratio)))
                compressors = {"dense": dense, "gs": gs, "one float": OneFloat}
                for label, seconds in time_steps(model, compressors, args.steps, args.warmup).items():
                    rows[name]["times"][setting][label].append(seconds)
            counts[setting]["numba"] = set_threads(setting, startup)["numba"]
    if hvd.rank() != 0:
        return
    result = {"format": 2, "ranks": hvd.size(), "ratio": args.ratio if args.level == "sparse" else "auto (dense level)",
              "dense": "fp16" if args.level == "dense" else "none", "code": code_version(),
              "steps": args.steps, "warmup": args.warmup,
              "repeats": args.repeats, "threads": {s: counts[s] for s in args.threads}, "rows": rows}
    print(table(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
