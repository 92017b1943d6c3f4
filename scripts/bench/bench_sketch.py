"""Kernel benchmark: one rank's gs-SGD compression compute for one step, as the engine runs it,
next to ``torch.topk(|x|, k)`` on the same vector in the same run::

    top_abs(a, L·k)                          pre-filter: the L·k largest |a|
    accumulate_at(table, idx, a[idx])        sparse sketch of them
    heavy_hitters(merged, m·k)               pruned query of the merged table (P ranks' sketches)
    top_abs(est, k)                          final choice of k among the m·k

The merged table is the sum of P ranks' sketches of their pre-filtered vectors (lognormal-scaled
normals plus a shared heavy part), built once outside the timing. Also timed: a CSVec-style
torch reference (stored r×D int64 buckets and f32 signs, ``index_add_``, an r×D gather, median,
topk) and a one-pass memory floor (``x.sum()``); GB/s are 4·D bytes over each D-sized phase.

    python scripts/bench/bench_sketch.py --out docs/bench_sketch.json --plot docs/bench_sketch.png
    python scripts/bench/bench_sketch.py --log2-size 24 --ratio 0.001 --quick    # ~1 minute

Prints a Markdown table (median seconds) and, last, ``gs_vs_topk <whole step / topk>`` of the
last configuration.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from typing import Callable

import numba
import torch

from gs_horovod.engine import GsConfig, count_for
from gs_horovod.kernels import torch_ops
from gs_horovod.kernels.hashing import hash_keys, reference_buckets_signs

PHASES = ("top_abs", "accumulate_at", "heavy_hitters", "final_topk")


def timed(fn: Callable[[], object], reps: int) -> float:
    """Median seconds of ``reps`` calls after one warm-up call."""
    fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def rank_vector(d: int, shared_idx: torch.Tensor, shared_val: torch.Tensor, rank: int) -> torch.Tensor:
    """A rank's error-fed vector: lognormal-scaled normal noise plus the shared heavy part."""
    g = torch.Generator().manual_seed(1000 + rank)
    a = torch.randn(d, generator=g) * torch.randn(d, generator=g).mul_(0.5).exp_()
    a[shared_idx] += shared_val
    return a


class StoredTablesSketch:
    """The CSVec approach, for comparison: r×D int64 buckets and f32 signs stored; accumulate by
    per-row index_add_, query by an r×D gather and a median, then topk."""

    def __init__(self, d: int, rows: int, cols: int) -> None:
        buckets, signs = reference_buckets_signs(hash_keys(0), cols, 0, d, rows)
        self.buckets, self.signs = torch.from_numpy(buckets), torch.from_numpy(signs)
        self.rows, self.cols = rows, cols

    def step(self, a: torch.Tensor, merged: torch.Tensor, count: int, k: int) -> torch.Tensor:
        table = torch.zeros(self.rows, self.cols)
        for j in range(self.rows):
            table[j].index_add_(0, self.buckets[j], self.signs[j] * a)
        est = (merged.gather(1, self.buckets) * self.signs).median(dim=0).values
        cand = torch.topk(est.abs(), count, sorted=False).indices
        return cand[torch.topk(est[cand].abs(), k, sorted=False).indices]

    @property
    def nbytes(self) -> int:
        return self.buckets.numel() * 8 + self.signs.numel() * 4


def reference(a: torch.Tensor, merged: torch.Tensor, rows: int, cols: int, count: int, k: int,
              reps: int) -> tuple[float, int]:
    """Seconds of the CSVec-style step and the bytes it keeps (stored tables + the r×D gather)."""
    ref = StoredTablesSketch(a.numel(), rows, cols)
    return timed(lambda: ref.step(a, merged, count, k), reps), ref.nbytes + rows * a.numel() * 4


def measure(log2d: int, ratio: float, args: argparse.Namespace) -> dict:
    d = 1 << log2d
    k = count_for(ratio, d)
    lk, count, cols = min(d, math.ceil(args.prefilter * k)), min(d, args.candidates * k), math.ceil(args.width * k)
    rows, backend, keys, reps = args.rows, args.backend, hash_keys(0), args.reps
    g = torch.Generator().manual_seed(0)
    shared_idx = torch.randperm(d, generator=g)[:k]
    shared_val = torch.randn(k, generator=g) * 8
    merged = torch.zeros(rows, cols)
    for rank in range(args.ranks):  # the merged table: P ranks' pre-filtered sketches
        a = rank_vector(d, shared_idx, shared_val, rank)
        idx = torch_ops.top_abs(backend, a, lk)
        torch_ops.accumulate_at(backend, merged, idx, a[idx], keys)
    a = rank_vector(d, shared_idx, shared_val, 0)
    table = torch.zeros(rows, cols)
    idx = torch_ops.top_abs(backend, a, lk)
    cand, est = torch_ops.heavy_hitters(backend, merged, keys, d, count)

    def accumulate() -> None:
        table.zero_()
        torch_ops.accumulate_at(backend, table, idx, a[idx], keys)

    def step() -> torch.Tensor:
        sel = torch_ops.top_abs(backend, a, lk)
        table.zero_()
        torch_ops.accumulate_at(backend, table, sel, a[sel], keys)
        c, e = torch_ops.heavy_hitters(backend, merged, keys, d, count)
        return c[torch_ops.top_abs(backend, e, k)]

    row = {"log2d": log2d, "d": d, "ratio": ratio, "k": k, "prefilter": lk, "candidates": count, "rows": rows,
           "cols": cols, "ranks": args.ranks, "backend": backend, "threads": torch.get_num_threads(),
           "sum_s": timed(lambda: a.sum(), reps),
           "topk_s": timed(lambda: torch.topk(a.abs(), k, sorted=False), reps),
           "top_abs_s": timed(lambda: torch_ops.top_abs(backend, a, lk), reps),
           "accumulate_at_s": timed(accumulate, reps),
           "heavy_hitters_s": timed(lambda: torch_ops.heavy_hitters(backend, merged, keys, d, count), reps),
           "final_topk_s": timed(lambda: torch_ops.top_abs(backend, est, k), reps),
           "step_s": timed(step, reps)}
    row["topk_s_after"] = timed(lambda: torch.topk(a.abs(), k, sorted=False), reps)  # drift check
    row["reference_s"], row["reference_bytes"] = reference(a, merged, rows, cols, count, k, max(1, reps // 3))
    row["ours_bytes"] = 8 + rows * cols * 4 + lk * 8 + count * 12 * (1 + numba.get_num_threads())
    return row


def gbs(d: int, seconds: float) -> float:
    return 4 * d / seconds / 1e9


def table_lines(results: list[dict], args: argparse.Namespace) -> list[str]:
    lines = [f"CPU: {platform.processor() or platform.machine()}, {results[0]['threads']} threads; backend "
             f"{args.backend}; r = {args.rows}, cols = {args.width}·k, m = {args.candidates}, L = {args.prefilter}, "
             f"P = {args.ranks} ranks merged; median of {args.reps} runs (s); GB/s = 4·D bytes / time",
             "| D | k | x.sum() floor | top_abs(L·k) | accumulate_at | heavy_hitters(m·k) | final top-k | "
             "**gs step** | torch.topk | **step / topk** | CSVec-style ref | ref / step | extra memory: ours / ref |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        topk = min(r["topk_s"], r["topk_s_after"])
        lines.append(
            f"| 2^{r['log2d']} | {r['k']:,} (D/{round(1 / r['ratio'])}) "
            f"| {r['sum_s']:.4f} ({gbs(r['d'], r['sum_s']):.1f}) "
            f"| {r['top_abs_s']:.4f} ({gbs(r['d'], r['top_abs_s']):.1f}) | {r['accumulate_at_s']:.4f} "
            f"| {r['heavy_hitters_s']:.4f} ({gbs(r['d'], r['heavy_hitters_s']):.1f}) | {r['final_topk_s']:.4f} "
            f"| **{r['step_s']:.4f}** | {topk:.4f} ({gbs(r['d'], topk):.1f}) | **{r['step_s'] / topk:.2f}×** "
            f"| {r['reference_s']:.3f} | {r['reference_s'] / r['step_s']:.0f}× "
            f"| {r['ours_bytes'] / 2**20:,.1f} MiB / {r['reference_bytes'] / 2**20:,.0f} MiB |")
    return lines


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["log2d"] for r in results})
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.5 * len(sizes), 4), squeeze=False)
    for ax, log2d in zip(axes[0], sizes):
        rs = [r for r in results if r["log2d"] == log2d]
        labels = [f"k = D/{round(1 / r['ratio'])}" for r in rs]
        x = range(len(rs))
        bottom = [0.0] * len(rs)
        for phase in PHASES:
            h = [r[f"{phase}_s"] * 1e3 for r in rs]
            ax.bar([i - 0.2 for i in x], h, 0.4, bottom=bottom, label=phase)
            bottom = [b + v for b, v in zip(bottom, h)]
        ax.bar([i + 0.2 for i in x], [min(r["topk_s"], r["topk_s_after"]) * 1e3 for r in rs], 0.4,
               color="grey", label="torch.topk(|x|, k)")
        ax.set_xticks(list(x), labels)
        ax.set_ylabel("ms per step (one rank)")
        ax.set_title(f"D = 2^{log2d}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (``scripts/check_docs.py`` parses every documented command with it)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--log2-size", type=int, nargs="+", default=[24, 26])
    p.add_argument("--ratio", type=float, nargs="+", default=[0.01, 0.001])
    shipped = GsConfig()  # GsSketch's defaults
    p.add_argument("--rows", type=int, default=shipped.rows)
    p.add_argument("--width", type=float, default=shipped.width, help="cols = ceil(width · k)")
    p.add_argument("--candidates", type=int, default=shipped.candidates, help="m: heavy_hitters returns m·k")
    p.add_argument("--prefilter", type=float, default=float(shipped.prefilter), help="L: the pre-filter keeps L·k")
    p.add_argument("--ranks", type=int, default=16, help="P: ranks summed into the merged table")
    p.add_argument("--backend", default="numba", choices=["numba", "torch", "cuda"])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="3 runs per timing")
    p.add_argument("--out")
    p.add_argument("--plot")
    args = p.parse_args(argv)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.quick:
        args.reps = 3
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    results = [measure(log2d, ratio, args) for log2d in args.log2_size for ratio in args.ratio]
    print("\n".join(table_lines(results, args)))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    if args.plot:
        plot(results, args.plot)
    last = results[-1]
    print(f"gs_vs_topk {last['step_s'] / min(last['topk_s'], last['topk_s_after']):.3f}")


if __name__ == "__main__":
    main()
