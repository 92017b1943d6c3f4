"""The gs-SGD step on one rank, framework-agnostic (arrays and kernels come from ``ops``).

For each compressed tensor (flattened to d float32 coordinates) and step t::

    u_t   = m · u_{t-1} + g_t                 (momentum correction; u = g when m = 0)
    a_t   = e_{t-1} + u_t                     (error feedback: add what was not sent before)
    S_t   = CountSketch(a_t)                  (rows × cols, same hashes on every rank)
    S̄_t  = mean over ranks of S_t            (the caller's allreduce: sketches are linear)
    I_t   = top-k of |query(S̄_t)|            (identical on every rank: same S̄_t, same hashes)
    v_t   = mean over ranks of a_t[I_t]       (exact: a second, k-sized allreduce) or
            query(S̄_t)[I_t]                  (estimate: no second round)
    Δ_t   = v_t scattered into zeros(d)       (the update the optimizer sees)
    e_t   = a_t with e_t[I_t] = 0            (this rank's a_t[I_t] went into the merge)
    u_t[I_t] = 0                              (momentum factor masking, only when m > 0)

So Σ_ranks e_t + Σ_ranks a_t[I_t] = Σ_ranks a_t exactly, and with the exact round
P·Δ_t = Σ_ranks a_t[I_t]: nothing is lost, only delayed. Without it Δ_t carries the sketch's
estimation error on I_t instead. (Subtracting the estimate instead of zeroing, so that the
error stays in the residual, diverged in our tests when estimates were noisy.) During the first
``warmup_steps`` steps of a tensor, a_t itself is the payload (a dense mean) and e_t = 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from .kernels import BACKENDS
from .kernels.hashing import MAX_COLS
from .sketch import Array, ArrayOps, CountSketch

NONFINITE = ("raise", "skip")


def _check_number(name: str, value: Any, kind: type, low: float, high: float, *, low_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise TypeError(f"{name} must be {'a number' if kind is float else 'an int'}, got {type(value).__name__}")
    if math.isnan(value) or value < low or value > high or (low_open and value == low):
        left = "(" if low_open else "["
        raise ValueError(f"{name} must be in {left}{low}, {high}], got {value!r}")


@dataclass(frozen=True)
class GsConfig:
    """Options of gs-SGD, validated at construction.

    ratio: k = ceil(ratio · d) coordinates sent per tensor of d elements, in (0, 1].
    k: a fixed k per tensor instead of ``ratio`` (a compressed tensor smaller than k is an error).
    rows: sketch rows r (odd gives a clean median).
    width: sketch columns per row as a multiple of k: cols = ceil(width · k).
    seed: hash seed; must be equal on every rank.
    exact: run the second, k-sized allreduce for the exact values of the heavy hitters.
    warmup_steps: steps per tensor sent dense before sketching starts.
    min_size: tensors with fewer elements are sent dense, uncompressed.
    momentum: momentum-correction factor m in [0, 1) (use with a momentum-free optimizer).
    backend: sketch kernels: "auto", "torch", "numba" (CPU) or "cuda" (Numba CUDA).
    nonfinite: a NaN/Inf in a merged gradient on any rank: "raise" an error on every rank, or
        "skip" the tensor's update for that step; either way residuals stay as before it.
    check_every: every N steps, compare a checksum of the selected indices across ranks and
        raise on every rank if they differ (0: never; a debugging aid, costs a sync).
    """

    ratio: float = 0.01
    k: Optional[int] = None
    rows: int = 5
    width: float = 4.0
    seed: int = 0
    exact: bool = True
    warmup_steps: int = 0
    min_size: int = 1024
    momentum: float = 0.0
    backend: str = "auto"
    nonfinite: str = "raise"
    check_every: int = 0

    def __post_init__(self) -> None:
        _check_number("ratio", self.ratio, float, 0.0, 1.0, low_open=True)
        if self.k is not None:
            _check_number("k", self.k, int, 1, 2**62)
        _check_number("rows", self.rows, int, 1, 255)
        _check_number("width", self.width, float, 0.0, float(MAX_COLS), low_open=True)
        _check_number("seed", self.seed, int, 0, 2**64 - 1)
        if not isinstance(self.exact, bool):
            raise TypeError(f"exact must be a bool, got {type(self.exact).__name__}")
        _check_number("warmup_steps", self.warmup_steps, int, 0, 2**62)
        _check_number("min_size", self.min_size, int, 1, 2**62)
        _check_number("momentum", self.momentum, float, 0.0, 1.0)
        if self.momentum == 1.0:
            raise ValueError("momentum must be in [0.0, 1.0), got 1.0")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.nonfinite not in NONFINITE:
            raise ValueError(f"nonfinite must be one of {NONFINITE}, got {self.nonfinite!r}")
        _check_number("check_every", self.check_every, int, 0, 2**62)

    def k_for(self, d: int) -> int:
        """Coordinates sent for a tensor of d elements."""
        return self.k if self.k is not None else min(d, max(1, math.ceil(self.ratio * d)))

    def cols_for(self, d: int) -> int:
        """Sketch columns for a tensor of d elements."""
        return min(MAX_COLS, max(1, math.ceil(self.width * self.k_for(d))))

    def payload_numel(self, d: int) -> int:
        """Elements this rank puts on the wire per step for a tensor of d elements."""
        return self.rows * self.cols_for(d) + (self.k_for(d) if self.exact else 0)


@dataclass
class TensorState:
    """Per-tensor state on one rank.

    residual: (d,) f32 error-feedback memory e.
    momentum: (d,) f32 momentum-correction buffer u, or None when m = 0.
    steps: how many steps of the tensor were committed.
    acc, next_momentum: a_t and u_t of the step in flight, committed by ``apply`` or
        ``commit_dense`` once the merge came back finite, dropped by ``discard``.
    """

    residual: Array
    momentum: Optional[Array]
    steps: int = 0
    acc: Optional[Array] = None
    next_momentum: Optional[Array] = None


@dataclass
class Selection:
    """The heavy hitters of one tensor in one step.

    indices: (k,) int64 ascending; estimates: (k,) f32 from the merged sketch;
    local: (k,) f32 this rank's a_t at those indices (what the exact round averages).
    """

    indices: Array
    estimates: Array
    local: Array


@dataclass
class CommStats:
    """Payload bytes this rank handed to collectives, by path, and steps (cumulative);
    ``skipped``: tensor updates dropped for NaN/Inf under nonfinite="skip"."""

    sketch_bytes: int = 0
    exact_bytes: int = 0
    dense_bytes: int = 0
    steps: int = 0
    skipped: int = 0

    @property
    def total_bytes(self) -> int:
        return self.sketch_bytes + self.exact_bytes + self.dense_bytes


@dataclass
class MergeStats:
    """Per-rank traffic of ``tree_allreduce`` calls (cumulative): bytes this rank sent and
    point-to-point rounds it took part in, split by level."""

    bytes_sent: int = 0
    doubling_rounds: int = 0
    node_rounds: int = 0
    calls: int = 0


@dataclass
class GsSgd:
    """gs-SGD state of one rank: per-tensor residuals keyed by a stable tensor name."""

    config: GsConfig
    ops: ArrayOps
    states: dict[str, TensorState] = field(default_factory=dict)

    def uses_sketch(self, name: str) -> bool:
        """Whether the tensor's next encode sketches (False while warming up)."""
        st = self.states.get(name)
        return (st.steps if st else 0) >= self.config.warmup_steps

    def encode(self, name: str, grad: Array) -> Array:
        """Takes g (d,) f32; returns the payload to average (or sum) across ranks: a new sketch
        table (rows, cols) f32, or during warm-up a_t (d,) f32 itself. Nothing is committed
        until the merge returns (``apply``/``commit_dense``), so a step whose merge is
        non-finite can be dropped (``discard``) with the residual as it was."""
        d = int(grad.shape[0])
        cfg = self.config
        if cfg.k is not None and cfg.k > d:
            raise ValueError(
                f"k={cfg.k} exceeds the {d} elements of tensor {name!r}; raise min_size above k or use ratio"
            )
        st = self.states.get(name)
        if st is None or int(st.residual.shape[0]) != d:
            momentum = self.ops.zeros((d,), grad) if cfg.momentum else None
            st = self.states[name] = TensorState(self.ops.zeros((d,), grad), momentum)
        u = grad
        if st.momentum is not None:
            u = st.next_momentum = st.momentum * cfg.momentum + grad
        st.acc = st.residual + u
        if st.steps < cfg.warmup_steps:
            return st.acc + 0.0  # a copy: the collective may overwrite its payload in place
        return CountSketch.zeros(cfg.rows, cfg.cols_for(d), cfg.seed, self.ops, grad).accumulate(st.acc).table

    def select(self, name: str, merged_table: Array) -> Selection:
        """Heavy hitters of the merged (rows, cols) sketch, with this rank's local values."""
        st = self.states[name]
        d = int(st.residual.shape[0])
        sketch = CountSketch(self.config.rows, self.config.cols_for(d), self.config.seed, self.ops, merged_table)
        idx, est = sketch.heavy_hitters(self.config.k_for(d), d)
        return Selection(idx, est, self.ops.take(st.acc, idx))

    def apply(self, name: str, selection: Selection, values: Array) -> Array:
        """Commits the step and returns the update Δ (d,) f32 holding ``values`` at the selected
        indices; this rank's a_t[I] went into the merge, so it leaves the residual (and u_t[I]
        leaves the momentum buffer)."""
        st = self.states[name]
        d = int(st.residual.shape[0])
        st.residual = self.ops.scatter_sub(st.acc, selection.indices, selection.local)
        if st.momentum is not None:
            momentum_sent = self.ops.take(st.next_momentum, selection.indices)
            st.momentum = self.ops.scatter_sub(st.next_momentum, selection.indices, momentum_sent)
        self._end_step(st)
        return self.ops.scatter(d, selection.indices, values)

    def commit_dense(self, name: str) -> None:
        """Commits a warm-up step: all of a_t was sent, so residual (and momentum) restart at 0."""
        st = self.states[name]
        st.residual = self.ops.zeros(tuple(st.residual.shape), st.residual)
        if st.momentum is not None:
            st.momentum = self.ops.zeros(tuple(st.momentum.shape), st.momentum)
        self._end_step(st)

    def discard(self, name: str) -> bool:
        """Drops the step in flight (residual and momentum stay as before it); returns whether
        this rank's a_t was finite, to tell which rank brought a non-finite value."""
        st = self.states[name]
        finite = st.acc is None or self.ops.all_finite(st.acc)
        st.acc = st.next_momentum = None
        return finite

    @staticmethod
    def _end_step(st: TensorState) -> None:
        st.acc = st.next_momentum = None
        st.steps += 1
