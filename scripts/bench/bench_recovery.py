"""How much of the exact top-k's mass each method delivers, and at what bytes: the library's
gs-SGD engine and baselines on P ranks simulated in one process, over real training steps.

    python scripts/bench/bench_recovery.py --quick                        # P = 16, 1.28M MLP, ratio 0.001, 20 steps
    python scripts/bench/bench_recovery.py --run a --ranks 16 --out R.jsonl    # one part of the full study
    python scripts/bench/bench_recovery.py --run a --ranks 64 --out R.jsonl --append    # another, into the same file
    python scripts/bench/bench_recovery.py --report R.jsonl --plot docs/recovery.png
    python scripts/bench/bench_recovery.py --report R.jsonl --markdown T.md    # + the per-exchange table
    python scripts/bench/bench_recovery.py --run b,d --ranks 2,4,8,16 --ratios 0.001 --steps 20 \
        --grid rule --baselines none --seeds 0 1 2 --out docs/recovery_rule.jsonl  # exchange="auto"'s rule
    python scripts/bench/bench_recovery.py --rule docs/recovery_rule.jsonl           # its table

The study and the choice of the shipped sizes: docs/design.md ("Recovery").

Methods. gs-SGD is the engine itself: rank r holds ``EngineState(GsSgd(config, TorchOps(), comm_r),
CommStats())`` on ``comm_r = SimulatedRanks(P).comms[r]``. The baselines are
``gs_bench.methods.METHODS``' exchanges, one per rank on the same comms: top-k allgather
and gTop-k per tensor ("layer") and over all weights ("global"), Sketched-SGD with its
published sizes, PowerSGD of rank 4. Two methods need no collectives and are a few lines here:
dense (the exact mean) and the reference, the exact top-k of S applied exactly, with per-rank
error feedback. Tensors under ``GsConfig().min_size`` elements (the biases) are averaged
exactly by every method, as the library does, and left out of the mass.

Per step, with a_r = e_r + g_r (D,) (rank r's residual before the step and its gradient, the
compressed tensors in name order) and S = Σ_r a_r (D,):

    delivered mass = Σ_i Δ_i · S_i / ‖top-k(S)‖²,   Δ = P · the averaged update,   k = count_for(ratio, D)

and a record's ``mass`` is its mean over the steps: 1 for the reference; dense's is
‖S‖²/‖top-k(S)‖² ≥ 1 (left out of the tables), and PowerSGD's dense low-rank update may exceed
1 too. Bytes are per rank per step as the library counts them (``gs_horovod.transports.collective_cost.Traffic`` of
rank 0's SimulatedComm): ``payload`` handed to collectives and ``wire`` bytes through the
busiest rank, the small tensors' exact allreduce included (gs sends them in its exact round);
dense is one ring allreduce of every tensor. SimulatedComm averages a float16 sketch in f32 in
rank order and rounds the mean to f16 once. Its alltoall counts the bytes the busiest rank
really sent and received; ``wire_over_even`` is the record's wire bytes over what even loads
would have put through a rank (``worst_over_even``: the worst single collective's).

Tasks: (a) the MLP 64-256-128-10 (D = 50,432 compressed weights), (b) 64-1536-768-10
(D = 1,287,168), both on scikit-learn's digits, (d) the MNIST-5k CNN of the demo
(``gs_bench.workloads.MnistCNN``, D = 823,808 compressed weights) on the 4,000 training images
of MNIST-5k; each rank's gradient from its own micro-batch of ``--batch`` images; every method
trains its own copy from the same start on the same micro-batches (SGD lr 0.05, momentum 0.9,
on the averaged update); (c) planted heavy-tailed vectors, no training (dense, the reference
and PowerSGD skipped). ``--seeds`` repeats a run with other initial weights and micro-batches
(seed 0 is the start every earlier record used); a record carries its ``seed``.

gs settings (``--grid``): ``exchanges`` is the defaults (``GsConfig()`` with the ratio:
exchange "auto", which resolves to the allgather at P ≤ 2 and the sparse exchange above; the
record's ``exchange_used`` says which), then each exchange forced at the shipped sizes:
"sparse", "allgather" applying the top k, "allgather" at its own defaults (no exact round, the
union applied: top-k allgather in the engine) and "sketch" (the paper's Count-Sketch). ``rule``
is the two exchanges ``exchange="auto"`` chooses between: "sparse" and "allgather" at its own
defaults (the union applied); every gs record says in ``auto_picks`` which of them "auto" takes
for that model at that P. ``--rule`` tabulates them: per (task, P), the union's mass and wire
bytes over the sparse exchange's, over the seeds. The sketch-size grids force "sketch".

``--quick`` is (b) at P = 16 (``--ranks`` changes it), ratio 0.001 (k = 1,288; (a) would
have k = 51), 20 steps, every baseline and the 5 gs settings of ``gs_grid("exchanges")``:
13 methods, about 2 minutes of wall time on 2 shared cores (about 80 s of CPU). It ends with
``defaults_vs_gtopk P=16 delivered_mass_ratio <x> wire_bytes_ratio <y>``: gs at its defaults
against gTop-k over all weights ("gtopk-global"), mass and wire bytes per rank per step.

``--out`` appends a record per method as it finishes; an existing file is refused (exit 1,
nothing run) unless ``--append`` is given, and every record written carries ``run_id`` (one per
invocation) and ``code`` (the commit), :mod:`gs_bench.runs`. Readers (``--report``, ``--rule``,
:func:`read_records`) keep one record per setting and seed: the latest run's, saying on stderr
which they used where runs repeat one (a record without ``run_id`` is an older run of its own).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import replace
from itertools import product
from typing import Any, Callable, Iterator, Optional, Union

import numpy as np
import torch
import torch.nn.functional as F

from gs_bench.methods import METHODS
from gs_bench.runs import add_out_flags, append_line, check_out, latest_runs, read_jsonl, stamp
from gs_horovod.engine import CommStats, EngineState, GsConfig, GsSgd, Plan, count_for
from gs_horovod.kernels.torch_ops import TorchOps
from gs_horovod.transports.collective_cost import wire_bytes
from gs_horovod.transports.simulated import SimulatedComm, SimulatedRanks

SETTINGS = ("rows", "width", "candidates", "prefilter", "sketch_dtype", "exact", "scope", "apply", "exchange")
MIN_SIZE = GsConfig().min_size
SEED = 0
LR, MOMENTUM = 0.05, 0.9
OLD_DEFAULTS = GsConfig(scope="layer", rows=5, width=4.0, candidates=1, prefilter=0, sketch_dtype="float32",
                        exchange="sketch")

Tensor = torch.Tensor
Grads = dict[str, Tensor]  # name → (P, d) f32: every rank's flat gradient
Shapes = dict[str, tuple[int, ...]]  # name → the tensor's shape


def shipped_settings() -> GsConfig:
    """The shipped sizes: ``GsConfig``'s defaults, the one place they live."""
    return GsConfig()


def label(cfg: GsConfig) -> str:
    """``r<rows> w<width> m<candidates>[ exact]|noexact L<prefilter> f16|f32[ topk|all][ sketch|allgather|sparse]
    [ compact|compact8]``: ``exact`` / ``noexact`` when the exact round is forced on / off (else
    the exchange's own), the apply rule when given, the exchange when forced (not "auto"), the
    pair wire format when it is "compact" or "compact8"."""
    m = {None: f"m{cfg.candidates}", True: f"m{cfg.candidates} exact", False: "noexact"}[cfg.exact]
    text = f"r{cfg.rows} w{cfg.width:g} {m} L{cfg.prefilter} {'f16' if cfg.sketch_dtype == 'float16' else 'f32'}"
    text += (f" {cfg.apply}" if cfg.apply else "") + ("" if cfg.exchange == "auto" else f" {cfg.exchange}")
    return text + (f" {cfg.wire}" if cfg.wire != "fp32" and cfg.exchange != "sketch" else "")


def is_shipped(r: dict) -> bool:
    """Whether record r is gs global at the shipped sizes (in the wire format it ran with:
    records from before ``wire`` existed ran with "fp32" pairs; "compact8" is a variant,
    :func:`is_defaults_compact8`)."""
    shipped = replace(shipped_settings(), wire=r.get("wire_format", "fp32"))
    return r.get("scope") == "global" and r.get("label") == label(shipped) and shipped.wire != "compact8"


def is_defaults_compact8(r: dict) -> bool:
    """Whether record r is gs at its defaults but for ``wire="compact8"``."""
    return r.get("scope") == "global" and r.get("label") == label(replace(shipped_settings(), wire="compact8"))


def is_old(r: dict) -> bool:
    """Whether record r is gs at the old defaults (layer scope, r5 w4 m1 L0 f32)."""
    return r.get("scope") == "layer" and r.get("label") == label(OLD_DEFAULTS)


# ---------------------------------------------------------------- methods

def stacked(grads: Grads, names: list[str], residuals: list[Optional[Tensor]]) -> Tensor:
    """a (P, D): row r = e_r + g_r over the tensors ``names`` (residual None: zero)."""
    a = torch.cat([grads[n] for n in names], 1)
    for row, e in zip(a, residuals):
        if e is not None:
            row += e
    return a


def compressed(shapes: Shapes) -> list[str]:
    """The tensors the library compresses (at least ``min_size`` elements), in name order."""
    return sorted(n for n, s in shapes.items() if math.prod(s) >= MIN_SIZE)


class Dense:
    """The exact mean of every gradient; one ring allreduce of all of them.

    Every method has: ``info`` (its record's fields), ``residuals`` (P entries, (D,) f32 in
    name order or None) as they are before a step, ``step(grads)`` → name → averaged update
    (d,) f32, and ``bytes()`` → (payload, wire) per rank per step (None: not counted)."""

    def __init__(self, ranks: int) -> None:
        self.info, self.residuals, self.ranks, self.nbytes = {"method": "dense"}, [None] * ranks, ranks, 0.0

    def step(self, grads: Grads) -> dict[str, Tensor]:
        self.nbytes = 4.0 * sum(g.shape[1] for g in grads.values())
        return {n: g.mean(0) for n, g in grads.items()}

    def bytes(self) -> tuple[float, float]:
        return self.nbytes, wire_bytes("allreduce", self.nbytes, self.ranks)


class ExactTopK:
    """The reference: Δ = S on the k largest |S| (mass 1), e_r = a_r elsewhere; no bytes."""

    def __init__(self, ranks: int, shapes: Shapes, ratio: float) -> None:
        self.info, self.residuals, self.names = {"method": "exact top-k"}, [None] * ranks, compressed(shapes)
        self.sizes = [math.prod(shapes[n]) for n in self.names]
        self.k = count_for(ratio, sum(self.sizes))

    def step(self, grads: Grads) -> dict[str, Tensor]:
        a = stacked(grads, self.names, self.residuals)
        S = a.sum(0)
        sel = torch.topk(S.abs(), self.k, sorted=False).indices
        delta = torch.zeros_like(S)
        delta[sel] = S[sel] / a.shape[0]
        a[:, sel] = 0
        self.residuals = list(a)
        small = {n: g.mean(0) for n, g in grads.items() if n not in self.names}
        return {**small, **dict(zip(self.names, torch.split(delta, self.sizes)))}

    def bytes(self) -> None:
        return None


class Simulated:
    """A library method on ``SimulatedRanks(ranks)``: ``make(comm)`` builds each rank's
    ``EngineState`` or ``Reducer`` once, on the comm its rank keeps across steps."""

    def __init__(self, info: dict[str, Any], ranks: int, shapes: Shapes,
                 make: Callable[[SimulatedComm], Any]) -> None:
        self.info, self.shapes, self.names = info, shapes, tuple(compressed(shapes))
        self.group = SimulatedRanks(ranks)
        self.each = [make(comm) for comm in self.group.comms]

    @property
    def residuals(self) -> list[Optional[Tensor]]:
        """Each rank's residual: a Reducer's is in the order it was handed the tensors (name
        order), a EngineState's in its plan's (name order too: checked)."""
        for x in self.each:
            if isinstance(x, EngineState) and x.plan is not None and x.plan.names != self.names:
                raise ValueError(f"EngineState laid out {x.plan.names}, expected {self.names}")
        return [x.residual for x in self.each]

    def step(self, grads: Grads) -> dict[str, Tensor]:
        names = sorted(grads)

        def one(rank: int, comm: SimulatedComm) -> dict[str, Tensor]:
            x = self.each[rank]
            if isinstance(x, EngineState):
                out = x.step({n: grads[n][rank] for n in names})
                comm.traffic.end_step()
                return out
            mine = [(n, grads[n][rank].view(self.shapes[n])) for n in names]
            return {n: u.reshape(-1) for n, u in zip(names, x.reduce(mine, comm))}

        return self.group.run(one)[0]

    def bytes(self) -> tuple[float, float]:
        return self.group.comms[0].traffic.per_step()


Method = Union[Dense, ExactTopK, Simulated]

# key → (method name, METHODS key, options; {}: the method's own). "gtopk-global-compact" is
# not the authors' gTop-k: its pairs in the engine's compact format (what the encoding alone buys)
BASELINES: dict[str, tuple[str, str, dict]] = {
    "topk": ("top-k allgather", "topk", {"scope": "layer"}),
    "topk-global": ("top-k allgather (global)", "topk", {"scope": "global"}),
    "gtopk": ("gTop-k", "gtopk", {"scope": "layer"}), "gtopk-global": ("gTop-k (global)", "gtopk", {"scope": "global"}),
    "gtopk-global-compact": ("gTop-k (global, compact pairs)", "gtopk", {"scope": "global", "wire": "compact"}),
    "sketched": ("Sketched-SGD", "sketched", {}), "powersgd": ("PowerSGD", "powersgd", {})}


def baseline(key: str, ranks: int, shapes: Shapes, ratio: float) -> Method:
    """"dense", "exact" or a key of BASELINES, for P = ``ranks`` and tensors of ``shapes``."""
    if key == "dense":
        return Dense(ranks)
    if key == "exact":
        return ExactTopK(ranks, shapes, ratio)
    name, method, options = BASELINES[key]
    ratio_arg = ratio if METHODS[method].takes_ratio else None
    info = {"method": name, **{"wire_format" if option == "wire" else option: value
                               for option, value in options.items()}}
    return Simulated(info, ranks, shapes, lambda comm: METHODS[method].simulated(comm, ratio_arg, options))


def gs_method(cfg: GsConfig, ranks: int, shapes: Shapes, ratio: float) -> Method:
    """gs-SGD with ``cfg`` at ``ratio``: the engine's EngineState on every rank."""
    cfg = replace(cfg, ratio=ratio)
    info = {"method": f"gs {cfg.scope}", **{f: getattr(cfg, f) for f in SETTINGS}, "wire_format": cfg.wire,
            "label": label(cfg)}
    return Simulated(info, ranks, shapes, lambda comm: EngineState(GsSgd(cfg, TorchOps(), comm), CommStats()))


# ---------------------------------------------------------------- tasks

class DigitsTask:
    """The digits MLP 64-h-h/2-10 (``gs_bench.workloads.digits_mlp``) on the 1,437
    training images of ``digits_shard``; rank r's micro-batch at a step is the r-th run of
    ``batch`` images of a permutation seeded by the step and ``seed`` (the same for every
    method); the initial weights are seeded by ``seed``.

    Every task has ``shapes`` (name → shape), ``new_model()`` (a fresh copy, the same weights
    every time), ``grads(step)`` → (name → (P, d) f32, mean loss) and ``apply(updates)`` (an SGD
    step on the averaged updates, name → (d,) f32)."""

    trains = True

    def __init__(self, name: str, hidden: int, ranks: int, batch: int, seed: int = 0) -> None:
        self.name, self.hidden, self.ranks, self.batch, self.seed = name, hidden, ranks, batch, seed
        self.x, self.y = self.data()
        self.new_model()
        self.shapes = {n: tuple(p.shape) for n, p in self.params.items()}

    def data(self) -> tuple[Tensor, Tensor]:
        from gs_bench.workloads import digits_shard

        x, y, _, _ = digits_shard(0, 1)
        return torch.from_numpy(x), torch.from_numpy(y)

    def make_model(self) -> torch.nn.Module:
        from gs_bench.workloads import digits_mlp

        return digits_mlp(self.hidden)

    def new_model(self) -> None:
        torch.manual_seed(SEED + self.seed)
        self.model = self.make_model()
        self.params = dict(self.model.named_parameters())
        self.opt = torch.optim.SGD(self.model.parameters(), lr=LR, momentum=MOMENTUM)

    def grads(self, step: int) -> tuple[Grads, float]:
        from torch.func import functional_call, grad_and_value, vmap

        need = self.ranks * self.batch
        g = torch.Generator().manual_seed(1000 + step + 1_000_000 * self.seed)
        order = torch.cat([torch.randperm(len(self.x), generator=g) for _ in range(math.ceil(need / len(self.x)))])
        xb = self.x[order[:need]].view(self.ranks, self.batch, *self.x.shape[1:])
        yb = self.y[order[:need]].view(self.ranks, self.batch)

        def loss(params: dict[str, Tensor], xs: Tensor, ys: Tensor) -> Tensor:
            return F.cross_entropy(functional_call(self.model, params, (xs,)), ys)

        detached = {n: p.detach() for n, p in self.params.items()}
        grads, losses = vmap(grad_and_value(loss), in_dims=(None, 0, 0))(detached, xb, yb)
        return {n: v.reshape(self.ranks, -1) for n, v in grads.items()}, losses.mean().item()

    def apply(self, updates: dict[str, Tensor]) -> None:
        for n, p in self.params.items():
            p.grad = updates[n].view_as(p)
        self.opt.step()


class CnnTask(DigitsTask):
    """The MNIST-5k CNN of the demo (``gs_bench.workloads.MnistCNN``, 824,458 parameters) on the
    4,000 training images of ``mnist5k``, micro-batches and seeds as :class:`DigitsTask`'s."""

    def __init__(self, ranks: int, batch: int, seed: int = 0) -> None:
        super().__init__("MNIST-5k CNN", 256, ranks, batch, seed)

    def data(self) -> tuple[Tensor, Tensor]:
        from gs_bench.workloads import mnist5k

        x, y, _, _ = mnist5k(0, 1)
        return torch.from_numpy(x), torch.from_numpy(y)

    def make_model(self) -> torch.nn.Module:
        from gs_bench.workloads import MnistCNN

        return MnistCNN(self.hidden)


class PlantedTask:
    """Fresh heavy-tailed vectors each step, no training: k = count_for(ratio, D) coordinates
    (random each step) carry v_i = ±√P·(3 + 3·Pareto(1.5)) in the P-sum, split evenly over ranks,
    plus N(0, 1) per rank and coordinate; D is cut into 4 equal 1-D 'tensors' t0..t3."""

    trains = False

    def __init__(self, ranks: int, d: int, ratio: float) -> None:
        self.name, self.ranks, self.ratio = "planted", ranks, ratio
        self.shapes = {f"t{i}": (d // 4,) for i in range(4)}

    def new_model(self) -> None:
        pass

    def grads(self, step: int) -> tuple[Grads, float]:
        g = torch.Generator().manual_seed(2000 + step)
        D, P = 4 * self.shapes["t0"][0], self.ranks
        k = count_for(self.ratio, D)
        G = torch.randn(P, D, generator=g)
        where = torch.randperm(D, generator=g)[:k]
        sign = torch.randint(0, 2, (k,), generator=g) * 2.0 - 1.0
        pareto = torch.rand(k, generator=g).pow(-1 / 1.5) - 1
        G[:, where] += (sign * math.sqrt(P) * (3 + 3 * pareto) / P)[None]
        return dict(zip(self.shapes, G.chunk(4, 1))), float("nan")

    def apply(self, updates: dict[str, Tensor]) -> None:
        pass


Task = Union[DigitsTask, CnnTask, PlantedTask]


# ---------------------------------------------------------------- the simulation

def delivered(delta: Tensor, S: Tensor, k: int) -> float:
    """Σ Δ·S / ‖top-k(S)‖² for Δ, S (D,), in float64."""
    best = torch.topk(S.abs(), k, sorted=False).values.double()
    return float(delta.double() @ S.double() / (best @ best))


def simulate(task: Task, method: Method, steps: int, ratio: float) -> dict:
    """Runs ``method`` (built for this task) ``steps`` steps from the task's start: its record."""
    task.new_model()
    names, P = compressed(task.shapes), task.ranks
    k = count_for(ratio, sum(math.prod(task.shapes[n]) for n in names))
    masses, losses = [], []
    t0 = time.perf_counter()
    for step in range(steps):
        grads, loss = task.grads(step)
        S = stacked(grads, names, method.residuals).sum(0)
        updates = method.step(grads)
        masses.append(delivered(P * torch.cat([updates[n] for n in names]), S, k))
        losses.append(loss)
        task.apply(updates)
    payload, wire = method.bytes() or (None, None)
    used = [x.plan.exchange for x in getattr(method, "each", []) if isinstance(x, EngineState)][:1]
    picks = {"auto_picks": auto_picks(task.shapes, ratio, P)} if "rows" in method.info else {}
    traffic = method.group.comms[0].traffic if isinstance(method, Simulated) else None
    uneven = {"wire_over_even": traffic.wire / traffic.even_wire,
              "worst_over_even": traffic.worst_over_even} if traffic is not None and traffic.even_wire else {}
    seed = {"seed": task.seed} if getattr(task, "seed", 0) else {}
    return {"task": task.name, "P": P, "ratio": ratio, "steps": steps, **seed, **method.info,
            **({"exchange_used": used[0]} if used else {}), **picks, **uneven,
            "mass": float(np.mean(masses)), "mass_steps": masses, "loss": losses,
            "wire": wire, "payload": payload, "seconds": time.perf_counter() - t0}


def auto_picks(shapes: Shapes, ratio: float, ranks: int) -> str:
    """The exchange ``exchange="auto"`` (GsConfig's defaults at ``ratio``) takes for tensors of
    ``shapes`` on ``ranks`` ranks of Horovod's ring allreduces: :meth:`Plan.split`'s rule."""
    named = [(n, math.prod(s)) for n, s in shapes.items()]
    return Plan.split(named, GsConfig(ratio=ratio), ranks=ranks).exchange


def gs(rows: int, width: float, candidates: int, prefilter: int, dtype: str = "float16",
       scope: str = "global") -> GsConfig:
    """A grid point of the sketch's sizes; ``candidates`` 0: no exact round (``exact=False``)."""
    return GsConfig(scope=scope, rows=rows, width=width, candidates=max(1, candidates), prefilter=prefilter,
                    sketch_dtype=dtype, exact=None if candidates > 0 else False, exchange="sketch")


def gs_grid(level: str) -> Iterator[GsConfig]:
    """gs configurations. The sketch-size grids force ``exchange="sketch"``: 'full' is rows
    {1,3,5} × width {1,2,4,8} × candidates {0 (no exact round),1,2,4} × prefilter {0,1,2} ×
    dtype {f32,f16} in both scopes (layer: a subset); 'pruned' drops f32 except at the shipped
    point, and prefilter 0 beyond 2 configs; 'small' keeps prefilter 1 and f16 but for 3
    configs; 'quick' is a neighbourhood of the shipped sizes; each ends with the old defaults
    (layer scope, rows 5, width 4, 1 candidate round, whole residuals, f32). 'shipped' is
    GsConfig's defaults; 'exchanges' the defaults ("auto"), the defaults with ``wire="compact8"``,
    then each exchange forced at the shipped sizes in both of "fp32" and "compact": "sparse",
    "allgather" applying the top k, "allgather" at its own defaults (top-k allgather), and
    "sketch"; 'compact8' the defaults with ``wire="compact8"`` alone (beside an 'exchanges' run);
    'sizing' is the study of issue 20: the sketch forced at
    widths 2–16 and 1, 2 or 4 candidates, the allgather forced at pre-filters 1 and 2, each
    applying the top k or all fetched values; 'rule' the two exchanges "auto" chooses between:
    "sparse" and "allgather" at its own defaults (the union applied); 'prefilter' those two with
    each rank nominating its top (L·k), L = 1, 2, 3 (sparse) and 1, 2 (allgather)."""
    shipped = shipped_settings()
    if level == "none":
        return
    if level == "shipped":
        yield shipped
    elif level == "sizing":
        yield shipped
        for width, m, apply in product((2.0, 4.0, 8.0, 16.0), (1, 2, 4), ("topk", "all")):
            if m > 1 or apply == "topk":
                yield replace(shipped, exchange="sketch", width=width, candidates=m, apply=apply)
        for pre, m, apply in product((1, 2), (1, 2), ("topk", "all")):
            if m <= pre and (m > 1 or apply == "topk"):
                yield replace(shipped, exchange="allgather", prefilter=pre, candidates=m, apply=apply)
        for apply in ("topk", "all"):  # "all" without the exact round: top-k allgather in the engine
            yield replace(shipped, exchange="allgather", exact=False, apply=apply)
    elif level == "prefilter":
        for pre in (1, 2, 3):
            yield replace(shipped, exchange="sparse", prefilter=pre)
        for pre in (1, 2):
            yield replace(shipped, exchange="allgather", prefilter=pre)  # its own defaults: the union applied
        return
    elif level == "rule":
        yield replace(shipped, exchange="sparse")
        yield replace(shipped, exchange="allgather")  # its own defaults: no exact round, the union applied
        return
    elif level == "exchanges":
        yield shipped  # "auto": the allgather at small P, the sparse exchange above
        yield replace(shipped, wire="compact8")  # ... with E4M3 values, labelled
        for wire in ("fp32", "compact"):  # each pair exchange in both wire formats, labelled
            yield replace(shipped, exchange="sparse", wire=wire)
            yield replace(shipped, exchange="allgather", apply="topk", wire=wire)
            yield replace(shipped, exchange="allgather", wire=wire)  # its own defaults: top-k allgather
        yield replace(shipped, exchange="sketch")  # the paper's Count-Sketch at the shipped sizes
        return
    elif level == "compact8":  # the defaults with E4M3 values alone, beside an "exchanges" run's records
        yield replace(shipped, wire="compact8")
        return
    elif level == "quick":
        for change in ({}, {"rows": 1, "width": 4.0, "candidates": 2}, {"rows": 5}, {"width": 1.0},
                       {"width": 4.0}, {"candidates": 2}, {"exact": False}, {"prefilter": 2}, {"prefilter": 0},
                       {"sketch_dtype": "float32"}, {"rows": 5, "width": 4.0, "candidates": 2}, {"scope": "layer"}):
            yield replace(shipped, exchange="sketch", **change)
    else:
        small = level == "small"
        for rows, width, m, pre, dt in product((1, 3, 5), (1.0, 2.0, 4.0, 8.0), (0, 1, 2, 4),
                                               (1,) if small else (0, 1, 2),
                                               ("float32", "float16") if level == "full" else ("float16",)):
            if level != "pruned" or pre or (rows, width) in ((5, 4.0), (3, 2.0)):
                yield gs(rows, width, m, pre, dt)
        for (rows, width), pre in product(((1, 4.0), (3, 2.0), (5, 4.0)) if small else (), (0, 2)):
            yield gs(rows, width, 2, pre)
        for (rows, width), m, pre in product(((3, 2.0), (5, 4.0), (1, 4.0)), (1, 2), (0, 1)):
            yield gs(rows, width, m, pre, scope="layer")
        yield replace(shipped, sketch_dtype="float32")
    yield OLD_DEFAULTS


def run(task: Task, ratio: float, steps: int, level: str, out: Optional[str], baselines: str = "all",
        run_fields: Optional[dict[str, Any]] = None) -> list[dict]:
    """The baselines ("all", "core": dense and both gTop-k, "none", or a comma-separated list of
    dense, exact and the keys of BASELINES), then the gs grid, on one task; one record per
    method, appended to ``out`` as it finishes with ``run_fields`` (:func:`gs_bench.runs.stamp`)."""
    P, shapes = task.ranks, task.shapes
    keys = {"all": ["dense", "exact", *BASELINES], "core": ["dense", "gtopk", "gtopk-global"], "none": []}
    makers: list[Callable[[], Method]] = [
        lambda key=key: baseline(key, P, shapes, ratio)
        for key in keys.get(baselines, baselines.split(","))
        if task.trains or key not in ("dense", "exact", "powersgd")]
    makers += [lambda cfg=cfg: gs_method(cfg, P, shapes, ratio) for cfg in dict.fromkeys(gs_grid(level))]
    records = []
    for make in makers:
        rec = {**simulate(task, make(), steps, ratio), **(run_fields or {})}
        records.append(rec)
        wire = "–" if rec["wire"] is None else f"{rec['wire'] / 1e3:.1f} kB"
        print(f"{rec['task']} P={P} ratio={ratio} {rec['method']} {rec.get('label', '')}: mass {rec['mass']:.3f} "
              f"wire {wire} loss {rec['loss'][-1]:.3f} ({rec['seconds']:.1f} s)", flush=True)
        if out:
            append_line(out, rec)
    return records


def compare(records: list[dict], ranks: int, peer: str = "gTop-k (global)",
            wire: Optional[str] = None) -> tuple[float, float]:
    """(gs mass / peer mass, gs wire / peer wire) for gs at its defaults (``GsConfig()`` with the
    ratio: exchange "auto"; ``wire="compact8"``: with that wire) at P = ranks; the peer is gTop-k
    over all weights unless named."""
    ref = next(r for r in records if r["P"] == ranks and r["method"] == peer)
    ours = is_defaults_compact8 if wire == "compact8" else is_shipped
    ship = next(r for r in records if r["P"] == ranks and ours(r))
    return ship["mass"] / ref["mass"], ship["wire"] / ref["wire"]


# ---------------------------------------------------------------- report

def summary(groups: dict[tuple, list[dict]]) -> None:
    """One row per (task, ratio, P): both gTop-k, the shipped gs and the best gs global config
    within gTop-k's bytes."""
    print("\n### Shipped gs global vs gTop-k\n")
    print("| task | ratio | P | gTop-k mass | gTop-k (global) mass | shipped mass | shipped / gTop-k mass "
          "| shipped / gTop-k bytes | best gs global within gTop-k bytes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (task, ratio, P), rs in sorted(groups.items()):
        ref = next((r for r in rs if r["method"] == "gTop-k"), None)
        glob = next((r for r in rs if r["method"] == "gTop-k (global)"), None)
        ship = next((r for r in rs if is_shipped(r)), None)
        if not (ref and glob and ship):
            continue
        fits = [r for r in rs if r["method"] == "gs global" and r["wire"] <= ref["wire"] * (1 + 1e-9)]
        best = max(fits, key=lambda r: r["mass"]) if fits else None
        best_text = f"{best['label']}: {best['mass']:.3f} at {best['wire'] / 1e3:.1f} kB" if best else "–"
        print(f"| {task} | {ratio} | {P} | {ref['mass']:.3f} | {glob['mass']:.3f} | {ship['mass']:.3f} "
              f"| {ship['mass'] / ref['mass']:.2f} | {ship['wire'] / ref['wire']:.2f} | {best_text} |")


def tables(records: list[dict]) -> dict[tuple, list[dict]]:
    """Prints, per (task, ratio, P), the baselines and the gs configs on the Pareto front (mass
    against wire bytes), the shipped and the old defaults, then the summary; returns the
    records grouped by (task, ratio, P)."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["task"], r["ratio"], r["P"]), []).append(r)
    for (task, ratio, P), rs in sorted(groups.items()):
        ref = next((r for r in rs if r["method"] == "gTop-k"), None)
        print(f"\n### {task}, ratio {ratio}, P = {P}\n")
        print("| method | settings | delivered mass | kB / rank / step | vs gTop-k mass | vs gTop-k bytes "
              "| final loss |")
        print("|---|---|---|---|---|---|---|")
        gs = [r for r in rs if "rows" in r]
        front = [r for r in gs if not any(o["wire"] <= r["wire"] and o["mass"] > r["mass"] for o in gs)]
        marked = [r for r in gs if is_shipped(r) or is_old(r)]
        show = [r for r in rs if "rows" not in r] + sorted({id(r): r for r in front + marked}.values(),
                                                            key=lambda r: r["wire"])
        for r in show:
            tag = " **(shipped)**" if is_shipped(r) else " (old default)" if is_old(r) else ""
            has = ref and r["method"] not in ("dense", "exact top-k")
            rel = f"{r['mass'] / ref['mass']:.2f} | {r['wire'] / ref['wire']:.2f}" if has else "– | –"
            mass = "–" if r["method"] == "dense" else f"{r['mass']:.3f}"
            wire = "–" if r["wire"] is None else f"{r['wire'] / 1e3:.1f}"
            loss = r["loss"][-1]
            print(f"| {r['method']}{tag} | {r.get('label', '')} | {mass} | {wire} | {rel} "
                  f"| {'–' if loss != loss else f'{loss:.3f}'} |")
    summary(groups)
    return groups


def loss_figure(records: list[dict], path: str) -> None:
    """The loss curves (5-step running means) of every record, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in records:
        smooth = np.convolve(r["loss"], np.ones(5) / 5, mode="valid")
        tag = ", shipped" if is_shipped(r) else ", old defaults" if is_old(r) else ""
        ax.plot(np.arange(len(smooth)) + 5, smooth, label=f"{r['method']}{tag} {r.get('label', '')}")
    first = records[0]
    ax.set(xlabel="step", ylabel="training loss (5-step running mean)",
           title=f"{first['task']}, P = {first['P']}, ratio {first['ratio']}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def mass_figure(groups: dict[tuple, list[dict]], path: str) -> None:
    """Delivered mass against wire bytes, one panel per (task, ratio), one colour per P: every
    gs global config (dots; line: the Pareto front), the baselines and the shipped gs (star)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    keys = sorted({(t, q) for t, q, _ in groups})
    ncols = min(3, len(keys))
    nrows = math.ceil(len(keys) / ncols)
    fig, grid = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 4.2 * nrows + 0.8), squeeze=False)
    axes = list(grid.reshape(-1))
    for ax in axes[len(keys):]:
        ax.axis("off")
    colours = {4: "tab:blue", 16: "tab:orange", 64: "tab:green", 256: "tab:red"}
    markers = {"gTop-k": "s", "gTop-k (global)": "D", "top-k allgather": "^", "top-k allgather (global)": "<",
               "Sketched-SGD": "v", "PowerSGD": "P"}
    for ax, (task, ratio) in zip(axes, keys):
        for P in sorted(P for t, q, P in groups if (t, q) == (task, ratio)):
            rs, c = groups[(task, ratio, P)], colours.get(P, "k")
            gs = sorted((r for r in rs if r["method"] == "gs global"), key=lambda r: r["wire"])
            front, best = [], -1.0
            for r in gs:
                if r["mass"] > best:
                    front.append(r)
                    best = r["mass"]
            ax.scatter([r["wire"] for r in gs], [r["mass"] for r in gs], s=4, color=c, alpha=0.25)
            ax.plot([r["wire"] for r in front], [r["mass"] for r in front], color=c)
            for r in rs:
                if r["method"] in markers:
                    ax.scatter(r["wire"], r["mass"], marker=markers[r["method"]], color=c, edgecolor="k", s=40)
                elif is_shipped(r):
                    ax.scatter(r["wire"], r["mass"], marker="*", color=c, edgecolor="k", s=160)
        ax.set(xscale="log", xlabel="bytes per rank per step (wire)", ylabel="delivered mass",
               title=f"{task}, ratio {ratio}", ylim=(0, 1.02))
        ax.grid(True, which="both", alpha=0.3)
    handles = [Line2D([], [], color=c, label=f"P = {P}: gs global (line: front)") for P, c in colours.items()]
    handles += [Line2D([], [], ls="", marker=m, color="w", markeredgecolor="k", label=name)
                for name, m in {**markers, "gs shipped": "*"}.items()]
    fig.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="lower center", ncol=5)
    fig.tight_layout(rect=(0, 0.8 / (4.2 * nrows + 0.8), 1, 1))
    fig.savefig(path, dpi=110)


def method_name(r: dict) -> str:
    """A record's method for :func:`exchange_markdown`: a baseline's name, or for gs "gs
    defaults (auto → <exchange used>)" / "gs <exchange>[, apply <rule>]" (the allgather without
    an apply rule: ", its defaults (top-k allgather)"; plus the scope when
    it is "layer", and the settings when they are not the shipped sizes)."""
    if "rows" not in r:
        return r["method"]
    used = r.get("exchange_used", "?")
    text = f"gs defaults (auto → {used})" if r["exchange"] == "auto" else f"gs {r['exchange']}"
    if r.get("wire_format") in ("compact", "compact8") and (r["exchange"] in ("allgather", "sparse")
                                                            or r["wire_format"] == "compact8"):
        text += f" {r['wire_format']}"
    if r.get("apply"):
        text += f", apply {r['apply']}"
    elif r["exchange"] == "allgather":
        text += ", its defaults (top-k allgather)"
    sizes = label(replace(shipped_settings(), exchange=r["exchange"], apply=r.get("apply"),
                          wire=r.get("wire_format", "fp32")))
    if r.get("label") != sizes:
        text += f" [{r.get('label')}]"
    return text + (" (layer)" if r.get("scope") == "layer" else "")


def exchange_markdown(records: list[dict]) -> str:
    """The markdown table of every record, per (task, ratio): P, method, delivered mass,
    payload and wire bytes per rank per step, mass per wire kB (dense's mass, ≥ 1 by
    definition, and the reference's bytes, none, are "–") and the wire bytes over an even
    split's (above 1 only where an alltoall's loads were uneven; worst single step in brackets)."""
    order = ["dense", "exact top-k", *(name for name, _, _ in BASELINES.values())]
    gs_order = {e: i for i, e in enumerate(("auto", "sparse", "allgather", "sketch"))}

    def key(r: dict) -> tuple:
        if "rows" not in r:
            return (r["P"], 0, order.index(r["method"]) if r["method"] in order else len(order), "", "")
        return (r["P"], 1, gs_order.get(r["exchange"], 9), r.get("apply") or "~", r.get("label", ""))

    lines = []
    by_task: dict[tuple, list[dict]] = {}
    for r in records:
        by_task.setdefault((r["task"], r["ratio"]), []).append(r)
    for (task, ratio), rs in sorted(by_task.items()):
        steps = sorted({r["steps"] for r in rs})
        lines += [f"### {task}, ratio {ratio} ({'/'.join(map(str, steps))} steps)", "",
                  "| P | method | delivered mass | payload bytes / step | wire bytes / step | mass per wire kB "
                  "| wire / even [worst] |", "|---|---|---|---|---|---|---|"]
        for r in sorted(rs, key=key):
            mass = None if r["method"] == "dense" else r["mass"]
            payload = "–" if r["payload"] is None else f"{r['payload']:,.0f}"
            wire = "–" if r["wire"] is None else f"{r['wire']:,.0f}"
            per_kb = "–" if mass is None or not r["wire"] else f"{mass / (r['wire'] / 1e3):.3g}"
            uneven = f"{r['wire_over_even']:.3f} [{r['worst_over_even']:.2f}]" if "wire_over_even" in r else "–"
            lines.append(f"| {r['P']} | {method_name(r)} | {'–' if mass is None else f'{mass:.3f}'} "
                         f"| {payload} | {wire} | {per_kb} | {uneven} |")
        lines.append("")
    return "\n".join(lines)


def report(paths: list[str], plot: Optional[str], loss_plot: Optional[str] = None,
           markdown: Optional[str] = None) -> None:
    """:func:`tables` of the records in ``paths`` (one per setting and seed: :func:`read_records`),
    the plots asked for, and
    :func:`exchange_markdown` written to ``markdown``."""
    records = read_records(paths)
    groups = tables(records)
    if markdown:
        with open(markdown, "w") as f:
            f.write(f"<!-- generated: python scripts/bench/bench_recovery.py --report {' '.join(paths)} "
                    f"--markdown {markdown} -->\n\n" + exchange_markdown(records))
    if loss_plot:
        loss_figure(records, loss_plot)
    if plot:
        mass_figure(groups, plot)


def rule_rows(records: list[dict]) -> list[dict]:
    """Per (task, ratio, P), over the seeds that have both: the allgather's union (its own
    defaults) against the sparse exchange: ``mass`` and ``wire`` (the union's over the sparse
    exchange's, one per seed), ``per_byte`` (the union's mass per wire byte over the sparse
    exchange's, one per seed), how many seeds ``union_wins`` per byte, and ``picks`` (what
    "auto" takes there)."""
    runs: dict[tuple, dict[str, dict]] = {}
    for r in records:
        if "rows" in r and r["exchange"] in ("sparse", "allgather") and not r.get("apply") and r.get("exact") is None:
            runs.setdefault((r["task"], r["ratio"], r["P"], r.get("seed", 0)), {})[r["exchange"]] = r
    out: dict[tuple, dict] = {}
    for (task, ratio, P, seed), pair in sorted(runs.items()):
        if set(pair) != {"sparse", "allgather"}:
            continue
        union, sparse = pair["allgather"], pair["sparse"]
        row = out.setdefault((task, ratio, P), {"task": task, "ratio": ratio, "P": P, "seeds": [], "mass": [],
                                                "wire": [], "per_byte": [], "picks": union.get("auto_picks")})
        row["seeds"].append(seed)
        row["mass"].append(union["mass"] / sparse["mass"])
        row["wire"].append(union["wire"] / sparse["wire"])
        row["per_byte"].append(row["mass"][-1] / row["wire"][-1])
    for row in out.values():
        row["union_wins"] = sum(x > 1 for x in row["per_byte"])
    return list(out.values())


def spread_text(values: list[float], digits: int = 2) -> str:
    """``median [min–max]`` of ``values`` (one value: itself)."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{float(np.median(values)):.{digits}f} [{min(values):.{digits}f}–{max(values):.{digits}f}]"


def rule_markdown(records: list[dict]) -> str:
    """:func:`rule_rows` as a Markdown table, each ratio as median [min–max] over the seeds."""
    steps = sorted({r["steps"] for r in records if "rows" in r})
    lines = [f"The allgather's union (its own defaults) ÷ the sparse exchange, each seed's figure a mean over "
             f"{'/'.join(map(str, steps))} steps; median [min–max] over the seeds", "",
             "| task | k/D | P | seeds | mass | wire bytes | mass per wire byte | seeds where the union delivers "
             "more per byte | `auto` picks |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rule_rows(records):
        lines.append(f"| {row['task']} | {row['ratio']:g} | {row['P']} | {len(row['seeds'])} | "
                     f"{spread_text(row['mass'])} | {spread_text(row['wire'])} | {spread_text(row['per_byte'])} | "
                     f"{row['union_wins']} of {len(row['seeds'])} | {row['picks']} |")
    return "\n".join(lines)


RESULT_FIELDS = frozenset({"mass", "mass_steps", "loss", "wire", "payload", "seconds", "exchange_used", "auto_picks",
                           "wire_over_even", "worst_over_even", "run_id", "code"})
"""A record's fields that a run measured (or stamped); every other field is its setting."""


def setting_of(r: dict) -> str:
    """What a record measured: every field but :data:`RESULT_FIELDS`, the seed (0 if absent) included."""
    return json.dumps({**{k: v for k, v in r.items() if k not in RESULT_FIELDS}, "seed": r.get("seed", 0)},
                      sort_keys=True)


def read_records(paths: list[str]) -> list[dict]:
    """The records of ``paths``, one per :func:`setting_of`: where runs repeat a setting and seed,
    the latest run's (:func:`gs_bench.runs.latest_runs`, which says on stderr which it used), in
    the place of the setting's first record."""
    def describe(r: dict) -> str:
        return f"{r['task']} P={r['P']} ratio={r['ratio']} seed {r.get('seed', 0)} {r['method']} {r.get('label', '')}"

    records, where = read_jsonl(paths)
    return latest_runs(records, setting_of, where, lambda r: describe(r).rstrip())


TASKS = ("a", "b", "c", "d")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (``scripts/check_docs.py`` parses every documented command with it)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="(b) the 1.28M digits MLP, ratio 0.001, every baseline and exchange (grid 'exchanges')")
    p.add_argument("--run", help="comma-separated tasks: (a) digits MLP, (b) 1.28M MLP, (c) planted, "
                                 "(d) MNIST-5k CNN")
    p.add_argument("--ranks", help="comma-separated P, powers of two for gTop-k (default 4,16,64,256; "
                                   "with --quick 16)")
    p.add_argument("--ratios", default="0.01,0.001")
    p.add_argument("--steps", type=int, help="steps per method (default 40; with --quick 20)")
    p.add_argument("--batch", type=int, default=8, help="images per rank per step")
    p.add_argument("--grid", choices=["full", "pruned", "small", "quick", "shipped", "sizing", "exchanges", "rule",
                                      "prefilter", "compact8", "none"], default="full")
    p.add_argument("--seeds", type=int, nargs="+", default=[0],
                   help="initial weights and micro-batches (0: the start of every earlier record)")
    p.add_argument("--threads", type=int, default=2, help="torch (and Numba) threads")
    p.add_argument("--planted-d", type=int, default=2 ** 16, help="(c): D")
    p.add_argument("--baselines", default="all", help="all, core, none or a list (see run())")
    add_out_flags(p, "one JSON record per method")
    p.add_argument("--report", nargs="+", help="JSONL files to tabulate")
    p.add_argument("--plot", help="with --report: PNG of mass against bytes")
    p.add_argument("--markdown", help="with --report: write the per-exchange markdown table here")
    p.add_argument("--loss-plot", help="with --report: PNG of the loss curves of every record read")
    p.add_argument("--rule", nargs="+", metavar="JSONL", help="the table of exchange='auto''s rule from these records")
    args = p.parse_args(argv)
    if args.run and not set(args.run.split(",")) <= set(TASKS):
        p.error(f"--run takes tasks of {sorted(TASKS)}, comma-separated; got {args.run!r}")
    if not (args.quick or args.run or args.report or args.rule):
        p.error("give --quick, --run, --report or --rule")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.quick or args.run:
        check_out(args.out, args.append)
    run_fields = stamp() if args.out else None
    torch.set_num_threads(args.threads)
    steps = args.steps if args.steps is not None else 20 if args.quick else 40
    if args.report:
        report(args.report, args.plot, args.loss_plot, args.markdown)
        return
    if args.rule:
        print(rule_markdown(read_records(args.rule)))
        return
    if args.quick:
        P = int(args.ranks or 16)
        t0 = time.process_time()
        task = DigitsTask("digits MLP 1.28M", 1536, P, args.batch)
        records = run(task, 0.001, steps, "exchanges", args.out, args.baselines, run_fields)
        tables(records)
        mass, wire = compare(records, P)
        print(f"\n({time.process_time() - t0:.0f} s of CPU)")
        print(f"defaults_vs_gtopk P={P} delivered_mass_ratio {mass:.3f} wire_bytes_ratio {wire:.3f}")
        mass, wire = compare(records, P, wire="compact8")
        print(f"compact8_vs_gtopk P={P} delivered_mass_ratio {mass:.3f} wire_bytes_ratio {wire:.3f}")
        return
    for name in args.run.split(","):
        for seed in args.seeds:
            for ranks in map(int, (args.ranks or "4,16,64,256").split(",")):
                for ratio in map(float, args.ratios.split(",")):
                    if name == "a":
                        task: Task = DigitsTask("digits MLP", 256, ranks, args.batch, seed)
                    elif name == "b":
                        task = DigitsTask("digits MLP 1.28M", 1536, ranks, args.batch, seed)
                    elif name == "d":
                        task = CnnTask(ranks, args.batch, seed)
                    else:
                        task = PlantedTask(ranks, args.planted_d, ratio)
                    run(task, ratio, steps, args.grid, args.out, args.baselines, run_fields)


if __name__ == "__main__":
    main()
