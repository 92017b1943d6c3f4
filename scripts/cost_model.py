"""A cost model of one data-parallel training step per method: compute plus, for every
communication round the method actually takes, α + bytes/β.

    time per step = compute (forward/backward + the method's compression work)
                    + Σ over the method's collectives of its rounds' (α + bytes / β)

Collectives (P ranks; n = bytes a rank contributes):
- ``allreduce``  ring: 2(P−1) rounds of n/P
- ``tree``       recursive-doubling allreduce: ⌈log2 P⌉ rounds of n
- ``allgather``  ring: P−1 rounds of n
- ``pairwise``   one recursive-doubling exchange round of n (gTop-k issues 2·log2 P of them)
- ``gather``     star, every rank to rank 0: α + (P−1)·n/β through rank 0's link
- ``broadcast``  binomial tree: ⌈log2 P⌉ rounds of n

Two uses:

``--validate RESULTS.jsonl``: predicts the shaped runs of ``scripts/bench_throughput.sh``
from what the same file holds: α and β from its ping-pong per rate; compute per (method,
ranks) measured on this machine by the same run on unshaped links (its time per step less the
model's communication time there); collectives as each run recorded them. Prints the measured
steps/s per rank count (with gs-SGD's ratio to each method), then measured vs predicted
steps/s and, as its LAST line, ``max_rel_error <x>``.

``--project``: steps/s for P = 8 … 1024 at 1, 10, 100 Gbit/s for a ResNet-50-sized (25.6M)
and a BERT-large-sized (340M) model on GPU-class compute (ASSUMPTIONS, stated in
``MODELS`` and ``--gpu-bandwidth``), with gs-SGD's global-scope wire format as parameters
(``--rows``, ``--width``, ``--candidates``, ``--sketch-bytes``), a table of gs-SGD's
speed-up over each peer and a plot (``--plot``).
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from gs_horovod.gs_sgd import GsConfig

Collectives = list[tuple[str, float]]


def rounds(kind: str, nbytes: float, ranks: int) -> list[float]:
    """The bytes of each round a rank's link carries in turn for one collective."""
    P = ranks
    if P <= 1:
        return []
    if kind == "allreduce":
        return [nbytes / P] * (2 * (P - 1))
    if kind in ("tree", "broadcast"):
        return [nbytes] * math.ceil(math.log2(P))
    if kind == "allgather":
        return [nbytes] * (P - 1)
    if kind == "pairwise":
        return [nbytes]
    if kind == "gather":
        return [(P - 1) * nbytes]
    raise ValueError(f"unknown collective {kind!r}")


def comm_seconds(collectives: Collectives, ranks: int, alpha: float, beta: float) -> float:
    """Σ over every round of every collective of α + bytes/β."""
    return sum(alpha + b / beta for kind, n in collectives for b in rounds(kind, n, ranks))


# ---------------------------------------------------------------------------------------------
# validation against the shaped runs


def measured(runs: list[dict]) -> None:
    """Prints the runs' steps/s, a table per rank count: a row per method, a column per link
    setting (in the file's order), then gs-SGD's steps/s divided by the method's at each
    shaped link (> 1: gs-SGD faster)."""
    labels = list(dict.fromkeys(r["label"] for r in runs))
    shaped = [label for label in labels if label != "local"]
    for P in sorted({r["ranks"] for r in runs}):
        at = {(r["method"], r["label"]): r for r in runs if r["ranks"] == P}
        print(f"{P} ranks, steps/s:\n\n| method | payload bytes/step/rank | " + " | ".join(labels)
              + "".join(f" | gs-SGD ÷ it, {label}" for label in shaped) + " |\n|---|---|"
              + "---|" * (len(labels) + len(shaped)))
        for m in (m for m in METHOD_NAMES if any(k[0] == m for k in at)):
            payload = next(r["bytes_per_step"] for k, r in at.items() if k[0] == m)
            cells = [f"{at[m, label]['steps_per_s']:.3f}" if (m, label) in at else "" for label in labels]
            cells += [f"{at['gs', label]['steps_per_s'] / at[m, label]['steps_per_s']:.2f}"
                      if m != "gs" and ("gs", label) in at and (m, label) in at else "" for label in shaped]
            print(f"| {METHOD_NAMES[m]} | {payload:,.0f} | " + " | ".join(cells) + " |")
        print()


def validate(path: Path) -> float:
    """Prints the measured steps/s (:func:`measured`), then predicts every shaped run in
    ``path``; prints a table and returns the largest relative error of steps/s. Compute per
    (method, ranks) = the unshaped ("local") run's time per step minus what the model gives for
    its collectives on the unshaped link."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    links = {r["label"]: (r["alpha_s"], r["beta_bytes_per_s"]) for r in rows if r.get("kind") == "pingpong"}
    runs = [r for r in rows if r.get("kind") == "run"]
    measured(runs)
    compute = {}
    for r in runs:
        if r["label"] == "local":
            comm = comm_seconds([tuple(c) for c in r["collectives"]], r["ranks"], *links["local"])
            compute[(r["method"], r["ranks"])] = max(0.0, 1.0 / r["steps_per_s"] - comm)
    shaped = [r for r in runs if r["label"] != "local" and (r["method"], r["ranks"]) in compute]
    if not shaped:
        raise SystemExit(f"{path} has no shaped run with an unshaped one to calibrate it "
                         "(scripts/bench_throughput.sh writes both)")
    print("| rate | P | method | α (µs) | β (MB/s) | compute (s) | comm (s) | measured steps/s | predicted | "
          "rel. error |\n|---|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    for r in shaped:
        alpha, beta = links[r["label"]]
        c = compute[(r["method"], r["ranks"])]
        comm = comm_seconds([tuple(x) for x in r["collectives"]], r["ranks"], alpha, beta)
        predicted = 1.0 / (c + comm)
        err = abs(predicted - r["steps_per_s"]) / r["steps_per_s"]
        worst = max(worst, err)
        print(f"| {r['label']} | {r['ranks']} | {r['method']} | {alpha * 1e6:.0f} | {beta / 1e6:.1f} | {c:.3f} "
              f"| {comm:.3f} | {r['steps_per_s']:.3f} | {predicted:.3f} | {err:.2f} |")
    print(f"max_rel_error {worst:.3f}")
    return worst


# ---------------------------------------------------------------------------------------------
# projection to GPU clusters


@dataclass
class Model:
    """A model for the projection. ``compute_s``: forward + backward per step per GPU, an
    ASSUMPTION (see ``source``); ``layers``: (rows, cols) of its weight matrices, for PowerSGD."""

    name: str
    params: int
    compute_s: float
    source: str
    layers: list[tuple[int, int]]


def _resnet50_layers() -> list[tuple[int, int]]:
    """ResNet-50's conv weights as (out channels, in channels·kh·kw) matrices plus the fc layer:
    the 25.5M of its 25.6M parameters that PowerSGD compresses."""
    layers = [(64, 3 * 49)]
    inp = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            layers += [(width, inp), (width, width * 9), (4 * width, width)]
            if b == 0:
                layers.append((4 * width, inp))
            inp = 4 * width
    return layers + [(1000, 2048)]


def _bert_large_layers() -> list[tuple[int, int]]:
    """BERT-large's matrices: 24 layers of Q, K, V, O (1024×1024) and the FFN (4096×1024, 1024×4096),
    the word-embedding table (30522×1024) and the pooler."""
    return [(1024, 1024)] * 4 * 24 + [(4096, 1024), (1024, 4096)] * 24 + [(30522, 1024), (1024, 1024)]


MODELS = {
    "resnet50": Model("ResNet-50 (25.6M)", 25_600_000, 0.100,
                      "ASSUMED 0.10 s/step: batch 256 per GPU at ~2,500 images/s, roughly the per-A100 "
                      "mixed-precision training throughput NVIDIA publishes for ResNet-50 v1.5 "
                      "(DeepLearningExamples); not measured here", _resnet50_layers()),
    "bert-large": Model("BERT-large (340M)", 340_000_000, 0.330,
                        "ASSUMED 0.33 s/step: batch 32 × 512 tokens = 6 · 340M · 16,384 ≈ 33 TFLOP per "
                        "step at an assumed 100 TFLOP/s sustained (about a third of an A100's fp16 peak); "
                        "not measured here", _bert_large_layers()),
}
METHOD_NAMES = {"none": "dense", "fp16": "fp16", "gs": "gs-SGD", "topk": "top-k allgather", "gtopk": "gTop-k",
                "sketched": "Sketched-SGD", "powersgd": "PowerSGD"}


@dataclass
class Wire:
    """Compression parameters of the projection (gs-SGD's wire format and the peers' k)."""

    ratio: float = 0.001
    rows: int = 3
    width: float = 2.0
    candidates: int = 2
    sketch_bytes: int = 2
    sketched_p2: int = 4
    sketched_rows: int = 5
    sketched_width: float = 4.0
    powersgd_rank: int = 4


def projected_collectives(method: str, model: Model, ranks: int, w: Wire) -> Collectives:
    """The collectives of one step for the whole model (gs-SGD in global scope: one k for the
    whole model, its sketch merged by ONE ring allreduce and its candidates' values by one more)."""
    D = model.params
    k = math.ceil(w.ratio * D)
    if method == "none":
        return [("allreduce", 4 * D)]
    if method == "fp16":
        return [("allreduce", 2 * D)]
    if method == "gs":
        cols = math.ceil(w.width * k)
        return [("allreduce", w.rows * cols * w.sketch_bytes), ("allreduce", w.candidates * k * 4)]
    if method == "topk":
        return [("allgather", 4 * k), ("allgather", 4 * k)]
    if method == "gtopk":
        return [("pairwise", 4 * k)] * (2 * math.ceil(math.log2(ranks)))
    if method == "sketched":
        cands = w.sketched_p2 * k
        sketch = 4 * w.sketched_rows * math.ceil(w.sketched_width * k)
        return [("gather", sketch), ("broadcast", 8 * cands), ("allreduce", 4 * cands)]
    if method == "powersgd":
        r = w.powersgd_rank
        low = [(n, m) for n, m in model.layers if min(n, m) > r]
        return [("allreduce", 4 * r * sum(n for n, _ in low)), ("allreduce", 4 * r * sum(m for _, m in low))]
    raise ValueError(f"unknown method {method!r}")


def kernel_passes(method: str, w: Wire) -> float:
    """ASSUMED memory passes over the D-element f32 gradient for a method's compression work on
    a GPU (streaming passes; scattered atomic adds counted as 4 passes each, gathers as 2):
    error feedback 3 (read g, read e, write a), residual update 2, top-k selection 4."""
    if method == "none":
        return 0.0
    if method == "fp16":
        return 2.0
    if method in ("gs", "sketched"):  # Sketched-SGD's root does the same query
        rows = w.rows if method == "gs" else w.sketched_rows
        return 3 + 4 * rows + 2 * rows + 4 + 2
    if method in ("topk", "gtopk"):
        return 3 + 4 + 2
    if method == "powersgd":
        return 3 + 2 + 1 + 2  # M·Q and Mᵀ·P read M once each; P·Qᵀ written once
    raise ValueError(f"unknown method {method!r}")


def project(models: list[Model], rates_gbit: list[float], ranks: list[int], methods: list[str], w: Wire,
            alpha: float, gpu_bandwidth: float, kernel_json: Optional[dict]) -> dict:
    """{model: {rate: {method: [steps/s for each P]}}}."""
    out: dict = {}
    for model in models:
        for rate in rates_gbit:
            beta = rate * 1e9 / 8
            for method in methods:
                if kernel_json and method in kernel_json.get("seconds_per_element", {}):
                    kernel = kernel_json["seconds_per_element"][method] * model.params
                else:
                    kernel = kernel_passes(method, w) * 4 * model.params / gpu_bandwidth
                series = []
                for P in ranks:
                    comm = comm_seconds(projected_collectives(method, model, P, w), P, alpha, beta)
                    series.append(1.0 / (model.compute_s + kernel + comm))
                out.setdefault(model.name, {}).setdefault(rate, {})[method] = series
    return out


def plot(table: dict, ranks: list[int], path: Path) -> None:
    """One panel per (model, rate): gs-SGD's speed-up over each peer against P; above 1, gs-SGD wins."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(table)
    rates = list(table[models[0]])
    fig, axes = plt.subplots(len(models), len(rates), figsize=(4.2 * len(rates), 3.6 * len(models)), squeeze=False)
    for i, model in enumerate(models):
        for j, rate in enumerate(rates):
            ax = axes[i][j]
            gs = table[model][rate]["gs"]
            for method, series in table[model][rate].items():
                if method != "gs":
                    ax.plot(ranks, [g / s for g, s in zip(gs, series)], marker=".", label=f"vs {METHOD_NAMES[method]}")
            ax.axhline(1.0, color="k", lw=0.8)
            ax.set(xscale="log", yscale="log", title=f"{model}, {rate:g} Gbit/s", xlabel="ranks P",
                   ylabel="gs-SGD steps/s ÷ peer's")
            ax.set_xticks(ranks, [str(p) for p in ranks], fontsize=7)
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Projected: above 1, gs-SGD is faster (GPU compute and kernel times ASSUMED; see docs)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--validate", type=Path, metavar="RESULTS_JSONL", help="predict bench_throughput.sh's runs")
    p.add_argument("--project", action="store_true", help="project steps/s to P = 8 … 1024")
    p.add_argument("--ratio", type=float, default=0.001, help="k / D for the whole model (every method)")
    shipped = GsConfig()  # GsSketch's defaults
    p.add_argument("--rows", type=int, default=shipped.rows, help="gs sketch rows")
    p.add_argument("--width", type=float, default=shipped.width, help="gs sketch columns / k")
    p.add_argument("--candidates", type=int, default=shipped.candidates, help="gs candidate values per k")
    p.add_argument("--sketch-bytes", type=int, choices=(2, 4), default=2 if shipped.sketch_dtype == "float16" else 4,
                   help="2: float16 sketch, 4: float32")
    p.add_argument("--alpha", type=float, default=5e-6, help="projection: per-round latency in s (ASSUMED)")
    p.add_argument("--gpu-bandwidth", type=float, default=1.0e12,
                   help="projection: effective GPU memory bandwidth in bytes/s for compression kernels (ASSUMED)")
    p.add_argument("--kernel-json", type=Path,
                   help='projection: measured kernel times, {"seconds_per_element": {method: s}} (overrides passes)')
    p.add_argument("--plot", type=Path, help="projection: write the speed-up plot here")
    p.add_argument("--out", type=Path, help="projection: write the steps/s table as JSON here")
    args = p.parse_args()
    if args.project:
        w = Wire(args.ratio, args.rows, args.width, args.candidates, args.sketch_bytes)
        ranks = [2 ** i for i in range(3, 11)]
        methods = list(METHOD_NAMES)
        kernel = json.loads(args.kernel_json.read_text()) if args.kernel_json else None
        table = project(list(MODELS.values()), [1.0, 10.0, 100.0], ranks, methods, w, args.alpha,
                        args.gpu_bandwidth, kernel)
        for model in MODELS.values():
            print(f"\n{model.name}: compute {model.source}")
        print(f"\nk = {args.ratio} · D; gs: {args.rows} rows × {args.width}·k columns, "
              f"{args.sketch_bytes}-byte sketch, {args.candidates}·k candidates; "
              f"α = {args.alpha * 1e6:g} µs per round (ASSUMED); "
              f"compression kernels at {args.gpu_bandwidth / 1e9:g} GB/s (ASSUMED)")
        print("\ngs-SGD steps/s ÷ each peer's (> 1: gs-SGD faster)\n")
        print("| model | Gbit/s | P | gs steps/s | " + " | ".join(f"÷ {METHOD_NAMES[m]}" for m in methods if m != "gs")
              + " |\n|---|---|---|---|" + "---|" * (len(methods) - 1))
        for model, by_rate in table.items():
            for rate, by_method in by_rate.items():
                for i, P in enumerate(ranks):
                    if P not in (8, 64, 1024):
                        continue
                    gs = by_method["gs"][i]
                    print(f"| {model} | {rate:g} | {P} | {gs:.2f} | "
                          + " | ".join(f"{gs / by_method[m][i]:.2f}" for m in methods if m != "gs") + " |")
        wins: dict = defaultdict(list)
        for model, by_rate in table.items():
            for rate, by_method in by_rate.items():
                for m in methods:
                    if m != "gs" and all(g > s for g, s in zip(by_method["gs"], by_method[m])):
                        wins[(model, rate)].append(METHOD_NAMES[m])
        print("\ngs-SGD faster at every P = 8 … 1024:")
        for (model, rate), peers in wins.items():
            print(f"- {model} at {rate:g} Gbit/s: {', '.join(peers)}")
        if args.plot:
            plot(table, ranks, args.plot)
        if args.out:
            args.out.write_text(json.dumps({"ranks": ranks, "table": {m: {str(r): v for r, v in t.items()}
                                                                      for m, t in table.items()}}, indent=1))
    if args.validate:
        validate(args.validate)
    if not (args.project or args.validate):
        p.error("give --validate RESULTS_JSONL and/or --project")


if __name__ == "__main__":
    main()
