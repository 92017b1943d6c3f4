"""Wall-clock time to a held-out target, per method, on real ranks over shaped links: the
figure a user chooses a method by.

    python scripts/bench/bench_time_to_accuracy.py run --out docs/time_to_accuracy.jsonl \\
        --workloads cnn lm --ranks 2 4 --rates 100mbit 1gbit --repeats 3 \\
        --methods gs gs:exchange=sketch gtopk topk powersgd:rank=1 fp16 none
    python scripts/bench/bench_time_to_accuracy.py run --out docs/time_to_accuracy.jsonl --append \\
        --methods gs:exchange=sparse    # more runs into the same file
    python scripts/bench/bench_time_to_accuracy.py report docs/time_to_accuracy.jsonl \\
        [--target cnn=0.93 lm=20] [--plot docs/time_to_accuracy.png]

``run`` launches, for each repeat (outermost, so drift spreads over every method alike), each
workload, rank count and link rate, each method (its order rotated by one per repeat) as
``scripts/bench/shaped.sh RATE P -- mpirun -np P python <example> ...`` (Horovod's MPI
controller, TCP between the ranks' namespaces) and appends one JSON line per run: the method,
its options, the seed (the repeat), the held-out metric after every evaluation with the
training seconds at that point (evaluation included) and the wire bytes through a rank so far,
and bytes per step. A run that fails
is written as a row with ``failed`` (its exit status and the end of its stderr), the study goes
on, and ``run`` exits 1 at the end. With ``--warmup``, each (workload, ranks, rate) first trains
its first method once more (seed 0), written with ``"warmup": true`` and never counted (the
link's and the page cache's first use). An existing ``--out`` is refused (exit 1, nothing run) unless
``--append`` is given; every row carries ``run_id`` (one per invocation, :mod:`gs_bench.runs`) and
``code`` (the commit). ``--simulated`` runs each training as ``--simulated-ranks P
--simulated-link RATE`` in one process instead (no shaping, no mpirun; for steps and bytes).

Workloads (``WORKLOADS``: the example, its fixed flags, the metric and the target declared
before the study): ``cnn`` trains ``scripts/bench/train_torch.py --model cnn`` for 4 epochs
(held-out accuracy, higher is better, target 0.93); ``lm`` trains
``scripts/bench/train_lm.py`` with a 512-unit LSTM and 128-wide embedding for 80 steps,
evaluated every 10 (per-byte perplexity, lower is better, target 20): a smaller LM than the
example's default (1536 units, 11.5 M parameters), so that the 168 runs fit in two hours
on two cores. METHOD[:NAME=VALUE,...] as in bench_throughput.sh: options go to gs as
``--gs``, to a baseline as ``--opt``; ``--ratio`` goes to the methods that select k coordinates,
except bare ``gs``: the shipped defaults (``ratio="auto"``), run as a user gets them.

``report`` gives, per (workload, ranks, rate, method), the seconds to reach the target (the
first crossing, interpolated linearly between the two evaluations around it), as mean ± std
over the repeats that reached it and how many did. Where appended runs repeat a (workload,
ranks, rate, method, seed), it reads the latest run's row (:func:`read_rows`) and says so on
stderr. ``run``: root only (shaped.sh).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

from gs_bench.runs import add_out_flags, append_line, check_out, latest_runs, one_wire, read_jsonl, stamp

ROOT = Path(__file__).resolve().parents[2]
SELECTS_K = ("gs", "topk", "gtopk", "sketched")
WORKLOADS = {
    "cnn": ("scripts/bench/train_torch.py", ["--model", "cnn", "--epochs", "4"], "accuracy", 0.93),
    "lm": ("scripts/bench/train_lm.py", ["--hidden", "512", "--embed", "128", "--steps", "80", "--eval-every", "10"],
           "perplexity", 20.0),
}


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
    """(label, example flags) of METHOD[:NAME=VALUE,...]: ``--ratio`` for the methods that select
    k coordinates, except bare ``gs`` (the shipped defaults, as a user gets them), variants
    that name their own ``ratio`` or ``k``, and gs variants of the defaults' measured density
    (``budget``, ``ramp``, ``critical``: ``ratio="auto"`` options)."""
    method, _, options = variant.partition(":")
    flag = "--gs" if method == "gs" else "--opt"
    args = ["--compression", method]
    for option in filter(None, options.split(",")):
        args += [flag, option]
    own = ("ratio", "k", "budget", "ramp", "critical") if method == "gs" else ("ratio", "k")
    if method in SELECTS_K and not any(o.split("=")[0] in own for o in options.split(",")) and variant != "gs":
        args += ["--ratio", str(ratio)]
    return variant, args


def one_run(workload: str, ranks: int, rate: str, variant: str, repeat: int, args: argparse.Namespace) -> dict:
    """One training on shaped links; its row (``failed`` in place of the history if it failed)."""
    example, fixed, metric, _ = WORKLOADS[workload]
    label, flags = method_args(variant, args.ratio)
    python = os.environ.get("GS_VENV", str(ROOT / ".venv")) + "/bin/python"
    row: dict[str, Any] = {"workload": workload, "ranks": ranks, "rate": rate, "method": label,
                           "repeat": repeat, "seed": repeat, "metric": metric}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "history.json"
        train = [python, str(ROOT / example), *fixed, *flags, "--seed", str(repeat), "--json", str(out)]
        if args.simulated:
            row["rate"] = f"{rate} modelled"
            cmd = [*train, "--simulated-ranks", str(ranks), "--simulated-link", rate, *args.extra]
        else:
            cmd = ["bash", str(ROOT / "scripts/bench/shaped.sh"), rate, str(ranks), "--",
                   "mpirun", "-np", str(ranks), *train, *args.extra]
        row["command"] = " ".join(cmd[1:] if cmd[0] == "bash" else cmd).replace(str(ROOT) + "/", "")
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            row["failed"] = {"returncode": proc.returncode, "stderr": proc.stderr[-2000:]}
            return row
        result = json.loads(out.read_text())
    history = result["history"]
    row["wire"] = result.get("wire")
    row["history"] = [{"seconds": h["seconds"], metric: h[metric],
                       "wire_bytes": round(h["wire_bytes_per_step"] * h["epoch"] * h["steps"])} for h in history]
    row["bytes_per_step"] = history[-1]["bytes_per_step"]
    return row


def run(args: argparse.Namespace) -> None:
    """The study: every row appended to ``args.out`` with this invocation's :func:`gs_bench.runs.stamp`;
    an existing ``args.out`` is refused unless ``args.append``."""
    check_out(args.out, args.append)
    methods, failures, run_fields, warmed = list(args.methods), 0, stamp(), set()
    for repeat in range(args.repeats):
        order = methods[repeat % len(methods):] + methods[:repeat % len(methods)]
        for workload, ranks, rate, variant in itertools.product(args.workloads, args.ranks, args.rates, order):
            if args.warmup and (workload, ranks, rate) not in warmed:
                warmed.add((workload, ranks, rate))
                warm = {**one_run(workload, ranks, rate, variant, 0, args), **run_fields, "warmup": True}
                append_line(args.out, warm)
                print(f"{workload} P={ranks} {rate} {variant}: warm-up (not counted)"
                      + (f" FAILED ({warm['failed']['returncode']})" if "failed" in warm else ""), flush=True)
            row = {**one_run(workload, ranks, rate, variant, repeat, args), **run_fields}
            append_line(args.out, row)
            where = f"{workload} P={ranks} {rate} {row['method']} repeat {repeat}"
            if "failed" in row:
                failures += 1
                print(f"FAILED ({row['failed']['returncode']}): {where}: {row['command']}\n"
                      f"{row['failed']['stderr']}", flush=True)
                continue
            metric, target = row["metric"], WORKLOADS[workload][3]
            last, reached = row["history"][-1], time_to_target(row["history"], metric, target)
            print(f"{where}: final {last[metric]:.4f} after {last['seconds']:.1f} s"
                  + ("" if reached is None else f", {metric} {target} at {reached:.1f} s"), flush=True)
    if failures:
        sys.exit(f"{failures} run(s) failed; their rows carry 'failed'")


def setting_of(row: dict[str, Any]) -> Optional[tuple]:
    """What a row measured: (workload, ranks, rate, method, seed); None for a row without a seed
    (or repeat), which no other row can repeat."""
    seed = row.get("seed", row.get("repeat"))
    return None if seed is None else (row["workload"], row["ranks"], row["rate"], row["method"], seed)


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The rows of a ``run`` file but its warm-up runs, one per :func:`setting_of`: the latest
    run's where appended runs repeat one (:func:`gs_bench.runs.latest_runs`, which says on stderr
    which it used)."""
    rows, where = read_jsonl([path])
    counted = [i for i, row in enumerate(rows) if not row.get("warmup")]
    rows, where = [rows[i] for i in counted], [where[i] for i in counted]
    return latest_runs(rows, setting_of, where, lambda r: "{} P={} {} {} seed {}".format(*setting_of(r) or ()))


def summarise(rows: list[dict[str, Any]], targets: dict[str, float]) -> list[dict[str, Any]]:
    """Per (workload, ranks, rate, method), in the rows' order: the target, repeats, how many
    failed, how many reached ``targets[workload]``, the mean and sample std of their seconds to
    it (None when fewer than one / two reached it), and the mean bytes per step."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["workload"], row["ranks"], row["rate"], row["method"]), []).append(row)
    out = []
    for (workload, ranks, rate, method), mine in groups.items():
        ran = [row for row in mine if "failed" not in row]
        one_wire(ran, f"{method} ({workload}, {ranks} ranks, {rate})")
        times = [time_to_target(row["history"], row["metric"], targets[workload]) for row in ran]
        reached = [t for t in times if t is not None]
        out.append({"workload": workload, "ranks": ranks, "rate": rate, "method": method,
                    "target": targets[workload], "repeats": len(mine), "failed": len(mine) - len(ran),
                    "reached": len(reached), "mean_seconds": statistics.mean(reached) if reached else None,
                    "std_seconds": statistics.stdev(reached) if len(reached) > 1 else None,
                    "bytes_per_step": statistics.mean(row["bytes_per_step"] for row in ran) if ran else None})
    return out


def targets_of(pairs: list[str]) -> dict[str, float]:
    """The declared targets, with WORKLOAD=VALUE pairs overriding them."""
    targets = {name: spec[3] for name, spec in WORKLOADS.items()}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name not in targets or not value:
            raise SystemExit(f"--target takes WORKLOAD=VALUE with WORKLOAD in {sorted(targets)}, got {pair!r}")
        targets[name] = float(value)
    return targets


def table(summary: list[dict[str, Any]]) -> str:
    """The summary as a Markdown table."""
    lines = ["| workload | P | link | method | bytes/step/rank | reached target | seconds to target (mean ± std over "
             "the repeats that reached it) |",
             "|---|---|---|---|---|---|---|"]
    for s in summary:
        metric = WORKLOADS[s["workload"]][2]
        seconds = "—" if s["mean_seconds"] is None else f"{s['mean_seconds']:.1f}" + (
            "" if s["std_seconds"] is None else f" ± {s['std_seconds']:.1f}")
        failed = f", {s['failed']} failed" if s["failed"] else ""
        sent = "—" if s["bytes_per_step"] is None else f"{s['bytes_per_step']:,.0f}"
        lines.append(f"| {s['workload']} ({metric} {s['target']:g}) | {s['ranks']} | {s['rate']} | {s['method']} | "
                     f"{sent} | {s['reached']}/{s['repeats']}{failed} | {seconds} |")
    return "\n".join(lines)


def plot(summary: list[dict[str, Any]], path: str) -> None:
    """One panel per (workload, P, link): bars of mean seconds to target with their std over the
    repeats that reached it (how many, where not all); a method that never did: no bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys((s["workload"], s["ranks"], s["rate"]) for s in summary))
    columns = 4
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.0 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (workload, ranks, rate) in zip(axes.flat, panels):
        mine = [s for s in summary if (s["workload"], s["ranks"], s["rate"]) == (workload, ranks, rate)]
        ax.barh([s["method"] for s in mine], [s["mean_seconds"] or 0 for s in mine],
                xerr=[s["std_seconds"] or 0 for s in mine])
        for y, s in enumerate(mine):
            if s["mean_seconds"] is None:
                ax.text(0, y, " not reached", va="center", fontsize=8)
            elif s["reached"] < s["repeats"]:
                ax.text(s["mean_seconds"], y, f" {s['reached']}/{s['repeats']} reached", va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{workload}, P = {ranks}, {rate}", fontsize=10)
        ax.set_xlabel(f"seconds to {WORKLOADS[workload][2]} {mine[0]['target']:g}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report(args: argparse.Namespace) -> None:
    summary = summarise(read_rows(args.data), targets_of(args.target))
    print(table(summary))
    if args.plot:
        plot(summary, args.plot)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (``scripts/check_docs.py`` parses every documented command with it)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    add_out_flags(r, "one JSON line per run", required=True)
    r.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=["cnn", "lm"])
    r.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    r.add_argument("--rates", nargs="+", default=["100mbit", "1gbit"])
    r.add_argument("--methods", nargs="+",
                   default=["gs", "gs:exchange=sketch", "gtopk", "topk", "powersgd:rank=1", "fp16", "none"])
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--ratio", type=float, default=0.01)
    r.add_argument("--warmup", action="store_true",
                   help="one uncounted run (the first method, seed 0) before each setting's first")
    r.add_argument("--simulated", action="store_true",
                   help="P ranks simulated in one process on a modelled link at each rate (rate 'R modelled' in "
                        "the rows; their seconds are the process's, P ranks' compute in turn: steps and bytes only)")
    r.add_argument("extra", nargs="*", help="after --: passed to every example run")
    s = sub.add_parser("report")
    s.add_argument("data")
    s.add_argument("--target", nargs="*", default=[], metavar="WORKLOAD=VALUE", help="override a declared target")
    s.add_argument("--plot")
    args = p.parse_args(argv)
    if args.command == "run":
        from gs_bench.variants import parse_variant

        for word in args.methods:
            try:
                parse_variant(word)
            except ValueError as e:
                p.error(f"--methods: {e}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.command == "run":
        run(args)
    else:
        report(args)


if __name__ == "__main__":
    main()
