"""Runs under ``mpirun``: tree_allreduce against MPI.Allreduce, one JSON file per rank.

    mpirun -np 3 python tests/workers/mpi_merge.py OUT_DIR

One scenario per launch: ``OUT_DIR``.
"""

from __future__ import annotations

import hashlib
import sys

import numpy as np
from mpi4py import MPI
from rank_result import write_result

from gs_horovod.transports.mpi import Communicators, MergeStats, tree_allreduce


def main(out_dir: str) -> None:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    result: dict = {"rank": rank, "size": comm.Get_size(), "cases": {}}
    layouts = {"flat": dict(node_aware=False), "host": dict(), "2_per_host": dict(ranks_per_host=2)}
    for layout, kw in layouts.items():
        comms = Communicators(comm, **kw)
        for dtype in (np.float32, np.float64):
            for n in (1, 1000, 100_003):
                x = np.random.default_rng(rank * 1000 + n).standard_normal(n).astype(dtype)
                stats = MergeStats()
                total = tree_allreduce(x, comms, stats)
                reference = np.empty_like(x)
                comm.Allreduce(x, reference, op=MPI.SUM)
                result["cases"][f"{layout}/{np.dtype(dtype).name}/{n}"] = {
                    "max_abs_diff": float(np.abs(total - reference).max()),
                    "scale": float(np.abs(reference).max()),
                    "digest": hashlib.sha256(total.tobytes()).hexdigest(),
                    "input_unchanged": bool(np.array_equal(
                        x, np.random.default_rng(rank * 1000 + n).standard_normal(n).astype(dtype))),
                    "bytes_sent": stats.bytes_sent,
                    "doubling_rounds": stats.doubling_rounds,
                    "node_rounds": stats.node_rounds,
                    "node_size": comms.node.Get_size(),
                    "is_leader": comms.leaders is not None,
                    "leaders": comms.leaders.Get_size() if comms.leaders is not None else None,
                }
    write_result(out_dir, rank, result)


if __name__ == "__main__":
    main(sys.argv[1])
