"""Convergence of every method on the MNIST-5k CNN (``scripts/train_torch.py``): held-out
accuracy against steps and against cumulative bytes, over several seeds, at a fixed step
budget (the same epochs for every method), at k = 1/100 and 1/1000.

    python scripts/bench_convergence.py --out-dir docs                # full matrix (long)
    python scripts/bench_convergence.py --quick --out-dir /tmp/conv   # a smoke subset

Each (method, ratio, seed) is one ``horovodrun -np RANKS --gloo`` run of train_torch.py;
writes ``convergence_cnn.json``, ``convergence_cnn.png`` and a Markdown table (mean ± half
the range over seeds) to stdout. A run that fails (e.g. a GsSketch option the installed engine
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
QUICK = {"methods": ["dense", "gs", "topk"], "ratios": [0.01], "seeds": [0], "epochs": 2}


def run(label: str, ratio: float, seed: int, args: argparse.Namespace) -> dict:
    compression, extra = METHODS.get(label, (label, []))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "h.json")
        launcher = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        cmd = [launcher, "-np", str(args.ranks), "-H", f"localhost:{args.ranks}", "--gloo",
               "--gloo-timeout-seconds", "300", sys.executable, str(ROOT / "scripts/train_torch.py"),
               "--model", args.model, "--compression", compression, "--epochs", str(args.epochs),
               "--seed", str(seed), "--json", out, *extra]
        if label not in UNCOMPRESSED:
            cmd += ["--ratio", str(ratio)]
        env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3")
        subprocess.run(cmd, check=True, capture_output=True, env=env, cwd=ROOT)
        return json.loads(Path(out).read_text())


def curves(result: dict) -> tuple[list[int], list[float], list[float]]:
    """(cumulative steps, cumulative MB per rank, accuracy) per epoch of one run."""
    h = result["history"]
    steps = [e["epoch"] * e["steps"] for e in h]
    return steps, [s * e["bytes_per_step"] / 1e6 for s, e in zip(steps, h)], [e["accuracy"] for e in h]


def plot(runs: dict, path: Path, title: str) -> None:
    """Accuracy vs steps and vs cumulative MB: mean over seeds, min–max band; a colour per
    method, solid k = 1/100, dashed k = 1/1000."""
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
        per_seed = [curves(r) for r in seeds.values()]
        steps = per_seed[0][0]
        acc = np.array([c[2] for c in per_seed])
        mb = np.mean([c[1] for c in per_seed], axis=0)
        for ax, x in ((axes[0], steps), (axes[1], mb)):
            ax.plot(x, acc.mean(0), style, color=colour, label=key)
            ax.fill_between(x, acc.min(0), acc.max(0), color=colour, alpha=0.15)
    axes[0].set(xlabel="steps", ylabel="held-out accuracy")
    axes[1].set(xlabel="MB handed to collectives per rank (cumulative)", ylabel="held-out accuracy", xscale="log")
    for ax in axes:
        ax.grid(True, alpha=0.3)
    axes[1].legend(fontsize=7, ncol=2)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(runs: dict) -> str:
    lines = ["| method @ k/d | seeds | final accuracy (mean ± half range) | best accuracy (mean) | "
             "bytes/step/rank | seconds (mean) |", "|---|---|---|---|---|---|"]
    for key, seeds in runs.items():
        finals = [r["history"][-1]["accuracy"] for r in seeds.values()]
        bests = [max(e["accuracy"] for e in r["history"]) for r in seeds.values()]
        sent = sum(r["history"][-1]["bytes_per_step"] for r in seeds.values()) / len(seeds)
        secs = sum(r["seconds"] for r in seeds.values()) / len(seeds)
        mean, half = sum(finals) / len(finals), (max(finals) - min(finals)) / 2
        lines.append(f"| {key} | {len(seeds)} | {mean:.4f} ± {half:.4f} | {sum(bests) / len(bests):.4f} "
                     f"| {sent:,.0f} | {secs:.1f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--epochs", type=int, default=10, help="the step budget: epochs × steps per epoch, every method")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--ratios", type=float, nargs="+", default=[0.01, 0.001])
    p.add_argument("--methods", nargs="+", default=list(METHODS),
                   help=f"labels of {list(METHODS)}, or any train_torch.py --compression (e.g. gs: engine defaults)")
    p.add_argument("--quick", action="store_true",
                   help=f"a smoke subset: {QUICK['methods']}, ratio {QUICK['ratios']}, seed {QUICK['seeds']}, "
                        f"{QUICK['epochs']} epochs")
    p.add_argument("--out-dir", default="docs")
    p.add_argument("--plot-only", action="store_true", help="re-plot <out-dir>/convergence_<model>.json")
    args = p.parse_args()
    if args.quick:
        args.methods, args.ratios, args.seeds, args.epochs = (QUICK["methods"], QUICK["ratios"], QUICK["seeds"],
                                                              QUICK["epochs"])
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = out / f"convergence_{args.model}.json"
    title = f"MNIST-5k {args.model}, {args.ranks} ranks, {args.epochs} epochs (solid: k = 1/100, dashed: 1/1000)"
    if args.plot_only:
        plot(json.loads(data.read_text()), out / f"convergence_{args.model}.png", title)
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
    print(table(runs))
    plot(runs, out / f"convergence_{args.model}.png", title)


if __name__ == "__main__":
    main()
