"""Steps per second of one method training the byte-level LSTM language model
(``workloads.LstmLM``, 11.48M parameters) on the standard library's ``.py`` sources
(``workloads.stdlib_text``, this rank's shard of the training files). Launched by
``scripts/bench_throughput.sh`` on ranks in separate network namespaces. Rank 0 appends one
JSON line to ``--out`` with steps/s, the payload bytes per step and the collectives of one
step (``[kind, bytes]``, kinds as in ``scripts/cost_model.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import time

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from demo_common import add_compression_flags, gs_options
from workloads import LstmLM, stdlib_text, text_batch

from gs_horovod.baselines import METHODS, distributed_optimizer
from gs_horovod.torch import GsSketch


def collectives(method: str, exchange_or_gs, named: list, ranks: int, powersgd_rank: int,
                steps: int) -> list[list]:
    """The collectives one step issues, as [kind, bytes per rank]: "allreduce" (ring), "allgather"
    (ring, bytes this rank contributes), "pairwise" (one recursive-doubling exchange),
    "gather" (every rank to rank 0), "broadcast" (from rank 0)."""
    dense = sum(p.numel() * 4 for _, p in named)
    if method in ("none", "fp16"):
        return [["allreduce", dense // (2 if method == "fp16" else 1)]]
    if method == "gs":
        s = exchange_or_gs.stats
        out = [["allreduce", (s.sketch_bytes + s.dense_bytes) / steps]]
        return out + ([["allreduce", s.exact_bytes / steps]] if s.exact_bytes else [])
    ex = exchange_or_gs
    sizes = [p.numel() for _, p in named]
    if method == "topk":
        half = ex.bytes_per_step(sizes, ranks) / 2
        return [["allgather", half], ["allgather", half]]
    if method == "gtopk":
        per_round = sum(4 * ex.k_for(d) for d in sizes)
        return [["pairwise", per_round]] * (2 * int(math.log2(ranks)))
    if method == "sketched":
        sketch = sum(4 * ex.rows * ex._cols(d) for d in sizes)
        cands = sum(min(d, ex.p2 * ex.k_for(d)) for d in sizes)
        return [["gather", sketch], ["broadcast", 8 * cands], ["allreduce", 4 * cands]]
    if method == "powersgd":
        shapes = [(p.shape[0], p.numel() // p.shape[0]) if p.dim() >= 2 else (p.numel(), 1) for _, p in named]
        low = [s for s in shapes if min(s) > powersgd_rank]
        flat = sum(4 * n * m for n, m in shapes if min(n, m) <= powersgd_rank)
        return ([["allreduce", flat]] if flat else []) + [
            ["allreduce", sum(4 * n * powersgd_rank for n, _ in low)],
            ["allreduce", sum(4 * m * powersgd_rank for _, m in low)]]
    raise ValueError(f"unknown method {method!r}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_compression_flags(p, ["gs", "none", "fp16", *METHODS])
    p.add_argument("--powersgd-rank", type=int, default=4)
    p.add_argument("--batch", type=int, default=2, help="windows per rank per step")
    p.add_argument("--seq", type=int, default=16, help="bytes per window")
    p.add_argument("--hidden", type=int, default=1536)
    p.add_argument("--steps", type=int, default=3, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (kernel compilation)")
    p.add_argument("--label", default="", help="e.g. the link rate")
    p.add_argument("--out")
    args = p.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    corpus = stdlib_text(hvd.rank(), hvd.size())
    model = LstmLM(hidden=args.hidden)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    named = list(model.named_parameters())
    base = torch.optim.SGD(model.parameters(), lr=0.01)
    if args.compression == "gs":
        handle = GsSketch(**gs_options(args))
        opt = hvd.DistributedOptimizer(base, named_parameters=named, compression=handle)
        bytes_per_step = lambda: handle.stats.total_bytes / max(1, handle.stats.steps)  # noqa: E731
    else:
        extra = {"ratio": args.ratio} if args.ratio is not None else {}
        if args.compression == "powersgd":
            extra["powersgd_rank"] = args.powersgd_rank
        opt, bytes_per_step = distributed_optimizer(args.compression, base, named, **extra)
        handle = getattr(opt, "exchange", None)
    g = torch.Generator().manual_seed(hvd.rank())

    def step() -> None:
        inputs, targets = text_batch(corpus.train, args.batch, args.seq, g)
        opt.zero_grad()
        logits = model(inputs)
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    hvd.allreduce(torch.zeros(1), name="barrier.start")
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    hvd.allreduce(torch.zeros(1), name="barrier.end")
    seconds = time.perf_counter() - start
    if hvd.rank() == 0:
        row = {"kind": "run", "label": args.label, "method": args.compression,
               "ratio": args.ratio, "gs_options": gs_options(args) if args.compression == "gs" else {},
               "ranks": hvd.size(), "batch": args.batch, "seq": args.seq,
               "params": sum(q.numel() for _, q in named), "steps": args.steps,
               "steps_per_s": args.steps / seconds, "bytes_per_step": bytes_per_step(),
               "collectives": collectives(args.compression, handle, named, hvd.size(), args.powersgd_rank,
                                          args.warmup + args.steps)}
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
