"""Seconds per collective against its size, through real Horovod ranks: allreduce, allgather,
alltoall, and the alltoalls with one receiver (pairwise, gather) and broadcast, issued as the
methods issue them (:class:`gs_horovod.transports.horovod.HorovodCollectives`). What
``scripts/bench/cost_model.py --collectives`` fits α and β per collective algorithm from.
Launched by ``scripts/bench/collective_sweep.sh`` on shaped links; rank 0 appends one JSON line
per (collective, size) to ``--out`` (which must not exist unless ``--append`` is given):

    {"kind": "collective", "collective": KIND, "label": LINK, "ranks": P, "bytes": n,
     "seconds": median over repeats, "all_s": [...], "run_id": ..., "code": ...}

(``run_id``: ``--run-id``, else one for this invocation; ``code``: the commit; :mod:`gs_bench.runs`.)

n is the payload one rank contributes (:mod:`gs_horovod.transports.collective_cost`'s convention: alltoall sends
n/P to each rank; pairwise swaps n with rank ^ 1; gather sends n to rank 0; broadcast sends
n from rank 0). One timing is the slowest rank's time from a common start (a tiny allreduce)
to its call's return. Sizes go up until a call's median passes ``--max-call-s``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import horovod.torch as hvd
import torch

from gs_bench.cli import append_jsonl
from gs_bench.one_receiver import gather, pairwise
from gs_bench.runs import add_out_flags, check_out, stamp
from gs_horovod.kernels.torch_ops import TorchOps
from gs_horovod.transports.horovod import HorovodCollectives

KINDS = ("allreduce", "allgather", "alltoall", "pairwise", "gather", "broadcast")
SIZES = (4 << 10, 64 << 10, 512 << 10, 2 << 20, 8 << 20)


def issue(comm: HorovodCollectives, kind: str, x: torch.Tensor, name: str) -> None:
    """One collective of x (n/4,) f32 as ``kind``."""
    P = comm.size
    if kind == "allreduce":
        comm.allreduce(x, name)
    elif kind == "allgather":
        comm.allgather(x, name)
    elif kind == "alltoall":
        comm.alltoall(x, torch.full((P,), x.numel() // P, dtype=torch.int32), name)
    elif kind == "pairwise":
        pairwise(comm, x, comm.rank ^ 1, name)
    elif kind == "gather":
        gather(comm, x, name)
    else:
        comm.broadcast(x, name)


def seconds(comm: HorovodCollectives, kind: str, nbytes: int, repeats: int) -> list[float]:
    """The slowest rank's seconds for each of ``repeats`` calls (after one untimed call)."""
    x = torch.ones(nbytes // 4)
    out = []
    for r in range(repeats + 1):
        hvd.allreduce(torch.zeros(1), name="sweep.start")
        start = time.perf_counter()
        issue(comm, kind, x, f"sweep.{kind}.{nbytes}")
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        slowest = float(hvd.allreduce(elapsed, op=hvd.Max, name="sweep.max")[0])
        out += [slowest] if r else []
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (``scripts/check_docs.py`` parses every documented command with it)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--label", required=True, help="the link setting (local, 100mbit, ...)")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    p.add_argument("--sizes", nargs="+", type=int, default=list(SIZES), help="payload bytes per rank")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-call-s", type=float, default=2.0, help="no larger size once a call's median passes this")
    add_out_flags(p, "one JSON line per collective and size", run_id=True)
    args = p.parse_args(argv)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    check_out(args.out, args.append)
    run_fields = stamp(args.run_id)
    hvd.init()
    P = hvd.size()
    comm = HorovodCollectives(hvd, TorchOps(), hvd.Average, hvd.global_process_set)
    for kind in args.kinds:
        if kind == "pairwise" and P % 2:
            continue  # rank ^ 1 has no partner for the last rank
        for n in sorted(args.sizes):
            n -= n % (4 * P)  # whole f32 elements, split evenly over the ranks
            times = seconds(comm, kind, n, args.repeats)
            median = statistics.median(times)
            if hvd.rank() == 0:
                append_jsonl(args.out, {"kind": "collective", "collective": kind, "label": args.label, "ranks": P,
                                        "bytes": n, "seconds": median, "all_s": times, **run_fields})
                print(f"[sweep] {args.label} P={P} {kind} {n} B: {median * 1e3:.2f} ms", flush=True)
            if median > args.max_call_s:
                break


if __name__ == "__main__":
    main()
