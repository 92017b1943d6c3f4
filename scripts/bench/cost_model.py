"""A cost model of one data-parallel training step per method: compute plus, for every
communication round the method takes, α + bytes/β.

    time per step = compute (forward/backward + the method's compression work)
                    + Σ over the method's collectives of its rounds' (α + bytes / β)

The rounds of each collective (ring allreduce, tree, ring allgather, pairwise, star gather,
binomial broadcast) are :func:`gs_horovod.transports.collective_cost.rounds`. A method variant is a word as
``scripts/bench/bench_throughput.sh`` takes it: ``METHOD[:NAME=VALUE,...]`` with the baseline's
constructor options or GsSketch's (e.g. ``gtopk:scope=layer``, ``powersgd:rank=1``).

``--validate RESULTS.jsonl`` (the rows of ``scripts/bench/bench_throughput.sh``):

1. Measured steps/s per rank count: per variant and link setting the median over the repeats
   with min–max, and gs-SGD's steps/s ÷ each variant's at every shaped link.
2. Calibration (in-sample): α and β per link setting from its ping-pong (median over
   repeats); compute per (variant, P) = the unshaped ("local") runs' median time per step less
   the model's communication time on the unshaped link.
3. Prediction (out-of-sample): every shaped run, at bandwidths no compute calibration saw,
   from its compute at the same P and its recorded collectives at that rate's α and β.
4. Cross-P (out-of-sample, secondary): every run at a larger P from the smallest P's compute,
   scaled by ranks per core (the harness pins rank i to core i mod cores).

With ``--collectives SWEEP.jsonl`` (``scripts/bench/collective_sweep.sh``: allreduce,
allgather, alltoall, pairwise, gather and broadcast size sweeps through real Horovod ranks on
the same shaped links), each collective is priced at α and β fitted per collective algorithm
and link (:func:`fit_collectives`) instead of the ping-pong's; the sweep never sees a training
run, so every shaped row stays out-of-sample. ``--validation-out`` writes the verdict as JSON
(``max_rel_error``, ``holds``: ≤ ``TARGET``, the fits).

The LAST line is ``max_rel_error <x>``: the largest |predicted − measured| / measured steps/s
of step 3 over the rows whose modelled communication is ≥ 20 % of the step (the line above it
says how many rows that is; ``nan`` when none is).

``--project``: steps/s for P = 8 … 1024 at 1, 10, 100 Gbit/s for ResNet-50 (25.6M) and
BERT-large (335M), their parameter shapes written out below, on GPU-class compute
(ASSUMPTIONS, stated in ``MODELS``, ``--alpha`` and ``--gpu-bandwidth``). Each variant's
collectives come from the shapes alone: the baselines' ``Reducer.planned``, gs-SGD's
``Plan.payload_bytes``. Prints gs-SGD's speed-up over each variant; ``--plot`` draws it.
The projection is labelled validated only when ``--validation`` (the JSON of
``--validation-out``) says the model holds; the label and the measured error go into ``--out``.

    bash scripts/bench/collective_sweep.sh docs/collective_sweep.jsonl "100mbit 1gbit" "2 4"
    python scripts/bench/cost_model.py --validate docs/throughput_fair.jsonl \
        --collectives docs/collective_sweep.jsonl --validation-out docs/cost_model_validation.json
    python scripts/bench/cost_model.py --project --validation docs/cost_model_validation.json \
        --plot docs/projection.png --out docs/projection.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from gs_bench.variants import gs_config, parse_variant, planned, reducer, variant_label
from gs_horovod.transports.collective_cost import Collective, rounds

Collectives = list[Collective]
SHARE = 0.20  # max_rel_error counts rows whose modelled communication is at least this share of the step
TARGET = 0.20  # the model holds when max_rel_error is at most this
BIG = 1 << 20  # collective sizes (bytes per rank) from which a sweep's slope gives β
HEADLINE = ("gs", "gs:exchange=sketch", "gtopk", "gtopk:scope=layer", "topk", "sketched", "powersgd:rank=1",
            "powersgd:rank=4", "none", "fp16")


Fits = dict[str, tuple[float, float]]  # collective kind → its (α s per round, β bytes/s) on one link


def comm_seconds(collectives: Collectives, ranks: int, alpha: float, beta: float, fits: Optional[Fits] = None) -> float:
    """Σ over every round of every collective of α + bytes/β, at the collective kind's own
    (α, β) where ``fits`` has its kind, else at ``alpha`` and ``beta``."""
    fits = fits or {}
    total = 0.0
    for kind, n in collectives:
        a, b = fits.get(kind, (alpha, beta))
        total += sum(a + x / b for x in rounds(kind, n, ranks))
    return total


# ---------------------------------------------------------------------------------------------
# α and β per collective algorithm, from scripts/bench/collective_sweep.sh


def fit_kind(rows: list[dict]) -> Optional[tuple[float, float, float]]:
    """(α, β, worst in-sample |fitted − measured| / measured over the rows of ≥ BIG bytes) of
    t = α·R + W/β for one collective on one link, R its rounds and W their bytes
    (:func:`gs_horovod.transports.collective_cost.rounds`), as :func:`pingpong.fit` fits a link: α = the median over
    rank counts of t/R at the smallest size (Horovod's per-call overhead included); β from the
    least-squares slope of t against W over the sizes of ≥ BIG bytes (below that tc's token
    bucket lets a message through at line rate), with an intercept per rank count. None when
    there is no such slope (fewer than two large sizes at some rank count, or a slope ≤ 0)."""
    R = np.array([len(rounds(r["collective"], r["bytes"], r["ranks"])) for r in rows], float)
    W = np.array([sum(rounds(r["collective"], r["bytes"], r["ranks"])) for r in rows], float)
    t = np.array([r["seconds"] for r in rows], float)
    n = np.array([r["bytes"] for r in rows])
    P = np.array([r["ranks"] for r in rows])
    alpha = float(np.median([t[i] / R[i] for p in set(P.tolist()) for i in np.flatnonzero(P == p)
                             if n[i] == n[P == p].min()]))
    big = n >= BIG
    ps = sorted(set(P[big].tolist()))
    design = np.stack([P[big] == p for p in ps] + [W[big]], 1).astype(float)
    coef, _, rank, _ = np.linalg.lstsq(design, t[big], rcond=None)
    if rank < design.shape[1] or coef[-1] <= 0:
        return None  # too few large sizes for a slope, or none that grows with the bytes
    fitted = design @ coef
    return alpha, 1.0 / float(coef[-1]), float(np.max(np.abs(fitted - t[big]) / t[big]))


def fit_collectives(path: Path) -> dict[str, dict[str, tuple[float, float, float]]]:
    """{link label: {collective kind: (α, β, worst in-sample relative error)}} from a sweep file's
    ``"kind": "collective"`` rows, every rank count of a link together."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for line in path.read_text().splitlines():
        r = json.loads(line) if line.strip() else {}
        if r.get("kind") == "collective":
            groups[r["label"], r["collective"]].append(r)
    fits: dict[str, dict[str, tuple[float, float, float]]] = defaultdict(dict)
    for (label, kind), rows in groups.items():
        fit = fit_kind(rows)
        if fit:
            fits[label][kind] = fit
    return dict(fits)


# ---------------------------------------------------------------------------------------------
# validation against the shaped runs


@dataclass
class Cell:
    """The runs of one (variant, ranks, link) cell: steps/s by repeat."""

    variant: str
    label: str
    ranks: int
    by_repeat: dict[int, float]
    payload: float
    collectives: Collectives
    cores: Optional[int]

    @property
    def median(self) -> float:
        return statistics.median(self.by_repeat.values())

    def text(self) -> str:
        values = self.by_repeat.values()
        return f"{self.median:.3f} ({min(values):.3f}–{max(values):.3f})"


def load(path: Path) -> tuple[dict[str, tuple[float, float]], dict[tuple[str, int, str], Cell], list[str]]:
    """(links {label: (α, β) medians over the ping-pongs}, cells {(variant, ranks, label)}, labels
    in file order) of a results file."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    pings: dict[str, list[tuple[float, float]]] = defaultdict(list)
    cells: dict[tuple[str, int, str], Cell] = {}
    labels: list[str] = []
    for r in rows:
        if r.get("kind") == "pingpong":
            pings[r["label"]].append((r["alpha_s"], r["beta_bytes_per_s"]))
        elif r.get("kind") == "run":
            if "variant" not in r:
                raise SystemExit(f"{path}: a run without 'variant' (written by an older bench_throughput.py, "
                                 "whose options it cannot tell); rerun scripts/bench/bench_throughput.sh")
            variant = r["variant"]
            key = (variant, r["ranks"], r["label"])
            if key not in cells:
                cells[key] = Cell(variant, r["label"], r["ranks"], {}, r["bytes_per_step"],
                                  [tuple(c) for c in r["collectives"]], r.get("cpu_count"))
            cell = cells[key]
            cell.by_repeat[r.get("repeat", len(cell.by_repeat))] = r["steps_per_s"]
            labels += [r["label"]] if r["label"] not in labels else []
    links = {label: (statistics.median(a for a, _ in v), statistics.median(b for _, b in v))
             for label, v in pings.items()}
    return links, cells, labels


def _label(variant: str) -> str:
    return variant_label(*parse_variant(variant))


def _ratio(gs: Cell, other: Cell) -> str:
    """gs-SGD's median steps/s ÷ the other's, with min–max of the per-repeat ratios (runs of the
    same repeat ran close in time) when at least two repeats pair up."""
    text = f"{gs.median / other.median:.2f}"
    paired = [gs.by_repeat[i] / other.by_repeat[i] for i in gs.by_repeat if i in other.by_repeat]
    return text + (f" ({min(paired):.2f}–{max(paired):.2f})" if len(paired) > 1 else "")


def measured(cells: dict[tuple[str, int, str], Cell], labels: list[str]) -> None:
    """Per rank count: a row per variant (file order), a column per link setting (median
    steps/s, min–max over repeats), then gs-SGD's ÷ the variant's at each shaped link."""
    shaped = [label for label in labels if label != "local"]
    variants = list(dict.fromkeys(v for v, _, _ in cells))
    gs = next((v for v in variants if parse_variant(v)[0] == "gs"), None)
    shaped = shaped if gs else []
    for P in sorted({p for _, p, _ in cells}):
        repeats = sorted({len(c.by_repeat) for c in cells.values() if c.ranks == P})
        span = str(repeats[0]) if len(repeats) == 1 else f"{repeats[0]}–{repeats[-1]}"
        print(f"{P} ranks: steps/s, median (min–max) over {span} repeat{'' if span == '1' else 's'} per cell"
              + (f"; {_label(gs)} ÷ each, median (per-repeat min–max)" if gs else "") + "\n")
        print("| variant | payload bytes/step/rank | " + " | ".join(labels)
              + "".join(f" | gs-SGD ÷ it, {label}" for label in shaped) + " |\n|---|---|"
              + "---|" * (len(labels) + len(shaped)))
        for v in variants:
            mine = {label: cells[v, P, label] for label in labels if (v, P, label) in cells}
            if not mine:
                continue
            cols = [mine[label].text() if label in mine else "" for label in labels]
            cols += [_ratio(cells[gs, P, label], mine[label]) if v != gs and label in mine and (gs, P, label) in cells
                     else "" for label in shaped]
            print(f"| {_label(v)} | {next(iter(mine.values())).payload:,.0f} | " + " | ".join(cols) + " |")
        print()


def _predict_table(title: str, rows: list[tuple[Cell, float, float, float, float]]) -> tuple[float, int]:
    """Prints (cell, α, β, compute, comm) predictions; returns (max relative error over the rows
    with comm ≥ SHARE of the step, how many rows that is)."""
    print(f"{title}\n\n| link | P | variant | α (µs) | β (MB/s) | compute (s) | comm (s) | comm share | "
          "measured steps/s | predicted | rel. error |\n|---|---|---|---|---|---|---|---|---|---|---|")
    worst, counted = float("nan"), 0
    for cell, alpha, beta, compute, comm in rows:
        predicted = 1.0 / (compute + comm)
        err = abs(predicted - cell.median) / cell.median
        share = comm / (compute + comm)
        if share >= SHARE:
            counted += 1
            worst = err if math.isnan(worst) else max(worst, err)
        print(f"| {cell.label} | {cell.ranks} | {_label(cell.variant)} | {alpha * 1e6:.0f} | {beta / 1e6:.1f} | "
              f"{compute:.4f} | {comm:.4f} | {share:.0%}{'' if share >= SHARE else ' (not counted)'} | "
              f"{cell.text()} | {predicted:.3f} | {err:.3f} |")
    print()
    return worst, counted


def validate(path: Path, collectives: Optional[Path] = None, out: Optional[Path] = None) -> float:
    """Prints the measured tables, the calibration and the predictions of a results file (see
    the module docstring); returns max_rel_error of the out-of-sample shaped predictions over
    the rows with modelled communication ≥ 20 % of the step (nan when there are none). With
    ``collectives`` (a sweep file), each collective kind the sweep measured on a link is priced
    at its own fitted α and β there, the rest at the ping-pong's. ``out``: the result as JSON."""
    links, cells, labels = load(path)
    measured(cells, labels)
    if "local" not in links:
        raise SystemExit(f"{path} has no unshaped ('local') ping-pong to calibrate compute with")
    print("Links (ping-pong between ranks 0 and 1, median over repeats):\n\n"
          "| link | α (µs) | β (MB/s) |\n|---|---|---|")
    for label, (alpha, beta) in links.items():
        print(f"| {label} | {alpha * 1e6:.1f} | {beta / 1e6:.1f} |")
    swept = fit_collectives(collectives) if collectives else {}
    fits = {label: {kind: (links[label][0], b) for kind, (_, b, _) in by_kind.items()}
            for label, by_kind in swept.items() if label != "local" and label in links}
    if swept:
        print(f"\nβ per collective algorithm and link (fitted to {collectives}: t = α·rounds + round bytes/β, "
              "β from the slope over ≥ 1 MiB per rank, worst in-sample error there). Priced at the shaped links' "
              "β with the ping-pong's α per round: the time per round at the smallest size (Horovod's per-call "
              "overhead, shown) is in the compute the unshaped runs calibrate. The unshaped link keeps the "
              "ping-pong's α and β: its sweep times CPU contention, not a link.\n\n"
              "| link | collective | smallest size: s/round (µs) | β (MB/s) | β ÷ ping-pong β | worst fit error "
              "| used |\n"
              "|---|---|---|---|---|---|---|")
        for label, by_kind in swept.items():
            for kind, (a, b, worst) in by_kind.items():
                ratio = f"{b / links[label][1]:.2f}" if label in links else ""
                print(f"| {label} | {kind} | {a * 1e6:.0f} | {b / 1e6:.1f} | {ratio} | {worst:.2f} | "
                      f"{'yes' if kind in fits.get(label, {}) else 'no'} |")
    compute: dict[tuple[str, int], float] = {}
    print("\nCalibration (in-sample): compute = unshaped median s/step − modelled comm on the unshaped link\n\n"
          "| P | variant | s/step | comm (s) | compute (s) |\n|---|---|---|---|---|")
    for (v, P, label), cell in cells.items():
        if label == "local":
            comm = comm_seconds(cell.collectives, P, *links["local"], fits.get("local"))
            compute[v, P] = max(0.0, 1.0 / cell.median - comm)
            print(f"| {P} | {_label(v)} | {1.0 / cell.median:.4f} | {comm:.4f} | {compute[v, P]:.4f} |")
    print()
    shaped = [(c, *links[c.label], compute[c.variant, c.ranks]) for c in cells.values()
              if c.label != "local" and c.label in links and (c.variant, c.ranks) in compute]
    if not shaped:
        raise SystemExit(f"{path} has no shaped run with a ping-pong at its rate and an unshaped run of its "
                         "variant and P (scripts/bench/bench_throughput.sh writes all three)")
    how = ("each collective at its kind's fitted α and β (the α, β columns: the ping-pong's, for kinds not swept)"
           if fits else "the rate's α and β")
    worst, counted = _predict_table(
        f"Prediction (out-of-sample): shaped runs from the compute calibrated at the same P, {how}",
        [(c, a, b, k, comm_seconds(c.collectives, c.ranks, a, b, fits.get(c.label))) for c, a, b, k in shaped])
    cross = []
    for c in cells.values():
        base = min((p for v, p in compute if v == c.variant), default=c.ranks)
        if c.ranks > base and c.label in links and c.cores:
            scale = math.ceil(c.ranks / c.cores) / math.ceil(base / c.cores)
            a, b = links[c.label]
            cross.append((c, a, b, compute[c.variant, base] * scale,
                          comm_seconds(c.collectives, c.ranks, a, b, fits.get(c.label))))
    cross_worst = float("nan")
    if cross:
        cross_worst, cross_counted = _predict_table(
            "Cross-P (out-of-sample, secondary): every run at a larger P from the smallest P's compute "
            "× ranks per core", cross)
        print(f"cross-P max_rel_error {cross_worst:.3f} over {cross_counted} of {len(cross)} rows "
              f"(comm ≥ {SHARE:.0%}); not part of the line below\n")
    if out:
        out.write_text(json.dumps({
            "results": str(path), "collectives": str(collectives) if collectives else None,
            "max_rel_error": worst, "rows_counted": counted, "rows": len(shaped), "comm_share_counted": SHARE,
            "target": TARGET, "holds": bool(worst <= TARGET), "cross_p_max_rel_error": cross_worst,
            "fits": {label: {kind: {"smallest_size_s_per_round": a, "beta_bytes_per_s": b, "worst_fit_error": e,
                                    "used": kind in fits.get(label, {})}
                             for kind, (a, b, e) in by_kind.items()} for label, by_kind in swept.items()},
            "pingpong": {label: {"alpha_s": a, "beta_bytes_per_s": b} for label, (a, b) in links.items()},
        }, indent=1) + "\n")
    print(f"max_rel_error over {counted} of {len(shaped)} shaped predictions, those whose modelled communication "
          f"is ≥ {SHARE:.0%} of the step (compute calibrated at the same P on unshaped links)")
    print(f"max_rel_error {worst:.3f}")
    return worst


# ---------------------------------------------------------------------------------------------
# projection to GPU clusters


@dataclass
class Model:
    """A model for the projection. ``compute_s``: forward + backward per step per GPU, an
    ASSUMPTION (see ``source``); ``shapes``: its parameters' shapes."""

    name: str
    compute_s: float
    source: str
    shapes: list[tuple[int, ...]]

    @property
    def params(self) -> int:
        return sum(map(math.prod, self.shapes))


def _resnet50_shapes() -> list[tuple[int, ...]]:
    """torchvision's ResNet-50 parameters (25,557,032): convolutions (out, in, kh, kw), batch-norm
    weight and bias per conv, the fc layer."""
    def conv_bn(out: int, inp: int, k: int) -> list[tuple[int, ...]]:
        return [(out, inp, k, k), (out,), (out,)]

    shapes = conv_bn(64, 3, 7)
    inp = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            shapes += conv_bn(width, inp, 1) + conv_bn(width, width, 3) + conv_bn(4 * width, width, 1)
            if b == 0:
                shapes += conv_bn(4 * width, inp, 1)
            inp = 4 * width
    return shapes + [(1000, 2048), (1000,)]


def _bert_large_shapes() -> list[tuple[int, ...]]:
    """BERT-large's (uncased, with pooler) parameters (335,141,888): embeddings and their
    LayerNorm; 24 layers of Q, K, V, O (1024×1024 and biases), two LayerNorms, the FFN
    (4096×1024, 1024×4096 and biases); the pooler."""
    h, f = 1024, 4096
    layer = [(h, h), (h,)] * 4 + [(h,)] * 2 + [(f, h), (f,), (h, f), (h,)] + [(h,)] * 2
    return [(30522, h), (512, h), (2, h), (h,), (h,)] + layer * 24 + [(h, h), (h,)]


MODELS = {
    "resnet50": Model("ResNet-50 (25.6M)", 0.100,
                      "ASSUMED 0.10 s/step: batch 256 per GPU at ~2,500 images/s, roughly the per-A100 "
                      "mixed-precision training throughput NVIDIA publishes for ResNet-50 v1.5 "
                      "(DeepLearningExamples); not measured here", _resnet50_shapes()),
    "bert-large": Model("BERT-large (335M)", 0.330,
                        "ASSUMED 0.33 s/step: batch 32 × 512 tokens = 6 · 335M · 16,384 ≈ 33 TFLOP per "
                        "step at an assumed 100 TFLOP/s sustained (about a third of an A100's fp16 peak); "
                        "not measured here", _bert_large_shapes()),
}


def kernel_passes(method: str, options: dict[str, Any]) -> float:
    """ASSUMED memory passes over the D-element f32 gradient for a method's compression work on
    a GPU (streaming passes; scattered atomic adds counted as 4 passes each, gathers as 2):
    error feedback 3 (read g, read e, write a), residual update 2, top-k selection 4."""
    if method == "none":
        return 0.0
    if method == "fp16":
        return 2.0
    if method == "gs" and gs_config(options, None)[0].exchange != "sketch":
        return 3 + 4 + 2  # the exact exchanges: a pre-filter, no sketch (P ≥ 3: "auto" is the sparse exchange)
    if method in ("gs", "sketched"):  # Sketched-SGD's root does the same query
        rows = gs_config(options, None)[0].rows if method == "gs" else reducer(method, options, None).rows
        return 3 + 4 * rows + 2 * rows + 4 + 2
    if method in ("topk", "gtopk"):
        return 3 + 4 + 2
    return 3 + 2 + 1 + 2  # PowerSGD: M·Q and Mᵀ·P read M once each; P·Qᵀ written once


def project(models: list[Model], rates_gbit: list[float], ranks: list[int], variants: list[str], ratio: float,
            alpha: float, gpu_bandwidth: float, kernel_json: Optional[dict]) -> dict:
    """{model: {rate: {variant: [steps/s for each P]}}}."""
    out: dict = {}
    measured_kernels = (kernel_json or {}).get("seconds_per_element", {})
    for model in models:
        for rate in rates_gbit:
            beta = rate * 1e9 / 8
            for v in variants:
                method, options = parse_variant(v)
                per_element = measured_kernels.get(v, measured_kernels.get(method))
                if per_element is not None:
                    kernel = per_element * model.params
                else:
                    kernel = kernel_passes(method, options) * 4 * model.params / gpu_bandwidth
                series = []
                for P in ranks:
                    comm = comm_seconds(planned(method, options, model.shapes, P, ratio), P, alpha, beta)
                    series.append(1.0 / (model.compute_s + kernel + comm))
                out.setdefault(model.name, {}).setdefault(rate, {})[v] = series
    return out


def plot(table: dict, ranks: list[int], gs: str, path: Path) -> None:
    """One panel per (model, rate): gs-SGD's speed-up over each variant against P; above 1, gs-SGD wins."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(table)
    rates = list(table[models[0]])
    fig, axes = plt.subplots(len(models), len(rates), figsize=(4.2 * len(rates), 3.6 * len(models)), squeeze=False)
    for i, model in enumerate(models):
        for j, rate in enumerate(rates):
            ax = axes[i][j]
            mine = table[model][rate][gs]
            for v, series in table[model][rate].items():
                if v != gs:
                    ax.plot(ranks, [g / s for g, s in zip(mine, series)], marker=".", label=f"vs {_label(v)}")
            ax.axhline(1.0, color="k", lw=0.8)
            ax.set(xscale="log", yscale="log", title=f"{model}, {rate:g} Gbit/s", xlabel="ranks P",
                   ylabel="gs-SGD steps/s ÷ peer's")
            ax.set_xticks(ranks, [str(p) for p in ranks], fontsize=7)
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=6)
    fig.suptitle("Projected: above 1, gs-SGD is faster (GPU compute and kernel times ASSUMED; see docs)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_projection(args: argparse.Namespace) -> None:
    """--project: the table, the wins, and the plot / JSON when asked."""
    variants = args.variants.split()
    gs = next((v for v in variants if parse_variant(v)[0] == "gs"), None)
    if gs is None:
        raise SystemExit("--variants needs a gs variant to compare the others with")
    ranks = [2 ** i for i in range(3, 11)]
    kernel = json.loads(args.kernel_json.read_text()) if args.kernel_json else None
    table = project(list(MODELS.values()), [1.0, 10.0, 100.0], ranks, variants, args.ratio, args.alpha,
                    args.gpu_bandwidth, kernel)
    for model in MODELS.values():
        print(f"\n{model.name}, {model.params:,} parameters: compute {model.source}")
    config = gs_config(parse_variant(gs)[1], args.ratio)[0]
    print(f"\nk = {args.ratio} · D for every method that selects k (PowerSGD: its rank sets the size); "
          f"{_label(gs)}: {config.rows} rows × {config.width}·k columns, {config.sketch_dtype} sketch, "
          f"{config.candidates}·k candidates; baselines at their defaults unless the variant says otherwise; "
          f"α = {args.alpha * 1e6:g} µs per round (ASSUMED); compression kernels at "
          f"{args.gpu_bandwidth / 1e9:g} GB/s (ASSUMED)")
    others = [v for v in variants if v != gs]
    print(f"\n{_label(gs)} steps/s ÷ each variant's (> 1: gs-SGD faster)\n")
    print("| model | Gbit/s | P | gs steps/s | " + " | ".join(f"÷ {_label(v)}" for v in others)
          + " |\n|---|---|---|---|" + "---|" * len(others))
    for model, by_rate in table.items():
        for rate, by_variant in by_rate.items():
            for i, P in enumerate(ranks):
                if P in (8, 64, 1024):
                    mine = by_variant[gs][i]
                    print(f"| {model} | {rate:g} | {P} | {mine:.2f} | "
                          + " | ".join(f"{mine / by_variant[v][i]:.2f}" for v in others) + " |")
    print("\ngs-SGD faster at every P = 8 … 1024:")
    for model, by_rate in table.items():
        for rate, by_variant in by_rate.items():
            wins = [_label(v) for v in others if all(g > s for g, s in zip(by_variant[gs], by_variant[v]))]
            print(f"- {model} at {rate:g} Gbit/s: {', '.join(wins) or 'none'}")
    verdict = json.loads(args.validation.read_text()) if args.validation else None
    validated = bool(verdict and verdict["holds"])
    status = (f"validated: the cost model's max_rel_error {verdict['max_rel_error']:.3f} ≤ {verdict['target']} on "
              f"{verdict['results']}" if validated else
              f"UNVALIDATED: the cost model's max_rel_error on measured runs is {verdict['max_rel_error']:.3f}, above "
              f"the {verdict['target']} it must reach ({verdict['results']})" if verdict else
              "UNVALIDATED: no --validation given")
    print(f"\nProjection {status}")
    if args.plot:
        plot(table, ranks, gs, args.plot)
    if args.out:
        args.out.write_text(json.dumps({"ranks": ranks, "ratio": args.ratio, "validated": validated, "status": status,
                                        "max_rel_error": verdict["max_rel_error"] if verdict else None,
                                        "table": {m: {str(r): v for r, v in t.items()} for m, t in table.items()}},
                                       indent=1))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (``scripts/check_docs.py`` parses every documented command with it)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--validate", type=Path, metavar="RESULTS_JSONL", help="predict bench_throughput.sh's runs")
    p.add_argument("--collectives", type=Path, metavar="SWEEP_JSONL",
                   help="validate: α and β per collective algorithm fitted to collective_sweep.sh's rows")
    p.add_argument("--validation-out", type=Path, help="validate: write max_rel_error, the fits and the verdict here")
    p.add_argument("--project", action="store_true", help="project steps/s to P = 8 … 1024")
    p.add_argument("--variants", default=" ".join(HEADLINE),
                   help="projection: variant words, METHOD[:NAME=VALUE,...], one of them gs (default: %(default)s)")
    p.add_argument("--ratio", type=float, default=0.001,
                   help="projection: k / D for the whole model (gs, top-k, gTop-k, Sketched-SGD)")
    p.add_argument("--alpha", type=float, default=5e-6, help="projection: per-round latency in s (ASSUMED)")
    p.add_argument("--gpu-bandwidth", type=float, default=1.0e12,
                   help="projection: effective GPU memory bandwidth in bytes/s for compression kernels (ASSUMED)")
    p.add_argument("--kernel-json", type=Path,
                   help='projection: measured kernel times, {"seconds_per_element": {method or variant: s}} '
                        "(overrides the passes)")
    p.add_argument("--validation", type=Path,
                   help="projection: the --validation-out JSON whose verdict labels the projection")
    p.add_argument("--plot", type=Path, help="projection: write the speed-up plot here")
    p.add_argument("--out", type=Path, help="projection: write the steps/s table as JSON here")
    args = p.parse_args(argv)
    if not (args.project or args.validate):
        p.error("give --validate RESULTS_JSONL and/or --project")
    for word in args.variants.split():
        try:
            parse_variant(word)
        except ValueError as e:
            p.error(f"--variants: {e}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.project:
        print_projection(args)
    if args.validate:
        validate(args.validate, args.collectives, args.validation_out)


if __name__ == "__main__":
    main()
