"""Latency and bytes of merging a sketch buffer: gs_horovod's tree_allreduce (flat recursive
doubling, and node-aware), Horovod's allreduce, and MPI.Allreduce. Run under MPI:

    horovodrun -np 4 -H localhost:4 --mpi --mpi-args="--oversubscribe --bind-to none" \\
        python scripts/bench/bench_merge.py --out docs/merge_benchmark_P4.json

Rank 0 prints a Markdown table (median of ``--reps`` timed calls after 3 warm-up calls) and
writes the raw numbers to ``--out``. Bytes are what one rank sends per call: counted by
MergeStats for the tree; for Horovod and MPI their own algorithms decide (not observable).
``--quick`` times only the two smallest buffers, 3 calls each: a smoke run of seconds.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import horovod.torch as hvd
import numpy as np
import torch
from mpi4py import MPI

from gs_horovod.transports.mpi import Communicators, MergeStats, tree_allreduce

SIZES = [10_000, 100_000, 1_000_000, 10_000_000]  # bytes of float32 sketch


def timed(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    samples = []
    for _ in range(reps):
        MPI.COMM_WORLD.Barrier()
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def measure(nbytes: int, comm: MPI.Comm, flat: Communicators, node: Communicators, reps: int) -> dict:
    """Median latencies (ms) of the four merges of a float32 buffer of ``nbytes``."""
    x = np.random.default_rng(hvd.rank()).standard_normal(nbytes // 4).astype(np.float32)
    t = torch.from_numpy(x.copy())
    out = np.empty_like(x)
    stats = {"flat": MergeStats(), "node": MergeStats()}
    row = {
        "bytes": nbytes,
        "tree_flat_ms": timed(lambda: tree_allreduce(x, flat, stats["flat"]), reps),
        "tree_node_aware_ms": timed(lambda: tree_allreduce(x, node, stats["node"]), reps),
        "horovod_ms": timed(lambda: hvd.allreduce(t, op=hvd.Sum, name=f"bench{nbytes}"), reps),
        "mpi_allreduce_ms": timed(lambda: comm.Allreduce(x, out, op=MPI.SUM), reps),
    }
    for key in ("flat", "node"):
        row[f"tree_{key}_bytes_sent_rank0"] = comm.bcast(stats[key].bytes_sent / stats[key].calls, root=0)
        row[f"tree_{key}_rounds_rank0"] = comm.bcast(stats[key].doubling_rounds / stats[key].calls, root=0)
    return row


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (``scripts/check_docs.py`` parses every documented command with it)."""
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="the two smallest buffers, 3 timed calls each")
    p.add_argument("--out")
    args = p.parse_args(argv)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sizes = SIZES[:2] if args.quick else SIZES
    if args.quick:
        args.reps = 3
    hvd.init()
    comm = MPI.COMM_WORLD.Dup()
    flat, node = Communicators(comm, node_aware=False), Communicators(comm)
    rows = [measure(nbytes, comm, flat, node, args.reps) for nbytes in sizes]
    if hvd.rank() == 0:
        print(f"P = {hvd.size()} ranks on {platform.node()} ({MPI.Get_library_version().splitlines()[0]}), "
              f"median of {args.reps} calls, ms")
        print("| sketch bytes | tree flat | tree node-aware | Horovod allreduce | MPI.Allreduce "
              "| tree flat bytes sent (rank 0) | doubling rounds (rank 0) |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['bytes']:,} | {r['tree_flat_ms']:.3f} | {r['tree_node_aware_ms']:.3f} | {r['horovod_ms']:.3f} "
                  f"| {r['mpi_allreduce_ms']:.3f} | {r['tree_flat_bytes_sent_rank0']:,.0f} "
                  f"| {r['tree_flat_rounds_rank0']:.0f} |")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"ranks": hvd.size(), "reps": args.reps, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
