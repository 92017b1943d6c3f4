"""The measured tables and figures of docs/benchmarks.md, docs/design.md and README.md,
regenerated from the data files in docs/.

    python scripts/bench/report.py            # rewrite every generated block
    python scripts/bench/report.py --check    # exit 1, naming each block and a short diff, if any differs

A generated block sits between ``<!-- report:NAME -->`` and ``<!-- /report:NAME -->``; what lies
outside the markers is hand-written and left alone. A block on its own lines holds a table or
lines; a block inside a line holds one number or phrase. :data:`BLOCKS` maps each name to the
function that writes it from ``<root>/docs`` (``--root`` points at another copy of the repository,
as the tests do). A name in a file with no function, or a function whose data file is missing,
is an error; so is a block that the data no longer gives (``--check``).

Comparisons at equal wire bytes take each peer at gs's whole cumulative wire bytes, interpolated
between its evaluations (``bench_convergence.at_budget``); a peer whose evaluations do not reach
that budget, or start beyond it, is written as such, never dropped.

Appended runs (``--append``) may repeat a setting and seed: the records of bench_recovery.py and
bench_time_to_accuracy.py are read one per (setting, seed), the latest run's (the greatest
``run_id``; a record without one is an older run of its own, a later line newer), and a warning
on stderr names the record used and those dropped (:func:`gs_bench.runs.latest_runs`).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import json
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Callable, Iterable, NamedTuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_convergence as conv  # noqa: E402
import bench_time_to_accuracy as tta  # noqa: E402

from gs_bench.runs import one_wire, read_jsonl  # noqa: E402

ROOT = HERE.parents[1]
FILES = ("docs/benchmarks.md", "docs/design.md", "docs/tensorflow.md", "docs/merge_benchmark.md",
         "docs/reliability.md", "docs/user-guide.md", "README.md")
MARKER = re.compile(r"<!-- report:(?P<name>[\w.-]+) -->(?P<body>.*?)<!-- /report:(?P=name) -->", re.S)

Block = Callable[[Path], str]
BLOCKS: dict[str, Block] = {}


def block(name: str) -> Callable[[Block], Block]:
    """Registers the function that writes block ``name`` from the docs directory."""
    def register(fn: Block) -> Block:
        BLOCKS[name] = fn
        return fn
    return register


def load(docs: Path, name: str):
    """``docs/NAME``'s JSON; a convergence record (method @ ratio → seed → run) is refused where one
    entry's seeds ran with different wire formats (:func:`gs_bench.runs.one_wire`)."""
    data = json.loads((docs / name).read_text())
    if isinstance(data, dict):
        for key, seeds in data.items():
            if isinstance(seeds, dict) and seeds and all(isinstance(r, dict) and "history" in r
                                                         for r in seeds.values()):
                one_wire(list(seeds.values()), f"docs/{name} {key!r}")
    return data


def recovery_records(docs: Path, name: str) -> list[dict]:
    """``docs/NAME``'s bench_recovery.py records, one per setting and seed (the latest run's:
    ``bench_recovery.read_records``)."""
    import bench_recovery

    return bench_recovery.read_records([str(docs / name)])


def printed(fn: Callable[[], object]) -> str:
    """What ``fn`` prints, stripped."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fn()
    return out.getvalue().strip()


# ---------------------------------------------------------------------------------------------
# convergence (bench_convergence.py's records)

def metric_of(runs: dict) -> str:
    return "perplexity" if "perplexity" in next(iter(next(iter(runs.values())).values()))["history"][0] else "accuracy"


def convergence_table(docs: Path, name: str) -> str:
    runs = load(docs, name)
    return conv.table(runs, metric_of(runs))


def equal_bytes_table(docs: Path, name: str, ratios: tuple[float | str, ...],
                      families: tuple[str, ...] = ("gs",)) -> str:
    """Per gs run (each of ``families`` at each of its k in ``ratios``, "auto": its default
    density): its whole cumulative wire budget, its final metric, and each peer at that budget
    (:func:`bench_convergence.at_budget`: interpolated, stopped short of it, or starting beyond
    it), means over seeds. Peers: every method but dense and the gs variants."""
    runs = load(docs, name)
    metric = metric_of(runs)
    peers = [k.rsplit(" @ ", 1)[0] for k in runs if not k.startswith(("gs", "dense"))]
    peers = list(dict.fromkeys(peers))
    lines = ["| gs run | its budget (wire MB) | its final | " + " | ".join(peers) + " |",
             "|---|---|---|" + "---|" * len(peers)]
    for family in families:
        for ratio in (r for r in ratios if f"{family} @ {conv.ratio_text(r)}" in runs):
            last, sent = conv.gs_budget(runs[f"{family} @ {conv.ratio_text(ratio)}"], metric)
            at = conv.peers_at_budget(runs, metric, ratio, family)
            cells = []
            for p in peers:
                key = next((k for k in at if k.rsplit(" @ ", 1)[0] == p), None)
                cells.append(at[key].text() if key else "–")
            k = "the defaults (ratio=\"auto\")" if ratio == "auto" else f"1/{round(1 / ratio)}"
            lines.append(f"| {family} @ {k} | {sent:.3g} | **{last:.4g}** | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def gs_vs_best_line(docs: Path, name: str, ranks: int, ratio: float = 0.001) -> str:
    """The peers at gs's budget and the ``gs_vs_best`` line, as ``bench_convergence.py
    --simulated-ranks P --plot-only`` prints them (:func:`bench_convergence.gs_vs_best_lines`)."""
    runs = load(docs, name)
    return "\n".join("    " + line for line in conv.gs_vs_best_lines(runs, metric_of(runs), ratio, ranks))


for _name, _file in {"cnn": "convergence_cnn.json", "lm": "convergence_lm.json",
                     "lm_ddp4": "convergence_lm_ddp4.json", "lm_ddp2": "convergence_lm_ddp2.json",
                     "cnn_ddp2": "convergence_cnn_ddp2.json", "cnn_sim4": "convergence_cnn_sim4.json",
                     "cnn_sim16": "convergence_cnn_sim16.json",
                     "lm_sim16": "convergence_lm_sim16.json",
                     "cnn_sim64": "convergence_cnn_sim64.json",
                     "cnn_fsdp2x2": "convergence_cnn_fsdp2x2.json",
                     "lm_fsdp2x2": "convergence_lm_fsdp2x2.json",
                     "cnn_ddp2_b64": "fsdp_vs_ddp/convergence_cnn_ddp2.json"}.items():
    block(f"{_name}.table")(lambda docs, f=_file: convergence_table(docs, f))
for _name, _file in {"cnn": "convergence_cnn.json", "lm": "convergence_lm.json",
                     "lm_ddp4": "convergence_lm_ddp4.json", "lm_ddp2": "convergence_lm_ddp2.json",
                     "cnn_ddp2": "convergence_cnn_ddp2.json"}.items():
    block(f"{_name}.equal_bytes")(lambda docs, f=_file: equal_bytes_table(docs, f, ("auto", 0.01, 0.001)))
GS_FAMILIES = ("gs", "gs compact8")
"""The gs variants of the equal-bytes study: the defaults, and the defaults with ``wire="compact8"``."""
def gs_ratios(runs: dict, family: str = "gs") -> tuple[float, ...]:
    """The k/D gs (or the gs variant ``family``) ran at in ``runs``, descending."""
    return tuple(sorted((float(k.rsplit(" @ ", 1)[1]) for k in runs if k.rsplit(" @ ", 1)[0] == family), reverse=True))


MATCH = 0.1
"""How far gs's whole cumulative wire budget may lie from a peer's for "at equal bytes"."""


def matched(own: float, sent: float) -> bool:
    """Whether gs's budget ``sent`` lies within :data:`MATCH` of the peer's ``own``."""
    return abs(sent - own) <= MATCH * own


def matched_gs(runs: dict, metric: str, key: str,
               family: str = "gs") -> tuple[float, float, float, float, conv.AtBudget]:
    """For peer ``key``: (the k of the gs run (of the variant ``family``) whose whole cumulative
    wire budget is nearest the peer's from below, within :data:`MATCH` of it (else the nearest:
    see :func:`matched`), the peer's own budget MB, gs's final metric and budget MB there, the
    peer at gs's budget), means over seeds. A gs run that spent more than the peer meets the
    peer's last evaluation, not the peer at gs's bytes, so one within the band below is preferred."""
    own = conv.gs_budget(runs[key], metric)[1]
    budgets = {r: conv.gs_budget(runs[f"{family} @ {r:g}"], metric)[1] for r in gs_ratios(runs, family)}
    below = [r for r, b in budgets.items() if (1 - MATCH) * own <= b <= own]
    ratio = max(below, key=budgets.get) if below else min(budgets, key=lambda r: abs(budgets[r] - own))
    last, sent = conv.gs_budget(runs[f"{family} @ {ratio:g}"], metric)
    return ratio, own, last, sent, conv.at_budget(runs[key], metric, sent)


def powersgd_at_equal_bytes(docs: Path, name: str) -> str:
    """For each PowerSGD rank in ``name``: the gs run whose whole cumulative wire budget is
    nearest PowerSGD's own, gs's final metric there against PowerSGD's at gs's budget
    (:func:`bench_convergence.at_budget`), and their ratio (means over seeds)."""
    runs = load(docs, name)
    metric = metric_of(runs)
    lines = []
    for family in (f for f in GS_FAMILIES if gs_ratios(runs, f)):
        for key in (k for k in runs if k.startswith("powersgd")):
            ratio, own, last, sent, got = matched_gs(runs, metric, key, family)
            if got.status == "starts beyond" or not matched(own, sent):
                lines.append(f"- {key.rsplit(' @ ', 1)[0]}: no {family} run within {MATCH:.0%} of its budget "
                             f"({own:.3g} MB); the nearest, {family} at k = D/{round(1 / ratio)}, sent {sent:.3g} MB "
                             "in all")
                continue
            ahead = (last < got.value) == (metric == "perplexity")
            lines.append(f"- {key.rsplit(' @ ', 1)[0]} (its whole budget {own:.3g} MB) against {family} at "
                         f"k = D/{round(1 / ratio)} ({sent:.3g} MB): {metric} {last:.4g} against {got.text()} "
                         f"at gs's bytes, gs ÷ PowerSGD {last / got.value:.2f} "
                         f"({'gs ahead' if ahead else 'gs behind'} on the means)")
    return "\n".join(lines)


EQUAL_BYTES = {"cnn_sim4": "equal_bytes/convergence_cnn_sim4.json",
               "lm_sim4": "equal_bytes/convergence_lm_sim4.json",
               "cnn_sim16": "equal_bytes/convergence_cnn_sim16.json",
               "lm_sim16": "equal_bytes/convergence_lm_sim16.json",
               "cnn_sim64": "equal_bytes/convergence_cnn_sim64.json"}
"""bench_convergence.py's equal-bytes study (``--out-dir docs/equal_bytes``): gs at several k."""
for _name, _file in EQUAL_BYTES.items():
    block(f"equal_bytes.{_name}.table")(lambda docs, f=_file: convergence_table(docs, f))
    block(f"equal_bytes.{_name}.at_budget")(lambda docs, f=_file: equal_bytes_table(
        docs, f, tuple(sorted({r for g in GS_FAMILIES for r in gs_ratios(load(docs, f), g)}, reverse=True)),
        GS_FAMILIES))
    block(f"equal_bytes.{_name}.powersgd")(lambda docs, f=_file: powersgd_at_equal_bytes(docs, f))
for _name, _file, _ranks in (("cnn_sim16", "convergence_cnn_sim16.json", 16),
                             ("lm_sim16", "convergence_lm_sim16.json", 16),
                             ("cnn_sim64", "convergence_cnn_sim64.json", 64),
                             ("cnn_sim4", "convergence_cnn_sim4.json", 4),
                             ("cnn_sim4_before", "convergence_cnn_sim4_before_sparse.json", 4),
                             ("cnn_sim16_before", "convergence_cnn_sim16_before_sparse.json", 16),
                             ("cnn_sim64_before", "convergence_cnn_sim64_before_sparse.json", 64),
                             ("lm_sim16_before", "convergence_lm_sim16_before_sparse.json", 16)):
    block(f"{_name}.gs_vs_best")(lambda docs, f=_file, p=_ranks: gs_vs_best_line(docs, f, p))


@block("sim_before.table")
def sim_before_table(docs: Path) -> str:
    """Final held-out accuracy and wire kB a step of the CNN at 4, 16 and 64 simulated ranks,
    when ``auto`` chose between the allgather and the sketch (one seed each)."""
    files = {4: "convergence_cnn_sim4_before_sparse.json", 16: "convergence_cnn_sim16_before_sparse.json",
             64: "convergence_cnn_sim64_before_sparse.json"}
    runs = {P: load(docs, f) for P, f in files.items()}
    names = {"dense @ 1": "dense", "gs @ 0.001": "**GsSketch defaults**", "topk @ 0.001": "top-k allgather (global)",
             "topk layer @ 0.001": "top-k allgather (per tensor)", "gtopk @ 0.001": "gTop-k (global)",
             "gtopk layer @ 0.001": "gTop-k (per tensor)", "powersgd r1 @ 1": "PowerSGD r1"}
    used = {4: " (allgather)", 16: " (sketch)", 64: " (sketch)"}
    lines = ["| method | " + " | ".join(f"P = {P} | kB/step" for P in files) + " |",
             "|---|" + "---|---|" * len(files)]
    for key, text in names.items():
        cells = []
        for P, r in runs.items():
            if key not in r:
                cells += ["–", "–"]
                continue
            h = [s["history"][-1] for s in r[key].values()]
            acc = sum(e["accuracy"] for e in h) / len(h)
            kb = sum(e["wire_bytes_per_step"] for e in h) / len(h) / 1e3
            cells += [f"{acc:.4f}" + (used[P] if key == "gs @ 0.001" else ""),
                      f"{kb:,.1f}" if kb < 1000 else f"{kb:,.0f}"]
        lines.append(f"| {text} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


@block("lm_sim16_before.table")
def lm_sim16_before_table(docs: Path) -> str:
    """The LM at 16 simulated ranks before the sparse exchange: final perplexity, wire kB a step,
    and each method at gs's whole cumulative wire bytes (interpolated)."""
    runs = load(docs, "convergence_lm_sim16_before_sparse.json")
    last, sent = conv.gs_budget(runs["gs @ 0.001"], "perplexity")
    at = conv.peers_at_budget(runs, "perplexity", 0.001)
    names = {"dense @ 1": "dense", "gs @ 0.001": "**GsSketch defaults** (sketch)",
             "topk @ 0.001": "top-k allgather (global)", "gtopk @ 0.001": "gTop-k (global)",
             "powersgd r1 @ 1": "PowerSGD r1"}
    lines = [f"| method | held-out perplexity after 60 steps | kB/step | at gs's {sent:.3g} MB |", "|---|---|---|---|"]
    for key, text in names.items():
        h = [s["history"][-1] for s in runs[key].values()]
        ppl = sum(e["perplexity"] for e in h) / len(h)
        kb = sum(e["wire_bytes_per_step"] for e in h) / len(h) / 1e3
        there = f"{last:.4g}" if key == "gs @ 0.001" else at[key].text() if key in at else "–"
        lines.append(f"| {text} | {ppl:.4g} | {kb:,.1f} | {there} |" if kb < 1000 else
                     f"| {text} | {ppl:.4g} | {kb:,.0f} | {there} |")
    return "\n".join(lines)


@block("mlp_demo.table")
def mlp_demo_table(docs: Path) -> str:
    """The earlier digits-MLP matrix (``docs/convergence.json``): final and best held-out accuracy,
    bytes a rank hands to collectives per step, seconds."""
    runs = load(docs, "convergence.json")
    lines = ["| method @ k/d | final accuracy | best accuracy | bytes/step/rank | seconds |", "|---|---|---|---|---|"]
    for key, r in runs.items():
        h = r["history"]
        lines.append(f"| {key} | {h[-1]['accuracy']:.4f} | {max(e['accuracy'] for e in h):.4f} "
                     f"| {h[-1]['bytes_per_step']:,.0f} | {r['seconds']:.1f} |")
    return "\n".join(lines)


@block("sim_vs_real_P4")
def sim_vs_real(docs: Path) -> str:
    """Held-out accuracy after each epoch, real and simulated ranks, from
    ``docs/sim_vs_real_mlp_P4_sparse.json``."""
    d = load(docs, "sim_vs_real_mlp_P4_sparse.json")
    real = [e["accuracy"] for e in d["horovodrun"]["history"]]
    sim = [e["accuracy"] for e in d["simulated"]["history"]]
    return (f"{', '.join(f'{a:.4f}' for a in real)} under horovodrun, "
            f"{', '.join(f'{a:.4f}' for a in sim)} simulated")


def record_file(stem: str) -> str:
    """The convergence record a figure's FILE names: ``convergence_FILE.json`` in docs/, with an
    ``eq_`` prefix the equal-bytes study's (``eq_cnn_sim16``: :data:`EQUAL_BYTES`), with a
    ``wire_`` prefix the equal-k wire study's (``wire_lm_sim16``: docs/wire/convergence_lm_sim16.json)."""
    if stem.startswith("eq_"):
        return EQUAL_BYTES[stem[3:]]
    if stem.startswith("wire_"):
        return f"wire/convergence_{stem[5:]}.json"
    return f"convergence_{stem}.json"


def run_figure(docs: Path, name: str) -> str:
    """An inline figure of a convergence record, named ``WHAT.FILE.METHOD.K``: FILE the record's
    stem after ``convergence_`` (``cnn``, ``lm_ddp4``, ...), METHOD its label with ``-`` for spaces,
    K the ratio (``1`` for methods without one); WHAT is ``final`` (the final metric, mean over
    seeds), ``kb`` (wire kB a step through the busiest rank) or ``at_gs`` (the method at gs's whole
    cumulative wire bytes at that K, :func:`bench_convergence.at_budget`; for a method without a
    ratio K is ``1-vs-GSK``, gs's ratio)."""
    what, stem, method, ratio = name.split(".", 3)
    ratio, _, gs_ratio = ratio.partition("-vs-")
    runs = load(docs, record_file(stem))
    metric = metric_of(runs)
    key = f"{method.replace('-', ' ')} @ {ratio}"
    seeds = runs[key]
    if what == "final":
        return f"{conv.final(seeds, metric):.4g}" if metric == "perplexity" else f"{conv.final(seeds, metric):.4f}"
    if what == "kb":
        return f"{sum(r['history'][-1]['wire_bytes_per_step'] for r in seeds.values()) / len(seeds) / 1e3:.1f}"
    _, sent = conv.gs_budget(runs[f"gs @ {gs_ratio or ratio}"], metric)
    return conv.at_budget(seeds, metric, sent).text()


def spread(docs: Path, name: str) -> str:
    """``spread.FILE.METHOD.K``: the final metric's mean ± half range over seeds (accuracy to 3
    decimals, perplexity to 1), as :func:`run_figure` names records."""
    _, stem, method, ratio = name.split(".", 3)
    runs = load(docs, record_file(stem))
    metric = metric_of(runs)
    got = finals(runs[f"{method.replace('-', ' ')} @ {ratio}"], metric)
    mean, half = sum(got) / len(got), (max(got) - min(got)) / 2
    digits = 1 if metric == "perplexity" else 3
    return f"{mean:.{digits}f} ± {half:.{digits}f}"


# FSDP2 with GsFsdpState against the DDP hook at the same global batch and steps:
# label, record, its runs' names (dense, gs)
FSDP_VS_DDP = (("FSDP2 2 × 2", "convergence_cnn_fsdp2x2.json", ("plain HSDP", "GsFsdpState")),
               ("DDP, 2 ranks", "fsdp_vs_ddp/convergence_cnn_ddp2.json", ("DDP's allreduce", "gs_hook")))


def finals(seeds: dict, metric: str) -> list[float]:
    """Each seed's final metric."""
    return [r["history"][-1][metric] for r in seeds.values()]


@block("fsdp_vs_ddp.table")
def fsdp_vs_ddp_table(docs: Path) -> str:
    """Per k: FSDP2 2 × 2 (GsFsdpState, plain HSDP) beside the DDP hook on 2 ranks (gs_hook, DDP's
    allreduce): final held-out accuracy over seeds, wire kB a step through a rank and through all
    ranks of a replica (FSDP: its S shards; DDP: its one rank)."""
    lines = ["| k/d | run | seeds | final accuracy (mean ± half range) | min – max over seeds "
             "| wire kB/step through a rank | wire kB/step, all ranks of a replica |", "|---|---|---|---|---|---|---|"]
    for key, k in (("dense @ 1", "dense"), ("gs @ 0.01", "1/100"), ("gs @ 0.001", "1/1000")):
        for label, name, methods in FSDP_VS_DDP:
            seeds = load(docs, name)[key]
            got = finals(seeds, "accuracy")
            run = next(iter(seeds.values()))
            per_replica = run["ranks"] // run["args"].get("replicas", run["ranks"])
            kb = sum(r["history"][-1]["wire_bytes_per_step"] for r in seeds.values()) / len(seeds) / 1e3
            lines.append(f"| {k} | {label}, {methods[key != 'dense @ 1']} | {len(got)} "
                         f"| {sum(got) / len(got):.4f} ± {(max(got) - min(got)) / 2:.4f} "
                         f"| {min(got):.4f} – {max(got):.4f} | {kb:,.1f} | {kb * per_replica:,.1f} |")
    return "\n".join(lines)


def fsdp_within_ddp(docs: Path, key: str) -> tuple[str, list[float], list[float]]:
    """(where FSDP2's mean final accuracy of ``key`` lies against the DDP hook's range over its
    seeds: "within", "above" or "below"; FSDP2's finals, the DDP hook's)."""
    (_, fsdp_name, _), (_, ddp_name, _) = FSDP_VS_DDP
    mine, theirs = finals(load(docs, fsdp_name)[key], "accuracy"), finals(load(docs, ddp_name)[key], "accuracy")
    mean = sum(mine) / len(mine)
    return ("below" if mean < min(theirs) else "above" if mean > max(theirs) else "within"), mine, theirs


@block("fsdp_vs_ddp.goal")
def fsdp_vs_ddp_goal(docs: Path) -> str:
    """The headline's verdict: at which k gs under FSDP2 is within the DDP hook's seeds' range or
    above it (not below)."""
    met = {k: fsdp_within_ddp(docs, key)[0] != "below" for key, k in (("gs @ 0.01", "1/100"), ("gs @ 0.001", "1/1000"))}
    if all(met.values()):
        return "met at both k"
    if not any(met.values()):
        return "not met at either k"
    return "met at " + " and ".join(k for k, w in met.items() if w) + ", not at " + " and ".join(
        k for k, w in met.items() if not w)


@block("fsdp_vs_ddp.verdict")
def fsdp_vs_ddp_verdict(docs: Path) -> str:
    """For gs at 1/100 and 1/1000 and for dense: whether FSDP2's mean final accuracy lies within,
    above or below the DDP hook's range over its seeds, and the difference of the means."""
    parts = []
    for key, k in (("gs @ 0.01", "gs at 1/100"), ("gs @ 0.001", "gs at 1/1000"), ("dense @ 1", "dense")):
        where, mine, theirs = fsdp_within_ddp(docs, key)
        mean = sum(mine) / len(mine)
        overlap = "overlap" if max(min(mine), min(theirs)) <= min(max(mine), max(theirs)) else "do not overlap"
        parts.append(f"{k}, FSDP2's mean {mean:.4f} ({len(mine)} seeds) is **{where}** the DDP hook's range "
                     f"{min(theirs):.4f} – {max(theirs):.4f} ({len(theirs)} seeds; "
                     f"{100 * (mean - sum(theirs) / len(theirs)):+.2f} points against its mean; FSDP2's seeds "
                     f"{min(mine):.4f} – {max(mine):.4f}, the ranges {overlap})")
    return "; ".join(parts)


def seeds_ahead(docs: Path, name: str) -> str:
    """``ahead.FILE.METHOD.K``: in how many seeds gs at K = 0.001 ended ahead of METHOD (@ K, as
    :func:`run_figure` names records; higher accuracy, lower perplexity), out of the seeds both ran."""
    _, stem, method, ratio = name.split(".", 3)
    runs = load(docs, record_file(stem))
    metric = metric_of(runs)
    gs, other = runs["gs @ 0.001"], runs[f"{method.replace('-', ' ')} @ {ratio}"]
    seeds = [k for k in gs if k in other]
    better = (lambda a, b: a > b) if metric == "accuracy" else (lambda a, b: a < b)
    ahead = sum(better(gs[k]["history"][-1][metric], other[k]["history"][-1][metric]) for k in seeds)
    return f"{ahead} of {len(seeds)} seeds"


def gs_vs_best_figure(docs: Path, name: str) -> str:
    """``gs_vs_best.FILE``: the ``gs_vs_best`` line of a simulated-ranks record at k = D/1000."""
    runs = load(docs, f"convergence_{name.split('.', 1)[1]}.json")
    ranks = next(iter(runs["gs @ 0.001"].values()))["ranks"]
    return conv.gs_vs_best_lines(runs, metric_of(runs), 0.001, ranks)[-1]


def sparse_vs_gtopk(docs: Path, name: str) -> str:
    """``sparse_vs_gtopk.WHAT.P`` from ``docs/recovery_sparse.jsonl`` (``compact_vs_gtopk.WHAT.P``:
    from ``docs/recovery_wire.jsonl``, the compact defaults; ``compact8_vs_gtopk.WHAT.P``: there,
    the defaults with ``wire="compact8"``): the defaults' delivered mass over
    gTop-k (global)'s (WHAT ``mass``), their wire bytes over its (``wire``), or the defaults' wire
    kB a step (``kb``)."""
    family, what, ranks = name.split(".")
    data = "recovery_sparse.jsonl" if family == "sparse_vs_gtopk" else "recovery_wire.jsonl"
    records = recovery_records(docs, data)
    at = [r for r in records if r["P"] == int(ranks)]
    wire = "compact8" if family == "compact8_vs_gtopk" else None
    gs = next(r for r in at if "rows" in r and r["exchange"] == "auto" and r.get("wire_format") in (
        (wire,) if wire else (None, "fp32", "compact")))
    peer = next(r for r in at if r["method"] == "gTop-k (global)")
    if what == "kb":
        return f"{gs['wire'] / 1e3:.1f}"
    return f"{gs[what] / peer[what]:.2f}×"


def recovery_figure(docs: Path, name: str) -> str:
    """``rs.WHAT.P.METHOD`` from ``docs/recovery_sparse.jsonl`` (``rw.…``: from
    ``docs/recovery_wire.jsonl``, the pair exchanges with compact pairs): the delivered mass (WHAT
    ``mass``) or wire kB a step (``kb``) of METHOD at P: ``defaults`` (gs, ``exchange="auto"``),
    ``sparse``, ``sketch`` (gs at that exchange, shipped sizes), ``gtopk`` (gTop-k over all
    weights) or ``gtopk-compact`` (the same with compact pairs, ``rw`` only)."""
    family, what, ranks, method = name.split(".")
    data = "recovery_wire.jsonl" if family == "rw" else "recovery_sparse.jsonl"
    records = recovery_records(docs, data)
    exchange = {"defaults": "auto", "sparse": "sparse", "sketch": "sketch"}.get(method)
    peers = {"gtopk": "gTop-k (global)", "gtopk-compact": "gTop-k (global, compact pairs)"}
    r = next(r for r in records if r["P"] == int(ranks) and (
        r["method"] == peers[method] if method in peers else
        "rows" in r and r["exchange"] == exchange and not r.get("apply")
        and (family == "rs" or exchange == "sketch" or r.get("wire_format") == "compact")))
    return f"{r['mass']:.3f}" if what == "mass" else f"{r['wire'] / 1e3:.1f}"


@block("recovery.goal")
def recovery_goal(docs: Path) -> str:
    """The shipped sketch against gTop-k per tensor and over all weights at the goal point (the
    digits MLP, P = 16, ratio 0.01), from the Pareto table of ``docs/recovery.jsonl``."""
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in
            recovery_sections(docs)["digits MLP, ratio 0.01, P = 16"].splitlines()[2:]}
    shipped, glob = rows["gs global **(shipped)**"], rows["gTop-k (global)"]
    return (f"{shipped[4]}× per-tensor gTop-k's mass at {shipped[5]}× its bytes, but less than gTop-k over all "
            f"weights ({shipped[2]} against {glob[2]})")


def generator(name: str) -> Block | None:
    """The function that writes block ``name``: a registered one, or an inline figure
    (:func:`run_figure`, :func:`spread`, :func:`gs_vs_best_figure`, :func:`sparse_vs_gtopk`,
    :func:`recovery_figure`, :func:`time_to_accuracy_figure`, :func:`fastest_to_target`,
    :func:`rule_figure`, :func:`prefilter_figure`, ...)."""
    if name in BLOCKS:
        return BLOCKS[name]
    family = name.split(".", 1)[0]
    if family in ("final", "kb", "at_gs") and name.count(".") >= 3:
        return lambda docs: run_figure(docs, name)
    if family == "spread" and name.count(".") >= 3:
        return lambda docs: spread(docs, name)
    if family == "ahead" and name.count(".") >= 3:
        return lambda docs: seeds_ahead(docs, name)
    if family == "gs_vs_best" and name.count(".") == 1:
        return lambda docs: gs_vs_best_figure(docs, name)
    if family in ("sparse_vs_gtopk", "compact_vs_gtopk", "compact8_vs_gtopk") and name.count(".") == 2:
        return lambda docs: sparse_vs_gtopk(docs, name)
    if family == "sketch_vs_gtopk" and name.count(".") == 1:
        return lambda docs: sketch_vs_gtopk(docs, name)
    if family in ("rs", "rw") and name.count(".") == 3:
        return lambda docs: recovery_figure(docs, name)
    if family == "tta" and name.count(".") == 4:
        return lambda docs: time_to_accuracy_figure(docs, name)
    if family == "tta_fastest" and name.count(".") == 3:
        return lambda docs: fastest_to_target(docs, name)
    if family in ("tta_over", "tta_later") and name.count(".") == 2:
        return lambda docs: defaults_over(docs, name)
    if family == "demo" and name.count(".") == 2 and name.split(".")[2] in DEMO_RUNS:
        return lambda docs: demo_figure(docs, name)
    if family == "compute_vs_topk" and name.count(".") == 2:
        return lambda docs: compute_vs_topk(docs, name)
    if family == "tput" and name.count(".") == 3:
        return lambda docs: throughput_ratio(docs, name)
    if family in TTA_RANGES and name.count(".") == 1:
        return lambda docs: tta_range(docs, name)
    if family == "over_plan" and name.count(".") >= 3:
        return lambda docs: over_plan(docs, name)
    if family in ("eb", "eb8") and name.count(".") == 3:
        return lambda docs: equal_bytes_figure(docs, name)
    if family == "rule" and name.count(".") in (2, 3):
        return lambda docs: rule_figure(docs, name)
    if family == "pre" and name.count(".") == 4:
        return lambda docs: prefilter_figure(docs, name)
    if name in FIGURE_RATIOS:
        return lambda docs: figure_ratio(docs, name)
    if family == "points" and name.count(".") >= 3:
        return lambda docs: points_below_dense(docs, name)
    if family == "tta_reached" and name.count(".") == 2:
        return lambda docs: tta_reached(docs, name)
    return None


STUDY_MODELS = {study: ("lm", 512) if study.startswith("lm") else ("cnn", None) for study in EQUAL_BYTES}
"""The model (``--model``, ``--hidden``) of each equal-bytes study."""


def over_plan(docs: Path, name: str) -> str:
    """``over_plan.STUDY.METHOD.K``: the equal-bytes study's METHOD (``gs`` or ``gs-compact8``) at
    K, its measured wire bytes a step (mean over seeds) over what the plan expects for it
    (``bench_convergence.gs_wire``: every message at its even share), as a percentage over."""
    _, study, method, ratio = name.split(".", 3)
    seeds = load(docs, EQUAL_BYTES[study])[f"{method.replace('-', ' ')} @ {ratio}"]
    measured = sum(r["history"][-1]["wire_bytes_per_step"] for r in seeds.values()) / len(seeds)
    model, hidden = STUDY_MODELS[study]
    shapes = conv.model_shapes(argparse.Namespace(model=model, hidden=hidden))
    options = {"wire": method.split("-", 1)[1]} if "-" in method else {}  # "gs": the defaults
    planned = conv.gs_wire(shapes, float(ratio), next(iter(seeds.values()))["ranks"], options)
    return f"{100 * (measured / planned - 1):.1f} %"


def equal_bytes_figure(docs: Path, name: str) -> str:
    """``eb.WHAT.STUDY.PEER`` from ``docs/equal_bytes/convergence_STUDY.json`` (PEER a PowerSGD
    label with "-" for spaces; ``eb8.…``: gs with ``wire="compact8"``): gs at the k whose whole
    budget is nearest PEER's (:func:`matched_gs`), WHAT ``gs`` its final metric, ``peer`` PEER's
    at gs's bytes (:func:`bench_convergence.at_budget`), ``ratio`` gs's over PEER's, ``k`` that k
    as D/n, ``kb`` gs's wire kB a step there."""
    family, what, study, peer = name.split(".")
    gs = {"eb": "gs", "eb8": "gs compact8"}[family]
    runs = load(docs, EQUAL_BYTES[study])
    metric = metric_of(runs)
    ratio, own, last, sent, got = matched_gs(runs, metric, f"{peer.replace('-', ' ')} @ 1", gs)
    if not matched(own, sent):
        return f"n/a (no gs run within {MATCH:.0%} of its {own:.3g} MB)"
    digits = 1 if metric == "perplexity" else 3
    if what == "gs":
        return f"{last:.{digits}f}"
    if what == "peer":
        return f"{got.value:.{digits}f}"
    if what == "ratio":
        return f"{last / got.value:.2f}×"
    if what == "k":
        return f"D/{round(1 / ratio)}"
    if what == "kb":
        seeds = runs[f"{gs} @ {ratio:g}"]
        return f"{sum(r['history'][-1]['wire_bytes_per_step'] for r in seeds.values()) / len(seeds) / 1e3:.1f}"
    raise KeyError(f"{name}: WHAT is gs, peer, ratio, k or kb")


DEMO_RUNS = {"gs": "(the defaults)", "none": "--compression none", "sketch": "--gs exchange=sketch"}


def demo_figure(docs: Path, name: str) -> str:
    """``demo.WHAT.RUN`` from ``docs/demo_P2_RUN.json`` (RUN: gs, none, sketch): the final held-out
    accuracy (WHAT ``acc``) or the training steps per second (``steps_per_s``)."""
    _, what, run = name.split(".")
    d = load(docs, f"demo_P2_{run}.json")
    h = d["history"]
    if what == "acc":
        return f"{h[-1]['accuracy']:.4f}"
    if what == "steps_per_s":
        return f"{sum(e['steps'] for e in h) / d['seconds']:.2f}"
    raise KeyError(f"{name}: WHAT is acc or steps_per_s")


@block("demo.console")
def demo_console(docs: Path) -> str:
    """The demo's console lines (first and last epoch, the summary's metric and bytes, its training
    time) from ``docs/demo_P2_gs.json``, as ``gs_bench.cli.Report`` prints them."""
    d = load(docs, "demo_P2_gs.json")
    h = d["history"]
    steps = sum(e["steps"] for e in h)
    sent, wire = h[-1]["bytes_per_step"], h[-1]["wire_bytes_per_step"]
    epoch = [f"epoch {e['epoch']:3d}/{len(h)}  loss {e['loss']:.4f}  held-out accuracy {e['accuracy']:.4f}"
             for e in (h[0], h[-1])]
    return "\n".join(["```text", f"gs_horovod demo: {d['ranks']} ranks (horovodrun --gloo), MNIST-5k CNN",
                      epoch[0], "...", epoch[1], "",
                      f"summary ({d['ranks']} ranks, --compression {d['args']['compression']})",
                      f"  held-out accuracy   {h[-1]['accuracy']:.4f} after {steps} steps "
                      f"(best {max(e['accuracy'] for e in h):.4f})",
                      f"  bytes/step/rank     {sent:,.0f} ({d['dense_bytes_per_step'] / sent:.1f}x fewer than dense, "
                      f"{d['dense_bytes_per_step']:,}); {wire:,.0f} on the wire",
                      f"  training            {d['seconds']:.0f} s ({steps / d['seconds']:.2f} steps/s)", "```"])


@block("demo.table")
def demo_table(docs: Path) -> str:
    """The demo at 2 ranks with the defaults, dense and the paper's sketch, from
    ``docs/demo_P2_{gs,none,sketch}.json``."""
    lines = ["| `run_demo.sh` arguments | held-out accuracy after 10 epochs (best) | bytes / step / rank "
             "| wire bytes / step | training s | steps/s |", "|---|---|---|---|---|---|"]
    for name, text in DEMO_RUNS.items():
        d = load(docs, f"demo_P2_{name}.json")
        h = d["history"]
        steps = sum(e["steps"] for e in h)
        lines.append(f"| {text} | {h[-1]['accuracy']:.4f} ({max(e['accuracy'] for e in h):.4f}) "
                     f"| {h[-1]['bytes_per_step']:,.0f} | {h[-1]['wire_bytes_per_step']:,.0f} | {d['seconds']:.0f} "
                     f"| {steps / d['seconds']:.2f} |")
    return "\n".join(lines)


@block("tf.digits")
def tf_digits(docs: Path) -> str:
    """``train_tf.py`` on the digits at 2 ranks, GsSketch and dense, unshaped (loopback) from
    ``docs/tensorflow_digits_P2_{gs,none}.json`` and over a shaped 100 Mbit/s link from
    ``docs/tensorflow_digits_P2_100mbit_{gs,fp16,none}.json``."""
    lines = ["| link | run | final held-out accuracy (best) | bytes / step / rank | wire bytes / step | training s "
             "| first epoch s | steps/s |",
             "|---|---|---|---|---|---|---|---|"]
    for link, name in (("unshaped", "none"), ("unshaped", "gs"), ("100 Mbit/s", "100mbit_none"),
                       ("100 Mbit/s", "100mbit_fp16"), ("100 Mbit/s", "100mbit_gs")):
        d = load(docs, f"tensorflow_digits_P2_{name}.json")
        h = d["history"]
        steps = sum(e["steps"] for e in h)
        flags = f"--compression {d['args']['compression']}" + (
            f" --ratio {d['args']['ratio']:g}" if d["args"].get("ratio") is not None else "")
        lines.append(f"| {link} | `{flags}` | {h[-1]['accuracy']:.4f} "
                     f"({max(e['accuracy'] for e in h):.4f}) | {h[-1]['bytes_per_step']:,.0f} "
                     f"| {h[-1]['wire_bytes_per_step']:,.0f} | {d['seconds']:.0f} | {h[0]['seconds']:.1f} "
                     f"| {steps / d['seconds']:.1f} |")
    return "\n".join(lines)


@block("tf.digits.claim")
def tf_digits_claim(docs: Path) -> str:
    gs, dense = (load(docs, f"tensorflow_digits_P2_{n}.json")["history"][-1] for n in ("gs", "none"))
    return (f"{gs['accuracy']:.4f} with GsSketch at {gs['bytes_per_step']:,.0f} bytes/step/rank and "
            f"{dense['accuracy']:.4f} dense at {dense['bytes_per_step']:,.0f}")


# ---------------------------------------------------------------------------------------------
# bytes (bench_wire.py)

WIRE_COLUMNS = ("none", "fp16", "gs", "gs:transport=mpi", "topk", "gtopk", "sketched", "powersgd:rank=1",
                "powersgd:rank=4")
WIRE_RENAMED = {"gs:merge=mpi": "gs:transport=mpi"}  # variants as recorded before GsSketch's merge= became transport=


def variant_name(v: str) -> str:
    from gs_bench.variants import parse_variant, variant_label

    return variant_label(*parse_variant(v))


@block("wire.counted")
def wire_counted(docs: Path) -> str:
    """MB through the busiest rank per step for P = 2 … 1024 (payload per rank in the first row),
    from ``docs/wire_counted.json``."""
    d = {P: {WIRE_RENAMED.get(v, v): x for v, x in row.items()} for P, row in load(docs, "wire_counted.json").items()}
    cols = [v for v in WIRE_COLUMNS if v in d["2"]]
    lines = ["| P | " + " | ".join(variant_name(v) for v in cols) + " |", "|---|" + "---|" * len(cols),
             "| payload | " + " | ".join(f"{d['2'][v][0] / 1e6:,.3f}" for v in cols) + " |"]
    lines += [f"| {P} | " + " | ".join(f"{row[v][1] / 1e6:,.3f}" for v in cols) + " |" for P, row in d.items()]
    return "\n".join(lines)


def wire_measured(docs: Path, name: str) -> str:
    d = load(docs, name)
    lines = [f"P = {d['ranks']}, d = {d['d']:,}, ratio {d['ratio']}: bytes per rank per step, measured on rank 0 "
             "(its meter) vs counted from the shape", "",
             "| variant | payload measured | payload counted | wire measured | wire counted |", "|---|---|---|---|---|"]
    for v, (pay, wire) in d["measured_rank0"].items():
        pay_c, wire_c = d["counted"][v]
        lines.append(f"| {variant_name(v)} | {pay:,.0f} | {pay_c:,.0f} | {wire:,.0f} | {wire_c:,.0f} |")
    return "\n".join(lines)


block("wire.P2")(lambda docs: wire_measured(docs, "wire_P2.json"))
block("wire.P4")(lambda docs: wire_measured(docs, "wire_P4.json"))


# ---------------------------------------------------------------------------------------------
# compute (bench_sketch.py, bench_compute.py, bench_step.py)

@block("owner_loads.table")
def owner_loads(docs: Path) -> str:
    """``bench_owner_loads.py``'s table from ``docs/owner_loads.json``."""
    import bench_owner_loads

    return bench_owner_loads.table(load(docs, "owner_loads.json"))


@block("kernels.table")
def kernels(docs: Path) -> str:
    import bench_sketch

    rows = load(docs, "bench_sketch.json")
    r = rows[0]
    head = (f"backend {r['backend']}, {r['threads']} threads; r = {r['rows']}, cols = {r['cols'] / r['k']:.1f}·k, "
            f"m = {r['candidates'] / r['k']:g}, L = {r['prefilter'] / r['k']:g}, P = {r['ranks']} ranks merged; "
            "median seconds (GB/s = 4·D bytes / time)")
    args = argparse.Namespace(backend=r["backend"], rows=r["rows"], width=r["cols"] / r["k"],
                              candidates=r["candidates"], prefilter=r["prefilter"], ranks=r["ranks"], reps=0)
    return "\n".join([head, *bench_sketch.table_lines(rows, args)[1:]])


for _name, _file in {"compute.sparse": "bench_compute_sparse.json", "compute.full": "bench_compute.json",
                     "compute.quick": "bench_compute_quick.json",
                     "compute.compact": "bench_compute_compact.json",
                     "compute.levels": "bench_compute_levels.json",
                     "compute.levels.69b8d0e": "bench_compute_levels_69b8d0e.json"}.items():
    block(_name)(lambda docs, f=_file: __import__("bench_compute").table(load(docs, f)))


def codec_table(docs: Path, name: str) -> str:
    """``bench_compute.py --codec``'s rows (``docs/NAME``): the defaults' seconds in the compact
    codec and in selection per step, the busiest rank, and their ratio."""
    lines = ["| P | k | exchange (`auto`) | codec ms/step | selection ms/step | codec ÷ selection |",
             "|---|---|---|---|---|---|"]
    for r in load(docs, name):
        lines.append(f"| {r['ranks']} | D/{round(1 / r['ratio'])} | {r['exchange']} | {1e3 * r['codec_s']:.2f} "
                     f"| {1e3 * r['selection_s']:.1f} | {r['codec_s'] / r['selection_s']:.3f} |")
    return "\n".join(lines)


def codec_most(docs: Path, name: str) -> str:
    """The largest codec ÷ selection ratio in ``docs/NAME``, as a percentage."""
    return f"{100 * max(r['codec_s'] / r['selection_s'] for r in load(docs, name)):.1f} %"


for _name, _file in {"codec": "bench_codec.json", "codec8": "bench_codec_compact8.json"}.items():
    block(f"{_name}.table")(lambda docs, f=_file: codec_table(docs, f))
    block(f"{_name}.most")(lambda docs, f=_file: codec_most(docs, f))


@block("compute.compact.defaults_vs_topk")
def compact_defaults_vs_topk(docs: Path) -> str:
    """The defaults' median compute per step over top-k allgather's at P = 4, k = D/1000, from
    ``docs/bench_compute_compact.json`` (one run, side by side)."""
    rows = {r["method"]: r for r in load(docs, "bench_compute_compact.json") if (r["ranks"], r["ratio"]) == (4, 0.001)}
    return f"{rows['gs-SGD (defaults)']['median_s'] / rows['top-k allgather']['median_s']:.2f}×"


def compute_levels_growth(docs: Path, name: str) -> str:
    """The defaults' median compute per step at the densest level and the sparsest, per P, from
    ``docs/NAME`` (``bench_compute.py --ratios`` at the density rule's levels)."""
    rows = [r for r in load(docs, name) if r["method"] == "gs-SGD (defaults)"]
    parts = []
    for P in sorted({r["ranks"] for r in rows}):
        at = {r["ratio"]: r["median_s"] for r in rows if r["ranks"] == P}
        low, high = min(at), max(at)
        parts.append(f"{1e3 * at[low]:.1f} ms at D/{round(1 / low)} and {1e3 * at[high]:.1f} ms at D/{round(1 / high)} "
                     f"({at[high] / at[low]:.1f}×) at P = {P}")
    return "; ".join(parts)


for _name, _file in {"compute.levels.growth": "bench_compute_levels.json",
                     "compute.levels.growth.69b8d0e": "bench_compute_levels_69b8d0e.json"}.items():
    block(_name)(lambda docs, f=_file: compute_levels_growth(docs, f))


@block("step.table")
def step_table(docs: Path, file: str = "bench_step.json") -> str:
    """``bench_step.py``'s table from ``docs/bench_step.json`` (``file``): one median per cell
    (the first format: one run), or median [min–max] over repeats per thread setting (``format``
    2, ``bench_step.table``)."""
    d = load(docs, file)
    if d.get("format") == 2:
        import bench_step

        return bench_step.table(d)
    lines = [f"{d['ranks']} ranks, ratio {d['ratio']}, one run: median of {d['steps']} steps (seconds per opt.step())",
             "", "| model | tensors | elements | dense | gs | gs / dense | one float per tensor |",
             "|---|---|---|---|---|---|---|"]
    for name, r in d["rows"].items():
        lines.append(f"| {name} | {r['tensors']} | {r['params']:,} | {r['dense']:.4f} | {r['gs']:.4f} "
                     f"| {r['gs'] / r['dense']:.1f} | {r['one float']:.4f} |")
    return "\n".join(lines)


# bench_step.py --level dense (against FP16): block-name suffix → its record
STEP_DENSE = {"": "bench_step_dense.json", ".56cd730": "bench_step_dense_56cd730.json"}
for _suffix, _file in STEP_DENSE.items():
    block(f"step.dense.table{_suffix}")(lambda docs, f=_file: step_table(docs, f))


COMPUTE_METHODS = {"defaults": "gs-SGD (defaults)", "sparse": "gs-SGD (exchange=sparse)",
                   "sketch": "gs-SGD (exchange=sketch)", "gtopk": "gTop-k"}


def compute_vs_topk(docs: Path, name: str) -> str:
    """``compute_vs_topk.METHOD.P`` from ``docs/bench_compute_sparse.json``: METHOD's median compute
    per step over top-k allgather's at P (METHOD: defaults, sparse, sketch, gtopk)."""
    _, method, ranks = name.split(".")
    rows = {(r["method"], r["ranks"]): r for r in load(docs, "bench_compute_sparse.json")}
    mine, peer = rows[COMPUTE_METHODS[method], int(ranks)], rows["top-k allgather", int(ranks)]
    return f"{mine['median_s'] / peer['median_s']:.2f}×"


def merge_table(docs: Path, name: str) -> str:
    """``bench_merge.py``'s table (median ms per call) from its ``--out`` file."""
    lines = ["Median milliseconds per call over the script's repetitions, one run:", "",
             "| sketch bytes | tree flat | tree node-aware | Horovod allreduce | MPI.Allreduce "
             "| tree flat bytes sent (rank 0) | doubling rounds (rank 0) |", "|---|---|---|---|---|---|---|"]
    for r in load(docs, name)["rows"]:
        lines.append(f"| {r['bytes']:,} | {r['tree_flat_ms']:.3f} | {r['tree_node_aware_ms']:.3f} "
                     f"| {r['horovod_ms']:.3f} | {r['mpi_allreduce_ms']:.3f} | {r['tree_flat_bytes_sent_rank0']:,.0f} "
                     f"| {r['tree_flat_rounds_rank0']:.0f} |")
    return "\n".join(lines)


block("merge.P2")(lambda docs: merge_table(docs, "merge_benchmark_P2.json"))
block("merge.P4")(lambda docs: merge_table(docs, "merge_benchmark_P4.json"))


@block("soak")
def soak(docs: Path) -> str:
    """``soak.py``'s lines from ``docs/soak.json``: RSS per rank at each sample, growth after the first."""
    d = load(docs, "soak.json")
    lines = ["```"] + [f"step {s['step']:6d}  RSS MiB per rank {[round(v, 1) for v in s['rss_mib']]}  "
                       f"tensor states {s['states']}" for s in d["samples"]]
    lines.append(f"growth after step {d['samples'][0]['step']}: "
                 + ", ".join(f"rank {r} {100 * g:+.2f} %" for r, g in enumerate(d["growth"])))
    return "\n".join(lines + ["```"])


@block("elastic.demo")
def elastic_demo(docs: Path) -> str:
    """``elastic_runs.sh``'s runs from ``docs/elastic_demo.json``: per compression and seed, the
    held-out accuracy killed-then-added and uninterrupted, resets, ranks at the end."""
    d = load(docs, "elastic_demo.json")
    runs = d["runs"]
    lines = ["| compression | seed | accuracy, a worker killed then a slot added | uninterrupted | difference "
             "| optimizer steps (faulted / uninterrupted) | resets | ranks at the end | lost residual Σ e² |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in sorted(n for n in runs if n.endswith("killed_then_added")):
        faulted, straight = runs[name], runs[name.replace("killed_then_added", "uninterrupted")]
        compression, seed = name.split("-")[:2]
        lines.append(f"| {compression} | {seed.removeprefix('seed')} | {faulted['accuracy']:.4f} | "
                     f"{straight['accuracy']:.4f} | {faulted['accuracy'] - straight['accuracy']:+.4f} | "
                     f"{faulted['steps']} / {straight['steps']} | {faulted['resets']} | {faulted['ranks_at_end']} | "
                     f"{faulted['lost_residual']:.3g} |")
    return "\n".join(lines + ["", f"(`{d['command']}`, code {d['code']})"])


@block("elastic.repeats")
def elastic_repeats(docs: Path) -> str:
    """``elastic_repeats.py``'s runs from ``docs/elastic_repeats.jsonl``: per study (one Horovod
    build), the faulted runs that finished and that hung, their accuracy's range, the
    uninterrupted run's."""
    rows, _ = read_jsonl([docs / "elastic_repeats.jsonl"])
    lines = ["| Horovod's build edits (setup_env.sh) | epochs | faulted runs | finished | timed out (hung) "
             "| accuracy when finished: min, median, max | uninterrupted | code |", "|---|---|---|---|---|---|---|---|"]
    for run_id in dict.fromkeys(r["run_id"] for r in rows):
        study = [r for r in rows if r["run_id"] == run_id]
        faulted = [r for r in study if r["kill_at"]]
        done = sorted(r["accuracy"] for r in faulted if r["outcome"] == "finished")
        straight = [r for r in study if not r["kill_at"] and r["outcome"] == "finished"]
        spread = f"{done[0]:.4f}, {statistics.median(done):.4f}, {done[-1]:.4f}" if done else "–"
        alone = f"{straight[0]['accuracy']:.4f}" if straight else "–"
        hung = sum(r["outcome"] == "timed out" for r in faulted)
        lines.append(f"| {study[0]['horovod_edits']} | {study[0]['epochs']} | {len(faulted)} | {len(done)} | {hung} "
                     f"| {spread} | {alone} | {study[0]['code']} |")
    return "\n".join(lines)


@block("exit_codes")
def exit_codes(docs: Path) -> str:
    """``exit_codes.py``'s counts from ``docs/exit_codes.json``: per case, runs exiting 0 and
    runs in which a rank aborted at exit."""
    d = load(docs, "exit_codes.json")
    lines = ["| case | command | exit 0 | exit codes | a rank aborted at exit | code |", "|---|---|---|---|---|---|"]
    for name, c in d["cases"].items():
        codes = ", ".join(f"{code}: {n}" for code, n in c["exit_codes"].items())
        lines.append(f"| {name} | `{' '.join(c['command'])}` | {c['exit_0']} of {c['runs']} | {codes} | "
                     f"{c['runs_with_an_abort']} of {c['runs']} | {c['code']} |")
    return "\n".join(lines + ["", "(`python scripts/bench/exit_codes.py --runs 20 --out docs/exit_codes.json`, then "
                                   "`... --runs 8 --timeout 120 --cases ddp_restart_torch_init --append`)"])


# ---------------------------------------------------------------------------------------------
# shaped links and the cost model (bench_throughput.sh, cost_model.py)

def throughput_tables(docs: Path, name: str) -> str:
    """The steps/s tables and the links, as ``cost_model.py --validate`` prints them."""
    import cost_model

    links, cells, labels = cost_model.load(docs / name)
    text = printed(lambda: cost_model.measured(cells, labels))
    rows = [f"| {label} | {a * 1e6:.1f} | {b / 1e6:.1f} |" for label, (a, b) in links.items()]
    return (text + "\n\nLinks (ping-pong between ranks 0 and 1, median over repeats):\n\n"
            "| link | α (µs) | β (MB/s) |\n|---|---|---|\n" + "\n".join(rows))


block("throughput.fair")(lambda docs: throughput_tables(docs, "throughput_fair.jsonl"))
block("throughput.sparse")(lambda docs: throughput_tables(docs, "throughput_sparse.jsonl"))


def validation(docs: Path, name: str) -> str:
    """The prediction table and the ``max_rel_error`` line of ``cost_model.py --validate``."""
    import cost_model

    text = printed(lambda: cost_model.validate(docs / name))
    start = text.index("Prediction (out-of-sample)")
    return text[start:].strip()


def sketch_vs_gtopk(docs: Path, name: str) -> str:
    """``sketch_vs_gtopk.P`` (P a rank count, or ``all``): the range over the shaped links (and
    rank counts) of the paper's sketch's median steps/s over gTop-k (global)'s, from
    ``docs/throughput_fair.jsonl``."""
    import cost_model

    _, cells, _ = cost_model.load(docs / "throughput_fair.jsonl")
    ranks = name.split(".")[1]
    ratios = [c.median / cells["gtopk", c.ranks, c.label].median for (v, P, label), c in cells.items()
              if v == "gs:exchange=sketch" and label != "local" and (ranks == "all" or P == int(ranks))]
    return f"{min(ratios):.2f}–{max(ratios):.2f}×"


block("cost_model.validate")(lambda docs: validation(docs, "throughput_fair.jsonl"))


@block("throughput.spread")
def throughput_spread(docs: Path) -> str:
    """The farthest any repeat of ``docs/throughput_fair.jsonl`` lies from its cell's median steps/s,
    and the cell."""
    import cost_model

    _, cells, _ = cost_model.load(docs / "throughput_fair.jsonl")
    far, (v, P, label) = max((max(abs(x / c.median - 1) for x in c.by_repeat.values()), key)
                             for key, c in cells.items())
    return f"{100 * far:.0f} % ({variant_name(v)} at {P} ranks, {label})"


@block("cost_model.max_rel_error")
def max_rel_error(docs: Path) -> str:
    import cost_model

    return f"{printed(lambda: cost_model.validate(docs / 'throughput_fair.jsonl')).splitlines()[-1].split()[-1]}"


@block("cost_model.fitted")
def fitted_validation(docs: Path) -> str:
    """The verdict of ``cost_model.py --validate ... --collectives docs/collective_sweep.jsonl
    --validation-out docs/cost_model_validation.json``: β per collective fitted to size sweeps."""
    d = load(docs, "cost_model_validation.json")
    verdict = "holds" if d["holds"] else "does not hold"
    return (f"{d['max_rel_error']:.3f} over the {d['rows_counted']} of {d['rows']} shaped rows whose modelled "
            f"communication is at least {d['comm_share_counted']:.0%} of the step: the model {verdict} "
            f"(target {d['target']})")


@block("projection.table")
def projection_table(docs: Path) -> str:
    """gs-SGD's projected steps/s ÷ each variant's at P = 8, 64, 1024, and who it beats at every
    P, from ``docs/projection.json`` (``cost_model.py --project --out``)."""
    d = load(docs, "projection.json")
    ranks = d["ranks"]
    lines = []
    for model, by_rate in d["table"].items():
        for rate, by_variant in by_rate.items():
            variants = list(by_variant)
            gs, others = variants[0], variants[1:]
            if not lines:
                lines = ["| model | Gbit/s | P | gs steps/s | " + " | ".join(f"÷ {variant_name(v)}" for v in others)
                         + " |", "|---|---|---|---|" + "---|" * len(others)]
            for i, P in enumerate(ranks):
                if P in (8, 64, 1024):
                    mine = by_variant[gs][i]
                    lines.append(f"| {model} | {float(rate):g} | {P} | {mine:.2f} | "
                                 + " | ".join(f"{mine / by_variant[v][i]:.2f}" for v in others) + " |")
    lines += ["", f"gs-SGD faster at every P = {ranks[0]} … {ranks[-1]}:"]
    for model, by_rate in d["table"].items():
        for rate, by_variant in by_rate.items():
            variants = list(by_variant)
            gs = variants[0]
            wins = [variant_name(v) for v in variants[1:]
                    if all(g > s for g, s in zip(by_variant[gs], by_variant[v]))]
            lines.append(f"- {model} at {float(rate):g} Gbit/s: {', '.join(wins) or 'none'}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# delivered mass (bench_recovery.py's records)

def recovery_sections(docs: Path) -> dict[str, str]:
    """``bench_recovery.py --report docs/recovery.jsonl docs/recovery_curves.jsonl``'s printed
    sections by heading."""
    import bench_recovery

    paths = [str(docs / "recovery.jsonl"), str(docs / "recovery_curves.jsonl")]
    text = printed(lambda: bench_recovery.report(paths, None))
    parts = re.split(r"^### (.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}


block("recovery.shipped")(lambda docs: recovery_sections(docs)["Shipped gs global vs gTop-k"])
block("recovery.pareto")(lambda docs: recovery_sections(docs)["digits MLP, ratio 0.01, P = 16"])


@block("recovery.train")
def recovery_train(docs: Path) -> str:
    """The 60-step training runs of ``docs/recovery_curves.jsonl``, in order of the loss after
    them: delivered mass, wire kB a step, mean loss over steps 26–30 and 56–60."""
    records = recovery_records(docs, "recovery_curves.jsonl")
    lines = ["| method | settings | delivered mass | kB / rank / step | loss, steps 26–30 | loss, steps 56–60 |",
             "|---|---|---|---|---|---|"]
    for r in sorted(records, key=lambda r: sum(r["loss"][55:60])):
        name = r["method"] + (" **(shipped)**" if r.get("label") == "r3 w2 m1 L1 f16" and r["scope"] == "global"
                              else " (old defaults)" if r["method"] == "gs layer" else "")
        mass = "–" if r["method"] == "dense" else f"{r['mass']:.3f}"
        kb = "–" if not r["wire"] else f"{r['wire'] / 1e3:,.0f}"
        lines.append(f"| {name} | {r.get('label', '')} | {mass} | {kb} | {sum(r['loss'][25:30]) / 5:.3f} "
                     f"| {sum(r['loss'][55:60]) / 5:.3f} |")
    return "\n".join(lines)


@block("recovery.exchanges")
def recovery_exchanges(docs: Path) -> str:
    """The rows of ``docs/recovery_sparse.md``'s table that decide (the baselines over all weights,
    PowerSGD, the defaults, the sparse exchange and the sketch at their shipped sizes)."""
    import bench_recovery

    records = recovery_records(docs, "recovery_sparse.jsonl")
    table = bench_recovery.exchange_markdown(records).splitlines()
    keep = ("top-k allgather (global)", "gTop-k (global)", "PowerSGD", "gs defaults (auto → allgather)",
            "gs defaults (auto → sparse)", "gs sparse", "gs sketch")
    rows = [line for line in table[4:] if line.startswith("| ") and line.split(" | ")[1] in keep]
    return "\n".join(table[2:4] + rows)


@block("recovery.wire")
def recovery_wire(docs: Path) -> str:
    """``bench_recovery.py --report docs/recovery_wire.jsonl --markdown``'s table: every exchange
    with 8-byte and compact pairs beside the baselines (the digits MLP 1.28M, k = D/1000)."""
    import bench_recovery

    records = recovery_records(docs, "recovery_wire.jsonl")
    return "\n".join(bench_recovery.exchange_markdown(records).splitlines()[2:])


WIRE_STUDIES = ("cnn_sim4", "cnn_sim16", "cnn_sim64", "lm_sim4", "lm_sim16")
"""bench_convergence.py's equal-k wire study (``--out-dir docs/wire``): gs with each wire at k = D/1000."""
for _study in WIRE_STUDIES:
    block(f"wire_{_study}.table")(lambda docs, f=f"wire/convergence_{_study}.json": convergence_table(docs, f))


def wire_bytes_range(docs: Path, wire: str) -> str:
    """``wire.range.WIRE``: the least and most, over the equal-k wire studies, of gs's wire bytes a
    step with WIRE over its bytes with 8-byte pairs (means over the seeds)."""
    def mean_bytes(runs: dict, label: str) -> float:
        seeds = runs[f"{label} @ 0.001"].values()
        return sum(r["history"][-1]["wire_bytes_per_step"] for r in seeds) / len(seeds)

    ratios = [mean_bytes(runs, f"gs {wire}") / mean_bytes(runs, "gs fp32")
              for runs in (load(docs, f"wire/convergence_{study}.json") for study in WIRE_STUDIES)
              if f"gs {wire} @ 0.001" in runs]
    return f"{min(ratios):.2f}–{max(ratios):.2f}×"


for _wire in ("compact", "compact8"):
    block(f"wire.range.{_wire}")(lambda docs, w=_wire: wire_bytes_range(docs, w))


def is_default_sketch(r: dict) -> bool:
    """A record of the sketch at its shipped sizes (3 × 2k float16, k candidates, its top k applied)."""
    return "rows" in r and r["exchange"] == "sketch" and r.get("label", "").startswith("r3 w2 m1 L1 f16 topk")


@block("recovery.rule")
def recovery_rule(docs: Path) -> str:
    """``bench_recovery.py --rule docs/recovery_rule.jsonl``: the allgather's union against the
    sparse exchange per (task, P) over seeds, and what ``exchange="auto"`` picks there."""
    import bench_recovery

    return bench_recovery.rule_markdown(bench_recovery.read_records([str(docs / "recovery_rule.jsonl")]))


@block("recovery.prefilter")
def recovery_prefilter(docs: Path) -> str:
    """``docs/recovery_prefilter.jsonl`` (``bench_recovery.py --grid prefilter``): per task, P,
    exchange and pre-filter L, the delivered mass, the wire bytes and the mass per wire byte,
    median [min–max] over the seeds, and the mass per byte over L = 1's (same exchange, seed)."""
    import statistics

    def spread(xs: list[float], fmt: str) -> str:
        return f"{statistics.median(xs):{fmt}} [{min(xs):{fmt}}–{max(xs):{fmt}}]"

    lines = ["| task | P | exchange | L | seeds | delivered mass | wire kB / step | mass per wire byte ÷ L = 1's |",
             "|---|---|---|---|---|---|---|---|"]
    for (task, P, exchange, pre), (rs, per_byte) in sorted(prefilter_cells(docs).items()):
        lines.append(f"| {task} | {P} | {exchange} | {pre} | {len(rs)} | {spread([r['mass'] for r in rs], '.3f')} "
                     f"| {spread([r['wire'] / 1e3 for r in rs], '.1f')} | {spread(per_byte, '.2f')} |")
    return "\n".join(lines)


def prefilter_cells(docs: Path) -> dict[tuple, tuple[list[dict], list[float]]]:
    """``docs/recovery_prefilter.jsonl`` by (task, P, exchange, L): (the records, one a seed; each
    seed's mass per wire byte over L = 1's, same task, P, exchange and seed)."""
    import bench_recovery

    records = [r for r in bench_recovery.read_records([str(docs / "recovery_prefilter.jsonl")]) if "rows" in r]
    base = {(r["task"], r["P"], r["exchange"], r.get("seed", 0)): r["mass"] / r["wire"] for r in records
            if r["prefilter"] == 1}
    cells: dict[tuple, tuple[list[dict], list[float]]] = {}
    for r in records:
        rs, per_byte = cells.setdefault((r["task"], r["P"], r["exchange"], r["prefilter"]), ([], []))
        rs.append(r)
        per_byte.append(r["mass"] / r["wire"] / base[(r["task"], r["P"], r["exchange"], r.get("seed", 0))])
    return cells


def rule_cells(docs: Path) -> list[dict]:
    import bench_recovery

    return bench_recovery.rule_rows(bench_recovery.read_records([str(docs / "recovery_rule.jsonl")]))


RULE_TASKS = {"cnn": "MNIST-5k CNN", "mlp": "digits MLP 1.28M"}


def rule_figure(docs: Path, name: str) -> str:
    """``rule.WHAT.TASK.P`` from ``docs/recovery_rule.jsonl`` (TASK ``cnn`` or ``mlp``): the
    union's ``mass``, ``wire`` bytes or mass ``per_byte`` over the sparse exchange's, median over
    the seeds; ``rule.crossing.TASK``: between which measured P the union stops delivering more
    per byte in every seed."""
    import statistics

    parts = name.split(".")
    cells = sorted((c for c in rule_cells(docs) if c["task"] == RULE_TASKS[parts[2]]), key=lambda c: c["P"])
    if parts[1] == "crossing":
        ahead = [c["P"] for c in cells if c["union_wins"] == len(c["seeds"])]
        behind = [c["P"] for c in cells if c["P"] > max(ahead, default=0)]
        if not behind:
            return f"not within P ≤ {cells[-1]['P']}"
        first = next(c for c in cells if c["P"] == behind[0])
        split = "" if first["union_wins"] == 0 else f", level within the seeds at {first['P']}"
        return f"between P = {max(ahead)} and {behind[0]}{split}"
    cell = next(c for c in cells if c["P"] == int(parts[3]))
    return f"{statistics.median(cell[parts[1]]):.2f}×"


def prefilter_figure(docs: Path, name: str) -> str:
    """``pre.TASK.P.EXCHANGE.L`` from ``docs/recovery_prefilter.jsonl``: the median over the seeds
    of the mass per wire byte at pre-filter L over L = 1's (same exchange, task, P and seed)."""
    import statistics

    _, task, ranks, exchange, pre = name.split(".")
    _, per_byte = prefilter_cells(docs)[(RULE_TASKS[task], int(ranks), exchange, int(pre))]
    return f"{statistics.median(per_byte):.2f}×"


@block("rule.agrees")
def rule_agrees(docs: Path) -> str:
    """In how many (task, P) cells of ``docs/recovery_rule.jsonl`` ``auto``'s pick is the exchange
    with more mass per wire byte in every seed, and the cells where it is not."""
    cells = rule_cells(docs)
    right = [c for c in cells if (c["picks"] == "allgather") == (c["union_wins"] == len(c["seeds"]))
             and c["union_wins"] in (0, len(c["seeds"]))]
    other = [f"{c['task']} at P = {c['P']} (the union ahead per byte in {c['union_wins']} of {len(c['seeds'])} "
             f"seeds, `auto` picks {c['picks']})" for c in cells if c not in right]
    return (f"in {len(right)} of {len(cells)} (task, P) cells `auto` picks the exchange that delivered more mass "
            f"per wire byte in every seed" + (f"; not in {', '.join(other)}" if other else ""))


@block("recovery.exchange_before")
def recovery_exchange_before(docs: Path) -> str:
    """Mass, wire kB a step and loss after 20 steps per P of ``docs/recovery_exchange.jsonl``:
    the defaults then, the sketch at larger sizes, and the peers."""
    records = recovery_records(docs, "recovery_exchange.jsonl")
    lines = ["| P | method | mass | kB / step | loss after 20 steps |", "|---|---|---|---|---|"]
    for r in sorted(records, key=lambda r: (r["P"], r["wire"] or 0)):
        if "rows" in r:
            name = f"gs {r['exchange']} {' '.join(r['label'].split()[:-2])}, apply {r['apply']}"
            if not (is_default_sketch(r) or (r["exchange"] == "sketch" and " m4 " in r["label"] and r["apply"] == "all")
                    or r["exchange"] == "allgather"):
                continue
            name += " (**the defaults then**)" if is_default_sketch(r) and r["P"] > 4 else ""
        elif r["method"] in ("gTop-k (global)", "top-k allgather (global)", "PowerSGD r4"):
            name = r["method"] + (" (**the defaults then**: auto → allgather)" if r["method"].startswith("top-k")
                                  and r["P"] <= 4 else "")
        else:
            continue
        mass = f"({r['mass']:.2f})" if r["method"].startswith("PowerSGD") else f"{r['mass']:.3f}"
        lines.append(f"| {r['P']} | {name} | {mass} | {r['wire'] / 1e3:.1f} | {r['loss'][-1]:.3f} |")
    return "\n".join(lines)


@block("recovery.gtopk_over_sketch")
def gtopk_over_sketch(docs: Path) -> str:
    """gTop-k (global)'s delivered mass over the default sketch's, and its wire bytes over the
    sketch's, at each P of ``docs/recovery_exchange.jsonl``."""
    records = recovery_records(docs, "recovery_exchange.jsonl")
    parts = []
    for P in sorted({r["P"] for r in records}):
        at = [r for r in records if r["P"] == P]
        peer = next((r for r in at if r["method"] == "gTop-k (global)"), None)
        sketch = next((r for r in at if is_default_sketch(r)), None)
        if peer and sketch:
            parts.append(f"{peer['mass'] / sketch['mass']:.1f}× at P = {P} (sending "
                         f"{peer['wire'] / sketch['wire']:.2f}× the sketch's wire bytes)")
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------------
# time to accuracy (bench_time_to_accuracy.py's runs, docs/time_to_accuracy.jsonl)

def tta_summary(docs: Path, name: str = "time_to_accuracy.jsonl") -> list[dict]:
    """:func:`bench_time_to_accuracy.summarise` of ``docs/NAME`` (one row per setting and seed:
    :func:`bench_time_to_accuracy.read_rows`)."""
    return tta.summarise(tta.read_rows(docs / name), tta.targets_of([]))


def tta_repeats(docs: Path, name: str) -> dict[tuple, list[float | None]]:
    """Per (workload, ranks, rate, method) of ``docs/NAME``: each repeat's seconds to its
    workload's target, in repeat order (None where it was not reached)."""
    rows = tta.read_rows(docs / name)
    targets, out = tta.targets_of([]), {}
    for r in sorted((r for r in rows if "failed" not in r), key=lambda r: r["repeat"]):
        out.setdefault((r["workload"], r["ranks"], r["rate"], r["method"]), []).append(
            tta.time_to_target(r["history"], r["metric"], targets[r["workload"]]))
    return out


def tta_ratio(repeats: dict[tuple, list[float | None]], key: tuple, average: Callable[[list[float]], float]
              ) -> float | None:
    """The defaults' ``average`` seconds to the target over top-k allgather's at ``key``
    (workload, ranks, rate) of :func:`tta_repeats`; None unless every repeat of both reached it."""
    ours, theirs = repeats.get((*key, "gs")), repeats.get((*key, "topk"))
    if not ours or not theirs or None in ours or None in theirs:
        return None
    return average(ours) / average(theirs)


@block("time_to_accuracy.compact")
def time_to_accuracy_compact(docs: Path) -> str:
    """``docs/time_to_accuracy_compact.jsonl`` (the defaults with the compact wire and top-k
    allgather, side by side in one study): per (workload, P, link) both methods' seconds to the
    target (mean ± std), the defaults' over top-k allgather's by the means, every repeat's
    seconds, and the ratio by the medians."""
    import statistics

    summary = tta_summary(docs, "time_to_accuracy_compact.jsonl")
    repeats = tta_repeats(docs, "time_to_accuracy_compact.jsonl")
    lines = ["| workload | P | link | the defaults (gs) | top-k allgather | gs ÷ top-k allgather (means) "
             "| each repeat, gs / top-k allgather (s) | gs ÷ top-k allgather (medians) |",
             "|---|---|---|---|---|---|---|---|"]
    for key in dict.fromkeys((s["workload"], s["ranks"], s["rate"]) for s in summary):
        mine = {s["method"]: s for s in summary if (s["workload"], s["ranks"], s["rate"]) == key}
        gs, topk = mine.get("gs"), mine.get("topk")
        by_mean, by_median = ("—" if r is None else f"{r:.2f}"
                              for r in (tta_ratio(repeats, key, avg) for avg in (statistics.mean, statistics.median)))
        each = " / ".join(", ".join("—" if t is None else f"{t:.1f}" for t in repeats.get((*key, m), []))
                          for m in ("gs", "topk"))
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {seconds_to_target(gs) if gs else '—'} "
                     f"| {seconds_to_target(topk) if topk else '—'} | {by_mean} | {each} | {by_median} |")
    return "\n".join(lines)


LM_EVAL_EVERY = 10  # bench_time_to_accuracy.WORKLOADS["lm"]: an evaluation every 10 steps


def steps_to_target(row: dict, every: float | None = None) -> float | None:
    """The steps to the row's target, interpolated as :func:`bench_time_to_accuracy.time_to_target`
    interpolates seconds (evaluation i is at step every·(i + 1)): ``every`` is the LM's 10 unless
    given (the CNN evaluates once an epoch, whose steps depend on P: pass 1 to count in epochs);
    None for another workload without ``every``, or when the target was not reached."""
    if "failed" in row or (every is None and row["workload"] != "lm"):
        return None
    every = LM_EVAL_EVERY if every is None else every
    history = [{"seconds": every * (i + 1), row["metric"]: h[row["metric"]]}
               for i, h in enumerate(row["history"])]
    return tta.time_to_target(history, row["metric"], tta.targets_of([])[row["workload"]])


@block("density.pilot")
def density_pilot(docs: Path) -> str:
    """``docs/tta_density_pilot.jsonl``: per (workload, P, link) and method, the seconds to the
    target, the LM's steps to it, bytes per step and the last evaluation; one repeat (seed 0)."""
    rows = tta.read_rows(docs / "tta_density_pilot.jsonl")
    targets = tta.targets_of([])
    lines = ["| workload | P | link | method | seconds to target | steps to target (LM) | bytes/step/rank "
             "| last evaluation |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "failed" in r:
            lines.append(f"| {r['workload']} | {r['ranks']} | {r['rate']} | {r['method']} | failed | | | |")
            continue
        seconds = tta.time_to_target(r["history"], r["metric"], targets[r["workload"]])
        steps = steps_to_target(r)
        lines.append(f"| {r['workload']} | {r['ranks']} | {r['rate']} | {r['method']} "
                     f"| {'not reached' if seconds is None else f'{seconds:.1f} s'} "
                     f"| {'' if r['workload'] != 'lm' else 'not reached' if steps is None else f'{steps:.0f}'} "
                     f"| {r['bytes_per_step']:,.0f} | {r['history'][-1][r['metric']]:.4g} |")
    return "\n".join(lines)


@block("density.pilot_verdict")
def density_pilot_verdict(docs: Path) -> str:
    """Per (workload, P, link) of ``docs/tta_density_pilot.jsonl``: the fastest method to the
    target, the defaults' (``gs``) seconds over it, and the defaults' LM steps over dense's."""
    rows = [r for r in tta.read_rows(docs / "tta_density_pilot.jsonl") if "failed" not in r]
    targets = tta.targets_of([])
    lines = ["| workload | P | link | fastest | the defaults ÷ fastest | the defaults' steps ÷ dense's (LM) |",
             "|---|---|---|---|---|---|"]
    fastest_count, settings = 0, 0
    for key in dict.fromkeys((r["workload"], r["ranks"], r["rate"]) for r in rows):
        mine = {r["method"]: r for r in rows if (r["workload"], r["ranks"], r["rate"]) == key}
        seconds = {m: tta.time_to_target(r["history"], r["metric"], targets[key[0]]) for m, r in mine.items()}
        reached = {m: t for m, t in seconds.items() if t is not None}
        if not reached:
            continue
        best = min(reached, key=reached.get)
        settings += 1
        fastest_count += best == "gs"
        ratio = "not reached" if seconds.get("gs") is None else f"{seconds['gs'] / reached[best]:.2f}"
        steps = {m: steps_to_target(mine[m]) for m in ("gs", "none") if m in mine}
        by_steps = "" if key[0] != "lm" else ("—" if None in steps.values() or len(steps) < 2 else
                                               f"{steps['gs'] / steps['none']:.2f}")
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {best} | {ratio} | {by_steps} |")
    lines.append(f"\nThe defaults were the fastest in {fastest_count} of {settings} settings.")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the training-phase options of ratio="auto" (ramp, critical) against the plain budget
# (docs/tta_phases.jsonl)

PHASES = "tta_phases.jsonl"
PLAIN, DENSE_REFERENCE = "gs", "fp16"


def at_bytes(row: dict, budget: float) -> float | None:
    """``row``'s metric at ``budget`` cumulative wire bytes through a rank, linear in bytes
    between the two evaluations around it; None before its first evaluation or past its last."""
    metric, points = row["metric"], row["history"]
    for before, after in zip(points, points[1:]):
        if before["wire_bytes"] <= budget <= after["wire_bytes"]:
            span = after["wire_bytes"] - before["wire_bytes"]
            share = 0.0 if span == 0 else (budget - before["wire_bytes"]) / span
            return before[metric] + share * (after[metric] - before[metric])
    return points[0][metric] if points and budget == points[0]["wire_bytes"] else None


def equal_bytes_ratio(row: dict, plain: dict) -> float | None:
    """``row``'s metric ÷ ``plain``'s at the smaller of their cumulative wire bytes at the end
    (:func:`at_bytes`), or None where either has no evaluation there."""
    budget = min(row["history"][-1]["wire_bytes"], plain["history"][-1]["wire_bytes"])
    mine, theirs = at_bytes(row, budget), at_bytes(plain, budget)
    return None if mine is None or theirs is None else mine / theirs


def phase_cells_of(path: Path) -> dict[tuple, dict[str, dict[int, dict]]]:
    """A time-to-accuracy file as (workload, P, link) → method → seed → row (failed runs left out)."""
    cells: dict[tuple, dict[str, dict[int, dict]]] = {}
    for r in tta.read_rows(path):
        if "failed" not in r:
            cells.setdefault((r["workload"], r["ranks"], r["rate"]), {}).setdefault(r["method"], {})[r["seed"]] = r
    return cells


def mean_of(values: list[float | None]) -> str:
    kept = [v for v in values if v is not None]
    return "—" if not kept else f"{statistics.mean(kept):.2f}" if len(kept) == len(values) else \
        f"{statistics.mean(kept):.2f} ({len(kept)} of {len(values)})"


def steps_over_dense(seeds: dict[int, dict], dense: dict[int, dict]) -> dict[int, float | None]:
    """Per seed of ``seeds`` (seed → row): its steps to the target over ``dense``'s row of the same
    seed (:func:`steps_to_target`; the CNN's in epochs, the same schedule for both); None where
    either did not reach it or dense has no row."""
    out: dict[int, float | None] = {}
    for seed in sorted(seeds):
        every = None if seeds[seed]["workload"] == "lm" else 1
        mine = steps_to_target(seeds[seed], every)
        theirs = steps_to_target(dense[seed], every) if seed in dense else None
        out[seed] = None if mine is None or theirs is None else mine / theirs
    return out


def steps_table(path: Path, dense_method: str, plain_method: str) -> str:
    """Per (workload, P, link) and method of a time-to-accuracy file, means over the seeds: the
    LM's steps and seconds to its target (no seconds on modelled links), steps over
    ``dense_method``'s (per seed), wire MB a rank over the run, and the held-out metric over
    ``plain_method``'s at equal cumulative wire bytes (per seed, then the mean; each seed's ratio
    in brackets)."""
    targets = tta.targets_of([])
    lines = ["| workload | P | link | method | seeds at target | steps to target | steps ÷ dense's "
             f"| seconds to target | wire MB a rank | metric ÷ {plain_method}'s at equal bytes [per seed] |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (workload, ranks, rate), methods in phase_cells_of(path).items():
        dense, plain = methods.get(dense_method, {}), methods.get(plain_method, {})
        for method, seeds in methods.items():
            rows = [seeds[k] for k in sorted(seeds)]
            steps = [steps_to_target(r) for r in rows]
            seconds = [None if rate.endswith("modelled") else
                       tta.time_to_target(r["history"], r["metric"], targets[workload]) for r in rows]
            over = list(steps_over_dense(seeds, dense).values())
            equal = [equal_bytes_ratio(seeds[k], plain[k]) if k in plain else None for k in sorted(seeds)]
            each = ", ".join("—" if e is None else f"{e:.3f}" for e in equal)
            megabytes = statistics.mean(r["history"][-1]["wire_bytes"] for r in rows) / 1e6
            lines.append(f"| {workload} | {ranks} | {rate} | {method} | {sum(s is not None for s in steps)} of "
                         f"{len(rows)} | {mean_of(steps)} | {mean_of(over)} | {mean_of(seconds)} | {megabytes:,.0f} "
                         f"| {mean_of(equal)} [{each}] |")
    return "\n".join(lines)


def options_verdict(path: Path, dense_method: str, plain_method: str) -> str:
    """Per method of a time-to-accuracy file other than ``plain_method`` and ``dense_method``: in
    how many (setting, seed) pairs its metric at equal cumulative wire bytes beat
    ``plain_method``'s, and, on real links, its seconds to the target over ``plain_method``'s
    (mean of the settings' means, over the settings where every seed of both reached it)."""
    targets = tta.targets_of([])
    cells = phase_cells_of(path)
    options = [m for m in dict.fromkeys(m for c in cells.values() for m in c) if m not in (plain_method, dense_method)]
    lines = [f"| method | ahead of {plain_method} at equal bytes | seconds to target ÷ {plain_method}'s |",
             "|---|---|---|"]
    for option in options:
        ahead, pairs, speed = 0, 0, []
        for (workload, _, rate), methods in cells.items():
            mine, plain = methods.get(option, {}), methods.get(plain_method, {})
            for seed in sorted(set(mine) & set(plain)):
                ratio = equal_bytes_ratio(mine[seed], plain[seed])
                lower = mine[seed]["metric"] == "perplexity"  # lower is better
                pairs += 1
                ahead += ratio is not None and (ratio < 1 if lower else ratio > 1)
            times = [[tta.time_to_target(r["history"], r["metric"], targets[workload]) for r in side.values()]
                     for side in (mine, plain)]
            if not rate.endswith("modelled") and times[0] and times[1] and None not in times[0] + times[1]:
                speed.append(statistics.mean(times[0]) / statistics.mean(times[1]))
        lines.append(f"| {option} | {ahead} of {pairs} | {mean_of(speed) if speed else '—'} |")
    return "\n".join(lines)


@block("density.phases")
def density_phases(docs: Path) -> str:
    """docs/tta_phases.jsonl: the training-phase options against the plain budget (:func:`steps_table`)."""
    return steps_table(docs / PHASES, DENSE_REFERENCE, PLAIN)


@block("density.phases_verdict")
def density_phases_verdict(docs: Path) -> str:
    """docs/tta_phases.jsonl: :func:`options_verdict` against the plain budget."""
    return options_verdict(docs / PHASES, DENSE_REFERENCE, PLAIN)


@block("readme.steps")
def readme_steps(docs: Path) -> str:
    """The defaults' LM steps to the target over dense allreduce's (``none``) per P on the
    study's slowest link (docs/tta_defaults.jsonl, as its verdicts' last column: the mean and
    range over the seeds of each seed's ratio), and the range of their perplexity over dense's
    along the 400-step runs (docs/tta_lm400.jsonl)."""
    parts, links, seeds = [], set(), set()
    cells = {key: methods for key, methods in phase_cells_of(docs / STUDY).items() if key[0] == "lm"}
    if not cells:
        raise KeyError(f"no LM setting in docs/{STUDY}")
    slowest = min((key[2] for key in cells), key=link_bits)
    for (_, ranks, rate), methods in sorted(cells.items()):
        if rate != slowest:
            continue
        ratios = [r for r in steps_over_dense(methods.get("gs", {}), methods.get("none", {})).values()
                  if r is not None]
        if ratios:
            parts.append(f"{statistics.mean(ratios):.2f}× ({ranks} ranks; seeds {min(ratios):.2f}–{max(ratios):.2f}×)")
            links.add(LINKS.get(rate, rate))
            seeds.add(len(ratios))
    spans, long_ranks, steps = [], set(), 0
    for (_, ranks, _), methods in phase_cells_of(docs / LONG).items():
        plain, dense = methods.get(PLAIN, {}), methods.get(DENSE_REFERENCE, {})
        for k in sorted(set(plain) & set(dense)):
            spans += [a["perplexity"] / b["perplexity"] for a, b in zip(plain[k]["history"], dense[k]["history"])]
            long_ranks.add(ranks)
            steps = max(steps, len(plain[k]["history"]) * LM_EVAL_EVERY)
    return (f"the LM reached perplexity 20 in a mean of {' and '.join(parts)} dense's steps on "
            f"{', '.join(sorted(links))} ({', '.join(map(str, sorted(seeds)))} seeds each); over {steps} steps "
            f"({', '.join(map(str, sorted(long_ranks)))} ranks) its perplexity stayed "
            f"{min(spans):.2f}–{max(spans):.2f}× dense's")


UNION = "tta_sim16.jsonl"


@block("density.union")
def density_union(docs: Path) -> str:
    """docs/tta_sim16.jsonl: what the sparse exchange applies, on 16 simulated ranks (:func:`steps_table`)."""
    return steps_table(docs / UNION, "none", PLAIN)


@block("density.union_verdict")
def density_union_verdict(docs: Path) -> str:
    """docs/tta_sim16.jsonl: :func:`options_verdict` against the defaults."""
    return options_verdict(docs / UNION, "none", PLAIN)


SIM_CNN = "tta_sim_cnn.jsonl"  # the CNN at the defaults, dense and PowerSGD rank 1 and 2 on 16 and 64 simulated ranks


@block("density.sim_cnn_final")
def density_sim_cnn_final(docs: Path) -> str:
    """docs/tta_sim_cnn.jsonl: :func:`final_table`."""
    return final_table(docs / SIM_CNN)


def final_table(path: Path) -> str:
    """Per (workload, P, link) and method of a time-to-accuracy file: the held-out metric at the
    last evaluation (mean over the seeds, each seed's in brackets), and the wire MB a rank at the
    first evaluation and at the end (means over the seeds)."""
    lines = ["| workload | P | link | method | metric at the end: mean [per seed] | wire MB a rank at the first "
             "evaluation | at the end |", "|---|---|---|---|---|---|---|"]
    for (workload, ranks, rate), methods in phase_cells_of(path).items():
        for method, seeds in methods.items():
            rows = [seeds[k] for k in sorted(seeds)]
            last = [r["history"][-1][r["metric"]] for r in rows]
            first_mb, end_mb = (statistics.mean(r["history"][i]["wire_bytes"] for r in rows) / 1e6 for i in (0, -1))
            lines.append(f"| {workload} | {ranks} | {rate} | {method} | {statistics.mean(last):.3f} "
                         f"[{', '.join(f'{v:.3f}' for v in last)}] | {first_mb:,.1f} | {end_mb:,.1f} |")
    return "\n".join(lines)


LONG = "tta_lm400.jsonl"
LONG_STEPS = (20, 50, 100, 200, 400)


@block("density.long")
def density_long(docs: Path) -> str:
    """docs/tta_lm400.jsonl (the LM over 400 steps): per (P, link) and method, the mean held-out
    perplexity over the seeds after each of :data:`LONG_STEPS` steps, each method's over dense's
    (FP16's steps) of the same seed as the mean of the seeds' ratios, and the mean seconds."""
    cells = phase_cells_of(docs / LONG)
    lines = ["| P | link | method | " + " | ".join(f"after {n}" for n in LONG_STEPS) + " | seconds, all steps |",
             "|---|---|---|" + "---|" * (len(LONG_STEPS) + 1)]
    for (_, ranks, rate), methods in cells.items():
        dense = methods.get(DENSE_REFERENCE, {})
        for method, seeds in methods.items():
            cells_of = []
            for n in LONG_STEPS:
                if any(len(r["history"]) * LM_EVAL_EVERY < n for r in seeds.values()):
                    cells_of.append("—")
                    continue

                def after(row: dict, n: int = n) -> float:
                    return row["history"][n // LM_EVAL_EVERY - 1]["perplexity"]

                values = [after(r) for r in seeds.values()]
                ratios = [after(r) / after(dense[k]) for k, r in seeds.items() if k in dense]
                cells_of.append(f"{statistics.mean(values):.2f}" + ("" if method == DENSE_REFERENCE or not ratios
                                                                   else f" ({statistics.mean(ratios):.2f}×)"))
            seconds = statistics.mean(r["history"][-1]["seconds"] for r in seeds.values())
            lines.append(f"| {ranks} | {rate} | {method} | " + " | ".join(cells_of) + f" | {seconds:.0f} |")
    seeds = sorted({k for m in cells.values() for s in m.values() for k in s})
    lines.append(f"\nHeld-out perplexity after each number of steps, mean over seeds {', '.join(map(str, seeds))}; "
                 f"in brackets the mean of each seed's perplexity over {DENSE_REFERENCE}'s (dense steps); "
                 "training seconds to the last evaluation, evaluations included.")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the time-to-accuracy study at the shipped defaults (docs/tta_defaults.jsonl)

NEAR_FASTEST = 1.05
"""Issue 44's goal: the defaults within this factor of the fastest method's mean seconds."""


def complete(mine: Iterable[dict]) -> bool:
    """Whether every method of one setting's summaries ran as many repeats as the others (a study
    still running, or one stopped, has settings where they differ), ``gs`` among them."""
    mine = list(mine)
    return any(s["method"] == "gs" for s in mine) and len({s["repeats"] for s in mine}) == 1


def by_setting(summary: list[dict]) -> dict[tuple, dict[str, dict]]:
    """Summaries as (workload, P, link) → method → summary, in the file's order."""
    out: dict[tuple, dict[str, dict]] = {}
    for s in summary:
        out.setdefault((s["workload"], s["ranks"], s["rate"]), {})[s["method"]] = s
    return out


def verdicts(docs: Path, name: str) -> str:
    """Per (workload, P, link) of ``docs/NAME``: the fastest method (:func:`fastest`), the
    defaults' seconds, the ratio of their mean seconds to the fastest's and to FP16's, and the
    steps to the target over dense's (``none``; per seed, then the mean; the CNN's counted in
    epochs, interpolated between its evaluations, one an epoch). A setting whose methods ran
    different numbers of repeats (:func:`complete`) is named as such, not compared."""
    cells = phase_cells_of(docs / name)
    lines = ["| workload | P | link | fastest to target | the defaults (gs) | gs ÷ fastest | gs ÷ FP16 "
             "| gs's steps ÷ dense's |", "|---|---|---|---|---|---|---|---|"]
    for key, mine in by_setting(tta_summary(docs, name)).items():
        if not complete(mine.values()):
            repeats = sorted({s["repeats"] for s in mine.values()})
            lines.append(f"| {key[0]} | {key[1]} | {LINKS.get(key[2], key[2])} | incomplete: {repeats[0]}–"
                         f"{repeats[-1]} repeats a method | | | | |")
            continue
        best, gs, fp16 = fastest(mine.values()), mine.get("gs"), mine.get("fp16")
        every = gs is not None and gs["reached"] == gs["repeats"]
        over = ["—" if not every or other is None or other["reached"] < other["repeats"]
                else f"{gs['mean_seconds'] / other['mean_seconds']:.2f}" for other in (best, fp16)]
        methods = cells.get(key, {})
        steps = mean_of(list(steps_over_dense(methods.get("gs", {}), methods.get("none", {})).values()))
        lines.append(f"| {key[0]} | {key[1]} | {LINKS.get(key[2], key[2])} | "
                     + (f"{best['method']}: {seconds_to_target(best)}" if best else "none in every repeat")
                     + f" | {seconds_to_target(gs) if gs else '—'} | {over[0]} | {over[1]} | {steps} |")
    return "\n".join(lines)


def goal(docs: Path, name: str) -> str:
    """Over the complete settings of ``docs/NAME`` (:func:`complete`): in how many the defaults
    were the fastest, within :data:`NEAR_FASTEST` of the fastest's mean seconds, missed the
    target in some repeat; the range of their seconds over FP16's on each link; and how many
    settings were left out as incomplete."""
    settings = by_setting(tta_summary(docs, name))
    done = {key: mine for key, mine in settings.items() if complete(mine.values())}
    first, near, missed, over_fp16 = defaults_counts(done, NEAR_FASTEST)
    clauses = [f"the defaults were the fastest in {first} of {len(done)} settings and within {NEAR_FASTEST}× "
               f"of the fastest in {near} (counting those where they were the fastest)",
               f"they missed the target in some repeat in {missed}",
               *(f"{LINKS.get(rate, rate)} {ratio_range(ratios)} FP16's seconds" for rate, ratios in over_fp16.items())]
    if len(done) < len(settings):
        clauses.append(f"{len(settings) - len(done)} incomplete setting(s) left out")
    return "; ".join(clauses)


def segments(row: dict) -> list[tuple[float, float]]:
    """(seconds, wire bytes through a rank) of each stretch between evaluations of a run (the
    first from the start of training), evaluations included."""
    out, seconds, sent = [], 0.0, 0.0
    for h in row["history"]:
        out.append((h["seconds"] - seconds, h["wire_bytes"] - sent))
        seconds, sent = h["seconds"], h["wire_bytes"]
    return out


def stretches(gs: dict, fp16: dict) -> list[tuple[bool, float, float]]:
    """The defaults' run ``gs`` and FP16's ``fp16`` (one seed) stretch by stretch
    (:func:`segments`): (whether the defaults' stretch sent under 99 % of FP16's bytes, i.e. some
    step at a sparse level; its seconds; FP16's)."""
    return [(b < 0.99 * b16, t, t16) for (t, b), (t16, b16) in zip(segments(gs), segments(fp16))]


@block("tta_dense_path.segments")
def tta_dense_path_segments(docs: Path) -> str:
    return segments_table(docs / DENSE_PATH)


@block("tta_dense_means.segments")
def tta_dense_means_segments(docs: Path) -> str:
    return segments_table(docs / DENSE_MEANS)


def segments_table(path: Path) -> str:
    """Per (workload, P, link) of a time-to-accuracy file, the defaults' stretches between
    evaluations against FP16's same stretch of the same seed: how many sent fewer wire bytes
    (some step at a sparse level) and their seconds ÷ FP16's, and the same for the others (every
    step dense); sums over the seeds' stretches."""
    lines = ["| workload | P | link | stretches with a sparse step (of all) | their seconds ÷ FP16's "
             "| stretches all dense: seconds ÷ FP16's |", "|---|---|---|---|---|---|"]
    for (workload, ranks, rate), methods in phase_cells_of(path).items():
        gs, fp16 = methods.get("gs", {}), methods.get("fp16", {})
        sums = {True: [0, 0.0, 0.0], False: [0, 0.0, 0.0]}  # sparse? → [stretches, gs seconds, fp16 seconds]
        for seed in sorted(set(gs) & set(fp16)):
            for sparse, t, t16 in stretches(gs[seed], fp16[seed]):
                cell = sums[sparse]
                cell[0], cell[1], cell[2] = cell[0] + 1, cell[1] + t, cell[2] + t16
        total = sums[True][0] + sums[False][0]
        if not total:
            continue
        ratio = ["—" if not n else f"{a / b:.2f}" for n, a, b in (sums[True], sums[False])]
        lines.append(f"| {workload} | {ranks} | {LINKS.get(rate, rate)} | {sums[True][0]} of {total} | {ratio[0]} "
                     f"| {ratio[1]} |")
    return "\n".join(lines)


FIRST_STRETCH = "tta_first_stretch.jsonl"  # the defaults, the defaults held dense and FP16 at 4 ranks on 1 Gbit/s
HELD_DENSE = "gs:budget=1000000"
"""The defaults held at their dense level (a budget no dense step exceeds)."""


class FirstStretch(NamedTuple):
    """One method of one setting against FP16's runs of the same seeds: its first stretch between
    evaluations (from the start of training) and its later ones over FP16's (sums over the
    seeds), its mean seconds to the target over FP16's (None unless every seed of both reached
    it), how many seeds and later stretches, and how many of the first and of the later
    stretches sent fewer bytes than FP16's (some step at a sparse level)."""

    setting: tuple
    method: str
    first: float
    later: float
    target: float | None
    seeds: int
    rest: int
    sparse_first: int
    sparse_later: int


def target_ratio(mine: dict[int, dict], theirs: dict[int, dict], seeds: list[int]) -> float | None:
    """The mean seconds to the target of ``mine``'s runs of ``seeds`` (seed → row) over
    ``theirs``'; None unless every one of those runs reached it."""
    targets = tta.targets_of([])
    reach = [[tta.time_to_target(side[k]["history"], side[k]["metric"], targets[side[k]["workload"]]) for k in seeds]
             for side in (mine, theirs)]
    return None if None in reach[0] + reach[1] else statistics.mean(reach[0]) / statistics.mean(reach[1])


def first_stretches(docs: Path) -> list[FirstStretch]:
    """A :class:`FirstStretch` per setting and method of docs/tta_first_stretch.jsonl but FP16."""
    out = []
    for key, methods in phase_cells_of(docs / FIRST_STRETCH).items():
        fp16 = methods.get("fp16", {})
        for method, runs in methods.items():
            seeds = sorted(set(runs) & set(fp16))
            if method == "fp16" or not seeds:
                continue
            pairs = [stretches(runs[k], fp16[k]) for k in seeds]
            first = sum(p[0][1] for p in pairs) / sum(p[0][2] for p in pairs)
            later = sum(t for p in pairs for _, t, _ in p[1:]) / sum(t for p in pairs for _, _, t in p[1:])
            out.append(FirstStretch(key, method, first, later, target_ratio(runs, fp16, seeds), len(seeds),
                                    sum(len(p) - 1 for p in pairs),
                                    sum(p[0][0] for p in pairs), sum(s for p in pairs for s, _, _ in p[1:])))
    return out


@block("tta_first_stretch.table")
def tta_first_stretch_table(docs: Path) -> str:
    """:func:`first_stretches` as a table."""
    lines = ["| workload | P | link | method | first stretch ÷ FP16's | later stretches ÷ FP16's "
             "| seconds to target ÷ FP16's | stretches with a sparse step: first, later (of seeds) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in first_stretches(docs):
        (workload, ranks, rate), target = r.setting, "—" if r.target is None else f"{r.target:.2f}"
        lines.append(f"| {workload} | {ranks} | {LINKS.get(rate, rate)} | {r.method} | {r.first:.2f} | {r.later:.2f} "
                     f"| {target} | {r.sparse_first} of {r.seeds}, {r.sparse_later} of {r.rest} |")
    return "\n".join(lines)


@block("tta_first_stretch.held")
def tta_first_stretch_held(docs: Path) -> str:
    """The range of seconds to the target over FP16's of the defaults held dense and of the
    defaults, over the settings of docs/tta_first_stretch.jsonl."""
    ratios: dict[str, list[float]] = {HELD_DENSE: [], "gs": []}
    settings = set()
    for r in first_stretches(docs):
        if r.method in ratios and r.target is not None:
            ratios[r.method].append(r.target)
            settings.add(f"{r.setting[0]} at {r.setting[1]} ranks on {LINKS.get(r.setting[2], r.setting[2])}")
    return (f"held at their dense level the defaults took {ratio_range(ratios[HELD_DENSE])} FP16's seconds to the "
            f"target, as shipped {ratio_range(ratios['gs'])} ({', '.join(sorted(settings))})")


DENSE_PATH = "tta_dense_path.jsonl"
DENSE_MEANS = "tta_dense_means.jsonl"  # the defaults and FP16 after DenseMeans (code 047c2db)


def over_fp16(path: Path) -> dict[tuple, tuple[float | None, float, float | None]]:
    """Per (workload, P, link) of a time-to-accuracy file with ``gs`` and ``fp16`` rows: the
    ratio of the defaults' mean seconds to FP16's to the target (None unless every seed of both
    reached it) and over the whole run (the last evaluation's), and over the stretches where
    every step was dense (:func:`stretches`; None if none was)."""
    out = {}
    for key, methods in phase_cells_of(path).items():
        gs, fp16 = methods.get("gs", {}), methods.get("fp16", {})
        seeds = sorted(set(gs) & set(fp16))
        if not seeds:
            continue
        whole = [statistics.mean(side[k]["history"][-1]["seconds"] for k in seeds) for side in (gs, fp16)]
        dense = [(t, t16) for k in seeds for sparse, t, t16 in stretches(gs[k], fp16[k]) if not sparse]
        out[key] = (target_ratio(gs, fp16, seeds), whole[0] / whole[1],
                    sum(t for t, _ in dense) / sum(t for _, t in dense) if dense else None)
    return out


def codes_of(rows: Iterable[dict], key: tuple | None = None, methods: Iterable[str] | None = None) -> str:
    """The code versions of ``rows`` (of setting ``key`` = (workload, P, link) and of ``methods``,
    where given), sorted and joined."""
    methods = None if methods is None else set(methods)
    return ", ".join(sorted({r.get("code", "unknown") for r in rows
                             if (key is None or (r["workload"], r["ranks"], r["rate"]) == key)
                             and (methods is None or r["method"] in methods)}))


ENGINE = "tta_engine.jsonl"  # the defaults beside one peer a setting, after the faster union sum and dense path


@block("tta_engine.compare")
def tta_engine_compare(docs: Path) -> str:
    """Per setting of docs/tta_engine.jsonl: the defaults' and the other method's mean seconds to
    the target and their ratio, beside the same two in docs/tta_defaults.jsonl (the study, at its
    code), each line with the code versions of its rows."""
    before, after = by_setting(tta_summary(docs, STUDY)), by_setting(tta_summary(docs, ENGINE))
    rows = {name: tta.read_rows(docs / name) for name in (STUDY, ENGINE)}
    lines = ["| workload | P | link | code | the defaults (gs) | the other | gs ÷ the other |",
             "|---|---|---|---|---|---|---|"]
    for key, mine in after.items():
        peer = next(m for m in mine if m != "gs")
        for name, cell in ((STUDY, before.get(key, {})), (ENGINE, mine)):
            gs, other = cell.get("gs"), cell.get(peer)
            if gs is None or other is None:
                continue
            codes = codes_of(rows[name], key, ("gs", peer))
            whole = all(s["mean_seconds"] is not None and s["reached"] == s["repeats"] for s in (gs, other))
            ratio = f"{gs['mean_seconds'] / other['mean_seconds']:.2f}" if whole else "—"
            lines.append(f"| {key[0]} | {key[1]} | {LINKS.get(key[2], key[2])} | {codes} | {seconds_to_target(gs)} "
                         f"| {peer}: {seconds_to_target(other)} | {ratio} |")
    return "\n".join(lines)


@block("tta_dense_path.compare")
def tta_dense_path_compare(docs: Path) -> str:
    """The defaults over FP16 on the links of docs/tta_dense_path.jsonl (after the finiteness
    check became one reduction) and docs/tta_dense_means.jsonl (after the means were cast into
    one buffer handed out), beside the same settings of docs/tta_defaults.jsonl (the study):
    :func:`over_fp16`'s three ratios, each with the code versions of its setting's rows."""
    names = (STUDY, DENSE_PATH, DENSE_MEANS)
    ratios_of = {name: over_fp16(docs / name) for name in names}
    rows = {name: tta.read_rows(docs / name) for name in names}
    lines = ["| workload | P | link | code | seconds to target ÷ FP16's | seconds of the run ÷ FP16's "
             "| all-dense stretches ÷ FP16's |", "|---|---|---|---|---|---|---|"]
    keys = {**ratios_of[DENSE_PATH], **ratios_of[DENSE_MEANS]}
    for key in sorted(keys, key=lambda k: (k[0] != "lm", k[1])):
        for name in names:
            ratios = ratios_of[name].get(key)
            if ratios is None:
                continue
            cells = [codes_of(rows[name], key, ("gs", "fp16"))] + ["—" if r is None else f"{r:.2f}" for r in ratios]
            lines.append(f"| {key[0]} | {key[1]} | {LINKS.get(key[2], key[2])} | "
                         + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the README's first screen: the shipped defaults against FP16, PowerSGD and dense
# (docs/tta_defaults.jsonl, the study at the defaults; the one-seed pilot,
# docs/tta_density_pilot.jsonl, for the settings the study has not run)

STUDY = "tta_defaults.jsonl"
UNSHAPED = "tta_unshaped.jsonl"
"""The study's settings on the unshaped link (``--rates local``: no tc on the ranks' veth links)."""
PILOT = "tta_density_pilot.jsonl"
SCREEN_SOURCES = (STUDY, UNSHAPED, PILOT)
"""The first screen's data files, in precedence order: a setting is read from the first that has it."""
SCREEN_METHODS = {"gs": "the defaults", "fp16": "FP16", "powersgd:rank=1": "PowerSGD r1", "none": "dense"}
"""The methods of the README's results table and plot, in column order, and their labels."""
LINKS = {"100mbit": "100 Mbit/s", "1gbit": "1 Gbit/s", "10gbit": "10 Gbit/s", "local": "unshaped"}
STUDY_FILES = {"tta_defaults": STUDY, "tta_unshaped": UNSHAPED}
"""The study's files by block prefix (shaped links; the unshaped one). Each has four blocks:
PREFIX.table (``bench_time_to_accuracy.py report``'s table), .verdicts (:func:`verdicts`),
.goal (:func:`goal`) and .segments (:func:`segments_table`)."""
for _prefix, _name in STUDY_FILES.items():
    block(f"{_prefix}.table")(lambda docs, name=_name: tta.table(tta_summary(docs, name)))
    block(f"{_prefix}.verdicts")(lambda docs, name=_name: verdicts(docs, name))
    block(f"{_prefix}.goal")(lambda docs, name=_name: goal(docs, name))
    block(f"{_prefix}.segments")(lambda docs, name=_name: segments_table(docs / name))


def screen_summaries(docs: Path) -> dict[tuple, tuple[str, list[dict]]]:
    """Per (workload, P, link) of :data:`SCREEN_SOURCES` (the first file where it is
    :func:`complete`; files that do not exist skipped): (that file's name, its
    :func:`bench_time_to_accuracy.summarise` rows of every method); ordered by workload (as
    first met), P, then link speed."""
    out: dict[tuple, tuple[str, list[dict]]] = {}
    for name in SCREEN_SOURCES:
        if not (docs / name).exists():
            continue
        for key, methods in by_setting(tta.summarise(tta.read_rows(docs / name), tta.targets_of([]))).items():
            if complete(methods.values()):
                out.setdefault(key, (name, list(methods.values())))
    if not out:
        raise KeyError(f"none of {', '.join(SCREEN_SOURCES)} in {docs}")
    workloads = list(dict.fromkeys(key[0] for key in out))
    return dict(sorted(out.items(), key=lambda kv: (workloads.index(kv[0][0]), kv[0][1], link_bits(kv[0][2]))))


def screen_cells(docs: Path) -> dict[tuple, dict[str, tuple[float | None, float | None]]]:
    """Per (workload, P, link) of :func:`screen_summaries`: per method of :data:`SCREEN_METHODS`,
    (mean seconds to the target over the repeats, None unless every repeat reached it; mean bytes
    a step a rank)."""
    return {key: {s["method"]: (s["mean_seconds"] if s["reached"] == s["repeats"] else None, s["bytes_per_step"])
                  for s in rows if s["method"] in SCREEN_METHODS}
            for key, (_, rows) in screen_summaries(docs).items()}


def screen_provenance(docs: Path) -> str:
    """Per workload and data file of the first screen (files in :data:`SCREEN_SOURCES` order): the
    rank counts of the settings read from it, and those settings' repeats (seeds) and code
    versions, as the README's table caption says them."""
    used: dict[tuple[str, str], set[tuple]] = {}
    for key, (name, _) in screen_summaries(docs).items():
        used.setdefault((key[0], name), set()).add(key)
    workloads = list(dict.fromkeys(workload for workload, _ in used))
    parts = []
    for (workload, name), keys in sorted(used.items(), key=lambda kv: (workloads.index(kv[0][0]),
                                                                       SCREEN_SOURCES.index(kv[0][1]))):
        rows = [r for r in tta.read_rows(docs / name) if (r["workload"], r["ranks"], r["rate"]) in keys]
        seeds = sorted({r.get("seed", r["repeat"]) for r in rows})
        ranks = sorted({key[1] for key in keys})
        parts.append(f"{workload} at P = {', '.join(map(str, ranks))}: {len(seeds)} repeat"
                     f"{'s' if len(seeds) > 1 else ''} (seed{'s' if len(seeds) > 1 else ''} "
                     f"{', '.join(map(str, seeds))}), code {codes_of(rows)} (docs/{name})")
    return "; ".join(parts)


def kilobytes(b: float | None) -> str:
    return "—" if b is None else f"{b / 1000:,.0f} kB" if b >= 10_000 else f"{b / 1000:.1f} kB"


@block("readme.results")
def readme_results(docs: Path) -> str:
    """The README's table: per (workload, P, link), each method of :data:`SCREEN_METHODS`' seconds
    to the target and bytes a step a rank, the fastest of them in bold, and the fastest of every
    method its file ran there (:func:`fastest`)."""
    targets = tta.targets_of([])
    lines = ["| workload (target) | P | link | " + " | ".join(SCREEN_METHODS.values()) + " | fastest of those run |",
             "|---|---|---|" + "---|" * (len(SCREEN_METHODS) + 1)]
    summaries = screen_summaries(docs)
    for (workload, ranks, rate), mine in screen_cells(docs).items():
        reached = {m: t for m, (t, _) in mine.items() if t is not None}
        best = min(reached, key=reached.get) if reached else None
        cells = []
        for m in SCREEN_METHODS:
            if m not in mine:
                cells.append("—")
                continue
            t, b = mine[m]
            time = "not reached" if t is None else f"**{t:.1f} s**" if m == best else f"{t:.1f} s"
            cells.append(f"{time}, {kilobytes(b)}")
        first = fastest(summaries[(workload, ranks, rate)][1])
        cells.append("—" if first is None else f"{first['method']}, {first['mean_seconds']:.1f} s")
        metric = "accuracy" if workload == "cnn" else "perplexity"
        lines.append(f"| {workload} ({metric} {targets[workload]:g}) | {ranks} | {LINKS.get(rate, rate)} | "
                     + " | ".join(cells) + " |")
    lines.append(f"\nSeconds to the held-out target (the mean over the repeats) and bytes a step a rank (mean "
                 f"over the steps); {screen_provenance(docs)}; the defaults (`ratio=\"auto\"`) as each code "
                 "version shipped them.")
    return "\n".join(lines)


def screen_ratios(docs: Path, method: str, rate: str | None = None, over: str = "gs") -> list[float]:
    """``over``'s seconds ÷ ``method``'s in each first-screen setting (on ``rate`` only, if given)
    where both reached the target in every repeat."""
    out = []
    for (_, _, r), mine in screen_cells(docs).items():
        if rate and r != rate:
            continue
        a, b = mine.get(over, (None, None))[0], mine.get(method, (None, None))[0]
        if a is not None and b is not None:
            out.append(a / b)
    return out


def n_settings(n: int) -> str:
    return f"{n} setting{'' if n == 1 else 's'}"


def ratio_range(ratios: list[float]) -> str:
    if not ratios:
        raise KeyError("no setting where both reached the target")
    lo, hi = min(ratios), max(ratios)
    return f"{lo:.2f}×" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}–{hi:.2f}×"


@block("readme.when.slow")
def readme_when_slow(docs: Path) -> str:
    """The defaults' seconds to the target over dense's on the first screen's slowest link."""
    rate = min(screen_rates(docs), key=link_bits)
    ratios = screen_ratios(docs, "none", rate)
    return f"{ratio_range(ratios)} dense's seconds to the target on {LINKS.get(rate, rate)} ({n_settings(len(ratios))})"


@block("readme.when.fast")
def readme_when_fast(docs: Path) -> str:
    """The defaults' seconds to the target over FP16's on each of the first screen's links but
    the slowest, fastest last."""
    rates = sorted(screen_rates(docs), key=link_bits)[1:]
    parts = []
    for rate in rates:
        ratios = screen_ratios(docs, "fp16", rate)
        parts.append(f"{ratio_range(ratios)} FP16's seconds to the target on {LINKS.get(rate, rate)} "
                     f"({n_settings(len(ratios))})")
    return " and ".join(parts)


@block("readme.when.powersgd")
def readme_when_powersgd(docs: Path) -> str:
    """In how many first-screen settings PowerSGD rank 1 reached the target before the defaults, of those
    where both reached it, and in how many it missed it."""
    cells = screen_cells(docs)
    both = [c for c in cells.values() if c.get("gs", (None,))[0] is not None
            and c.get("powersgd:rank=1", (None,))[0] is not None]
    ahead = sum(c["powersgd:rank=1"][0] < c["gs"][0] for c in both)
    missed = sum(c.get("powersgd:rank=1", (None,))[0] is None for c in cells.values() if "powersgd:rank=1" in c)
    return (f"PowerSGD rank 1 reached the target first in {ahead} of the {len(both)} settings where both reached it "
            f"(it missed the target in {missed})")


def screen_rates(docs: Path) -> list[str]:
    return list(dict.fromkeys(rate for _, _, rate in screen_cells(docs)))


def link_bits(rate: str) -> float:
    """``100mbit`` → 1e8 bits a second (the links of scripts/bench/shaped.sh); ``local`` (not
    shaped: the veth links of one VM, as fast as its memory) → inf."""
    if rate == "local":
        return math.inf
    m = re.fullmatch(r"(\d+)(k|m|g)bit", rate)
    if not m:
        raise ValueError(f"unknown link {rate!r}")
    return int(m[1]) * {"k": 1e3, "m": 1e6, "g": 1e9}[m[2]]


# ---------------------------------------------------------------------------------------------
# ratios of two generated figures, and runs that reached a target

FIGURE_RATIOS = {
    "kb_ratio.wire_cnn_sim4": ("kb.wire_cnn_sim4.gs-compact.0.001", "kb.wire_cnn_sim4.gs-fp32.0.001"),
    "kb_ratio.wire_cnn_sim16": ("kb.wire_cnn_sim16.gs-compact.0.001", "kb.wire_cnn_sim16.gs-fp32.0.001"),
    "kb_ratio.wire_lm_sim16": ("kb.wire_lm_sim16.gs-compact.0.001", "kb.wire_lm_sim16.gs-fp32.0.001"),
    "kb_ratio.gtopk_compact.16": ("compact_vs_gtopk.kb.16", "rw.kb.16.gtopk-compact"),
    "kb_ratio.lm_sim16_gtopk": ("kb.lm_sim16.gs.0.001", "kb.lm_sim16.gtopk.0.001"),
    "final_ratio.lm.gs.0.001": ("final.lm.gs.0.001", "final.lm.dense.1"),
    "final_ratio.lm.gs.0.01": ("final.lm.gs.0.01", "final.lm.dense.1"),
    "final_ratio.lm.topk.0.001": ("final.lm.topk.0.001", "final.lm.dense.1"),
}
"""``NAME``: (block A, block B); the block is A's first number over B's, as ``0.57×``."""


def first_number(text: str) -> float:
    m = re.search(r"-?\d[\d,]*(?:\.\d+)?", text)
    if not m:
        raise ValueError(f"no number in {text!r}")
    return float(m[0].replace(",", ""))


def figure_ratio(docs: Path, name: str) -> str:
    a, b = FIGURE_RATIOS[name]
    return f"{first_number(generator(a)(docs)) / first_number(generator(b)(docs)):.2f}×"


def points_below_dense(docs: Path, name: str) -> str:
    """``points.FILE.METHOD.K``: METHOD's final accuracy at K minus dense's in that convergence
    record, in percentage points (:func:`run_figure`)."""
    _, stem, rest = name.split(".", 2)
    ours = first_number(run_figure(docs, f"final.{stem}.{rest}"))
    dense = first_number(run_figure(docs, f"final.{stem}.dense.1"))
    return f"{100 * (ours - dense):+.2f} points".replace("-", "−")


STEP_SPARSE = {"": "bench_step.json", ".50e1c5f": "bench_step_50e1c5f.json"}
"""bench_step.py at ratio 0.001 by block suffix: now, and the record it replaced (code 50e1c5f)."""
for _setting in ("one", "default"):
    for _suffix, _file in STEP_SPARSE.items():
        block(f"step_range{_suffix}.{_setting}")(lambda docs, s=_setting, f=_file: step_range(docs, s, f))
    for _suffix, _file in STEP_DENSE.items():
        block(f"step_range.dense{_suffix}.{_setting}")(lambda docs, s=_setting, f=_file: step_range(docs, s, f))


def step_range(docs: Path, setting: str, file: str = "bench_step.json") -> str:
    """The range over docs/bench_step.json's (``file``'s) models of GsSketch's ``opt.step()``
    over dense's (median over the repeats of each repeat's ratio) at thread setting ``setting``."""
    import statistics

    d = load(docs, file)
    ratios = [statistics.median(g / x for g, x in zip(row["times"][setting]["gs"], row["times"][setting]["dense"]))
              for row in d["rows"].values()]
    return f"{min(ratios):.2f}–{max(ratios):.2f}×"


def tta_reached(docs: Path, name: str) -> str:
    """``tta_reached.WORKLOAD.METHOD`` (METHOD as :func:`method_slug` writes it): over every
    setting of docs/time_to_accuracy.jsonl, in how many of METHOD's runs WORKLOAD reached its target."""
    _, workload, method = name.split(".")
    mine = [s for s in tta_summary(docs) if s["workload"] == workload and method_slug(s["method"]) == method]
    if not mine:
        raise KeyError(f"{name}: no runs")
    return f"{sum(s['reached'] for s in mine)} of {sum(s['repeats'] for s in mine)} runs"


# ---------------------------------------------------------------------------------------------
# what the plan gives at the shipped options (no data file: the code is the source)

def pilot_models() -> dict[str, list[tuple[str, int]]]:
    """(name, elements) of the parameters of the time-to-accuracy workloads' models (the pilot's
    CNN, and its LM: ``--hidden 512 --embed 128``)."""
    from gs_bench.workloads import LstmLM, MnistCNN

    return {f"CNN ({sum(p.numel() for p in m.parameters()):,} parameters)" if w == "cnn" else
            f"LM ({sum(p.numel() for p in m.parameters()):,} parameters)":
            [(n, p.numel()) for n, p in m.named_parameters()]
            for w, m in (("cnn", MnistCNN()), ("lm", LstmLM(hidden=512, embed=128)))}


@block("auto.switch")
def auto_switch(docs: Path) -> str:
    """``exchange="auto"``'s switch with the shipped options (``GsSketch()``, Horovod's ring
    allreduces), per model and density level of ``ratio="auto"``: the first P (2–1024) at which
    the plan takes the sparse exchange (``Plan.split``)."""
    from gs_horovod.engine.config import GsConfig
    from gs_horovod.engine.density import LEVELS
    from gs_horovod.engine.plan import Plan

    config, models = GsConfig(), pilot_models()
    lines = ["| level (k / D) | " + " | ".join(models) + " |", "|---|" + "---|" * len(models)]
    for level in LEVELS:
        cells = []
        for named in models.values():
            first = next((P for P in range(2, 1025) if Plan.split(named, config, ranks=P, level=level).exchange
                          == "sparse"), None)
            cells.append("never up to 1024" if first is None else f"from P = {first}")
        lines.append(f"| 1/{round(1 / level)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


PAIR_RANKS = (2, 4, 8, 16, 64, 256)


@block("wire.bits_per_pair")
def bits_per_pair(docs: Path) -> str:
    """Bits a pair of the compact wire (the default) as the plan prices a rank's messages, by
    exchange and P, for the pilot's models at the sparsest and the 1/100 level: the allgather's
    one message of k pairs, the sparse exchange's P messages of the L·k pairs it routes."""
    from gs_horovod.engine.config import GsConfig
    from gs_horovod.engine.plan import Plan

    lines = ["| model | level (k / D) | exchange | " + " | ".join(f"P = {P}" for P in PAIR_RANKS) + " |",
             "|---|---|---|" + "---|" * len(PAIR_RANKS)]
    for model, named in pilot_models().items():
        for level in (0.001, 0.01):
            for exchange in ("allgather", "sparse"):
                config, cells = GsConfig(exchange=exchange), []
                for P in PAIR_RANKS:
                    plan = Plan.split(named, config, ranks=P, level=level)
                    payload = plan.payload_bytes(config)
                    pairs = sum(g.k if exchange == "allgather" else g.fed for g in plan.groups)
                    sent = payload.gather if exchange == "allgather" else payload.alltoall
                    cells.append(f"{8 * sent / pairs:.1f}")
                lines.append(f"| {model} | 1/{round(1 / level)} | {exchange} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# plots: PNGs written from data, each stamped with a hash of what it plots (``--check`` compares
# the stamp, not the pixels, which differ between font and library builds)

PLOT_STAMP = "report-data"
Plot = Callable[[Path], tuple[object, Callable[[], object]]]
PLOTS: dict[str, Plot] = {}


def plot(path: str) -> Callable[[Plot], Plot]:
    """Registers the function that gives (the plotted data, a function drawing the figure) for
    the PNG ``path`` (relative to the root)."""
    def register(fn: Plot) -> Plot:
        PLOTS[path] = fn
        return fn
    return register


@plot("docs/tta_defaults.png")
def screen_plot(docs: Path) -> tuple[object, Callable[[], object]]:
    """Seconds to the target per method in each (workload, P, link) of the first screen: grouped bars, a
    cross where a method did not reach it."""
    cells = screen_cells(docs)
    data = {"version": 3, "methods": SCREEN_METHODS, "provenance": screen_provenance(docs),
            "cells": [[list(key), {m: list(v) for m, v in mine.items()}] for key, mine in cells.items()]}

    def draw() -> object:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        keys = list(cells)
        fig, ax = plt.subplots(figsize=(9, 3.6), dpi=100)
        width = 0.8 / len(SCREEN_METHODS)
        top = max((t for mine in cells.values() for t, _ in mine.values() if t is not None), default=1.0)
        for j, (m, label) in enumerate(SCREEN_METHODS.items()):
            xs = [i + (j - (len(SCREEN_METHODS) - 1) / 2) * width for i in range(len(keys))]
            ys = [cells[k].get(m, (None, None))[0] for k in keys]
            bars = ax.bar([x for x, y in zip(xs, ys) if y is not None], [y for y in ys if y is not None], width,
                          label=label, color=f"C{j}")
            missed = [x for x, y, k in zip(xs, ys, keys) if y is None and m in cells[k]]
            if missed:
                ax.plot(missed, [0.03 * top] * len(missed), "x", color=bars.patches[0].get_facecolor()
                        if bars.patches else f"C{j}", markersize=8)
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels([f"{w} P={p}\n{LINKS.get(r, r)}" for w, p, r in keys], fontsize=8)
        ax.set_ylim(0, 1.25 * top)
        ax.set_ylabel("seconds to target")
        ax.set_title("Time to the held-out target at the defaults (x: not reached; the README's table says "
                     "which runs)", fontsize=9)
        ax.legend(fontsize=8, ncol=len(SCREEN_METHODS), loc="upper left")
        fig.tight_layout()
        return fig

    return data, draw


def stamp_of(data: object) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def png_stamp(path: Path) -> str | None:
    """The stamp a PNG written by :func:`write_plot` carries, None if it has none."""
    from PIL import Image

    with Image.open(path) as image:
        return image.text.get(PLOT_STAMP) if hasattr(image, "text") else None


def write_plot(path: Path, data: object, draw: Callable[[], object]) -> None:
    import matplotlib.pyplot as plt

    fig = draw()
    fig.savefig(path, format="png", metadata={"Software": None, PLOT_STAMP: stamp_of(data)})
    plt.close(fig)


def plots(root: Path, check: bool, errors: list[str]) -> int:
    """Each registered PNG: rewritten (``check``: named) when its stamp is not its data's; the
    number stale."""
    stale = 0
    for rel, make in PLOTS.items():
        try:
            data, draw = make(root / "docs")
        except (OSError, KeyError, ValueError) as e:
            errors.append(f"{rel}: {type(e).__name__}: {e}")
            continue
        path = root / rel
        if path.exists() and png_stamp(path) == stamp_of(data):
            continue
        stale += 1
        print(f"{rel}: the plot differs from what its data gives" if path.exists() else f"{rel}: missing")
        if not check:
            write_plot(path, data, draw)
    return stale


TTA_RANGES = {"tta_compact": ("time_to_accuracy_compact.jsonl", "mean"),
              "tta_compact_before": ("time_to_accuracy_compact_before.jsonl", "mean"),
              "tta_median": ("time_to_accuracy_compact.jsonl", "median")}
"""The ``FAMILY.P`` figures of :func:`tta_range`: the study's file and the average compared."""


def tta_range(docs: Path, name: str) -> str:
    """``FAMILY.P`` (:data:`TTA_RANGES`): the range over the (workload, link) settings at P ranks
    of :func:`tta_ratio` in that study (``tta_compact_before``: the same study before the union's
    sums were sped up, on a less loaded machine; ``tta_median``: by the medians, not the means)."""
    import statistics

    family, ranks = name.split(".")
    file, average = TTA_RANGES[family]
    repeats = tta_repeats(docs, file)
    ratios = [r for r in (tta_ratio(repeats, (w, P, rate), getattr(statistics, average))
                          for w, P, rate in dict.fromkeys(k[:3] for k in repeats) if P == int(ranks))
              if r is not None]
    return f"{min(ratios):.2f}–{max(ratios):.2f}×"


def method_slug(method: str) -> str:
    """A method label as a block name allows it: ``gs:exchange=sketch`` → ``gs-exchange-sketch``."""
    return method.replace(":", "-").replace("=", "-").replace(",", "-")


def seconds_to_target(s: dict) -> str:
    if s["mean_seconds"] is None:
        return f"not reached ({s['reached']}/{s['repeats']})"
    spread = "" if s["std_seconds"] is None else f" ± {s['std_seconds']:.1f}"
    return f"{s['mean_seconds']:.1f}{spread} s" + ("" if s["reached"] == s["repeats"] else
                                                  f" ({s['reached']}/{s['repeats']} reached it)")


@block("time_to_accuracy")
def time_to_accuracy_table(docs: Path) -> str:
    """``bench_time_to_accuracy.py report docs/time_to_accuracy.jsonl``'s table."""
    return tta.table(tta_summary(docs))


def fastest(mine: Iterable[dict]) -> dict | None:
    """The least mean seconds to the target among the summaries that reached it in every repeat."""
    every = [s for s in mine if s["reached"] == s["repeats"]]
    return min(every, key=lambda s: s["mean_seconds"]) if every else None


def setting(docs: Path, name: str) -> tuple[list[dict], list[str]]:
    """The summary rows of the (workload, P, link) that a ``FAMILY.WORKLOAD.P.RATE[.METHOD]`` names."""
    parts = name.split(".")
    workload, ranks, rate = parts[1], int(parts[2]), parts[3]
    mine = [s for s in tta_summary(docs) if (s["workload"], s["ranks"], s["rate"]) == (workload, ranks, rate)]
    if not mine:
        raise KeyError(f"no time-to-accuracy runs for {workload} at P = {ranks}, {rate}")
    return mine, parts


def time_to_accuracy_figure(docs: Path, name: str) -> str:
    """``tta.WORKLOAD.P.RATE.METHOD`` (METHOD as :func:`method_slug` writes it): the mean ± std
    seconds to the declared target, or how many repeats reached it."""
    mine, parts = setting(docs, name)
    s = next((s for s in mine if method_slug(s["method"]) == parts[4]), None)
    if s is None:
        raise KeyError(f"{name}: no method {parts[4]!r} among {[method_slug(m['method']) for m in mine]}")
    return seconds_to_target(s)


@block("time_to_accuracy.verdicts")
def time_to_accuracy_verdicts(docs: Path) -> str:
    """Per (workload, P, link): the fastest method to the target among those that reached it in
    every repeat, the defaults' and the paper's sketch's seconds, and the defaults' over the
    fastest's."""
    summary = tta_summary(docs)
    lines = ["Seconds to the target: mean ± standard deviation over the repeats that reached it; gs ÷ fastest: "
             "the ratio of the means.", "",
             "| workload | P | link | fastest to target | the defaults (gs) | gs ÷ fastest | the paper's sketch |",
             "|---|---|---|---|---|---|---|"]
    for (workload, ranks, rate), mine in by_setting(summary).items():
        best = fastest(mine.values())
        gs, sketch = mine.get("gs"), mine.get("gs:exchange=sketch")
        ratio = (f"{gs['mean_seconds'] / best['mean_seconds']:.2f}" if best and gs and gs["reached"] == gs["repeats"]
                 else "—")
        lines.append(f"| {workload} | {ranks} | {rate} | "
                     + (f"{best['method']}: {seconds_to_target(best)}" if best else "none in every repeat")
                     + f" | {seconds_to_target(gs) if gs else '—'} | {ratio} | "
                     + f"{seconds_to_target(sketch) if sketch else '—'} |")
    return "\n".join(lines)


@block("time_to_accuracy.defaults")
def time_to_accuracy_defaults(docs: Path) -> str:
    """Over the (workload, P, link) settings: in how many the defaults were the fastest to the
    target (of the methods that reached it in every repeat), within 1.2× of the fastest, and
    missed it in some repeat."""
    settings = by_setting(tta_summary(docs))
    first, near, missed, _ = defaults_counts(settings, 1.2)
    return (f"the defaults were the fastest in {first} of {len(settings)} settings, within 1.2× of the fastest "
            f"in {near}, and missed the target in some repeat in {missed}")


def defaults_counts(settings: dict[tuple, dict[str, dict]], within: float
                    ) -> tuple[int, int, int, dict[str, list[float]]]:
    """Over settings of :func:`by_setting` (each with ``gs``): in how many the defaults were the
    fastest (:func:`fastest`), within ``within`` × the fastest's mean seconds (the fastest
    included), and missed the target in some repeat; and per link, their mean seconds over
    FP16's where both reached it in every repeat."""
    first = near = missed = 0
    over_fp16: dict[str, list[float]] = {}
    for key, mine in settings.items():
        gs, fp16 = mine["gs"], mine.get("fp16")
        if gs["reached"] < gs["repeats"]:
            missed += 1
            continue
        best = fastest(mine.values())
        first += best is gs
        near += gs["mean_seconds"] <= within * best["mean_seconds"]
        if fp16 and fp16["reached"] == fp16["repeats"]:
            over_fp16.setdefault(key[2], []).append(gs["mean_seconds"] / fp16["mean_seconds"])
    return first, near, missed, over_fp16


def defaults_over(docs: Path, name: str) -> str:
    """``tta_over.METHOD.RATE`` / ``tta_later.METHOD.RATE`` (RATE a link or ``all``): over the
    settings where the defaults and METHOD (as :func:`method_slug` writes it) both reached the
    target in every repeat, the range of the defaults' mean seconds ÷ METHOD's (``tta_over``:
    "1.06–1.98×") or how much later the defaults got there (``tta_later``: "1.6–9.9 %"), and in
    how many settings."""
    family, method, rate = name.split(".")
    summary = tta_summary(docs)
    ratios = []
    for key in dict.fromkeys((s["workload"], s["ranks"], s["rate"]) for s in summary):
        if rate != "all" and key[2] != rate:
            continue
        mine = {method_slug(s["method"]): s for s in summary if (s["workload"], s["ranks"], s["rate"]) == key}
        gs, other = mine.get("gs"), mine.get(method)
        if gs and other and gs["reached"] == gs["repeats"] and other["reached"] == other["repeats"]:
            ratios.append(gs["mean_seconds"] / other["mean_seconds"])
    if not ratios:
        raise KeyError(f"{name}: no setting where gs and {method} both reached the target in every repeat")
    if family == "tta_over":
        return f"{min(ratios):.2f}–{max(ratios):.2f}× (in {len(ratios)} settings)"
    return f"{100 * (min(ratios) - 1):.1f}–{100 * (max(ratios) - 1):.1f} % (in {len(ratios)} settings)"


def throughput_ratio(docs: Path, name: str) -> str:
    """``tput.VARIANT.P.LINK``: gs-SGD's median steps/s ÷ VARIANT's (a variant word with ``:``,
    ``=`` and ``,`` written ``-``) at P ranks on LINK, with the per-repeat min–max, from
    ``docs/throughput_fair.jsonl`` (as the throughput table's ratio columns)."""
    import cost_model

    _, variant, ranks, label = name.split(".")
    _, cells, _ = cost_model.load(docs / "throughput_fair.jsonl")
    words = {method_slug(v): v for v, _, _ in cells}
    if variant not in words:
        raise KeyError(f"{name}: no variant {variant!r} among {sorted(words)}")
    return cost_model._ratio(cells["gs", int(ranks), label], cells[words[variant], int(ranks), label])


def fastest_to_target(docs: Path, name: str) -> str:
    """``tta_fastest.WORKLOAD.P.RATE``: the method with the least mean seconds to the target among
    those that reached it in every repeat, and its seconds."""
    best = fastest(setting(docs, name)[0])
    return "none reached it in every repeat" if best is None else f"{best['method']} ({seconds_to_target(best)})"


def render(text: str, docs: Path, errors: list[str], path: str) -> tuple[str, list[tuple[str, str, str]]]:
    """``text`` with every block rewritten; the (name, old, new) of those that changed."""
    changed = []

    def one(m: re.Match) -> str:
        name, body = m["name"], m["body"]
        make = generator(name)
        if make is None:
            errors.append(f"{path}: block '{name}' has no generator in scripts/bench/report.py")
            return m[0]
        try:
            new = make(docs).strip("\n").rstrip()
        except (OSError, KeyError, ValueError, ImportError) as e:
            errors.append(f"{path}: block '{name}': {type(e).__name__}: {e}")
            return m[0]
        new = f"\n{new}\n" if body.startswith("\n") else new
        if new != body:
            changed.append((name, body, new))
        return f"<!-- report:{name} -->{new}<!-- /report:{name} -->"

    return MARKER.sub(one, text), changed


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``scripts/check_docs.py`` parses every documented command with it)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="rewrite nothing; exit 1 if any block differs")
    p.add_argument("--root", type=Path, default=ROOT, help="the repository copy to read docs/ and README.md from")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    docs = args.root / "docs"
    errors: list[str] = []
    stale = 0
    for rel in FILES:
        path = args.root / rel
        if not path.exists():
            continue
        text = path.read_text()
        new, changed = render(text, docs, errors, rel)
        for name, old, fresh in changed:
            stale += 1
            print(f"{rel}: block '{name}' differs from what its data gives")
            diff = list(difflib.unified_diff(old.strip().splitlines(), fresh.strip().splitlines(), "in the file",
                                             "from the data", lineterm="", n=0))
            print("\n".join(diff[:24]) + ("\n  ..." if len(diff) > 24 else ""))
        if changed and not args.check:
            path.write_text(new)
    stale += plots(args.root, args.check, errors)
    for e in errors:
        print(e)
    if args.check:
        print(f"report: {stale} stale block(s) or plot(s), {len(errors)} error(s)")
    else:
        print(f"report: {stale} block(s) or plot(s) rewritten, {len(errors)} error(s)")
    return 1 if errors or (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
