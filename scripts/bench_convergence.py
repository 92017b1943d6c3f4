"""Convergence of every method on the README demo (digits MLP, 2 ranks, same seeds): held-out
accuracy per epoch and against cumulative bytes, at k = 1/100 and 1/1000 of each tensor.

    python scripts/bench_convergence.py --out-dir docs --epochs 30

Runs ``scripts/train_torch.py`` under ``horovodrun -np 2 --gloo`` once per (method, ratio),
writes ``convergence.json``, ``convergence.png`` and a Markdown table to stdout.
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
METHODS = ["gs", "topk", "gtopk", "sketched", "powersgd"]


def run(method: str, ratio: float, epochs: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "h.json")
        launcher = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        cmd = [launcher, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
               str(ROOT / "scripts/train_torch.py"), "--compression", method, "--ratio", str(ratio),
               "--epochs", str(epochs), "--json", out]
        env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3")
        subprocess.run(cmd, check=True, capture_output=True, env=env, cwd=ROOT)
        return json.loads(Path(out).read_text())


def plot(runs: dict, path: Path) -> None:
    """Accuracy vs epoch and vs cumulative bytes: a colour per method, solid k = 1/100,
    dashed k = 1/1000."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {m: f"C{i}" for i, m in enumerate(["dense", "fp16", *METHODS])}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, r in runs.items():
        h = r["history"]
        method = label.split(" @ ")[0]
        style = "--" if label.endswith("0.001") else "-"
        axes[0].plot([e["epoch"] for e in h], [e["accuracy"] for e in h], style, color=colours[method], label=label)
        cum = [e["epoch"] * e["steps"] * e["bytes_per_step"] / 1e6 for e in h]
        axes[1].plot(cum, [e["accuracy"] for e in h], style, color=colours[method], label=label)
    axes[0].set(xlabel="epoch", ylabel="held-out accuracy", ylim=(0.3, 1.0))
    axes[1].set(xlabel="MB handed to collectives per rank (cumulative)", ylabel="held-out accuracy",
                xscale="log", ylim=(0.3, 1.0))
    for ax in axes:
        ax.grid(True, alpha=0.3)
    axes[1].legend(fontsize=7, ncol=2)
    fig.suptitle("digits MLP, 2 ranks (solid: k = 1/100, dashed: k = 1/1000)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--out-dir", default="docs")
    p.add_argument("--plot-only", action="store_true", help="re-plot <out-dir>/convergence.json")
    args = p.parse_args()
    if args.plot_only:
        plot(json.loads((Path(args.out_dir) / "convergence.json").read_text()), Path(args.out_dir) / "convergence.png")
        return
    runs = {"dense": run("none", 1.0, args.epochs), "fp16": run("fp16", 1.0, args.epochs)}
    for ratio in (0.01, 0.001):
        for m in METHODS:
            runs[f"{m} @ {ratio}"] = run(m, ratio, args.epochs)
    out = Path(args.out_dir)
    (out / "convergence.json").write_text(json.dumps(runs, indent=1))
    print("| method @ k/d | final accuracy | best accuracy | bytes/step/rank | seconds |\n|---|---|---|---|---|")
    for label, r in runs.items():
        h = r["history"]
        print(f"| {label} | {h[-1]['accuracy']:.4f} | {max(e['accuracy'] for e in h):.4f} "
              f"| {h[-1]['bytes_per_step']:,.0f} | {r['seconds']:.1f} |")
    plot(runs, out / "convergence.png")


if __name__ == "__main__":
    main()
