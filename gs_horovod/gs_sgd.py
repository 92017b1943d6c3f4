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
    k: a fixed k per tensor instead of ``ratio`` (clipped to d).
    rows: sketch rows r (odd gives a clean median).
    width: sketch columns per row as a multiple of k: cols = ceil(width · k).
    seed: hash seed; must be equal on every rank.
    exact: run the second, k-sized allreduce for the exact values of the heavy hitters.
    warmup_steps: steps per tensor sent dense before sketching starts.
    min_size: tensors with fewer elements are sent dense, uncompressed.
    momentum: momentum-correction factor m in [0, 1) (use with a momentum-free optimizer).
    backend: sketch kernels: "auto", "torch", "numba" (CPU) or "cuda" (Numba CUDA).
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

    def k_for(self, d: int) -> int:
        """Coordinates sent for a tensor of d elements."""
        return min(d, self.k) if self.k is not None else min(d, max(1, math.ceil(self.ratio * d)))

    def cols_for(self, d: int) -> int:
        """Sketch columns for a tensor of d elements."""
        return min(MAX_COLS, max(1, math.ceil(self.width * self.k_for(d))))

    def payload_numel(self, d: int) -> int:
        """Elements this rank puts on the wire per step for a tensor of d elements."""
        return self.rows * self.cols_for(d) + (self.k_for(d) if self.exact else 0)


@dataclass
class TensorState:
    """Per-tensor state on one rank.

    residual: (d,) f32 error-feedback memory e (holds a_t between encode and apply).
    momentum: (d,) f32 momentum-correction buffer u, or None when m = 0.
    steps: how many times the tensor was encoded.
    """

    residual: Array
    momentum: Optional[Array]
    steps: int = 0


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
    """Payload elements/bytes this rank handed to collectives (cumulative)."""

    sketch_bytes: int = 0
    exact_bytes: int = 0
    dense_bytes: int = 0
    steps: int = 0

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
        table (rows, cols) f32, or during warm-up a_t (d,) f32 itself, the residual then
        starting again at zero (everything is sent). The payload is the caller's to overwrite."""
        d = int(grad.shape[0])
        st = self.states.get(name)
        if st is None or int(st.residual.shape[0]) != d:
            zeros = self.ops.zeros((d,), grad)
            st = self.states[name] = TensorState(zeros, self.ops.zeros((d,), grad) if self.config.momentum else None)
        sketching = st.steps >= self.config.warmup_steps
        u = grad
        if st.momentum is not None:
            st.momentum = st.momentum * self.config.momentum + grad
            u = st.momentum
        st.residual = st.residual + u
        st.steps += 1
        if not sketching:
            payload, st.residual = st.residual, self.ops.zeros((d,), grad)
            if st.momentum is not None:
                st.momentum = self.ops.zeros((d,), grad)
            return payload
        sketch = CountSketch.zeros(self.config.rows, self.config.cols_for(d), self.config.seed, self.ops, grad)
        return sketch.accumulate(st.residual).table

    def select(self, name: str, merged_table: Array) -> Selection:
        """Heavy hitters of the merged (rows, cols) sketch, with this rank's local values."""
        st = self.states[name]
        d = int(st.residual.shape[0])
        sketch = CountSketch(self.config.rows, self.config.cols_for(d), self.config.seed, self.ops, merged_table)
        idx, est = sketch.heavy_hitters(self.config.k_for(d), d)
        return Selection(idx, est, self.ops.take(st.residual, idx))

    def apply(self, name: str, selection: Selection, values: Array) -> Array:
        """Returns the update Δ (d,) f32 holding ``values`` at the selected indices; this rank's
        a_t[I] went into the merge, so it leaves the residual (and the momentum buffer)."""
        st = self.states[name]
        d = int(st.residual.shape[0])
        st.residual = self.ops.scatter_sub(st.residual, selection.indices, selection.local)
        if st.momentum is not None:
            momentum_sent = self.ops.take(st.momentum, selection.indices)
            st.momentum = self.ops.scatter_sub(st.momentum, selection.indices, momentum_sent)
        return self.ops.scatter(d, selection.indices, values)
