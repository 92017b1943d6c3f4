"""MPI ping-pong between ranks 0 and 1: latency α and bandwidth β of the link between them,
fitted as one-way time t(n) = α + n / β over message sizes n. Run by
``scripts/bench/bench_throughput.sh`` inside the shaped network; rank 0 appends one JSON line
(``"kind": "pingpong"``, with ``run_id`` and ``code``: :mod:`gs_bench.runs`) to ``--out``, which
must not exist unless ``--append`` is given.

    mpirun -np 2 ... python scripts/bench/pingpong.py --label 1gbit --out results.jsonl
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

from gs_bench.cli import append_jsonl
from gs_bench.runs import add_out_flags, check_out, stamp

SIZES = (8, 1024, 65_536, 1 << 20, 4 << 20, 16 << 20)


def one_way_seconds(comm: MPI.Comm, nbytes: int, repeats: int) -> float:
    """Median one-way time (half a round trip) of ``nbytes`` between ranks 0 and 1."""
    buf = np.zeros(nbytes, dtype=np.uint8)
    rank, times = comm.Get_rank(), []
    for _ in range(repeats + 1):  # the first round trip warms the connection up
        comm.Barrier()
        start = time.perf_counter()
        if rank == 0:
            comm.Send(buf, dest=1)
            comm.Recv(buf, source=1)
        elif rank == 1:
            comm.Recv(buf, source=0)
            comm.Send(buf, dest=0)
        times.append((time.perf_counter() - start) / 2)
    return float(np.median(times[1:]))


def fit(sizes: list[int], seconds: list[float]) -> tuple[float, float]:
    """(α, β) of t = α + n / β: α from the smallest message, β the least-squares slope over the
    messages of 1 MiB and more (tc's token bucket lets smaller ones through at line rate)."""
    n, t = np.asarray(sizes, float), np.asarray(seconds, float)
    big = n >= (1 << 20)
    slope = np.polyfit(n[big], t[big], 1)[0]
    return float(t[np.argmin(n)]), 1.0 / float(slope)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (``scripts/check_docs.py`` parses every documented command with it)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--label", default="")
    p.add_argument("--repeats", type=int, default=5)
    add_out_flags(p, "one JSON line", run_id=True)
    args = p.parse_args(argv)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    check_out(args.out, args.append)
    run_fields = stamp(args.run_id)
    comm = MPI.COMM_WORLD
    seconds = [one_way_seconds(comm, n, args.repeats if n < (4 << 20) else 3) for n in SIZES]
    if comm.Get_rank() == 0:
        alpha, beta = fit(list(SIZES), seconds)
        row = {"kind": "pingpong", "label": args.label, "alpha_s": alpha, "beta_bytes_per_s": beta,
               "sizes": list(SIZES), "one_way_s": seconds, **run_fields}
        append_jsonl(args.out, row)


if __name__ == "__main__":
    main()
