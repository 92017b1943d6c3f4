"""How much of the exact top-k's mass each method delivers, and at what bytes: P workers
simulated in one process over a stretch of real training steps.

    python scripts/bench/bench_recovery.py --quick                      # a few minutes: P = 16, digits MLP
    python scripts/bench/bench_recovery.py --run a --out docs/recovery.jsonl   # one part of the full study
    python scripts/bench/bench_recovery.py --report docs/recovery.jsonl --plot docs/recovery.png

The study, its commands and the choice of the shipped sizes are in docs/design.md ("Recovery").

Tasks: (a) the digits MLP of scripts/examples/train_torch.py (``--model mlp --hidden 256``, 50k compressed
weights), (b) the same MLP at hidden 1536 (1.28M compressed weights), both on scikit-learn's
digits, each worker's gradient from its own micro-batch of ``--batch`` images; (c) planted
heavy-tailed vectors (no training). Every method trains its own copy of the model from the same
start on the same micro-batches (SGD, lr 0.05, momentum 0.9, on the mean of what the method
applies) and keeps its own per-worker residuals e (P, D). Tensors under MIN_SIZE elements (the
biases) are averaged densely for every method and counted neither in the mass nor in the bytes.

Per step, with a = e + g (P, D) and S = Σ_workers a (D,) (P-sums throughout):

    delivered mass = Σ_i Δ_i · S_i / ‖top-k(S)‖²,   k = ceil(ratio · D)

where Δ (D,) is what the method applies (as a P-sum); the table reports its mean over the
stretch. Bytes are per rank per step through the busiest rank, counted as bench_wire.py and
gs_horovod/baselines/methods.py count them: ring allreduce 4(P−1)/P·n, gTop-k 2·log2 P rounds of
8k, top-k allgather 2(P−1)·8k, Sketched-SGD's star (rank 0 receives P−1 sketches).

The gs step (global scope: one sketch over all D; layer scope: the same per tensor):
a worker feeds the sketch its top-(L·k) of |a| (``prefilter`` L; 0 = all of a), the merged
sketch is the sum of the workers' rows × ceil(width·k) tables, the ``candidates`` m·k largest
|median estimates| are summed exactly, the top k of those are applied and leave every worker's
residual. ``candidates=0`` means no exact round: Δ = the estimates at the top k, and each worker's
residual is zeroed at the selected coordinates it fed. The Count-Sketch is computed here in
vectorised torch, with the buckets and signs of gs_horovod.kernels.hashing's NumPy reference
(``reference_buckets_signs(hash_keys(seed), cols, 0, d, rows)``) computed once per (rows, cols, d)
and cached; nothing else of the engine is used. A float16 sketch is summed as a ring would:
each worker's table rounded to f16, added in worker order with the partial sum rounded to f16
after each addition (f32 arithmetic per addition, as Horovod's CPU float16 sum).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from typing import Callable, Iterator, Optional

import numpy as np
import torch
import torch.nn.functional as F

from gs_horovod.bench.workloads import digits_mlp

SHIPPED_FIELDS = ("rows", "width", "candidates", "prefilter", "sketch_dtype")


def shipped_settings() -> dict:
    """GsSketch's default sizes, read from the engine's options (``gs_horovod.gs_sgd.SimSettings``)."""
    from gs_horovod.gs_sgd import GsConfig

    defaults = GsConfig()
    return {f: getattr(defaults, f) for f in SHIPPED_FIELDS}


MIN_SIZE = 1024
SEED = 0
LR, MOMENTUM = 0.05, 0.9

Tensor = torch.Tensor


def ring_allreduce(nbytes: float, ranks: int) -> float:
    """Sent + received through a rank by a ring allreduce of ``nbytes``."""
    return 4 * (ranks - 1) / ranks * nbytes


# ---------------------------------------------------------------- hashes and layouts

_HASHES: dict[tuple[int, int, int], tuple[Tensor, Tensor]] = {}


def hashes(rows: int, cols: int, d: int) -> tuple[Tensor, Tensor]:
    """(flat table index (rows, d) int64 = row·cols + bucket, signs (rows, d) f32), cached."""
    key = (rows, cols, d)
    if key not in _HASHES:
        from gs_horovod.kernels.hashing import hash_keys, reference_buckets_signs

        buckets, signs = reference_buckets_signs(hash_keys(SEED), cols, 0, d, rows)
        flat = torch.from_numpy(buckets) + torch.arange(rows)[:, None] * cols
        _HASHES[key] = (flat, torch.from_numpy(signs))
    return _HASHES[key]


@dataclass(frozen=True)
class Segment:
    """A slice [start, start + d) of the compressed vector with its own k (and sketch)."""

    start: int
    d: int
    k: int


def layout(sizes: list[int], ratio: float, scope: str) -> list[Segment]:
    """One segment of D = Σ sizes (global scope) or one per tensor (layer scope)."""
    if scope == "global":
        total = sum(sizes)
        return [Segment(0, total, math.ceil(ratio * total))]
    starts = np.cumsum([0, *sizes[:-1]]).tolist()
    return [Segment(s, d, math.ceil(ratio * d)) for s, d in zip(starts, sizes)]


def topk_idx(x: Tensor, k: int) -> Tensor:
    """Indices of the k largest |x| along the last dimension (unsorted)."""
    return torch.topk(x.abs(), min(k, x.shape[-1]), dim=-1, sorted=False).indices


# ---------------------------------------------------------------- methods

class Method:
    """One exchange. ``step(a, S)`` takes a = e + g (P, D), modifies it in place into the new
    residuals, and returns Δ (D,), the P-sum it applies; S = a.sum(0) is passed in."""

    name = "method"

    def __init__(self, sizes: list[int], ratio: float, ranks: int) -> None:
        self.sizes, self.ratio, self.ranks = sizes, ratio, ranks

    def step(self, a: Tensor, S: Tensor) -> Tensor:
        raise NotImplementedError

    def wire(self) -> float:
        """Bytes sent + received through the busiest rank per step."""
        return 0.0

    def payload(self) -> float:
        """Bytes this rank hands to collectives per step."""
        return 0.0

    def describe(self) -> dict:
        return {"method": self.name}


class Dense(Method):
    """Dense allreduce: Δ = S, no residual."""

    name = "dense"

    def step(self, a: Tensor, S: Tensor) -> Tensor:
        a.zero_()
        return S.clone()

    def payload(self) -> float:
        return 4.0 * sum(self.sizes)

    def wire(self) -> float:
        return ring_allreduce(self.payload(), self.ranks)


class ExactTopK(Method):
    """The oracle: the global top-k of S, applied exactly (mass 1 by definition)."""

    name = "exact top-k"

    def step(self, a: Tensor, S: Tensor) -> Tensor:
        sel = topk_idx(S, math.ceil(self.ratio * S.numel()))
        a[:, sel] = 0
        return torch.zeros_like(S).index_copy_(0, sel, S[sel])


class TopKAllgather(Method):
    """Each worker's local top-k per tensor, allgathered and summed."""

    name = "top-k allgather"

    def step(self, a: Tensor, S: Tensor) -> Tensor:
        delta = torch.zeros_like(S)
        for seg in layout(self.sizes, self.ratio, "layer"):
            x = a[:, seg.start:seg.start + seg.d]
            idx = topk_idx(x, seg.k)
            delta[seg.start:seg.start + seg.d].index_add_(0, idx.reshape(-1), x.gather(1, idx).reshape(-1))
            x.scatter_(1, idx, 0.0)
        return delta

    def payload(self) -> float:
        return sum(8.0 * s.k for s in layout(self.sizes, self.ratio, "layer"))

    def wire(self) -> float:
        return 2 * (self.ranks - 1) * self.payload()


class GTopK(Method):
    """gTop-k by recursive doubling (P a power of two): in round i worker r and r ⊕ 2^i sum their
    k-sparse sets and keep the top k, so after log2 P rounds all hold the same set of partial
    sums, which is applied; a worker's residual loses its local top-k ∩ final set (as the
    baseline does, even where its value was dropped in an earlier round). ``scope`` "layer" is
    the baseline (per tensor); "global" runs it once over all D."""

    def __init__(self, sizes: list[int], ratio: float, ranks: int, scope: str = "layer") -> None:
        super().__init__(sizes, ratio, ranks)
        if ranks & (ranks - 1):
            raise ValueError(f"gTop-k needs a power-of-two P, got {ranks}")
        self.scope = scope
        self.name = "gTop-k" if scope == "layer" else "gTop-k (global)"

    def step(self, a: Tensor, S: Tensor) -> Tensor:
        delta = torch.zeros_like(S)
        for seg in layout(self.sizes, self.ratio, self.scope):
            x = a[:, seg.start:seg.start + seg.d]
            local = topk_idx(x, seg.k)
            cur = torch.zeros_like(x).scatter_(1, local, x.gather(1, local))
            while cur.shape[0] > 1:
                cur = cur.view(cur.shape[0] // 2, 2, seg.d).sum(1)
                keep = topk_idx(cur, seg.k)
                cur = torch.zeros_like(cur).scatter_(1, keep, cur.gather(1, keep))
            final = cur[0]
            delta[seg.start:seg.start + seg.d] = final
            in_final = (final != 0).gather(0, local.reshape(-1)).view_as(local)
            x.scatter_(1, local, torch.where(in_final, 0.0, x.gather(1, local)))
        return delta

    def payload(self) -> float:
        return math.log2(self.ranks) * sum(8.0 * s.k for s in layout(self.sizes, self.ratio, self.scope))

    def wire(self) -> float:
        return 2 * self.payload()

    def describe(self) -> dict:
        return {"method": self.name, "scope": self.scope}


@dataclass(frozen=True)
class SimSettings:
    """The gs options simulated here; ``candidates`` 0 = no exact round."""

    rows: int = 5
    width: float = 4.0
    candidates: int = 1
    prefilter: int = 0
    sketch_dtype: str = "float32"
    scope: str = "global"

    def label(self) -> str:
        m = f"m{self.candidates}" if self.candidates else "noexact"
        dt = "f16" if self.sketch_dtype == "float16" else "f32"
        return f"r{self.rows} w{self.width:g} {m} L{self.prefilter} {dt}"


class GsSketch(Method):
    """gs-SGD with the options of ``SimSettings`` (see the module docstring)."""

    def __init__(self, sizes: list[int], ratio: float, ranks: int, cfg: SimSettings,
                 name: Optional[str] = None) -> None:
        super().__init__(sizes, ratio, ranks)
        self.cfg = cfg
        self.segs = layout(sizes, ratio, cfg.scope)
        self.name = name or f"gs {cfg.scope}"

    def cols(self, seg: Segment) -> int:
        return max(1, math.ceil(self.cfg.width * seg.k))

    def merged_table(self, x: Tensor, fed_idx: Optional[Tensor], fed_val: Optional[Tensor], seg: Segment) -> Tensor:
        """Σ_workers CountSketch(fed part of x), (rows·cols,) f32 (f16-rounded as a ring sums)."""
        cfg, P = self.cfg, x.shape[0]
        cols = self.cols(seg)
        flat, signs = hashes(cfg.rows, cols, seg.d)
        size = cfg.rows * cols
        if cfg.sketch_dtype == "float32":
            fed = x.sum(0) if fed_idx is None else torch.zeros(seg.d).index_add_(0, fed_idx.reshape(-1),
                                                                              fed_val.reshape(-1))
            return torch.zeros(size).index_add_(0, flat.reshape(-1), (signs * fed).reshape(-1))
        tables = torch.zeros(P, size)
        if fed_idx is None:
            for w in range(P):
                tables[w].index_add_(0, flat.reshape(-1), (signs * x[w]).reshape(-1))
        else:
            where = flat[:, fed_idx].permute(1, 0, 2).reshape(P, -1)
            vals = (signs[:, fed_idx] * fed_val[None]).permute(1, 0, 2).reshape(P, -1)
            tables.scatter_add_(1, where, vals)
        acc = tables[0].half()
        for w in range(1, P):
            acc = (acc.float() + tables[w].half().float()).half()
        return acc.float()

    def step(self, a: Tensor, S: Tensor) -> Tensor:
        cfg = self.cfg
        delta = torch.zeros_like(S)
        for seg in self.segs:
            x = a[:, seg.start:seg.start + seg.d]
            s = S[seg.start:seg.start + seg.d]
            fed_idx = fed_val = None
            if cfg.prefilter:
                fed_idx = topk_idx(x, cfg.prefilter * seg.k)
                fed_val = x.gather(1, fed_idx)
            table = self.merged_table(x, fed_idx, fed_val, seg)
            flat, signs = hashes(cfg.rows, self.cols(seg), seg.d)
            est = signs * table[flat]
            est = est[0] if cfg.rows == 1 else est.median(0).values
            out = delta[seg.start:seg.start + seg.d]
            if cfg.candidates:
                cand = topk_idx(est, cfg.candidates * seg.k)
                sel = cand[topk_idx(s[cand], seg.k)]
                out[sel] = s[sel]
                x[:, sel] = 0
            else:
                sel = topk_idx(est, seg.k)
                out[sel] = est[sel]
                if fed_idx is None:
                    x[:, sel] = 0
                else:
                    fed = torch.zeros_like(x, dtype=torch.bool).scatter_(1, fed_idx, True)
                    x[:, sel] = torch.where(fed[:, sel], 0.0, x[:, sel])
        return delta

    def sketch_bytes(self) -> float:
        per = 2 if self.cfg.sketch_dtype == "float16" else 4
        return sum(per * self.cfg.rows * self.cols(s) for s in self.segs)

    def exact_bytes(self) -> float:
        return sum(4.0 * min(s.d, self.cfg.candidates * s.k) for s in self.segs)

    def payload(self) -> float:
        return self.sketch_bytes() + self.exact_bytes()

    def wire(self) -> float:
        exact = ring_allreduce(self.exact_bytes(), self.ranks) if self.cfg.candidates else 0.0
        return ring_allreduce(self.sketch_bytes(), self.ranks) + exact

    def describe(self) -> dict:
        return {"method": self.name, **asdict(self.cfg), "label": self.cfg.label()}


class SketchedSGD(GsSketch):
    """Sketched-SGD (the baseline): per tensor, rows 5, width 4, whole a sketched in f32, p2 = 4
    candidates summed exactly; the star sends every sketch to rank 0."""

    def __init__(self, sizes: list[int], ratio: float, ranks: int) -> None:
        super().__init__(sizes, ratio, ranks, SimSettings(5, 4.0, 4, 0, "float32", "layer"), "Sketched-SGD")

    def wire(self) -> float:
        cands = self.exact_bytes() / 4
        P = self.ranks
        return (P - 1) * self.sketch_bytes() + math.ceil(math.log2(P)) * 8 * cands + ring_allreduce(4 * cands, P)

    def describe(self) -> dict:
        return {"method": self.name}


# ---------------------------------------------------------------- tasks

class Task:
    """Per-worker gradients: ``grads(step)`` → (G (P, D) compressed flat, dense mean grads, loss)."""

    name = "task"
    sizes: list[int]

    def new_model(self) -> None:
        """Start a fresh copy (the same initial weights every time)."""

    def grads(self, step: int) -> tuple[Tensor, list[Tensor], float]:
        raise NotImplementedError

    def apply(self, delta_mean: Tensor, dense: list[Tensor]) -> None:
        """Takes an SGD step with the compressed mean update and the dense small-tensor means."""


class DigitsTask(Task):
    """The digits MLP (``gs_horovod.bench.workloads.digits_mlp(hidden)``, as
    scripts/examples/train_torch.py trains it with ``--model mlp``), on sklearn digits; P
    workers × ``batch`` images per step, drawn from a per-step permutation seeded by the step
    (the same for every method)."""

    def __init__(self, name: str, hidden: int, ranks: int, batch: int) -> None:
        from gs_horovod.bench.workloads import digits_shard

        self.name, self.hidden, self.ranks, self.batch = name, hidden, ranks, batch
        x, y, _, _ = digits_shard(0, 1)
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)
        self.new_model()
        self.sizes = [p.numel() for n, p in self.model.named_parameters() if n in self.comp]

    def new_model(self) -> None:
        torch.manual_seed(SEED)
        self.model = digits_mlp(self.hidden)
        self.params = dict(self.model.named_parameters())
        self.comp = [n for n, p in self.params.items() if p.numel() >= MIN_SIZE]
        self.small = [n for n in self.params if n not in self.comp]
        self.opt = torch.optim.SGD(self.model.parameters(), lr=LR, momentum=MOMENTUM)

    def batches(self, step: int) -> tuple[Tensor, Tensor]:
        need = self.ranks * self.batch
        g = torch.Generator().manual_seed(1000 + step)
        reps = math.ceil(need / len(self.x))
        order = torch.cat([torch.randperm(len(self.x), generator=g) for _ in range(reps)])[:need]
        return self.x[order].view(self.ranks, self.batch, -1), self.y[order].view(self.ranks, self.batch)

    def grads(self, step: int) -> tuple[Tensor, list[Tensor], float]:
        from torch.func import functional_call, grad_and_value, vmap

        xb, yb = self.batches(step)
        detached = {n: p.detach() for n, p in self.params.items()}

        def loss(params: dict[str, Tensor], xs: Tensor, ys: Tensor) -> Tensor:
            return F.cross_entropy(functional_call(self.model, params, (xs,)), ys)

        g, losses = vmap(grad_and_value(loss), in_dims=(None, 0, 0))(detached, xb, yb)
        G = torch.cat([g[n].reshape(self.ranks, -1) for n in self.comp], 1)
        return G, [g[n].mean(0) for n in self.small], losses.mean().item()

    def apply(self, delta_mean: Tensor, dense: list[Tensor]) -> None:
        start = 0
        for n in self.comp:
            p = self.params[n]
            p.grad = delta_mean[start:start + p.numel()].view_as(p).clone()
            start += p.numel()
        for n, d in zip(self.small, dense):
            self.params[n].grad = d
        self.opt.step()


class PlantedTask(Task):
    """Fresh heavy-tailed vectors each step, no training: k coordinates (random each step) carry
    v_i = ±√P·(3 + 3·Pareto(1.5)) in the P-sum, split evenly over workers, plus N(0, 1) per worker
    and coordinate; ``sizes`` cuts D into 4 equal 'tensors' for the layer-scope methods."""

    def __init__(self, ranks: int, d: int, ratio: float) -> None:
        self.name, self.ranks, self.ratio = "planted", ranks, ratio
        self.sizes = [d // 4] * 4

    def grads(self, step: int) -> tuple[Tensor, list[Tensor], float]:
        g = torch.Generator().manual_seed(2000 + step)
        D, P = sum(self.sizes), self.ranks
        k = math.ceil(self.ratio * D)
        G = torch.randn(P, D, generator=g)
        where = torch.randperm(D, generator=g)[:k]
        sign = torch.randint(0, 2, (k,), generator=g) * 2.0 - 1.0
        pareto = torch.rand(k, generator=g).pow(-1 / 1.5) - 1
        G[:, where] += (sign * math.sqrt(P) * (3 + 3 * pareto) / P)[None]
        return G, [], float("nan")


# ---------------------------------------------------------------- the simulation

def simulate(task: Task, make: Callable[[], Method], steps: int, ratio: float) -> dict:
    """Runs one method over ``steps`` steps from the task's start; its mass, bytes and losses."""
    task.new_model()
    method = make()
    resid: Optional[Tensor] = None
    masses, losses = [], []
    t0 = time.perf_counter()
    for step in range(steps):
        G, dense, loss = task.grads(step)
        a = G if resid is None else resid.add_(G)
        S = a.sum(0)
        k = math.ceil(ratio * S.numel())
        best = torch.topk(S.abs(), k, sorted=False).values.pow(2).sum()
        delta = method.step(a, S)
        masses.append(((delta * S).sum() / best).item())
        losses.append(loss)
        resid = a
        task.apply(delta / task.ranks, dense)
    return {"task": task.name, "P": task.ranks, "ratio": ratio, "steps": steps, **method.describe(),
            "mass": float(np.mean(masses)), "mass_steps": masses, "loss": losses,
            "wire": method.wire(), "payload": method.payload(), "seconds": time.perf_counter() - t0}


def gs_grid(level: str) -> Iterator[SimSettings]:
    """gs configurations: 'full' is rows {1,3,5} × width {1,2,4,8} × candidates {0,1,2,4} ×
    prefilter {0,1,2} × dtype {f32,f16} in both scopes (layer: a subset); 'pruned' drops f32 except
    at the shipped point, and prefilter 0 beyond 2 configs; 'small' keeps prefilter 1 and f16 but
    for 3 configs; 'quick' is a neighbourhood of the shipped sizes; 'shipped' is them and the old
    defaults (layer scope, rows 5, width 4, 1 candidate round, whole residuals, f32); 'none' is
    no gs at all."""
    if level == "none":
        return
    if level == "shipped":
        yield SimSettings(**shipped_settings())
        yield SimSettings(5, 4.0, 1, 0, "float32", "layer")  # the old defaults
        return
    if level == "quick":
        base = SimSettings(**shipped_settings())
        seen = set()
        for change in ({}, {"rows": 1, "width": 4.0, "candidates": 2}, {"rows": 5}, {"width": 1.0}, {"width": 4.0},
                       {"candidates": 2}, {"candidates": 0}, {"prefilter": 2}, {"prefilter": 0},
                       {"sketch_dtype": "float32"}, {"rows": 5, "width": 4.0, "candidates": 2}, {"scope": "layer"}):
            cfg = SimSettings(**{**asdict(base), **change})
            if cfg not in seen:
                seen.add(cfg)
                yield cfg
        yield SimSettings(5, 4.0, 1, 0, "float32", "layer")  # the old defaults
        return
    if level == "small":
        for rows in (1, 3, 5):
            for width in (1.0, 2.0, 4.0, 8.0):
                for m in (0, 1, 2, 4):
                    yield SimSettings(rows, width, m, 1, "float16", "global")
        for rows, width in ((1, 4.0), (3, 2.0), (5, 4.0)):
            for pre in (0, 2):
                yield SimSettings(rows, width, 2, pre, "float16", "global")
    dtypes = ("float32", "float16") if level == "full" else ("float16",)
    for rows in (1, 3, 5) if level != "small" else ():
        for width in (1.0, 2.0, 4.0, 8.0):
            for m in (0, 1, 2, 4):
                for pre in (0, 1, 2):
                    for dt in dtypes:
                        if level != "full" and pre == 0 and (rows, width) not in ((5, 4.0), (3, 2.0)):
                            continue
                        yield SimSettings(rows, width, m, pre, dt, "global")
    for rows, width in ((3, 2.0), (5, 4.0), (1, 4.0)):
        for m in (1, 2):
            for pre in (0, 1):
                yield SimSettings(rows, width, m, pre, "float16", "layer")
    shipped = SimSettings(**shipped_settings())
    yield SimSettings(**{**asdict(shipped), "sketch_dtype": "float32"})
    yield SimSettings(5, 4.0, 1, 0, "float32", "layer")  # the old defaults


def run(task: Task, ratio: float, steps: int, level: str, out: Optional[str], baselines: str = "all",
        training: bool = True) -> list[dict]:
    """The baselines ("all", "core": dense and both gTop-k, "none", or a comma-separated list of
    dense, exact, gtopk, gtopk-global, allgather, sketched), then the gs grid, on one task; one
    record per method appended to ``out``."""
    P, sizes = task.ranks, task.sizes
    makers: list[Callable[[], Method]] = []
    every: dict[str, Callable[[], Method]] = {
        "dense": lambda: Dense(sizes, ratio, P), "exact": lambda: ExactTopK(sizes, ratio, P),
        "gtopk": lambda: GTopK(sizes, ratio, P, "layer"), "gtopk-global": lambda: GTopK(sizes, ratio, P, "global"),
        "allgather": lambda: TopKAllgather(sizes, ratio, P), "sketched": lambda: SketchedSGD(sizes, ratio, P)}
    names = {"all": list(every), "core": ["dense", "gtopk", "gtopk-global"], "none": []}.get(baselines)
    for name in names if names is not None else baselines.split(","):
        if training or name not in ("dense", "exact"):
            makers.append(every[name])
    seen: set[SimSettings] = set()
    for cfg in gs_grid(level):
        if cfg not in seen:
            seen.add(cfg)
            makers.append(lambda cfg=cfg: GsSketch(sizes, ratio, P, cfg))
    records = []
    for make in makers:
        rec = simulate(task, make, steps, ratio)
        records.append(rec)
        print(f"{rec['task']} P={P} ratio={ratio} {rec['method']} {rec.get('label', '')}: mass {rec['mass']:.3f} "
              f"wire {rec['wire'] / 1e3:.1f} kB loss {rec['loss'][-1]:.3f} ({rec['seconds']:.1f} s)", flush=True)
        if out:
            with open(out, "a") as f:
                f.write(json.dumps(rec) + "\n")
    return records


def compare(records: list[dict], ranks: int, cfg: dict) -> tuple[float, float]:
    """(gs mass / gTop-k mass, gs wire / gTop-k wire) for the gs global ``cfg`` at P = ranks."""
    ref = next(r for r in records if r["P"] == ranks and r["method"] == "gTop-k")
    gs = next(r for r in records if r["P"] == ranks and r["method"] == "gs global"
              and all(r[key] == value for key, value in {**cfg, "scope": "global"}.items()))
    return gs["mass"] / ref["mass"], gs["wire"] / ref["wire"]


# ---------------------------------------------------------------- report

def summary(groups: dict[tuple, list[dict]], shipped: dict) -> None:
    """One row per (task, ratio, P): both gTop-k, the shipped gs and the best gs global config
    within gTop-k's bytes."""
    print("\n### Shipped gs global vs gTop-k\n")
    print("| task | ratio | P | gTop-k mass | gTop-k (global) mass | shipped mass | shipped / gTop-k mass "
          "| shipped / gTop-k bytes | best gs global within gTop-k bytes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (task, ratio, P), rs in sorted(groups.items()):
        ref = next((r for r in rs if r["method"] == "gTop-k"), None)
        glob = next((r for r in rs if r["method"] == "gTop-k (global)"), None)
        ship = next((r for r in rs if "rows" in r and all(r.get(key) == v for key, v in shipped.items())), None)
        if not (ref and glob and ship):
            continue
        fits = [r for r in rs if r.get("scope") == "global" and r["method"] == "gs global"
                and r["wire"] <= ref["wire"] * (1 + 1e-9)]
        best = max(fits, key=lambda r: r["mass"]) if fits else None
        best_text = f"{best['label']}: {best['mass']:.3f} at {best['wire'] / 1e3:.1f} kB" if best else "–"
        print(f"| {task} | {ratio} | {P} | {ref['mass']:.3f} | {glob['mass']:.3f} | {ship['mass']:.3f} "
              f"| {ship['mass'] / ref['mass']:.2f} | {ship['wire'] / ref['wire']:.2f} | {best_text} |")


def report(paths: list[str], plot: Optional[str], loss_plot: Optional[str] = None) -> None:
    """Prints, per (task, ratio, P), the baselines and the gs configs on the Pareto front, and the
    summary; plots mass against wire bytes, and the loss curves of every record. A record read
    again (same task, ratio, P, method and settings) replaces the earlier one."""
    unique: dict[tuple, dict] = {}
    for line in (line for p in paths for line in open(p) if line.strip()):
        r = json.loads(line)
        unique[(r["task"], r["ratio"], r["P"], r["method"], r.get("label"), r.get("scope"))] = r
    records = list(unique.values())
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["task"], r["ratio"], r["P"]), []).append(r)
    shipped = {**shipped_settings(), "scope": "global"}
    for (task, ratio, P), rs in sorted(groups.items()):
        ref = next((r for r in rs if r["method"] == "gTop-k"), None)
        print(f"\n### {task}, ratio {ratio}, P = {P}\n")
        print("| method | settings | delivered mass | kB / rank / step | vs gTop-k mass | vs gTop-k bytes "
              "| final loss |")
        print("|---|---|---|---|---|---|---|")
        gs = [r for r in rs if "rows" in r]
        front = [r for r in gs if not any(o["wire"] <= r["wire"] and o["mass"] > r["mass"] for o in gs)]
        chosen = [r for r in gs if all(r.get(key) == v for key, v in shipped.items())]
        old = [r for r in gs if r["scope"] == "layer" and r["label"] == "r5 w4 m1 L0 f32"]
        show = [r for r in rs if "rows" not in r] + sorted({id(r): r for r in front + chosen + old}.values(),
                                                            key=lambda r: r["wire"])
        for r in show:
            tag = " **(shipped)**" if r in chosen else " (old default)" if r in old else ""
            has = r["method"] not in ("dense", "exact top-k")
            rel = f"{r['mass'] / ref['mass']:.2f} | {r['wire'] / ref['wire']:.2f}" if ref and has else "– | –"
            mass = f"{r['mass']:.3f}" if r["method"] != "dense" else "–"
            wire = f"{r['wire'] / 1e3:.1f}" if r["method"] != "exact top-k" else "–"
            loss = r["loss"][-1]
            print(f"| {r['method']}{tag} | {r.get('label', '')} | {mass} | {wire} | {rel} "
                  f"| {'–' if loss != loss else f'{loss:.3f}'} |")
    summary(groups, shipped)
    if loss_plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for r in records:
            smooth = np.convolve(r["loss"], np.ones(5) / 5, mode="valid")
            tag = ", shipped" if all(r.get(key) == v for key, v in shipped.items()) else ""
            tag += ", old defaults" if r.get("scope") == "layer" and r.get("label") == "r5 w4 m1 L0 f32" else ""
            ax.plot(np.arange(len(smooth)) + 5, smooth, label=f"{r['method']}{tag} {r.get('label', '')}")
        first = records[0]
        ax.set(xlabel="step", ylabel="training loss (5-step running mean)",
               title=f"{first['task']}, P = {first['P']}, ratio {first['ratio']}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(loss_plot, dpi=110)
    if plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        keys = sorted({(t, q) for t, q, _ in groups})
        ncols = min(3, len(keys))
        nrows = math.ceil(len(keys) / ncols)
        fig, grid = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 4.2 * nrows + 0.8), squeeze=False)
        axes = [list(grid.reshape(-1))]
        for ax in axes[0][len(keys):]:
            ax.axis("off")
        colours = {4: "tab:blue", 16: "tab:orange", 64: "tab:green", 256: "tab:red"}
        markers = {"gTop-k": "s", "gTop-k (global)": "D", "top-k allgather": "^", "Sketched-SGD": "v"}
        for ax, (task, ratio) in zip(axes[0], keys):
            for P in sorted(P for t, q, P in groups if (t, q) == (task, ratio)):
                rs = groups[(task, ratio, P)]
                c = colours.get(P, "k")
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
                    elif all(r.get(key) == v for key, v in shipped.items()):
                        ax.scatter(r["wire"], r["mass"], marker="*", color=c, edgecolor="k", s=160)
            ax.set(xscale="log", xlabel="bytes per rank per step (wire)", ylabel="delivered mass",
                   title=f"{task}, ratio {ratio}", ylim=(0, 1.02))
            ax.grid(True, which="both", alpha=0.3)
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], color=c, label=f"P = {P}: gs global (line: front)")
                   for P, c in colours.items()]
        handles += [Line2D([], [], ls="", marker=m, color="w", markeredgecolor="k", label=name)
                    for name, m in {**markers, "gs shipped": "*"}.items()]
        labels = [h.get_label() for h in handles]
        fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=5)
        fig.tight_layout(rect=(0, 0.8 / (4.2 * nrows + 0.8), 1, 1))
        fig.savefig(plot, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="P = 16, digits MLP, ratio 0.01, around the shipped sizes")
    p.add_argument("--run", choices=["a", "b", "c"], help="task: (a) digits MLP, (b) 1.28M MLP, (c) planted")
    p.add_argument("--ranks", default="4,16,64,256", help="comma-separated P")
    p.add_argument("--ratios", default="0.01,0.001")
    p.add_argument("--steps", type=int, help="steps per method (default 40; with --quick 20)")
    p.add_argument("--batch", type=int, default=8, help="images per worker per step")
    p.add_argument("--grid", choices=["full", "pruned", "small", "quick", "shipped", "none"], default="full")
    p.add_argument("--threads", type=int, default=2, help="torch threads (2 at most here)")
    p.add_argument("--planted-d", type=int, default=2 ** 16, help="(c): D")
    p.add_argument("--baselines", default="all", help="all, core, none or a list (see run())")
    p.add_argument("--out", help="append one JSON record per method to this file")
    p.add_argument("--report", nargs="+", help="JSONL files to tabulate")
    p.add_argument("--plot", help="with --report: PNG of mass against bytes")
    p.add_argument("--loss-plot", help="with --report: PNG of the loss curves of every record read")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    steps = args.steps if args.steps is not None else 20 if args.quick else 40
    if args.report:
        report(args.report, args.plot, args.loss_plot)
        return
    if args.quick:
        t0 = time.perf_counter()
        records = run(DigitsTask("digits MLP", 256, 16, args.batch), 0.01, steps, "quick", args.out)
        mass, wire = compare(records, 16, shipped_settings())
        print(f"({time.perf_counter() - t0:.0f} s)")
        print(f"gs_vs_gtopk P=16 delivered_mass_ratio {mass:.3f} bytes_ratio {wire:.3f}")
        return
    for ranks in map(int, args.ranks.split(",")):
        for ratio in map(float, args.ratios.split(",")):
            level = args.grid
            if args.run == "a":
                task: Task = DigitsTask("digits MLP", 256, ranks, args.batch)
            elif args.run == "b":
                task = DigitsTask("digits MLP 1.28M", 1536, ranks, args.batch)
            else:
                task = PlantedTask(ranks, args.planted_d, ratio)
            run(task, ratio, steps, level, args.out, args.baselines, training=args.run != "c")
            _HASHES.clear()


if __name__ == "__main__":
    main()
