"""The gs-SGD step on one rank, written once for every framework (arrays and kernels come
from an :class:`~gs_horovod.array_ops.ArrayOps`, collectives from a
:class:`~gs_horovod.collectives.Collectives`).

A step takes the gradients g of all compressed tensors (each flattened to float32, in name
order) and works on groups of coordinates: with ``scope="global"`` one group of all D
coordinates (the tensors concatenated), with ``scope="layer"`` one group per tensor. For a
group of n coordinates with k = ceil(ratio · n) (or the fixed ``k``)::

    u_t   = m · u_{t-1} + g_t                (momentum correction; u = g when m = 0)
    a_t   = e_{t-1} + u_t                    (error feedback: what was not sent before)
    F_t   = top-(L·k) of |a_t|               (pre-filter; F_t = everything when L = 0)
    S_t   = CountSketch(a_t restricted to F_t)           rows × cols, cols = ceil(width · k)
    S̄_t  = mean over ranks of S_t           (ONE allreduce for all groups: sketches are linear)
    C_t   = top-(m·k) of |median estimate from S̄_t|     (candidates; identical on every rank)
    v_t   = mean over ranks of a_t[C_t]      (the exact round: ONE allreduce of all candidates)
    I_t   = top-k of |v_t| within C_t (``apply="topk"``) or all of C_t (``apply="all"``)
    Δ_t   = v_t[I_t] scattered into zeros
    e_t   = a_t − a_t[I_t]   (this rank's a_t at I_t went into Δ_t); u_t[I_t] = 0 when m > 0

The exchange that nominates C_t is the sketch above or one of two exact ones, where the union
of the P sets F_r with their partial sums s_i = Σ_{r : i ∈ F_r} a_r,i (added in rank order, the
same bits everywhere) stands in for the merged sketch's estimates (C_t: the top-(m·k) of them,
m·k ≤ L·k):

- ``exchange="allgather"``: one allgather of every rank's (F_t, a_t[F_t]) (8 bytes a
  coordinate, 16(P−1)·L·k bytes through a rank). Its own defaults are no exact round and the
  whole union applied: top-k allgather.
- ``exchange="sparse"`` (Ok-Topk / SparDL style; :meth:`GsSgd._sparse`): every coordinate has
  an owner rank, a hash of its index (so hot layers spread over every owner); one alltoall
  sends each pair to its owner, which adds what it receives in rank order; two allreduces of
  256-bin histograms of |s| per group (8 + 8 bits of the float's order key) agree on a
  threshold everywhere; each owner allgathers its coordinates above it plus the best of its
  boundary bin, and every rank keeps exactly the top-(m·k) (ties: lower index). About
  32(P−1)/P·L·k bytes through a rank plus 2 KB of histograms a group: flat in P, and the same
  selection as the allgather's, bit for bit.

``exchange="auto"`` takes the allgather while its wire bytes through a rank at this P are at
most :data:`UNION_WORTH` (2) times the sparse exchange's — the whole union it applies carried up
to about twice the top k's mass — and the sparse exchange beyond (:meth:`Layout.build`): the
allgather for P ≤ 4 + 1,024/k at the default sizes. Every later stage, rule and check is the
same for every exchange.

Without the exact round (``exact=False``, m = 1): I_t = C_t, Δ_t = the estimates, and a rank
only drops the coordinates of I_t it fed the sketch (I_t ∩ F_t); under the allgather with
``apply="all"``, C_t is the whole union (so every rank drops all of F_t: top-k allgather). Either way
Σ_ranks e_t + P · Δ_t = Σ_ranks a_t exactly with the exact round: nothing is lost, only delayed.

During the first ``warmup_steps`` steps a_t itself is averaged (dense) and e_t = 0. A merged
payload with NaN/Inf means some rank's a_t was not finite (the pre-filter ranks NaN/Inf as the
largest magnitudes, so they always reach the sketch): ``nonfinite="raise"`` raises on every
rank naming the tensors, ``"skip"`` returns zero updates; either way nothing is committed.

The step is functional: it returns the new state and the adapter stores it, so TensorFlow can
run it as graph code (``ops.cond`` is ``tf.cond`` there and a plain ``if`` in torch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, Optional

import numpy as np

from .array_ops import Array, ArrayOps
from .collectives import Collectives
from .kernels import BACKENDS
from .kernels.hashing import HASH_VERSION, MAX_COLS, MAX_ROWS, hash_keys
from .wire import total_wire_bytes

NONFINITE = ("raise", "skip")
EXCHANGES = ("auto", "sketch", "allgather", "sparse")
EXACT_EXCHANGES = ("allgather", "sparse")  # send (index, value) pairs: int32 indices, no estimates
RADIX_BINS = 256  # histogram bins per group in each of the sparse exchange's two threshold rounds
# "auto" takes the allgather while its wire bytes are at most this many times the sparse
# exchange's: the whole union it applies delivered 1.40×, 1.80× and 2.01× the top k's mass at
# P = 2, 4 and 8 (scripts/bench/bench_recovery.py, docs/recovery_sparse.jsonl)
UNION_WORTH = 2.0
APPLY = ("topk", "all")
MAX_GATHERED = 2**31  # the allgather sends indices as int32
SCOPES = ("global", "layer")
ALLREDUCE_KINDS = ("allreduce", "tree")  # how a transport's allreduces run: ring (Horovod), tree (merge="mpi")
SKETCH_DTYPES = ("float16", "float32")
DEFAULT_RATIO = 0.01


def count_for(ratio: float, n: int) -> int:
    """Coordinates applied per step at ``ratio`` for a group of n: ceil(ratio · n), in [1, n]
    (the rule of every method, gs-SGD and the baselines alike)."""
    return min(n, max(1, math.ceil(ratio * n)))


def _check_number(name: str, value: Any, kind: type, low: float, high: float, *, low_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise TypeError(f"{name} must be {'a number' if kind is float else 'an int'}, got {type(value).__name__}")
    if math.isnan(value) or value < low or value > high or (low_open and value == low):
        left = "(" if low_open else "["
        raise ValueError(f"{name} must be in {left}{low}, {high}], got {value!r}")


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


@dataclass(frozen=True)
class GsConfig:
    """Options of gs-SGD, validated at construction. The sketch's default sizes (rows 3, width 2,
    one round of k candidates, pre-filter 1, float16 sketch) and ``exchange="auto"``'s rule were
    chosen by measured delivered mass per wire byte (``scripts/bench/bench_recovery.py``,
    docs/design.md "Recovery" and "Exchange by P").

    scope: "global" (one sketch of all compressed coordinates per step, k = ceil(ratio · D))
        or "layer" (one sketch per tensor, k = ceil(ratio · d) each).
    ratio: fraction of coordinates applied per step, in (0, 1]; default 0.01 unless ``k`` is given.
    k: a fixed k per group instead of ``ratio`` (a group smaller than k is an error).
    rows: sketch rows r (odd gives a clean median).
    width: sketch columns per row as a multiple of k, at least 1: cols = ceil(width · k).
    candidates: m; the sketch nominates m·k coordinates and the exact round picks k of them
        (m > 1 needs the exact round).
    apply: "topk" applies the k largest of the m·k exact values fetched (without the exact
        round: of the estimates); "all" applies every value delivered: all m·k exact values, or
        without the exact round every estimate (under the allgather: the whole union of the
        ranks' pre-filtered sets with their partial sums, which is top-k allgather). None: the
        exchange's own, "all" for the allgather without the exact round, else "topk".
    exchange: what nominates the candidates: "sketch" (the paper's method), "allgather" (every
        rank's pre-filtered coordinates to every rank), "sparse" (the same coordinates summed
        by their owners, the top-(m·k) of the sums to every rank: flat in P), or "auto": the
        allgather while its wire bytes are at most twice the sparse exchange's, else "sparse".
    prefilter: L; each rank sketches only its own top-(L·k) coordinates of a_t (0: all of a_t).
    sketch_dtype: "float16" halves the sketch's bytes on the wire; "float32".
    seed: hash seed; must be equal on every rank.
    exact: run the second, (m·k)-sized allreduce for the exact values of the candidates. None:
        the exchange's own, True for the sketch (and whenever m > 1), False for the allgather and
        the sparse exchange (their values are exact sums already).
    warmup_steps: steps sent dense before sketching starts.
    min_size: tensors with fewer elements are sent dense, uncompressed.
    momentum: momentum-correction factor m in [0, 1) (use with a momentum-free optimizer).
    backend: sketch kernels: "auto", "torch", "numba" (CPU) or "cuda" (Numba CUDA); torch only.
    nonfinite: a NaN/Inf in a merged payload: "raise" on every rank, or "skip" the step's update;
        either way residuals stay as before the step.
    check_every: every N steps, compare a checksum of the selected indices across ranks and
        raise on every rank if they differ (0: never; a debugging aid, costs a sync).
    """

    scope: str = "global"
    ratio: Optional[float] = None
    k: Optional[int] = None
    rows: int = 3
    width: float = 2.0
    candidates: int = 1
    apply: Optional[str] = None
    exchange: str = "auto"
    prefilter: int = 1
    sketch_dtype: str = "float16"
    seed: int = 0
    exact: Optional[bool] = None
    warmup_steps: int = 0
    min_size: int = 1024
    momentum: float = 0.0
    backend: str = "auto"
    nonfinite: str = "raise"
    check_every: int = 0

    def __post_init__(self) -> None:
        _check_choice("scope", self.scope, SCOPES)
        if self.ratio is not None:
            _check_number("ratio", self.ratio, float, 0.0, 1.0, low_open=True)
        if self.k is not None:
            _check_number("k", self.k, int, 1, 2**62)
            if self.ratio is not None:
                raise ValueError(f"give either ratio or k, not both (got ratio={self.ratio}, k={self.k})")
        _check_number("rows", self.rows, int, 1, MAX_ROWS)
        _check_number("width", self.width, float, 1.0, float(MAX_COLS))  # fewer columns than k: no room for k
        _check_number("candidates", self.candidates, int, 1, 1024)
        _check_number("prefilter", self.prefilter, int, 0, 1024)
        _check_choice("sketch_dtype", self.sketch_dtype, SKETCH_DTYPES)
        _check_number("seed", self.seed, int, 0, 2**64 - 1)
        if self.exact is not None and not isinstance(self.exact, bool):
            raise TypeError(f"exact must be a bool or None, got {type(self.exact).__name__}")
        if self.candidates > 1 and self.exact is False:
            raise ValueError(f"candidates={self.candidates} needs the exact round (exact=True)")
        if self.apply is not None:
            _check_choice("apply", self.apply, APPLY)
        _check_choice("exchange", self.exchange, EXCHANGES)
        _check_number("warmup_steps", self.warmup_steps, int, 0, 2**62)
        _check_number("min_size", self.min_size, int, 1, 2**62)
        _check_number("momentum", self.momentum, float, 0.0, 1.0)
        if self.momentum == 1.0:
            raise ValueError("momentum must be in [0.0, 1.0), got 1.0")
        _check_choice("backend", self.backend, BACKENDS)
        _check_choice("nonfinite", self.nonfinite, NONFINITE)
        _check_number("check_every", self.check_every, int, 0, 2**62)

    def exact_for(self, exchange: str) -> bool:
        """Whether the exact round runs under ``exchange`` (one of "sketch", "allgather", "sparse")."""
        if self.exact is not None:
            return self.exact
        return exchange == "sketch" or self.candidates > 1

    def apply_for(self, exchange: str) -> str:
        """What is applied under ``exchange`` (one of "sketch", "allgather", "sparse")."""
        if self.apply is not None:
            return self.apply
        return "all" if exchange == "allgather" and not self.exact_for(exchange) else "topk"

    def k_for(self, n: int) -> int:
        """Coordinates applied per step for a group of n coordinates."""
        if self.k is not None:
            return self.k
        return count_for(DEFAULT_RATIO if self.ratio is None else self.ratio, n)

    def cols_for(self, n: int) -> int:
        """Sketch columns for a group of n coordinates."""
        return min(MAX_COLS, max(1, math.ceil(self.width * self.k_for(n))))

    def digest(self) -> int:
        """A 62-bit digest of everything that must agree across ranks (options and hash version)."""
        import zlib

        return zlib.crc32(repr((self, HASH_VERSION)).encode()) & (2**62 - 1)


@dataclass(frozen=True)
class Group:
    """A run of coordinates [start, start + size) of the step's vector, sketched together."""

    start: int
    size: int
    k: int
    cols: int
    fed: int  # coordinates each rank feeds the exchange (L·k, or size without pre-filter)
    candidates: int  # coordinates the exchange nominates (m·k; at most L·k under the exact exchanges)


class Payload(NamedTuple):
    """Bytes one rank hands to collectives in one step, by collective: the sketch merge, the
    allgather (the allgather exchange's pairs, or the sparse exchange's selected pairs: this
    rank's share), the sparse exchange's alltoall and its two threshold histograms (``select``,
    both rounds together), the exact round and the small tensors (``dense``)."""

    sketch: int = 0
    gather: int = 0
    alltoall: int = 0
    select: int = 0
    exact: int = 0
    dense: int = 0


def collectives_of(payload: Payload, merge: str = "allreduce") -> list[tuple[str, float]]:
    """A step's (kind, payload bytes) collectives (:mod:`gs_horovod.wire`) in issue order, the
    empty ones left out: the sketch merge, the threshold rounds and the exact round (with the
    small tensors) as ``merge`` ("allreduce", or "tree" under merge="mpi"), the allgather as
    "allgather", the alltoall as "alltoall". The one place a payload becomes collectives."""
    step = [(merge, payload.sketch), ("alltoall", payload.alltoall), (merge, payload.select / 2),
            (merge, payload.select / 2), ("allgather", payload.gather), (merge, payload.exact + payload.dense)]
    return [(kind, float(n)) for kind, n in step if n]


@dataclass(frozen=True)
class Layout:
    """Where each tensor of a step sits, and the groups that are sketched.

    names / sizes / offsets: the compressed tensors (sorted by name) in the step's vector of
    ``total`` = D coordinates; dense_names / dense_sizes: the tensors below ``min_size``, sent
    exactly (appended to the exact round, or averaged as they are); groups: see :class:`Group`;
    exchange: "sketch", "allgather" or "sparse", the config's choice for ``ranks`` (P) ranks;
    exact / apply: the config's for that exchange (:meth:`GsConfig.exact_for`,
    :meth:`GsConfig.apply_for`); ranks: P; allreduce_kind: the :mod:`gs_horovod.wire` kind the
    transport's allreduces run as ("allreduce": Horovod's ring; "tree": recursive doubling,
    merge="mpi"), which prices them in :meth:`collectives` and "auto".
    """

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    offsets: tuple[int, ...]
    groups: tuple[Group, ...]
    total: int
    dense_names: tuple[str, ...] = ()
    dense_sizes: tuple[int, ...] = ()
    exchange: str = "sketch"
    exact: bool = True
    apply: str = "topk"
    ranks: int = 1
    allreduce_kind: str = "allreduce"

    @classmethod
    def build(cls, names: list[str], sizes: list[int], config: GsConfig, dense_names: tuple[str, ...] = (),
              dense_sizes: tuple[int, ...] = (), *, ranks: int, allreduce_kind: str = "allreduce") -> Layout:
        """``names`` must be sorted (every rank lays tensors out alike); raises if k > a group.
        ``exchange="auto"`` lays out the allgather and the sparse exchange, each with its exact
        round as :meth:`GsConfig.exact_for` says, and keeps the allgather while its wire bytes at
        P = ``ranks``, with the allreduces (threshold rounds, exact round, small tensors) priced as
        ``allreduce_kind`` (:meth:`collectives` through :func:`gs_horovod.wire.total_wire_bytes`),
        are at most :data:`UNION_WORTH` times the sparse exchange's: the rule that measured
        delivered mass per wire byte gives (docs/design.md, "Exchange by P"). The sketch never
        delivered more per byte than the sparse exchange, so "auto" never picks it."""
        _check_choice("allreduce_kind", allreduce_kind, ALLREDUCE_KINDS)
        offsets, start = _starts(tuple(sizes)), sum(sizes)
        if config.scope == "global":
            spans = [(0, start, "all compressed tensors")] if start else []
        else:
            spans = list(zip(offsets, sizes, names))
        groups = []
        for first, size, name in spans:
            if config.k is not None and config.k > size:
                raise ValueError(f"k={config.k} exceeds the {size} elements of {name!r} (scope={config.scope!r}); "
                                 "raise min_size above k or use ratio")
            k = config.k_for(size)
            fed = min(size, config.prefilter * k) if config.prefilter else size
            groups.append(Group(first, size, k, config.cols_for(size), fed, min(size, config.candidates * k)))
        def laid_out(exchange: str) -> Layout:
            if exchange in EXACT_EXCHANGES:
                if start >= MAX_GATHERED:
                    raise ValueError(f"exchange={exchange!r} sends int32 indices: {start} coordinates is too many")
                chosen = [replace(g, candidates=min(g.candidates, g.fed)) for g in groups]
            else:
                chosen = groups
            return cls(tuple(names), tuple(sizes), tuple(offsets), tuple(chosen), start, tuple(dense_names),
                       tuple(dense_sizes), exchange, config.exact_for(exchange), config.apply_for(exchange), ranks,
                       allreduce_kind)

        if config.exchange != "auto":
            return laid_out(config.exchange)
        if start >= MAX_GATHERED:
            return laid_out("sketch")
        gather, sparse = laid_out("allgather"), laid_out("sparse")
        wire = {plan.exchange: total_wire_bytes(plan.collectives(config), ranks) for plan in (gather, sparse)}
        return gather if wire["allgather"] <= UNION_WORTH * wire["sparse"] else sparse

    @classmethod
    def split(cls, named: list[tuple[str, int]], config: GsConfig, *, ranks: int,
              allreduce_kind: str = "allreduce") -> Layout:
        """The layout of tensors given as (name, elements) on ``ranks`` ranks whose transport runs
        allreduces as ``allreduce_kind`` (:meth:`build`): those of at least
        ``min_size`` elements are compressed, the others sent exactly; each kind sorted by name.
        The one place the ``min_size`` split is made."""
        named = sorted(named)
        big = [(n, d) for n, d in named if d >= config.min_size]
        small = [(n, d) for n, d in named if d < config.min_size]
        return cls.build([n for n, _ in big], [d for _, d in big], config, tuple(n for n, _ in small),
                         tuple(d for _, d in small), ranks=ranks, allreduce_kind=allreduce_kind)

    @property
    def all_names(self) -> tuple[str, ...]:
        return self.names + self.dense_names

    @property
    def all_sizes(self) -> tuple[int, ...]:
        return self.sizes + self.dense_sizes

    @property
    def all_offsets(self) -> tuple[int, ...]:
        """Offsets of every tensor (compressed, then dense) in a step's update, (D + dense,)."""
        return self.offsets + tuple(self.total + o for o in _starts(self.dense_sizes))

    def payload_bytes(self, config: GsConfig, dense: bool = False, gathered: Any = None) -> Payload:
        """The :class:`Payload` one rank hands to collectives in one step: a compressed step (as
        ``exchange``), or with ``dense`` (warm-up, or nothing to sketch) everything at 4 bytes.
        The sparse exchange's allgather is what the rank sent, 8 bytes for each of the
        ``gathered`` pairs (:class:`StepResult`; an int or a scalar tensor), or, planned
        (None), an even share of 8·m·k/P bytes."""
        if dense or not self.groups:
            return Payload(dense=(self.total + sum(self.dense_sizes)) * 4)
        itemsize = 2 if config.sketch_dtype == "float16" else 4
        exact = sum(g.candidates for g in self.groups) * 4 if self.exact else 0
        small = sum(self.dense_sizes) * 4
        if self.exchange == "sketch":
            return Payload(sketch=sum(config.rows * g.cols for g in self.groups) * itemsize, exact=exact, dense=small)
        fed = sum(8 * g.fed for g in self.groups)
        if self.exchange == "allgather":
            return Payload(gather=fed, exact=exact, dense=small)
        share = math.ceil(sum(8 * g.candidates for g in self.groups) / self.ranks) if gathered is None else 8 * gathered
        return Payload(gather=share, alltoall=fed, select=2 * 4 * RADIX_BINS * len(self.groups), exact=exact,
                       dense=small)

    def collectives(self, config: GsConfig, dense: bool = False) -> list[tuple[str, float]]:
        """One step's (kind, payload bytes) collectives (:func:`collectives_of` of
        :meth:`payload_bytes`, the allreduces as ``allreduce_kind``)."""
        return collectives_of(self.payload_bytes(config, dense), self.allreduce_kind)


def _starts(sizes: tuple[int, ...]) -> list[int]:
    out, start = [], 0
    for d in sizes:
        out.append(start)
        start += d
    return out


@dataclass
class StepResult:
    """What one step returns: ``update`` (D + dense,) f32, every tensor's update in
    ``layout.all_names`` order at ``layout.all_offsets``; the state to store: ``residual`` (D,)
    f32, ``momentum`` (D,) f32 (None when m = 0) and ``steps``; ``applied``, a predicate, false
    when ``nonfinite="skip"`` dropped the step; ``gathered``: the (index, value) pairs this rank
    put into the sparse exchange's allgather (0 otherwise).
    Under TensorFlow every tensor here carries a control dependency on the step's checks
    (options, NaN/Inf, selections)."""

    update: Array
    residual: Array
    momentum: Optional[Array]
    steps: Any
    applied: Any
    gathered: Any = 0


class GsSgd:
    """gs-SGD for one optimizer on one rank: config, array ops and collectives; stateless
    itself (:class:`gs_horovod.state.GsState`, or TF's variables, keep what a step returns)."""

    def __init__(self, config: GsConfig, ops: ArrayOps, comm: Collectives) -> None:
        self.config, self.ops, self.comm = config, ops, comm
        self.keys = hash_keys(config.seed)

    def step(self, layout: Layout, grads: list[Array], residual: Array, momentum: Optional[Array], steps: Any,
             check_options: Any, dense: list[Array] = ()) -> StepResult:
        """One step of every tensor of ``layout``: ``grads`` (d_i,) f32 of the compressed tensors
        in its order, their ``residual`` e (D,) f32 and ``momentum`` (D,) f32 (None when m = 0),
        and ``dense`` (d_j,) f32, the tensors sent exactly. ``steps``: steps done so far (int or
        scalar tensor); ``check_options``: a predicate, true at an optimizer's first step, to
        compare the options' digest across ranks first. a = e + u is the one (D,) buffer the
        step writes: it becomes the new residual in place."""
        cfg, ops = self.config, self.ops
        checks = [ops.when(check_options, self._check_options)]
        a = u = None
        if layout.names:
            if cfg.momentum:
                u = ops.add_parts(momentum * cfg.momentum, grads)
                a = residual + u
            else:
                a = ops.add_parts(residual, grads)
        exact_part = ops.concat(list(dense)) if layout.dense_names else None
        # no momentum travels as () through ops.cond / ops.after (TF's nest has no None leaves)
        state = (layout, a, u, exact_part, residual, () if momentum is None else momentum, steps, checks)
        if not layout.groups:
            out = self._dense(*state)
        elif cfg.warmup_steps:
            out = ops.cond(steps < cfg.warmup_steps, lambda: self._dense(*state), lambda: self._sketched(*state))
        else:
            out = self._sketched(*state)
        update, residual, momentum, steps, applied, gathered = out
        return StepResult(update, residual, None if isinstance(momentum, tuple) else momentum, steps, applied,
                          gathered)

    def _check_options(self) -> Any:
        same = self.comm.same_on_every_rank(self.config.digest(), "gs_horovod.options")
        return self.ops.fail_unless(same, ValueError, lambda: [
            "GsSketch options differ across ranks (seed, sizes or modes must be equal on every rank); "
            f"this rank has {self.config} with hash version {HASH_VERSION}"])

    def _dense(self, layout: Layout, a: Array, u: Array, dense: Array, residual: Array, momentum: Array,
               steps: Any, checks: list[Any]) -> tuple:
        """Warm-up (and steps with nothing to sketch): everything averaged as it is; residual
        and momentum restart at zero."""
        ops = self.ops
        full = ops.concat([x for x in (a, dense) if x is not None])
        mean = self.comm.allreduce(full, "gs_horovod.dense")
        finite = ops.all_finite(mean)
        checks = [*checks, self._fail_unless_finite(layout, finite, a, dense, steps)]
        new_momentum = ops.zeros((layout.total,), full) if self.config.momentum else ()
        return self._finish(layout, finite, mean, ops.zeros((layout.total,), full), new_momentum, residual, momentum,
                            steps, checks, ops.count_of(0))

    def _sketched(self, layout: Layout, a: Array, u: Array, dense: Array, residual: Array, momentum: Array,
                  steps: Any, checks: list[Any]) -> tuple:
        cfg, ops = self.config, self.ops
        pairs = layout.exchange in EXACT_EXCHANGES
        fed = [ops.top_abs(ops.slice(a, g.start, g.size), g.fed) + g.start for g in layout.groups] \
            if cfg.prefilter or pairs else []
        gathered = ops.count_of(0)
        if layout.exchange == "sparse":
            picks, finite, gathered = self._sparse(layout, a, fed)
        elif layout.exchange == "allgather":
            picks, finite = self._gather(layout, a, fed)
        else:
            picks, finite = self._sketch(layout, a, fed)
        checks = [*checks, self._fail_unless_finite(layout, finite, a, dense, steps)]
        n_dense = sum(layout.dense_sizes)
        if layout.exact:
            cand = ops.concat([idx for idx, _ in picks])
            ncand = sum(grp.candidates for grp in layout.groups)
            local = ops.take(a, cand) if dense is None else ops.concat([ops.take(a, cand), dense])
            reduced = self.comm.allreduce(local, "gs_horovod.exact")
            exact, dense_mean = ops.slice(reduced, 0, ncand), ops.slice(reduced, ncand, n_dense)
            finite = ops.logical_and(finite, ops.all_finite(reduced))
            checks.append(self._fail_unless_finite(layout, finite, a, dense, steps))
            if layout.apply == "all":
                sel, values = cand, exact
            else:
                chosen, values, first = [], [], 0
                for grp in layout.groups:
                    vals = ops.slice(exact, first, grp.candidates)
                    best = ops.top_abs(vals, grp.k)
                    chosen.append(ops.take(ops.slice(cand, first, grp.candidates), best))
                    values.append(ops.take(vals, best))
                    first += grp.candidates
                sel, values = ops.concat(chosen), ops.concat(values)
            sent = ops.take(a, sel)
        else:
            sel, values = ops.concat([idx for idx, _ in picks]), ops.concat([est for _, est in picks])
            sent = ops.take(a, sel)
            if fed:
                sent = ops.where(ops.isin_sorted(sel, ops.concat(fed)), sent, ops.zeros_like(sent))
            dense_mean = None
            if dense is not None:
                dense_mean = self.comm.allreduce(dense, "gs_horovod.dense")
                finite = ops.logical_and(finite, ops.all_finite(dense_mean))
                checks.append(self._fail_unless_finite(layout, finite, a, dense, steps))
        if cfg.check_every:
            checks.append(ops.when(steps % cfg.check_every == 0, lambda: self._check_selection(sel, steps)))
        new_momentum = ops.scatter_sub(u, sel, ops.take(u, sel)) if cfg.momentum else ()
        new_residual = ops.scatter_sub(a, sel, sent)
        update = ops.scatter(layout.total, sel, values, a, dense_mean)
        return self._finish(layout, finite, update, new_residual, new_momentum, residual, momentum, steps, checks,
                            gathered)

    def _sketch(self, layout: Layout, a: Array, fed: list[Array]) -> tuple[list[tuple[Array, Array]], Any]:
        """Each group's candidates (idx (m·k,) ascending, estimates (m·k,) f32) from the merged
        sketch of a restricted to ``fed`` (every coordinate when empty), and whether the merged
        tables are finite."""
        cfg, ops = self.config, self.ops
        tables = []
        for i, grp in enumerate(layout.groups):
            table = ops.zeros((cfg.rows, grp.cols), a)
            if fed:
                table = ops.sketch_accumulate_at(table, fed[i] - grp.start, ops.take(a, fed[i]), self.keys)
            else:
                table = ops.sketch_accumulate(table, ops.slice(a, grp.start, grp.size), self.keys, 0)
            tables.append(ops.reshape(table, (-1,)))
        merged = ops.cast(self.comm.allreduce(ops.cast(ops.concat(tables), cfg.sketch_dtype), "gs_horovod.sketch"),
                          "float32")
        picks, start = [], 0
        for grp in layout.groups:
            table = ops.reshape(ops.slice(merged, start, cfg.rows * grp.cols), (cfg.rows, grp.cols))
            start += cfg.rows * grp.cols
            idx, est = ops.heavy_hitters(table, self.keys, grp.size, grp.candidates)
            picks.append((idx + grp.start, est))
        return picks, ops.all_finite(merged)

    def _gather(self, layout: Layout, a: Array, fed: list[Array]) -> tuple[list[tuple[Array, Array]], Any]:
        """Each group's candidates (idx ascending, estimates f32): the m·k of largest |partial
        sum| in the union of every rank's ``fed`` set (the whole union with ``apply="all"`` and
        no exact round), from one allgather of (index, value) pairs; the estimate is the partial
        sum as ``allreduce`` reduces (mean or sum). Also whether every gathered value is finite."""
        ops, P = self.ops, self.comm.size
        mine = ops.concat(fed)
        n = sum(g.fed for g in layout.groups)
        idx, vals = ops.unpairs(ops.reshape(self.comm.allgather(ops.pairs(mine, ops.take(a, mine)),
                                                                "gs_horovod.gather"), (-1,)))
        union, sums = self._union_sum(idx, vals, ops.from_numpy(np.full(P, n, np.int32)))
        picks = []
        whole = layout.apply == "all" and not layout.exact
        for grp, (first, size) in zip(layout.groups, ops.spans(union, [g.start for g in layout.groups])):
            g_union, g_sums = ops.slice(union, first, size), ops.slice(sums, first, size)
            if not whole:
                best = ops.top_abs(g_sums, grp.candidates)
                g_union, g_sums = ops.take(g_union, best), ops.take(g_sums, best)
            picks.append((g_union, g_sums))
        return picks, ops.all_finite(vals)

    def _union_sum(self, idx: Array, vals: Array, counts: Array) -> tuple[Array, Array]:
        """(union (u,) int64 ascending, s (u,) f32): the coordinates of every rank's pairs (rank
        r's ``counts[r]`` pairs, in rank order, each rank's indices distinct) and their sums
        added in rank order, divided by P when ``allreduce`` averages (as it would)."""
        union, sums = self.ops.union_sum(idx, vals, counts)
        return union, sums / self.comm.size if self.comm.averages else sums

    def _sparse(self, layout: Layout, a: Array, fed: list[Array]) -> tuple:
        """The sparse exchange: (picks as :meth:`_gather`'s, the top-(m·k) of the union's sums
        per group, on every rank alike; whether they are finite; the pairs this rank allgathered).

        1. alltoall: coordinate i belongs to rank owner(i), a hash of i (:meth:`ArrayOps.owner_of`:
           spread evenly whatever the layers' sizes and strides); rank r sends each of its pairs
           (F_r, a_r[F_r]) to its owner, which adds what it receives in rank order.
        2. threshold: per group, the owners' histograms of the order key of |s| (NaN highest:
           :meth:`ArrayOps.abs_key`), 8 high bits, then 8 more bits within the bin that holds the
           (m·k)-th largest, each summed by one allreduce, give the 16-bit key prefix t of the
           (m·k)-th largest, how many lie above it, and so how many ``ties`` of prefix t to take.
        3. allgather: each owner sends its pairs above t and its best ``ties`` of prefix t (by
           key, then lower index); every rank sorts what it gathers by index and keeps the above
           ones and the best ``ties`` of all prefix-t pairs: the same m·k coordinates everywhere.
           A pair above t lies in every rank's selection, so NaN/Inf anywhere in the sums reaches
           every rank.
        Nothing here depends on which rank owns what: the sums are the allgather's, bit for bit.
        """
        ops, comm = self.ops, self.comm
        mine = ops.concat(fed)
        owner = ops.owner_of(mine, comm.size, self.keys)
        routed = ops.take(mine, ops.stable_order(owner))  # by owner; ascending within each
        splits = ops.count(owner, comm.size) * 2  # two floats a pair
        received, got = comm.alltoall(ops.pairs(routed, ops.take(a, routed)), splits, "gs_horovod.sparse")
        idx, vals = ops.unpairs(received)
        union, sums = self._union_sum(idx, vals, got // 2)
        starts = ops.from_numpy(np.array([g.start for g in layout.groups] + [layout.total], np.int64), union)
        wanted = ops.from_numpy(np.array([g.candidates for g in layout.groups], np.int32), union)
        groups = len(layout.groups)
        group, key = ops.bucket(union, starts), ops.abs_key(sums)
        high = ops.key_bits(key, 23, 8)  # exponent: 8 bits
        cut_high, above = ops.radix_cut(comm.allreduce_sum(ops.count(group * RADIX_BINS + high,
                                                                      groups * RADIX_BINS), "gs_horovod.select.high"),
                                        wanted)
        in_cut = ops.equal_at(high, ops.take(cut_high, group))
        low = ops.key_bits(key, 15, 8)  # 8 more bits: the 16-bit prefix pins |s| to 2^-8
        cut_low, above_low = ops.radix_cut(
            comm.allreduce_sum(ops.count(group * RADIX_BINS + low, groups * RADIX_BINS, in_cut),
                               "gs_horovod.select.low"), wanted - above)
        prefix, ties = cut_high * RADIX_BINS + cut_low, wanted - above - above_low
        keep = ops.keep_top(ops.key_bits(key, 15, 16), key, group, prefix, ties)
        chosen = ops.take(union, keep)
        gathered = ops.reshape(comm.allgather(ops.pairs(chosen, ops.take(sums, keep)), "gs_horovod.sparse.selected"),
                               (-1,))
        out_idx, out_vals = ops.unpairs(gathered)
        ascending = ops.stable_order(out_idx)
        out_idx, out_vals = ops.take(out_idx, ascending), ops.take(out_vals, ascending)
        out_key, out_group = ops.abs_key(out_vals), ops.bucket(out_idx, starts)
        keep = ops.keep_top(ops.key_bits(out_key, 15, 16), out_key, out_group, prefix, ties)
        sel, est = ops.take(out_idx, keep), ops.take(out_vals, keep)
        picks, first = [], 0
        for grp in layout.groups:
            picks.append((ops.slice(sel, first, grp.candidates), ops.slice(est, first, grp.candidates)))
            first += grp.candidates
        return picks, ops.all_finite(est), ops.count_of(ops.size_of(chosen))

    def _finish(self, layout: Layout, finite: Any, update: Array, new_residual: Array, new_momentum: Any,
                residual: Array, momentum: Any, steps: Any, checks: list[Any], gathered: Any) -> tuple:
        """(update, residual, momentum, steps, applied, gathered), all after
        ``checks``; under nonfinite="skip" a non-finite step keeps the old state and returns a
        zero update (on every rank alike: the merged payloads are the same everywhere)."""
        ops = self.ops
        applied = (update, new_residual, new_momentum, steps + 1, finite, gathered)
        if self.config.nonfinite == "skip":
            zeros = ops.zeros((layout.total + sum(layout.dense_sizes),), update)
            applied = ops.cond(finite, lambda: applied,
                               lambda: (zeros, residual, momentum, steps, finite, gathered))
        return ops.after(checks, applied)

    def _fail_unless_finite(self, layout: Layout, finite: Any, a: Array, dense: Array, steps: Any) -> Any:
        """Under nonfinite="raise", fails on every rank (the merged payload is the same
        everywhere) naming the tensors whose a_t is NaN/Inf on some rank; one small allreduce,
        on the error path only."""
        ops = self.ops
        if self.config.nonfinite != "raise":
            return ops.when(False, lambda: None)

        def message() -> list[Any]:
            parts = [(a, o, d) for o, d in zip(layout.offsets, layout.sizes)]
            parts += [(dense, o, d) for o, d in zip(_starts(layout.dense_sizes), layout.dense_sizes)]
            flags = [ops.not_finite(ops.slice(x, o, d)) for x, o, d in parts]
            anywhere = self.comm.allreduce(ops.stack(flags), "gs_horovod.nonfinite")
            return ["GsSketch: the gradient of ", ops.join_names(layout.all_names, anywhere),
                    " is NaN or infinite on at least one rank at step ", steps,
                    "; residuals are left as before the step. GsSketch(nonfinite='skip') skips such steps instead."]

        return ops.fail_unless(finite, FloatingPointError, message)

    def _check_selection(self, sel: Array, steps: Any) -> Any:
        same = self.comm.same_on_every_rank(self.ops.checksum(sel), "gs_horovod.selections")
        return self.ops.fail_unless(same, RuntimeError, lambda: [
            "GsSketch: ranks selected different heavy hitters at step ", steps,
            " (checked because check_every is set); their models are diverging"])
