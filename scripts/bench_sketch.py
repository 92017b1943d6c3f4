"""Kernel benchmark: encode (accumulate) + query (all d) + top-k of a d-vector, per backend,
against a CSVec-style torch reference (stored r×d bucket/sign tables, ``index_add_``, an r×d
gather and median) and plain ``torch.topk`` of |x|.

    python scripts/bench_sketch.py --out docs/bench_sketch.json

Prints a Markdown table (median of ``--reps`` runs, seconds) with each backend's time as a
ratio to the reference and to torch.topk, and the memory each keeps besides the table.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from functools import partial

import numpy as np
import torch

from gs_horovod.kernels.hashing import reference_buckets_signs, row_keys
from gs_horovod.sketch import CountSketch
from gs_horovod.torch import TorchOps

ROWS, RATIO, WIDTH = 5, 0.001, 4.0


def timed(fn, reps: int) -> float:
    fn()  # compile / warm caches
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


class StoredTablesSketch:
    """The CSVec approach, re-written here for comparison: r×d int64 buckets and f32 signs
    stored, accumulate by per-row index_add_, query by an r×d gather and a median."""

    def __init__(self, d: int, cols: int, seed: int) -> None:
        buckets, signs = reference_buckets_signs(row_keys(seed, ROWS), cols, 0, d)
        self.buckets, self.signs = torch.from_numpy(buckets), torch.from_numpy(signs)
        self.cols = cols

    def run(self, x: torch.Tensor, k: int) -> torch.Tensor:
        table = torch.zeros(ROWS, self.cols)
        for j in range(ROWS):
            table[j].index_add_(0, self.buckets[j], self.signs[j] * x)
        est = (table.gather(1, self.buckets) * self.signs).median(dim=0).values
        return torch.topk(est.abs(), k, sorted=False).indices

    @property
    def nbytes(self) -> int:
        return self.buckets.numel() * 8 + self.signs.numel() * 4


def measure(d: int, reps: int) -> dict:
    """Median seconds of encode + query + top-k at size d for the reference, each backend and topk."""
    k = max(1, int(RATIO * d))
    cols = int(WIDTH * k)
    x = torch.randn(d, generator=torch.Generator().manual_seed(0))
    ref = StoredTablesSketch(d, cols, seed=0)
    row = {"d": d, "k": k, "cols": cols,
           "reference_s": timed(partial(ref.run, x, k), reps),
           "reference_table_bytes": ref.nbytes,
           "topk_s": timed(lambda: torch.topk(x.abs(), k, sorted=False), reps)}
    del ref
    for backend in ("torch", "numba"):
        ops = TorchOps(backend)
        row[f"{backend}_s"] = timed(lambda ops=ops: CountSketch.zeros(ROWS, cols, 0, ops, x).accumulate(x)
                                    .heavy_hitters(k, d), reps)
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--log2d", type=int, nargs="+", default=[20, 22, 24])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out")
    args = p.parse_args()
    rows = [measure(1 << log2d, args.reps) for log2d in args.log2d]
    print(f"CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads; "
          f"r = {ROWS}, k = {RATIO}·d, cols = {WIDTH}·k; median of {args.reps} runs (s)")
    print("| d | CSVec-style reference | torch ops | Numba CPU | torch.topk | reference / Numba | "
          "Numba / torch.topk | reference tables | our hash state |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| 2^{int(np.log2(r['d']))} | {r['reference_s']:.3f} | {r['torch_s']:.3f} | {r['numba_s']:.3f} "
              f"| {r['topk_s']:.3f} | {r['reference_s'] / r['numba_s']:.1f}× | {r['numba_s'] / r['topk_s']:.1f}× "
              f"| {r['reference_table_bytes'] / 2**20:,.0f} MiB | {ROWS * 8} B |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
