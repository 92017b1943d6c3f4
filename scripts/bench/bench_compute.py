"""Compression compute per method, side by side: one rank's whole compression work per step
(error feedback, selection, sketching, the merges it computes, the update and residual),
with P ranks simulated in one process (``gs_horovod.transports.simulated``: one rank runs at a time, so
each rank's time outside collectives is its own, uncontended; collectives cost nothing here).
The busiest rank's time is reported (Sketched-SGD: rank 0, which merges P sketches).

    python scripts/bench/bench_compute.py --out docs/bench_compute.json      # D = 2^24, P = 4, 16, k = D/100, D/1000
    python scripts/bench/bench_compute.py --quick                            # P = 4, k = D/1000, one timed step
    python scripts/bench/bench_compute.py --codec --wire compact8 --out R.json   # the E4M3 codec's share

D = 2^24 float32 coordinates as three matrices (4096×2048, 4096×1024, 2048×2048), each rank
with its own N(0, 1) gradient; every method runs with global scope (one selection over all D),
with the project's kernels (``top_abs``, the Count-Sketch kernels) and one torch/Numba thread
per rank. gs-SGD is the engine (``GsSgd``) at GsSketch's defaults (at P = 4 the allgather,
from P = 5 the sparse exchange), with the sparse exchange forced, and with the paper's sketch.
The output ends with ``sparse_vs_topk_allgather <ratio>``, ``defaults_vs_topk_allgather
<ratio>`` and ``gtopk_vs_topk_allgather <ratio>``: the forced sparse exchange's, GsSketch's
defaults' and gTop-k's compute over top-k allgather's at P = 4, k = D/1000; then
``compact_vs_fp32 defaults <x> sparse <y>``: the defaults' and the sparse exchange's compute with
the compact wire over the same with ``wire="fp32"`` (what encoding and decoding add). It starts
with ``codec_vs_selection`` for each (P, k): the defaults' seconds encoding and decoding compact
pairs over their seconds selecting (``top_abs``), the busiest rank, per step (``--codec``: only
these lines; with ``--out``, their rows).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable

import torch

from gs_bench.baselines import GTopK, PowerSGD, SketchedSGD, TopKAllgather
from gs_horovod.engine import GsConfig, GsSgd, Plan
from gs_horovod.kernels.torch_ops import TorchOps
from gs_horovod.transports.simulated import SimulatedRanks

SHAPES = [(4096, 2048), (4096, 1024), (2048, 2048)]  # 2^24 coordinates
NAMES = [f"layer{i}.weight" for i in range(len(SHAPES))]


class GsRank:
    """One rank's gs-SGD state as the adapters keep it (a flat residual), stepping the real
    engine (``GsSgd.step``) with the rank's collectives."""

    def __init__(self, ratio: float, shapes: list[tuple[int, ...]], ranks: int, **options: Any) -> None:
        self.config = GsConfig(ratio=ratio, **options)
        self.ops = TorchOps(self.config.backend)
        sizes = [s[0] * s[1] for s in shapes]
        self.plan = Plan.build(NAMES[:len(sizes)], sizes, self.config, ranks=ranks)
        self.residual = torch.zeros(sum(sizes))
        self.steps = 0

    def reduce(self, named: list[tuple[str, torch.Tensor]], comm: Any) -> torch.Tensor:
        out = GsSgd(self.config, self.ops, comm).step(self.plan, [g.reshape(-1) for _, g in named],
                                                      self.residual, None, self.steps, self.steps == 0)
        self.residual, self.steps = out.residual, out.steps
        return out.update


METHODS: dict[str, Callable[[float, list, int], Any]] = {  # (ratio, shapes, ranks) → one rank's method
    "gs-SGD (defaults)": GsRank,
    "gs-SGD (wire=fp32)": lambda r, shapes, P: GsRank(r, shapes, P, wire="fp32"),
    "gs-SGD (wire=compact8)": lambda r, shapes, P: GsRank(r, shapes, P, wire="compact8"),
    "gs-SGD (exchange=sparse)": lambda r, shapes, P: GsRank(r, shapes, P, exchange="sparse"),
    "gs-SGD (exchange=sparse, wire=fp32)": lambda r, shapes, P: GsRank(r, shapes, P, exchange="sparse", wire="fp32"),
    "gs-SGD (exchange=sketch)": lambda r, shapes, P: GsRank(r, shapes, P, exchange="sketch"),
    "top-k allgather": lambda r, shapes, P: TopKAllgather(ratio=r),
    "gTop-k": lambda r, shapes, P: GTopK(ratio=r),
    "Sketched-SGD (published sizes)": lambda r, shapes, P: SketchedSGD(ratio=r),
    "PowerSGD r1": lambda r, shapes, P: PowerSGD(rank=1),
    "PowerSGD r4": lambda r, shapes, P: PowerSGD(rank=4),
}


RATIOS = {  # the summary lines at P = 4, k = D/1000: (method, over this method)
    "sparse_vs_topk_allgather": ("gs-SGD (exchange=sparse)", "top-k allgather"),
    "defaults_vs_topk_allgather": ("gs-SGD (defaults)", "top-k allgather"),
    "gtopk_vs_topk_allgather": ("gTop-k", "top-k allgather"),
}


def measure(methods: list[str], ratio: float, ranks: int, shapes: list[tuple[int, ...]], steps: int) -> list[dict]:
    """Seconds of the busiest rank's compute per step for each method: median (and min, max)
    over ``steps`` timed steps after one untimed step (kernel compilation, warm starts). The
    methods take turns step by step, so a change in the machine's load hits them alike."""
    grads = []
    for r in range(ranks):
        g = torch.Generator().manual_seed(r)
        grads.append([(n, torch.randn(s, generator=g)) for n, s in zip(NAMES, shapes)])
    states = {m: [METHODS[m](ratio, shapes, ranks) for _ in range(ranks)] for m in methods}
    times: dict[str, list[float]] = {m: [] for m in methods}
    for step in range(steps + 1):
        for m in methods:
            group = SimulatedRanks(ranks)

            def one_step(rank: int, comm: Any, m: str = m) -> None:
                torch.set_num_threads(1)
                states[m][rank].reduce(grads[rank], comm)

            group.run(one_step)
            if step:
                times[m].append(max(group.compute_seconds))
    return [{"method": m, "ratio": ratio, "ranks": ranks, "dim": sum(a * b for a, b in shapes),
             "median_s": statistics.median(t), "min_s": min(t), "max_s": max(t), "steps": steps}
            for m, t in times.items()]


class TimedOps(TorchOps):
    """TorchOps that adds up the seconds spent rounding values to the wire, encoding and decoding
    compact pairs, and selecting (``top_abs``) in ``seconds`` (keys "codec", "selection")."""

    def __init__(self, backend: str = "auto") -> None:
        super().__init__(backend)
        self.seconds = {"codec": 0.0, "selection": 0.0}

    def _timed(self, key: str, fn: Callable, *args: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*args)
        self.seconds[key] += time.perf_counter() - t0
        return out

    def wire_rounded(self, *args: Any) -> Any:
        return self._timed("codec", super().wire_rounded, *args)

    def pack_pairs(self, *args: Any) -> Any:
        return self._timed("codec", super().pack_pairs, *args)

    def unpack_pairs(self, *args: Any) -> Any:
        return self._timed("codec", super().unpack_pairs, *args)

    def top_abs(self, *args: Any) -> Any:
        return self._timed("selection", super().top_abs, *args)


def codec_share(ratio: float, ranks: int, shapes: list[tuple[int, ...]], steps: int, wire: str = "compact") -> dict:
    """The compact codec's share of the defaults' step (with ``wire``): the busiest rank's seconds
    encoding and decoding pairs (and rounding its values to them: ``wire_rounded``) and its seconds selecting
    (``top_abs``: the pre-filter and, under the sparse exchange, the owners' selection), over
    ``steps`` steps after one untimed, one thread."""
    grads = []
    for r in range(ranks):
        g = torch.Generator().manual_seed(r)
        grads.append([(n, torch.randn(s, generator=g)) for n, s in zip(NAMES, shapes)])
    states = [GsRank(ratio, shapes, ranks, wire=wire) for _ in range(ranks)]
    for state in states:
        state.ops = TimedOps(state.config.backend)
    for step in range(steps + 1):
        if step == 1:
            for state in states:
                state.ops.seconds = {"codec": 0.0, "selection": 0.0}

        def one_step(rank: int, comm: Any) -> None:
            torch.set_num_threads(1)
            states[rank].reduce(grads[rank], comm)

        SimulatedRanks(ranks).run(one_step)
    busiest = max(states, key=lambda s: s.ops.seconds["codec"])
    return {"ranks": ranks, "ratio": ratio, "wire": wire, "exchange": states[0].plan.exchange,
            "codec_s": busiest.ops.seconds["codec"] / steps, "selection_s": busiest.ops.seconds["selection"] / steps}


def table(rows: list[dict]) -> str:
    cells = sorted({(r["ranks"], r["ratio"]) for r in rows}, key=lambda c: (c[0], -c[1]))
    at = {(r["method"], r["ranks"], r["ratio"]): r for r in rows}
    head = " | ".join(f"P = {P}, k = D/{round(1 / ratio)}" for P, ratio in cells)
    lines = [f"| method (busiest rank, s/step: median [min–max]) | {head} |", "|---|" + "---|" * len(cells)]
    for m in dict.fromkeys(r["method"] for r in rows):
        out = []
        for P, ratio in cells:
            r = at.get((m, P, ratio))
            out.append(f"{r['median_s']:.3f} [{r['min_s']:.3f}–{r['max_s']:.3f}]" if r else "")
        lines.append(f"| {m} | " + " | ".join(out) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (``scripts/check_docs.py`` parses every documented command with it)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, nargs="+", default=[4, 16])
    p.add_argument("--ratios", type=float, nargs="+", default=[0.01, 0.001])
    p.add_argument("--steps", type=int, default=3, help="timed steps per cell")
    p.add_argument("--scale", type=int, default=1, help="divide every matrix's rows by this (smaller D)")
    p.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS), metavar="METHOD",
                   help=f"a subset of {list(METHODS)} (default: all)")
    p.add_argument("--quick", action="store_true", help="P = 4, k = D/1000, one timed step")
    p.add_argument("--codec", action="store_true",
                   help="only the codec's time over the selection's (codec_vs_selection lines)")
    p.add_argument("--wire", choices=["compact", "compact8"], default="compact",
                   help="the pair wire of the codec_vs_selection lines")
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args(argv)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.quick:
        args.ranks, args.ratios, args.steps = [4], [0.001], 1
    shapes = [(a // args.scale, b) for a, b in SHAPES]
    torch.set_num_threads(1)
    shares = []
    for P in args.ranks:
        for ratio in args.ratios:
            share = codec_share(ratio, P, shapes, args.steps, args.wire)
            shares.append(share)
            print(f"codec_vs_selection P={P} k=D·{ratio:g} {share['codec_s'] / share['selection_s']:.3f} "
                  f"({share['exchange']}: {1e3 * share['codec_s']:.2f} ms against {1e3 * share['selection_s']:.1f} ms)",
                  flush=True)
    if args.codec:
        if args.out:
            with open(args.out, "w") as f:
                json.dump(shares, f, indent=1)
        return
    rows = []
    for P in args.ranks:
        for ratio in args.ratios:
            for row in measure(args.methods, ratio, P, shapes, args.steps):
                rows.append(row)
                print(f"[bench_compute] P={P} k=D·{ratio:g} {row['method']}: {row['median_s']:.3f} s", flush=True)
    print(table(rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    if (4, 0.001) in {(r["ranks"], r["ratio"]) for r in rows}:
        at = {r["method"]: r["median_s"] for r in rows if (r["ranks"], r["ratio"]) == (4, 0.001)}
        for line, (over, under) in RATIOS.items():
            if over in at and under in at:
                print(f"{line} {at[over] / at[under]:.3f}")
        pairs = [at.get(m) for m in ("gs-SGD (defaults)", "gs-SGD (wire=fp32)", "gs-SGD (exchange=sparse)",
                                     "gs-SGD (exchange=sparse, wire=fp32)")]
        if None not in pairs:
            print(f"compact_vs_fp32 defaults {pairs[0] / pairs[1]:.3f} sparse {pairs[2] / pairs[3]:.3f}")


if __name__ == "__main__":
    main()
