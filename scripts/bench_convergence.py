"""Convergence of every method at a fixed step budget, k = 1/100 and 1/1000, over several
seeds: held-out accuracy (MNIST-5k CNN, ``scripts/train_torch.py``) or per-byte perplexity
(stdlib-source LSTM, ``scripts/train_lm.py``) against steps and against cumulative bytes.

    python scripts/bench_convergence.py --out-dir docs                       # CNN, full matrix (long)
    python scripts/bench_convergence.py --model lm --hidden 512 --out-dir docs
    python scripts/bench_convergence.py --quick --out-dir /tmp/conv          # a smoke subset

Each (method, ratio, seed) is one ``horovodrun -np RANKS --gloo`` run of the model's script;
writes ``convergence_<model>.json``, ``convergence_<model>.png`` and a Markdown table (mean ±
half the range over seeds) to stdout. A run that fails (e.g. a GsSketch option the installed engine
does not have yet) is reported and left out, the others go on.

Methods: dense and fp16 (Horovod's), gs global and gs layer (GsSketch with ``scope="global"``
/ ``"layer"``; every other GsSketch option at its default), topk, gtopk, sketched, powersgd.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# label: (train_torch.py --compression, extra arguments); compressed methods also get --ratio
METHODS = {
    "dense": ("none", []),
    "fp16": ("fp16", []),
    "gs global": ("gs", ["--gs", "scope=global"]),
    "gs layer": ("gs", ["--gs", "scope=layer"]),
    "topk": ("topk", []),
    "gtopk": ("gtopk", []),
    "sketched": ("sketched", []),
    "powersgd": ("powersgd", []),
}
UNCOMPRESSED = ("dense", "fp16")
# model: (title, script, its --model flag if any, held-out metric)
WORKLOADS = {
    "cnn": ("MNIST-5k CNN", "scripts/train_torch.py", ["--model", "cnn"], "accuracy"),
    "mlp": ("digits MLP", "scripts/train_torch.py", ["--model", "mlp"], "accuracy"),
    "lm": ("LSTM LM on stdlib sources", "scripts/train_lm.py", [], "perplexity"),
}
QUICK = {"methods": ["dense", "gs", "topk"], "ratios": [0.01], "seeds": [0], "epochs": 2}


def budget(args: argparse.Namespace) -> tuple[list[str], str]:
    """The step budget as the model's script takes it, and in words: steps for the LM, epochs
    for the others."""
    if args.model == "lm":
        return ["--steps", str(args.steps), "--eval-every", str(args.eval_every)], f"{args.steps} steps"
    return ["--epochs", str(args.epochs)], f"{args.epochs} epochs"


def final(seeds: dict, metric: str) -> float:
    """The metric at the last evaluation, mean over seeds."""
    return sum(r["history"][-1][metric] for r in seeds.values()) / len(seeds)


def run(label: str, ratio: float, seed: int, args: argparse.Namespace) -> dict:
    compression, extra = METHODS.get(label, (label, []))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "h.json")
        launcher = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        _, script, model, _ = WORKLOADS[args.model]
        cmd = [launcher, "-np", str(args.ranks), "-H", f"localhost:{args.ranks}", "--gloo",
               "--gloo-timeout-seconds", "300", sys.executable, str(ROOT / script), *model, *budget(args)[0],
               "--compression", compression, "--seed", str(seed), "--json", out, *extra]
        if args.hidden is not None:
            cmd += ["--hidden", str(args.hidden)]
        if label not in UNCOMPRESSED:
            cmd += ["--ratio", str(ratio)]
        env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3")
        subprocess.run(cmd, check=True, capture_output=True, env=env, cwd=ROOT)
        return json.loads(Path(out).read_text())


def curves(result: dict, metric: str) -> tuple[list[int], list[float], list[float]]:
    """(cumulative steps, cumulative MB per rank, held-out metric) per evaluation of one run."""
    h = result["history"]
    steps = [e["epoch"] * e["steps"] for e in h]
    return steps, [s * e["bytes_per_step"] / 1e6 for s, e in zip(steps, h)], [e[metric] for e in h]


def plot(runs: dict, path: Path, title: str, metric: str) -> None:
    """The metric vs steps and vs cumulative MB: mean over seeds, min–max band; a colour per
    method, solid k = 1/100, dashed k = 1/1000 (perplexity on a log axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colours: dict[str, str] = {}
    for key, seeds in runs.items():
        label, ratio = key.rsplit(" @ ", 1)
        colour = colours.setdefault(label, f"C{len(colours)}")
        style = "--" if ratio == "0.001" else "-"
        per_seed = [curves(r, metric) for r in seeds.values()]
        steps = per_seed[0][0]
        values = np.array([c[2] for c in per_seed])
        mb = np.mean([c[1] for c in per_seed], axis=0)
        for ax, x in ((axes[0], steps), (axes[1], mb)):
            ax.plot(x, values.mean(0), style, color=colour, label=key)
            ax.fill_between(x, values.min(0), values.max(0), color=colour, alpha=0.15)
    axes[0].set(xlabel="steps", ylabel=f"held-out {metric}")
    axes[1].set(xlabel="MB handed to collectives per rank (cumulative)", ylabel=f"held-out {metric}", xscale="log")
    if metric == "perplexity":
        for ax in axes:
            ax.set_yscale("log")
    for ax in axes:
        ax.grid(True, alpha=0.3)
    axes[1].legend(fontsize=7, ncol=2)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(runs: dict, metric: str) -> str:
    best_of = min if metric == "perplexity" else max
    lines = [f"| method @ k/d | seeds | final {metric} (mean ± half range) | best {metric} (mean) | "
             "bytes/step/rank | seconds (mean) |", "|---|---|---|---|---|---|"]
    for key, seeds in runs.items():
        finals = [r["history"][-1][metric] for r in seeds.values()]
        bests = [best_of(e[metric] for e in r["history"]) for r in seeds.values()]
        sent = sum(r["history"][-1]["bytes_per_step"] for r in seeds.values()) / len(seeds)
        secs = sum(r["seconds"] for r in seeds.values()) / len(seeds)
        mean, half = sum(finals) / len(finals), (max(finals) - min(finals)) / 2
        lines.append(f"| {key} | {len(seeds)} | {mean:.4f} ± {half:.4f} | {sum(bests) / len(bests):.4f} "
                     f"| {sent:,.0f} | {secs:.1f} |")
    return "\n".join(lines)


def at_bytes(seeds: dict, metric: str, mb: float) -> tuple[float, float] | None:
    """(mean metric, mean MB) over seeds at each run's last evaluation within ``mb`` cumulative
    MB per rank; None when a run's first evaluation already sent more."""
    points = []
    for r in seeds.values():
        _, sent, values = curves(r, metric)
        within = [(v, m) for m, v in zip(sent, values) if m <= mb * (1 + 1e-9)]
        if not within:
            return None
        points.append(within[-1])
    return sum(v for v, _ in points) / len(points), sum(m for _, m in points) / len(points)


def headline(runs: dict, metric: str, reference: str = "gs global") -> str:
    """``reference`` against dense at its final evaluation (accuracy: points; perplexity: %), and
    every method at the same k at equal bytes: its metric when it had sent no more than the
    reference's whole budget (mean over seeds)."""
    lines = []
    dense = runs.get("dense @ 1")
    for key, seeds in runs.items():
        label, ratio = key.rsplit(" @ ", 1)
        if label != reference:
            continue
        last, sent = final(seeds, metric), sum(curves(r, metric)[1][-1] for r in seeds.values()) / len(seeds)
        if dense:
            d = final(dense, metric)
            gap = (f"{100 * (last - d):+.2f} points" if metric == "accuracy"
                   else f"{100 * (last / d - 1):+.1f} %")
            lines.append(f"{key}: final {metric} {last:.4f}, dense {d:.4f} ({gap} against dense)")
        lines.append(f"  at equal bytes (≤ {sent:.3g} MB per rank, {reference}'s whole budget):")
        for other, peer in runs.items():
            if other.rsplit(" @ ", 1)[1] != ratio or other == key:
                continue
            got = at_bytes(peer, metric, sent)
            lines.append(f"    {other}: " + (f"{got[0]:.4f} after {got[1]:.3g} MB" if got
                                            else "n/a (its first evaluation sent more)"))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=list(WORKLOADS), default="cnn")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--epochs", type=int, default=10, help="cnn, mlp: the step budget, every method")
    p.add_argument("--steps", type=int, default=120, help="lm: the step budget, every method")
    p.add_argument("--eval-every", type=int, default=20, help="lm: steps between held-out perplexities")
    p.add_argument("--hidden", type=int, help="the model's --hidden (default: the script's)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--ratios", type=float, nargs="+", default=[0.01, 0.001])
    p.add_argument("--methods", nargs="+", default=list(METHODS),
                   help=f"labels of {list(METHODS)}, or any train_torch.py --compression (e.g. gs: engine defaults)")
    p.add_argument("--quick", action="store_true",
                   help=f"a smoke subset: {QUICK['methods']}, ratio {QUICK['ratios']}, seed {QUICK['seeds']}, "
                        f"{QUICK['epochs']} epochs")
    p.add_argument("--out-dir", default="docs")
    p.add_argument("--plot-only", action="store_true",
                   help="table and plot again from <out-dir>/convergence_<model>.json")
    args = p.parse_args()
    if args.quick:
        args.methods, args.ratios, args.seeds, args.epochs = (QUICK["methods"], QUICK["ratios"], QUICK["seeds"],
                                                              QUICK["epochs"])
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = out / f"convergence_{args.model}.json"
    name, _, _, metric = WORKLOADS[args.model]
    title = f"{name}, {args.ranks} ranks, {budget(args)[1]} (solid: k = 1/100, dashed: 1/1000)"
    if args.plot_only:
        runs = json.loads(data.read_text())
        print(table(runs, metric) + "\n\n" + headline(runs, metric))
        plot(runs, out / f"convergence_{args.model}.png", title, metric)
        return
    runs: dict[str, dict[str, dict]] = {}
    for label in args.methods:
        for ratio in ([1.0] if label in UNCOMPRESSED else args.ratios):
            key = f"{label} @ {ratio:g}"
            for seed in args.seeds:
                print(f"[bench_convergence] {key} seed {seed}", file=sys.stderr, flush=True)
                try:
                    runs.setdefault(key, {})[str(seed)] = run(label, ratio, seed, args)
                except subprocess.CalledProcessError as e:
                    tail = e.stderr.decode(errors="replace").strip().splitlines()[-3:]
                    print(f"[bench_convergence] {key} seed {seed} FAILED: {' / '.join(tail)}", file=sys.stderr)
    runs = {k: v for k, v in runs.items() if v}
    data.write_text(json.dumps(runs, indent=1))
    print(table(runs, metric))
    print("\n" + headline(runs, metric))
    plot(runs, out / f"convergence_{args.model}.png", title, metric)


if __name__ == "__main__":
    main()
