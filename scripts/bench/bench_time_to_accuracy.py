"""Wall-clock time to a held-out target, per method, on real ranks over shaped links: the
figure a user chooses a method by.

    python scripts/bench/bench_time_to_accuracy.py run --out docs/time_to_accuracy.jsonl \\
        --workload cnn --ranks 2 4 --rates 100mbit 1gbit --repeats 3 \\
        --methods gs gs:exchange=sketch gtopk topk powersgd:rank=1 fp16 none
    python scripts/bench/bench_time_to_accuracy.py report docs/time_to_accuracy.jsonl \\
        --target 0.95 [--plot docs/time_to_accuracy.png]

``run`` launches, for each repeat (outermost, so drift spreads over every method alike), each
rank count and link rate, each method (its order rotated by one per repeat) as
``scripts/bench/shaped.sh RATE P -- mpirun -np P python <example> ...`` (Horovod's MPI
controller, TCP between the ranks' namespaces) and appends
one JSON line per run: the method, its options, the seed (the repeat), the held-out metric after
every evaluation with the training seconds at that point, and bytes per step. ``--workload
cnn`` trains ``scripts/examples/train_torch.py --model cnn`` (held-out accuracy, higher is
better); ``lm`` trains ``scripts/examples/train_lm.py`` (per-byte perplexity, lower is better).
METHOD[:NAME=VALUE,...] as in bench_throughput.sh: options go to gs as ``--gs``, to a baseline
as ``--opt``; ``--ratio`` goes to the methods that select k coordinates.

``report`` gives, per (workload, ranks, rate, method), the seconds to reach the target (the
first crossing, interpolated linearly between the two evaluations around it), as mean ± std
over the repeats that reached it and how many did. Root only (shaped.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[2]
SELECTS_K = ("gs", "topk", "gtopk", "sketched")
EXAMPLES = {"cnn": ("scripts/examples/train_torch.py", ["--model", "cnn"], "accuracy"),
            "lm": ("scripts/examples/train_lm.py", [], "perplexity")}


def time_to_target(history: list[dict[str, float]], metric: str, target: float) -> Optional[float]:
    """Training seconds at which ``metric`` first reaches ``target`` (accuracy: at least it;
    perplexity: at most it), interpolated linearly between the evaluation before and the one
    that reached it (the first evaluation's seconds when it reached it already); None if no
    evaluation did. ``history``: [{"seconds", metric}, ...] in time order."""
    better = (lambda v: v >= target) if metric == "accuracy" else (lambda v: v <= target)
    before: Optional[dict[str, float]] = None
    for point in history:
        value, seconds = point[metric], point["seconds"]
        if better(value):
            if before is None:
                return seconds
            share = (target - before[metric]) / (value - before[metric])
            return before["seconds"] + share * (seconds - before["seconds"])
        before = point
    return None


def method_args(variant: str, ratio: float) -> tuple[str, list[str]]:
    """(label, example flags) of METHOD[:NAME=VALUE,...]."""
    method, _, options = variant.partition(":")
    flag = "--gs" if method == "gs" else "--opt"
    args = ["--compression", method]
    for option in filter(None, options.split(",")):
        args += [flag, option]
    if method in SELECTS_K:
        args += ["--ratio", str(ratio)]
    return variant, args


def run(args: argparse.Namespace) -> None:
    example, fixed, metric = EXAMPLES[args.workload]
    python = os.environ.get("GS_VENV", str(ROOT / ".venv")) + "/bin/python"
    methods = list(args.methods)
    for repeat in range(args.repeats):
        order = methods[repeat % len(methods):] + methods[:repeat % len(methods)]
        for ranks in args.ranks:
            for rate in args.rates:
                for variant in order:
                    label, flags = method_args(variant, args.ratio)
                    with tempfile.TemporaryDirectory() as tmp:
                        out = Path(tmp) / "history.json"
                        cmd = ["bash", str(ROOT / "scripts/bench/shaped.sh"), rate, str(ranks), "--",
                               "mpirun", "-np", str(ranks), python, str(ROOT / example), *fixed,
                               *flags, "--seed", str(repeat), "--json", str(out), *args.extra]
                        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
                        if proc.returncode != 0:
                            sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
                        result = json.loads(out.read_text())
                    row = {"workload": args.workload, "ranks": ranks, "rate": rate, "method": label,
                           "repeat": repeat, "seed": repeat, "metric": metric,
                           "command": "scripts/bench/shaped.sh " + " ".join(cmd[2:]),
                           "history": [{"seconds": h["seconds"], metric: h[metric]} for h in result["history"]],
                           "bytes_per_step": result["history"][-1]["bytes_per_step"]}
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")
                    reached = time_to_target(row["history"], metric, args.target) if args.target else None
                    print(f"{args.workload} P={ranks} {rate} {label} repeat {repeat}: final "
                          f"{row['history'][-1][metric]:.4f} after {row['history'][-1]['seconds']:.1f} s"
                          + ("" if reached is None else f", target at {reached:.1f} s"), flush=True)


def summarise(rows: list[dict[str, Any]], target: float) -> list[dict[str, Any]]:
    """Per (workload, ranks, rate, method): repeats, how many reached ``target``, the mean and
    sample std of their seconds to it (None when fewer than one / two reached it)."""
    groups: dict[tuple, list[Optional[float]]] = {}
    for row in rows:
        key = (row["workload"], row["ranks"], row["rate"], row["method"])
        groups.setdefault(key, []).append(time_to_target(row["history"], row["metric"], target))
    out = []
    for (workload, ranks, rate, method), times in groups.items():
        reached = [t for t in times if t is not None]
        out.append({"workload": workload, "ranks": ranks, "rate": rate, "method": method, "repeats": len(times),
                    "reached": len(reached), "mean_seconds": statistics.mean(reached) if reached else None,
                    "std_seconds": statistics.stdev(reached) if len(reached) > 1 else None})
    return out


def report(args: argparse.Namespace) -> None:
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    summary = summarise(rows, args.target)
    print("| workload | P | link | method | reached | seconds to target |")
    print("|---|---|---|---|---|---|")
    for s in summary:
        seconds = "—" if s["mean_seconds"] is None else f"{s['mean_seconds']:.1f}" + (
            "" if s["std_seconds"] is None else f" ± {s['std_seconds']:.1f}")
        print(f"| {s['workload']} | {s['ranks']} | {s['rate']} | {s['method']} | {s['reached']}/{s['repeats']} | "
              f"{seconds} |")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        settings = sorted({(s["ranks"], s["rate"]) for s in summary})
        fig, axes = plt.subplots(1, len(settings), figsize=(4.5 * len(settings), 3.5), squeeze=False)
        for ax, (ranks, rate) in zip(axes[0], settings):
            mine = [s for s in summary if (s["ranks"], s["rate"]) == (ranks, rate) and s["mean_seconds"] is not None]
            ax.barh([s["method"] for s in mine], [s["mean_seconds"] for s in mine],
                    xerr=[s["std_seconds"] or 0 for s in mine])
            ax.set_title(f"P = {ranks}, {rate}")
            ax.set_xlabel(f"seconds to {rows[0]['metric']} {args.target}")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--workload", choices=sorted(EXAMPLES), default="cnn")
    r.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    r.add_argument("--rates", nargs="+", default=["100mbit", "1gbit"])
    r.add_argument("--methods", nargs="+",
                   default=["gs", "gs:exchange=sketch", "gtopk", "topk", "powersgd:rank=1", "fp16", "none"])
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--ratio", type=float, default=0.01)
    r.add_argument("--target", type=float, help="print when each run reached it")
    r.add_argument("extra", nargs="*", help="after --: passed to every example run (e.g. --epochs 4)")
    s = sub.add_parser("report")
    s.add_argument("data")
    s.add_argument("--target", type=float, required=True)
    s.add_argument("--plot")
    args = p.parse_args()
    if args.command == "run":
        run(args)
    else:
        report(args)


if __name__ == "__main__":
    main()
