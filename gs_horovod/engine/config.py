"""The options of gs-SGD (:class:`GsConfig`), validated once for every adapter, and the rule
that turns a ratio into a count (:func:`count_for`)."""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, fields
from typing import Any, Optional

from ..codecs import CODECS, PairCodec
from ..kernels import BACKENDS
from ..kernels.hashing import HASH_VERSION, MAX_COLS, MAX_ROWS
from .density import DEFAULT_BUDGET
from .exchanges import EXCHANGES

NONFINITE = ("raise", "skip")
APPLY = ("topk", "all")
SCOPES = ("global", "layer")
SKETCH_DTYPES = ("float16", "float32")
UNMEASURED_RATIO = 0.01  # a ratio="auto" plan built with no level: outside a measured step (tests, benchmarks)


def count_for(ratio: float, n: int) -> int:
    """Coordinates applied per step at ``ratio`` for a group of n: ceil(ratio · n), in [1, n]
    (the rule of every method, gs-SGD and the baselines alike)."""
    return min(n, max(1, math.ceil(ratio * n)))


def check_number(name: str, value: Any, kind: type, low: float, high: float, *, low_open: bool = False) -> None:
    """Raises TypeError / ValueError naming ``name`` unless ``value`` is a ``kind`` (int, or float:
    any number) in [low, high] (``low_open``: (low, high])."""
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise TypeError(f"{name} must be {'a number' if kind is float else 'an int'}, got {type(value).__name__}")
    if math.isnan(value) or value < low or value > high or (low_open and value == low):
        left = "(" if low_open else "["
        raise ValueError(f"{name} must be in {left}{low}, {high}], got {value!r}")


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    """Raises ValueError naming ``name`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


@dataclass(frozen=True)
class GsConfig:
    """Options of gs-SGD, validated at construction (TypeError / ValueError naming the option).
    The defaults of the sketch's sizes and ``exchange="auto"``'s rule: docs/design.md
    ("Recovery", "Exchange by P") gives the measurements they come from.

    scope: "global" (one group of all compressed coordinates per step, k = ceil(ratio · D))
        or "layer" (one group per tensor, k = ceil(ratio · d) each).
    ratio: fraction of coordinates applied per step, in (0, 1], or "auto" (the default, also
        spelled None): the density follows the measured step (:mod:`gs_horovod.engine.density`:
        dense float16 steps first, then the densest level whose exchange takes at most
        ``budget`` times the step's compute).
    k: a fixed k per group instead of ``ratio`` (a group smaller than k is an error).
    budget: under ``ratio="auto"``, the exchange's seconds allowed per second of compute
        (default 0.5); an error with an explicit ``ratio`` or ``k``.
    ramp: under ``ratio="auto"``, DGC's exponential density warm-up over the first ``ramp``
        steps (:func:`~gs_horovod.engine.density.ramp_floor`: at least 0.2, 0.05, 0.02, then 0.005
        of D a quarter each); 0: off. An error with an explicit ``ratio`` or ``k``.
    critical: under ``ratio="auto"``, Accordion's threshold η (its authors' 0.5): a window whose
        mean gradient norm (the ranks' mean of their own ‖g‖; under FSDP2 of their shards, over
        the replicas) changed by at least η relative to the previous window's is a critical regime
        and the next window is sent dense; 0: off. An error with an explicit ``ratio`` or ``k``.
    rows: sketch rows r (odd gives a clean median).
    width: sketch columns per row as a multiple of k, at least 1: cols = ceil(width · k).
    candidates: m; the exchange nominates m·k coordinates and the exact round picks k of them
        (m > 1 needs the exact round; the exchanges that send pairs nominate from each rank's
        top-(L·k), so m > L is an error there).
    apply: "topk" applies the k largest of the m·k exact values fetched (without the exact
        round: of the estimates); "all" applies every value delivered: all m·k exact values, or
        without the exact round every estimate (under the allgather: the whole union of the
        ranks' pre-filtered sets with their partial sums, which is top-k allgather). None: the
        exchange's own (:meth:`~gs_horovod.engine.exchanges.base.Exchange.default_apply`).
    exchange: what nominates the candidates (:data:`~gs_horovod.engine.exchanges.EXCHANGES`):
        "sketch" (the paper's method), "allgather" (every rank's pre-filtered coordinates to
        every rank), "sparse" (the same coordinates summed by their owners, the top-(m·k) of the
        sums to every rank: flat in P), or "auto": the allgather while its wire bytes are at
        most twice the sparse exchange's, else "sparse" (:meth:`~gs_horovod.engine.plan.Plan.build`).
    prefilter: L; each rank feeds the exchange only its own top-(L·k) coordinates of a_t (0: all).
    sketch_dtype: "float16" halves the sketch's bytes on the wire; "float32".
    wire: how the exchanges that send (index, value) pairs encode them: "fp32" (an int32 index
        and a float32 value, 8 bytes a pair; a vector of fewer than 2^31 coordinates) or
        "compact" (Elias–Fano indices and bfloat16 values, :mod:`gs_horovod.codecs.compact`:
        about 3.5 bytes a pair at k = D/1000, any vector length; what rounding takes from a
        rank's value stays in its residual, and an owner keeps what rounding its sum lost) or
        "compact8" (the same indices, values in 8-bit E4M3 with one power-of-two scale a
        message: about 2.5 bytes a pair at k = D/1000; relative rounding error at most 2^-4 for
        values within 2^-13 of the message's largest, smaller ones flushed towards zero, the
        rounding kept in the residuals; scope="global" only). Every name in
        :data:`gs_horovod.codecs.CODECS`.
    seed: hash seed; must be equal on every rank.
    exact: run the second, (m·k)-sized allreduce for the exact values of the candidates. None:
        the exchange's own (True for the sketch, False for the allgather and the sparse exchange,
        whose values are exact sums already), and True whenever m > 1.
    warmup_steps: steps sent dense before compression starts.
    min_size: tensors with fewer elements are sent dense, uncompressed.
    momentum: momentum-correction factor m in [0, 1) (use with a momentum-free optimizer).
    backend: kernels: "auto", "torch", "numba" (CPU) or "cuda" (Numba CUDA); torch only.
    nonfinite: a NaN/Inf in a merged payload: "raise" on every rank, or "skip" the step's update;
        either way residuals stay as before the step.
    check_every: every N steps, compare a checksum of the selected indices across ranks and
        raise on every rank if they differ (0: never; a debugging aid, costs a sync).
    """

    scope: str = "global"
    ratio: Optional[float] = None
    k: Optional[int] = None
    budget: Optional[float] = None
    ramp: int = 0
    critical: float = 0.0
    rows: int = 3
    width: float = 2.0
    candidates: int = 1
    apply: Optional[str] = None
    exchange: str = "auto"
    prefilter: int = 1
    sketch_dtype: str = "float16"
    wire: str = "compact"
    seed: int = 0
    exact: Optional[bool] = None
    warmup_steps: int = 0
    min_size: int = 1024
    momentum: float = 0.0
    backend: str = "auto"
    nonfinite: str = "raise"
    check_every: int = 0

    def __post_init__(self) -> None:
        check_choice("scope", self.scope, SCOPES)
        if self.ratio == "auto":
            object.__setattr__(self, "ratio", None)
        if self.ratio is not None:
            check_number("ratio", self.ratio, float, 0.0, 1.0, low_open=True)
        if self.k is not None:
            check_number("k", self.k, int, 1, 2**62)
            if self.ratio is not None:
                raise ValueError(f"give either ratio or k, not both (got ratio={self.ratio}, k={self.k})")
        if self.budget is not None:
            check_number("budget", self.budget, float, 0.0, 1e6, low_open=True)
        check_number("ramp", self.ramp, int, 0, 2**62)
        check_number("critical", self.critical, float, 0.0, 1e6)
        for name in self.measured_options:
            if not self.adaptive:
                fixed = "k" if self.k is not None else "ratio"
                raise ValueError(f"{name} applies to ratio='auto' only, not with a fixed {fixed} "
                                 f"({name}={getattr(self, name)})")
        check_number("rows", self.rows, int, 1, MAX_ROWS)
        check_number("width", self.width, float, 1.0, float(MAX_COLS))  # fewer columns than k: no room for k
        check_number("candidates", self.candidates, int, 1, 1024)
        check_number("prefilter", self.prefilter, int, 0, 1024)
        check_choice("sketch_dtype", self.sketch_dtype, SKETCH_DTYPES)
        check_choice("wire", self.wire, tuple(CODECS))
        if CODECS[self.wire].one_scale and self.scope == "layer":
            raise ValueError(f"wire={self.wire!r} scales each message by its largest value, one scale for every "
                             "layer, so a layer far quieter than the loudest would only ever send zeros under "
                             "scope='layer'; use scope='global' (it selects by magnitude over all layers) or "
                             "wire='compact'")
        check_number("seed", self.seed, int, 0, 2**64 - 1)
        if self.exact is not None and not isinstance(self.exact, bool):
            raise TypeError(f"exact must be a bool or None, got {type(self.exact).__name__}")
        if self.candidates > 1 and self.exact is False:
            raise ValueError(f"candidates={self.candidates} needs the exact round (exact=True)")
        if self.apply is not None:
            check_choice("apply", self.apply, APPLY)
        check_choice("exchange", self.exchange, ("auto", *EXCHANGES))
        may_run = [x for x in EXCHANGES.values() if x.auto_worth is not None] if self.exchange == "auto" \
            else [EXCHANGES[self.exchange]]
        if any(x.sends_pairs for x in may_run) and self.prefilter and self.candidates > self.prefilter:
            others = " or ".join(f"exchange={name!r}" for name, x in EXCHANGES.items() if not x.sends_pairs)
            raise ValueError(f"candidates={self.candidates} exceeds prefilter={self.prefilter}: exchange="
                             f"{self.exchange!r} nominates from each rank's top-(prefilter·k) coordinates, at most "
                             "prefilter·k candidates; set prefilter >= candidates (or 0: every coordinate), or "
                             f"use {others}")
        check_number("warmup_steps", self.warmup_steps, int, 0, 2**62)
        check_number("min_size", self.min_size, int, 1, 2**62)
        check_number("momentum", self.momentum, float, 0.0, 1.0)
        if self.momentum == 1.0:
            raise ValueError("momentum must be in [0.0, 1.0), got 1.0")
        check_choice("backend", self.backend, BACKENDS)
        check_choice("nonfinite", self.nonfinite, NONFINITE)
        check_number("check_every", self.check_every, int, 0, 2**62)

    @classmethod
    def from_options(cls, options: dict[str, Any], extra: tuple[str, ...] = (), owner: str = "GsSketch") -> GsConfig:
        """A validated config from keyword options; unknown names are a TypeError naming ``owner``
        and listing the allowed ones (``extra``: adapter-level options the caller took out)."""
        allowed = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise TypeError(f"{owner} got unknown option(s) {unknown}; allowed: {sorted(allowed | set(extra))}")
        return cls(**options)

    def exact_for(self, exchange: str) -> bool:
        """Whether the exact round runs under ``exchange`` (a name in :data:`EXCHANGES`)."""
        if self.exact is not None:
            return self.exact
        return EXCHANGES[exchange].exact_by_default or self.candidates > 1

    def apply_for(self, exchange: str) -> str:
        """What is applied under ``exchange`` (a name in :data:`EXCHANGES`)."""
        if self.apply is not None:
            return self.apply
        return EXCHANGES[exchange].default_apply(self.exact_for(exchange))

    @property
    def codec(self) -> PairCodec:
        """The wire format ``wire`` names (:data:`gs_horovod.codecs.CODECS`)."""
        return CODECS[self.wire]

    @property
    def adaptive(self) -> bool:
        """Whether the density follows the measured step (``ratio="auto"``)."""
        return self.ratio is None and self.k is None

    @property
    def measured_options(self) -> list[str]:
        """The options given that steer the measured density (``budget``, ``ramp``, ``critical``)."""
        return [f.name for f in fields(self)
                if f.name in ("budget", "ramp", "critical") and getattr(self, f.name) != f.default]

    @property
    def budget_or_default(self) -> float:
        """``budget``, or :data:`~gs_horovod.engine.density.DEFAULT_BUDGET` when not given."""
        return DEFAULT_BUDGET if self.budget is None else self.budget

    def k_for(self, n: int, level: Optional[float] = None) -> int:
        """Coordinates applied per step for a group of n coordinates; ``level``: the fraction
        ``ratio="auto"`` chose (:mod:`~gs_horovod.engine.density`; None: :data:`UNMEASURED_RATIO`)."""
        if self.k is not None:
            return self.k
        if self.ratio is not None:
            return count_for(self.ratio, n)
        return count_for(UNMEASURED_RATIO if level is None else level, n)

    def cols_for(self, n: int, level: Optional[float] = None) -> int:
        """Sketch columns for a group of n coordinates."""
        return min(MAX_COLS, max(1, math.ceil(self.width * self.k_for(n, level))))

    def digest(self, *extra: Any) -> int:
        """A 62-bit digest of everything that must agree across ranks (options, hash version and
        an adapter's ``extra`` values, e.g. FSDP2's mesh)."""
        return zlib.crc32(repr((self, HASH_VERSION, *extra)).encode()) & (2**62 - 1)
