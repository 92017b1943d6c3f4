"""Convergence of every method at a fixed step budget, k = 1/100 and 1/1000, over several
seeds: held-out accuracy (MNIST-5k CNN, ``scripts/bench/train_torch.py``) or per-byte perplexity
(stdlib-source LSTM, ``scripts/bench/train_lm.py``) against steps and against cumulative wire bytes.

    python scripts/bench/bench_convergence.py --out-dir docs                       # CNN, full matrix (long)
    python scripts/bench/bench_convergence.py --model lm --hidden 512 --out-dir docs
    python scripts/bench/bench_convergence.py --quick --out-dir /tmp/conv          # a smoke subset
    python scripts/bench/bench_convergence.py --launcher torchrun --ranks 2 --out-dir docs   # DDP hooks
    python scripts/bench/bench_convergence.py --launcher fsdp --ranks 4 --replicas 2 --out-dir docs   # HSDP 2 × 2
    python scripts/bench/bench_convergence.py --launcher fsdp --model lm --hidden 512 --steps 60 --out-dir docs
    python scripts/bench/bench_convergence.py --simulated-ranks 16 --out-dir docs      # 16 ranks in one process
    python scripts/bench/bench_convergence.py --simulated-ranks 16 --quick              # ends gs_vs_best ...

Each (method, ratio, seed) is one ``horovodrun -np RANKS --gloo`` run of the model's script;
writes ``convergence_<model>.json``, ``convergence_<model>.png`` and Markdown tables (mean ±
half the range over seeds) to stdout. A run that fails is reported and left out, the others go on.
``--launcher torchrun`` runs the model's script under ``torchrun`` instead: DistributedDataParallel
with a communication hook per method (:data:`DDP_LABELS`: gs_hook, torch's PowerSGD and fp16
hooks, DDP's default allreduce), into ``convergence_<model>_ddp<RANKS>.*``. ``--launcher fsdp`` runs
``scripts/bench/train_fsdp.py`` (the CNN or the LM) under ``torchrun`` on an R × S mesh
(``--replicas R``, S = RANKS / R): ``gs`` is GsFsdpState across the replicas, ``dense`` plain
HSDP (:data:`FSDP_LABELS`), into ``convergence_<model>_fsdp<R>x<S>.*``. ``--simulated-ranks P``
runs each script with ``--simulated-ranks P`` instead (P ranks in one process: the engine and
the baselines on simulated collectives, :class:`gs_bench.cli.SimulatedTrainingRanks`),
into ``convergence_<model>_sim<P>.*``; its ``--quick`` (the CNN, 2 epochs, batch 8 per rank,
k = D/1000, one seed) ends with the line ``gs_vs_best P=<P> metric_ratio <x> wire_bytes_ratio <y>``:
x = gs's final metric over the best other method's at gs's cumulative wire bytes (interpolated
between its evaluations, :func:`at_budget`; accuracy: above 1 is gs ahead; perplexity: below 1
is), y = gs's wire MB over that method's at that point (1 unless it sent less in all), after a
line per peer at that budget (a peer whose first evaluation sent more is listed, not picked).

Budgets are compared in **wire bytes through the busiest rank** (``gs_horovod.transports.collective_cost``: ring
allreduce 4(P−1)/P·n, ring allgather 2(P−1)·n, gTop-k's 2·log2 P pairwise rounds, Sketched-SGD's
star into rank 0), with the payload handed to collectives beside it. Methods: dense (Horovod's),
gs (GsSketch's defaults, global scope), top-k allgather and gTop-k with global and per-tensor
selection, Sketched-SGD over the whole model at its published sizes (5 rows × 10k columns,
4k candidates) and at the size whose wire bytes equal gs-SGD's at the same P and k
(``sketched = gs``, see :func:`equal_wire_sketched`), PowerSGD at rank 1 and rank 4. Every
method sends tensors under 1,024 elements exactly and selects with the project's kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
# label: (train script --compression, extra arguments); compressed methods also get --ratio
METHODS = {
    "dense": ("none", []),
    "fp16": ("fp16", []),
    "gs": ("gs", []),
    "gs layer": ("gs", ["--gs", "scope=layer"]),
    "gs sketch": ("gs", ["--gs", "exchange=sketch"]),  # the paper's sketch (the defaults: "auto")
    "gs fp32": ("gs", ["--gs", "wire=fp32"]),  # the defaults with each pair an int32 and a float32
    "gs compact": ("gs", ["--gs", "wire=compact"]),  # ... with Elias-Fano indices and bfloat16 values
    "gs compact8": ("gs", ["--gs", "wire=compact8"]),  # ... and E4M3 values, one scale a message
    "topk compact": ("gs", ["--gs", "exchange=allgather", "--gs", "wire=compact"]),  # top-k allgather, compact
    "topk": ("topk", []),
    "topk layer": ("topk", ["--opt", "scope=layer"]),
    "gtopk": ("gtopk", []),
    "gtopk layer": ("gtopk", ["--opt", "scope=layer"]),
    "gtopk compact": ("gtopk", ["--opt", "wire=compact"]),  # not the authors': its pairs in the compact format
    "sketched": ("sketched", []),
    "sketched = gs": ("sketched", []),  # sizes from equal_wire_sketched() at run time
    "sketched = gs fp32": ("sketched", []),  # ... at the wire bytes of GsSketch(wire="fp32")
    "powersgd r1": ("powersgd", ["--opt", "rank=1"]),
    "powersgd r2": ("powersgd", ["--opt", "rank=2"]),
    "powersgd r4": ("powersgd", ["--opt", "rank=4"]),
}
DEFAULT_METHODS = ["dense", "gs", "topk", "topk layer", "gtopk", "gtopk layer", "sketched", "sketched = gs",
                   "powersgd r1", "powersgd r4"]
UNCOMPRESSED = ("dense", "fp16", "powersgd r1", "powersgd r2", "powersgd r4")  # k does not apply: one run per seed
DDP_LABELS = ["dense", "fp16", "gs", "gs layer", "powersgd r1", "powersgd r4"]  # what runs as a DDP hook
DDP_DEFAULT = ["dense", "fp16", "gs", "powersgd r1", "powersgd r4"]
FSDP_LABELS = ["dense", "gs"]  # under --launcher fsdp: plain HSDP, GsFsdpState
FSDP_SCRIPT = "scripts/bench/train_fsdp.py"
# model: (title, script, its --model flag if any, held-out metric)
WORKLOADS = {
    "cnn": ("MNIST-5k CNN", "scripts/bench/train_torch.py", ["--model", "cnn"], "accuracy"),
    "mlp": ("digits MLP", "scripts/bench/train_torch.py", ["--model", "mlp"], "accuracy"),
    "lm": ("LSTM LM on stdlib sources", "scripts/bench/train_lm.py", [], "perplexity"),
}
QUICK = {"methods": ["gs fp32", "sketched = gs fp32"], "ratios": [0.01], "seeds": [0], "epochs": 1,
         "ranks": 2, "model": "mlp"}
QUICK_SIMULATED = {"methods": ["dense", "gs", "topk", "topk layer", "gtopk", "gtopk layer", "powersgd r1"],
                   "ratios": [0.001], "seeds": [0], "epochs": 2, "model": "cnn", "batch_size": 8}
# fp16 is Horovod's; Sketched-SGD at gs's bytes is sized for real ranks
SIMULATED = [label for label in METHODS if label not in ("fp16", "sketched = gs", "sketched = gs fp32")]


def model_shapes(args: argparse.Namespace) -> list[tuple[int, ...]]:
    """The parameter shapes of the run's model, in name order (as every method lays them out)."""
    from gs_bench.workloads import LstmLM, MnistCNN, digits_mlp

    if args.model == "lm":
        model = LstmLM(hidden=args.hidden or 1536)
    elif args.model == "cnn":
        model = MnistCNN(args.hidden or 256)
    else:
        model = digits_mlp(args.hidden or 256)
    return [tuple(p.shape) for _, p in sorted(model.named_parameters())]


def gs_wire(shapes: list[tuple[int, ...]], ratio: float, ranks: int, options: Optional[dict] = None) -> float:
    """Wire bytes per step through a rank of GsSketch with ``options`` (default: its defaults) at ``ratio``."""
    from gs_bench.variants import planned
    from gs_horovod.transports.collective_cost import total_wire_bytes

    return total_wire_bytes(planned("gs", options or {}, shapes, ranks, ratio), ranks)


def equal_wire_sketched(shapes: list[tuple[int, ...]], ratio: float, ranks: int, gs: Optional[dict] = None) -> dict:
    """Sketched-SGD's sizes whose wire bytes through rank 0 equal gs-SGD's (with the GsSketch
    options ``gs``; default: its defaults, whose compact pairs often leave no room for
    Sketched-SGD's exact round, a ValueError naming the bytes): 5 rows (published),
    the largest p2 of 4, 2, 1 that leaves room for at least one column per k (else p2 = 1 and
    fewer columns than k), and the width that fills the rest (wire bytes grow linearly with it)."""
    from gs_bench.baselines import SketchedSGD
    from gs_horovod.transports.collective_cost import total_wire_bytes

    target = gs_wire(shapes, ratio, ranks, gs)

    def wire(p2: int, width: float) -> float:
        return total_wire_bytes(SketchedSGD(ratio=ratio, width=width, p2=p2).planned(shapes, ranks), ranks)

    for p2 in (4, 2, 1):
        base, per_col = wire(p2, 1e-9), wire(p2, 1.0) - wire(p2, 1e-9)
        width = (target - base) / per_col
        if width >= 1.0 or (p2 == 1 and width > 0):
            # ceil(width·k) columns: step down until the rounded size is within the budget
            while wire(p2, width) > target:
                width *= 0.999
            return {"p2": p2, "width": round(width, 4)}
    raise ValueError(f"no Sketched-SGD size fits gs-SGD's {target:,.0f} wire bytes at P = {ranks}, k = {ratio}")


def budget(args: argparse.Namespace) -> tuple[list[str], str]:
    """The step budget as the model's script takes it, and in words: steps for the LM, epochs
    for the others."""
    if args.model == "lm":
        return ["--steps", str(args.steps), "--eval-every", str(args.eval_every)], f"{args.steps} steps"
    return ["--epochs", str(args.epochs)], f"{args.epochs} epochs"


def final(seeds: dict, metric: str) -> float:
    """The metric at the last evaluation, mean over seeds."""
    return sum(r["history"][-1][metric] for r in seeds.values()) / len(seeds)


def ratio_arg(text: str) -> float | str:
    """A ``--ratios`` item: k / D as a float, or "auto" (gs at its default density, no ``--ratio``)."""
    return "auto" if text == "auto" else float(text)


def ratio_text(ratio: float | str) -> str:
    """The ratio as record keys write it: "0.01", "1", "auto"."""
    return ratio if isinstance(ratio, str) else f"{ratio:g}"


def run(label: str, ratio: float | str, seed: int, args: argparse.Namespace) -> dict:
    compression, extra = METHODS[label]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "h.json")
        launcher = os.path.join(os.path.dirname(sys.executable), args.launcher)
        _, script, model, _ = WORKLOADS[args.model]
        if args.launcher == "fsdp":
            script, model = FSDP_SCRIPT, ["--model", args.model, "--replicas", str(args.replicas)]
            launcher = os.path.join(os.path.dirname(sys.executable), "torchrun")
        if args.simulated_ranks:
            start = []
        elif args.launcher in ("torchrun", "fsdp"):
            start = [launcher, "--standalone", "--nproc_per_node", str(args.ranks), "--no-python"]
        else:
            start = [launcher, "-np", str(args.ranks), "-H", f"localhost:{args.ranks}", "--gloo",
                     "--gloo-timeout-seconds", "300"]
        cmd = [*start, sys.executable, str(ROOT / script), *model, *budget(args)[0],
               "--compression", compression, "--seed", str(seed), "--json", out, *extra]
        if args.hidden is not None:
            cmd += ["--hidden", str(args.hidden)]
        if args.batch_size is not None:
            cmd += ["--batch-size", str(args.batch_size)]
        if args.simulated_ranks:
            cmd += ["--simulated-ranks", str(args.simulated_ranks)]
        if label not in UNCOMPRESSED and ratio != "auto":
            cmd += ["--ratio", str(ratio)]
        if label.startswith("sketched = gs"):
            sizes = equal_wire_sketched(model_shapes(args), ratio, args.simulated_ranks or args.ranks,
                                        {"wire": "fp32"} if label.endswith("fp32") else None)
            cmd += [arg for name, value in sizes.items() for arg in ("--opt", f"{name}={value}")]
        env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3")
        subprocess.run(cmd, check=True, capture_output=True, env=env, cwd=ROOT)
        return json.loads(Path(out).read_text())


def curves(result: dict, metric: str) -> tuple[list[int], list[float], list[float]]:
    """(cumulative steps, cumulative wire MB through a rank, held-out metric) per evaluation of
    one run."""
    h = result["history"]
    steps = [e["epoch"] * e["steps"] for e in h]
    return steps, [s * e["wire_bytes_per_step"] / 1e6 for s, e in zip(steps, h)], [e[metric] for e in h]


def plot(runs: dict, path: Path, title: str, metric: str) -> None:
    """The metric vs steps and vs cumulative MB: mean over seeds, min–max band; a colour per
    method, dashed k = 1/1000, dotted the methods without a k, solid the rest (k = 1/100, gs's
    default density) (perplexity on a log axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colours: dict[str, str] = {}
    for key, seeds in runs.items():
        label, ratio = key.rsplit(" @ ", 1)
        colour = colours.setdefault(label, f"C{len(colours)}")
        style = "--" if ratio == "0.001" else ":" if ratio == "1" else "-"
        per_seed = [curves(r, metric) for r in seeds.values()]
        steps = per_seed[0][0]
        values = np.array([c[2] for c in per_seed])
        mb = np.mean([c[1] for c in per_seed], axis=0)
        for ax, x in ((axes[0], steps), (axes[1], mb)):
            ax.plot(x, values.mean(0), style, color=colour, label=key)
            ax.fill_between(x, values.min(0), values.max(0), color=colour, alpha=0.15)
    axes[0].set(xlabel="steps", ylabel=f"held-out {metric}")
    axes[1].set(xlabel="wire MB through the busiest rank (cumulative)", ylabel=f"held-out {metric}", xscale="log")
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
             "wire bytes/step (busiest rank) | payload bytes/step/rank | seconds (mean) | steps/s |",
             "|---|---|---|---|---|---|---|---|"]
    for key, seeds in runs.items():
        finals = [r["history"][-1][metric] for r in seeds.values()]
        bests = [best_of(e[metric] for e in r["history"]) for r in seeds.values()]
        sent = sum(r["history"][-1]["bytes_per_step"] for r in seeds.values()) / len(seeds)
        wire = sum(r["history"][-1]["wire_bytes_per_step"] for r in seeds.values()) / len(seeds)
        secs = sum(r["seconds"] for r in seeds.values()) / len(seeds)
        rate = sum(curves(r, metric)[0][-1] / r["seconds"] for r in seeds.values()) / len(seeds)
        mean, half = sum(finals) / len(finals), (max(finals) - min(finals)) / 2
        lines.append(f"| {key} | {len(seeds)} | {mean:.4f} ± {half:.4f} | {sum(bests) / len(bests):.4f} "
                     f"| {wire:,.0f} | {sent:,.0f} | {secs:.1f} | {rate:.2f} |")
    return "\n".join(lines)


@dataclass
class AtBudget:
    """A method's held-out metric at a cumulative wire budget (MB through the busiest rank), mean
    over seeds. ``status``: "interpolated" (each run's evaluations bracket the budget: linear in
    MB between the two around it; ``mb`` is the budget), "stopped short" (a run's last
    evaluation sent less: its last evaluation, ``mb`` the MB it had sent, below the budget) or
    "starts beyond" (a run's first evaluation already sent more: no point within the budget;
    ``value`` and ``mb`` are its first evaluation's, above the budget)."""

    status: str
    value: float
    mb: float

    def text(self) -> str:
        """The cell as the docs' equal-bytes tables write it."""
        if self.status == "interpolated":
            return f"{self.value:.4g}"
        if self.status == "stopped short":
            return f"{self.value:.4g} (stopped short: all of its {self.mb:.3g} MB)"
        return f"n/a (first evaluation at {self.mb:.3g} MB: {self.value:.4g})"


def at_budget(seeds: dict, metric: str, mb: float) -> AtBudget:
    """``seeds``' metric at ``mb`` cumulative wire MB through a rank (:class:`AtBudget`): each
    run's metric interpolated linearly in MB between its last evaluation within ``mb`` and the
    next, so a method that evaluates rarely is not charged the budget it spent between
    evaluations; a run that never sent ``mb`` gives its last evaluation and one whose first
    evaluation sent more gives none (its status says which, the method is never dropped)."""
    points, status = [], "interpolated"
    for r in seeds.values():
        _, sent, values = curves(r, metric)
        i = sum(1 for m in sent if m <= mb * (1 + 1e-9)) - 1
        if i < 0:
            firsts = [(curves(s, metric)[2][0], curves(s, metric)[1][0]) for s in seeds.values()]
            return AtBudget("starts beyond", sum(v for v, _ in firsts) / len(firsts),
                            sum(m for _, m in firsts) / len(firsts))
        if i + 1 < len(sent):
            share = (mb - sent[i]) / (sent[i + 1] - sent[i])
            points.append((values[i] + share * (values[i + 1] - values[i]), mb))
        else:
            points.append((values[i], sent[i]))
            status = "stopped short" if sent[i] < mb * (1 - 1e-9) else status
    return AtBudget(status, sum(v for v, _ in points) / len(points), sum(m for _, m in points) / len(points))


def gs_budget(gs: dict, metric: str) -> tuple[float, float]:
    """(gs's final metric, its cumulative wire MB through a rank), means over seeds."""
    return final(gs, metric), sum(curves(r, metric)[1][-1] for r in gs.values()) / len(gs)


def peers_at_budget(runs: dict, metric: str, ratio: float | str, reference: str = "gs") -> dict[str, AtBudget]:
    """Every peer of ``reference`` at ``ratio`` (the methods at that k and those taking none, but
    dense) at the reference's whole cumulative wire bytes (:func:`at_budget`)."""
    ratio = ratio_text(ratio)
    _, sent = gs_budget(runs[f"{reference} @ {ratio}"], metric)
    return {key: at_budget(seeds, metric, sent) for key, seeds in runs.items()
            if key.rsplit(" @ ", 1)[0] not in (reference, "dense") and key.rsplit(" @ ", 1)[1] in (ratio, "1")}


def reference_of(methods: list[str]) -> str:
    """The gs variant the others are compared with: "gs" (the defaults) when it ran, else the
    first gs variant ("gs fp32", ...)."""
    return "gs" if "gs" in methods else next((m for m in methods if m.startswith("gs")), "gs")


def headline(runs: dict, metric: str, reference: str = "gs") -> str:
    """``reference`` against dense at its final evaluation (accuracy: points; perplexity: %), and
    every other method (at the same k, and those without a k) at equal wire bytes: its metric
    at the reference's whole cumulative budget (:func:`peers_at_budget`, mean over seeds)."""
    lines = []
    dense = runs.get("dense @ 1")
    for key, seeds in runs.items():
        label, ratio = key.rsplit(" @ ", 1)
        if label != reference:
            continue
        last, sent = gs_budget(seeds, metric)
        if dense:
            d = final(dense, metric)
            gap = (f"{100 * (last - d):+.2f} points" if metric == "accuracy"
                   else f"{100 * (last / d - 1):+.1f} %")
            lines.append(f"{key}: final {metric} {last:.4f}, dense {d:.4f} ({gap} against dense)")
        lines.append(f"  at equal wire bytes ({sent:.3g} MB through a rank, {reference}'s whole budget):")
        for other, got in peers_at_budget(runs, metric, ratio, reference).items():
            lines.append(f"    {other}: {got.text()}")
    return "\n".join(lines)


def gs_vs_best(runs: dict, metric: str, ratio: float | str) -> tuple[float, float, str, dict[str, AtBudget]]:
    """(gs's final metric / the best peer's, gs's wire MB / that peer's, its key, every peer at
    gs's budget): the best by ``metric`` among the peers with a point within gs's whole
    cumulative wire bytes (:func:`peers_at_budget`: interpolated there, or stopped short of
    it); the peers whose first evaluation sent more are in the dict, not in the pick."""
    last, sent = gs_budget(runs[f"gs @ {ratio_text(ratio)}"], metric)
    peers = peers_at_budget(runs, metric, ratio)
    within = {key: got for key, got in peers.items() if got.status != "starts beyond"}
    if not within:
        raise ValueError(f"no peer has an evaluation within gs's {sent:.3g} MB: "
                         + ", ".join(f"{key} {got.text()}" for key, got in peers.items()))
    pick = min if metric == "perplexity" else max
    key = pick(within, key=lambda k: within[k].value)
    return last / within[key].value, sent / within[key].mb, key, peers


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (``scripts/check_docs.py`` parses every documented command with it)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=list(WORKLOADS), default="cnn")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--epochs", type=int, default=10, help="cnn, mlp: the step budget, every method")
    p.add_argument("--steps", type=int, default=120, help="lm: the step budget, every method")
    p.add_argument("--eval-every", type=int, default=20, help="lm: steps between held-out perplexities")
    p.add_argument("--hidden", type=int, help="the model's --hidden (default: the script's)")
    p.add_argument("--batch-size", type=int, help="the script's --batch-size per rank (default: the script's)")
    p.add_argument("--simulated-ranks", type=int, metavar="P",
                   help="P ranks simulated in one process (the scripts' --simulated-ranks) instead of a launcher")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--ratios", type=ratio_arg, nargs="+", default=[0.01, 0.001],
                   help='k / D for the methods that select k; "auto": gs at its default density (no --ratio)')
    p.add_argument("--methods", nargs="+",
                   help=f"labels of {list(METHODS)} (default: {DEFAULT_METHODS}; under torchrun {DDP_DEFAULT})")
    p.add_argument("--quick", action="store_true",
                   help=f"a smoke subset: {QUICK['methods']}, ratio {QUICK['ratios']}, seed {QUICK['seeds']}, "
                        f"{QUICK['epochs']} epoch, {QUICK['ranks']} ranks, the {QUICK['model']}")
    p.add_argument("--launcher", choices=["horovodrun", "torchrun", "fsdp"], default="horovodrun",
                   help=f"torchrun: DDP with a communication hook per method ({DDP_LABELS}); fsdp: FSDP2 on an "
                        f"R x S mesh under torchrun, the CNN or the LM ({FSDP_LABELS})")
    p.add_argument("--replicas", type=int, default=2, help="--launcher fsdp: R (S = --ranks / R)")
    p.add_argument("--out-dir", default="docs")
    p.add_argument("--add", action="store_true",
                   help="keep the runs already in <out-dir>'s data file, add (or replace) the ones run now: "
                        "a matrix whose methods run at different ratios, built by several commands")
    p.add_argument("--plot-only", action="store_true",
                   help="table and plot again from <out-dir>/convergence_<model>.json")
    args = p.parse_args(argv)
    if args.quick and args.simulated_ranks:
        q = QUICK_SIMULATED
        args.methods, args.ratios, args.seeds, args.epochs, args.model, args.batch_size = (
            q["methods"], q["ratios"], q["seeds"], q["epochs"], q["model"], q["batch_size"])
    elif args.quick:
        args.methods, args.ratios, args.seeds, args.epochs, args.ranks, args.model = (
            QUICK["methods"], QUICK["ratios"], QUICK["seeds"], QUICK["epochs"], QUICK["ranks"], QUICK["model"])
    if not args.methods:
        args.methods = {"torchrun": DDP_DEFAULT, "fsdp": FSDP_LABELS}.get(args.launcher, DEFAULT_METHODS)
    if args.launcher == "fsdp" and (args.simulated_ranks or args.model == "mlp" or args.ranks % args.replicas):
        p.error("--launcher fsdp trains the cnn or the lm on real ranks, --replicas dividing --ranks")
    known = (SIMULATED if args.simulated_ranks else DDP_LABELS if args.launcher == "torchrun"
             else FSDP_LABELS if args.launcher == "fsdp" else list(METHODS))
    unknown = [m for m in args.methods if m not in known]
    if unknown:
        p.error(f"unknown methods {unknown} for --launcher {args.launcher}; known: {known}")
    selecting = [m for m in args.methods if m not in UNCOMPRESSED and not m.startswith("gs")]
    if "auto" in args.ratios and selecting:
        p.error(f"--ratios auto is gs's default density; {selecting} select k = ratio · D: run them with a "
                "numeric --ratios in a command of their own (--add)")
    return args


def stem_of(args: argparse.Namespace) -> str:
    """The name (without suffix) of the run's data file and plot in ``--out-dir``."""
    return f"convergence_{args.model}" + (f"_sim{args.simulated_ranks}" if args.simulated_ranks else
                                          f"_ddp{args.ranks}" if args.launcher == "torchrun" else
                                          f"_fsdp{args.replicas}x{args.ranks // args.replicas}"
                                          if args.launcher == "fsdp" else "")


def outputs(args: argparse.Namespace) -> list[Path]:
    """The files the command writes: the data file (not with ``--plot-only``, which reads it) and
    the plot (``scripts/check_docs.py`` checks that no documented command overwrites a record)."""
    out, stem = Path(args.out_dir), stem_of(args)
    return ([] if args.plot_only else [out / f"{stem}.json"]) + [out / f"{stem}.png"]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = stem_of(args)
    data = out / f"{stem}.json"
    name, _, _, metric = WORKLOADS[args.model]
    via = {"torchrun": ", DDP hooks (torchrun)",
           "fsdp": f", FSDP2 {args.replicas} replicas × {args.ranks // args.replicas} shards (torchrun)"}.get(
        "" if args.simulated_ranks else args.launcher, "")
    ranks = f"{args.simulated_ranks} simulated ranks" if args.simulated_ranks else f"{args.ranks} ranks"
    title = f"{name}, {ranks}{via}, {budget(args)[1]} (dashed: k = 1/1000, dotted: no k, solid: the rest)"
    if args.plot_only:
        runs = json.loads(data.read_text())
        print(table(runs, metric) + "\n\n" + headline(runs, metric, reference_of(args.methods)))
        plot(runs, out / f"{stem}.png", title, metric)
        print_gs_vs_best(runs, metric, args)
        return
    # seeds outermost, the data file rewritten after every run: a matrix cut short still holds
    # every method at the seeds it finished
    runs: dict[str, dict[str, dict]] = json.loads(data.read_text()) if args.add and data.exists() else {}
    for seed in args.seeds:
        for label in args.methods:
            for ratio in ([1.0] if label in UNCOMPRESSED else args.ratios):
                key = f"{label} @ {ratio_text(ratio)}"
                print(f"[bench_convergence] {key} seed {seed}", file=sys.stderr, flush=True)
                try:
                    runs.setdefault(key, {})[str(seed)] = run(label, ratio, seed, args)
                except subprocess.CalledProcessError as e:
                    tail = e.stderr.decode(errors="replace").strip().splitlines()[-3:]
                    print(f"[bench_convergence] {key} seed {seed} FAILED: {' / '.join(tail)}", file=sys.stderr)
                data.write_text(json.dumps({k: v for k, v in runs.items() if v}, indent=1))
    runs = {k: v for k, v in runs.items() if v}
    print(table(runs, metric))
    print("\n" + headline(runs, metric, reference_of(args.methods)))
    plot(runs, out / f"{stem}.png", title, metric)
    print_gs_vs_best(runs, metric, args)


def gs_vs_best_lines(runs: dict, metric: str, ratio: float | str, ranks: int) -> list[str]:
    """Every peer at gs's whole cumulative budget at ``ratio``, the best one with a point within
    it and the ``gs_vs_best`` line (:func:`gs_vs_best`); where no peer has such a point, the
    peers and ``gs_vs_best P=<P> none``."""
    _, sent = gs_budget(runs[f"gs @ {ratio_text(ratio)}"], metric)
    lines = [f"every peer at gs's {sent:.3g} wire MB (k = D·{ratio_text(ratio)}):"]
    try:
        x, y, peer, peers = gs_vs_best(runs, metric, ratio)
    except ValueError:  # every peer's first evaluation sent more than gs's whole budget
        lines += [f"  {key}: {got.text()}" for key, got in peers_at_budget(runs, metric, ratio).items()]
        return lines + [f"gs_vs_best P={ranks} none: no peer within gs's wire bytes"]
    lines += [f"  {key}: {got.text()}" for key, got in peers.items()]
    return lines + [f"best peer with a point within gs's wire bytes: {peer}",
                    f"gs_vs_best P={ranks} metric_ratio {x:.3f} wire_bytes_ratio {y:.3f}"]


def print_gs_vs_best(runs: dict, metric: str, args: argparse.Namespace) -> None:
    """Under --simulated-ranks, :func:`gs_vs_best_lines` for each ratio gs ran at."""
    if not args.simulated_ranks:
        return
    for ratio in args.ratios:
        if f"gs @ {ratio_text(ratio)}" in runs:
            print("\n" + "\n".join(gs_vs_best_lines(runs, metric, ratio, args.simulated_ranks)))


if __name__ == "__main__":
    main()
