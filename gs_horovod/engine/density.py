"""How many coordinates a step sends under ``ratio="auto"`` (the default): :class:`Density`,
a rule on the measured step, the same on every rank.

The densities are :data:`LEVELS`, fractions of D (k = ceil(level · D)), and :data:`DENSE`:
every coordinate in one float16 allreduce. A run starts at DENSE. After each window of
:data:`WINDOW` measured steps at one level (the first step at a level is not measured: kernels
compile, buffers are laid out), the ranks share their windows' sums (seconds, steps, gradient
norms) with one allgather of five floats each and every rank, from the same numbers, chooses::

    t_c        compute seconds a step: end of one engine step to the start of the next
               (forward, backward, optimizer, data), the slowest rank's window mean
    t_x(L)     seconds of the engine step at level L (selection, collectives, decoding), the
               least of the ranks' window means: a rank's collectives also wait for the
               slowest rank, and the rank that waited least measured the exchange itself.
               A dense step that overlaps backward (:meth:`EngineState.dense_ahead`) costs
               only what backward did not hide: from its last gradient to its end
    t_l(L)     the link's seconds of the step, the same least mean: t_x(L), except for a
               dense step that overlaps backward, where its allreduces run from the step's
               first gradient to its end (an upper bound where backward outlasts them)
    L          the densest of LEVELS whose link seconds fit:  wire(L) · per_byte ≤ budget · t_c
    L*         DENSE if  cost(DENSE) ≤ g · max(budget · t_c, cost(L)),  else L
    g          BLIND (2) until some sparse level was measured, then 1: the first price of a
               sparse level has no ``fixed`` in it, so the rule leaves dense for it only where
               the dense step costs twice what the level is predicted to
    cost(L)    t_x(L) where L was measured; else fixed + wire(L) · per_byte (DENSE: no fixed)
    per_byte   t_l(DENSE) / wire(DENSE)         (seconds a wire byte costs, from the dense window)
    fixed      t_x(S) − wire(S) · per_byte ≥ 0  (the selection's own seconds, from the densest
               sparse level S measured; 0 before one)

The budget bounds the link's share; the engine's own seconds (``fixed``) decide only whether
sending everything dense is cheaper. ``fixed`` is taken as the same at every level, which it is
not: the engine's work grows with k (docs/design.md, "What a sparse level costs besides its
bytes"), so an unmeasured level is priced low before any sparse level ran (hence ``g``) and
high after a denser one did.
wire(L) is the bytes through the busiest rank (:func:`~gs_horovod.transports.collective_cost.total_wire_bytes`)
of the plan at L. The link's seconds a byte come from the dense window alone, so the sparse
level moves only with t_c. A change of world (Horovod elastic) starts the rule again
(:meth:`Density.restart`).

Two training-phase options raise L* (both off by default, :func:`schedule`):

    ramp R       DGC's exponential warm-up: at step s < R the level is at least the one
                 nearest (in log) to 0.25 · 4^-floor(4s/R): 0.2, 0.05, 0.02, 0.005
    critical η   Accordion's critical regimes: n is the window's mean gradient norm ‖g‖ over
                 the ranks (each rank's gradient before its residual, the allgather's fifth
                 float); where |n − n'| ≥ η · n' against the previous window's n', the next
                 window is DENSE
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

import numpy as np

LEVELS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
DENSE = 1.0  # every coordinate, as a float16 allreduce
WINDOW = 5
DEFAULT_BUDGET = 0.5
BLIND = 2.0  # how much cheaper than dense a sparse level must look before any was measured
CHOICES = (*LEVELS, DENSE)


def choose(budget: float, compute: float, seconds: dict[float, float], wire: Callable[[float], float],
           links: Optional[dict[float, float]] = None) -> float:
    """The level of the module's rule: the densest of :data:`LEVELS` whose link seconds are at most
    ``budget · compute`` (else the sparsest), or DENSE where that costs no more than the budget or
    than the sparse level (:data:`BLIND` times either while no sparse level has been measured).
    ``seconds``: level → measured mean seconds of its engine step (t_x);
    ``links``: level → the link's mean seconds where they differ from t_x (t_l);
    ``wire``: level → wire bytes of its plan."""
    links = {**seconds, **(links or {})}
    per_byte = 0.0
    if DENSE in links and wire(DENSE) > 0:
        per_byte = links[DENSE] / wire(DENSE)
    sparse = [lv for lv in LEVELS if lv in seconds]
    fixed = max(0.0, seconds[sparse[-1]] - wire(sparse[-1]) * per_byte) if sparse else 0.0

    def cost(level: float) -> float:
        if level in seconds:
            return seconds[level]
        return (0.0 if level == DENSE else fixed) + wire(level) * per_byte

    allowed = budget * compute
    fitting = [lv for lv in LEVELS if wire(lv) * per_byte <= allowed]
    level = fitting[-1] if fitting else LEVELS[0]
    guard = 1.0 if sparse else BLIND
    return DENSE if cost(DENSE) <= guard * max(allowed, cost(level)) else level


def ramp_floor(step: int, ramp: int) -> float:
    """The least level at ``step`` of a ``ramp``-step exponential warm-up (DGC: 25 % of D, then
    a quarter as many every quarter of the ramp), as the nearest of :data:`LEVELS` in log; 0
    from step ``ramp`` on (and with ``ramp`` 0)."""
    if step >= ramp:
        return 0.0
    wanted = 0.25 * 4.0 ** -(4 * step // ramp)
    return min(LEVELS, key=lambda lv: abs(math.log(lv / wanted)))


def schedule(level: float, step: int, ramp: int, critical: bool) -> float:
    """``level`` (the budget's, :func:`choose`) raised by the training-phase options: DENSE in
    a ``critical`` regime, else at least :func:`ramp_floor` (``step``: steps applied so far)."""
    return DENSE if critical else max(level, ramp_floor(step, ramp))


@dataclass
class Density:
    """The density state of one :class:`~gs_horovod.engine.state.EngineState` or, under
    TensorFlow, one traced step's :class:`~gs_horovod.tf_step.MeasuredLevel` (saved in their
    checkpoints, :meth:`state_dict`).

    level: the fraction of D the next step sends (a :data:`CHOICES` value; DENSE: all of it in
    float16); measured: steps measured at this level in the current window; compute / exchange /
    link / norm: this rank's summed seconds of those steps and gradient norms ‖g‖ (its own,
    until agreed); seconds / links: level → agreed mean seconds of its engine step (t_x) and of
    its link (t_l); changes: how often the level changed; last_norm: the previous window's
    agreed mean gradient norm (None before one; ``critical`` only); forced: whether
    :attr:`level` is the schedule's rather than the rule's (a forced sparse level's seconds are
    not recorded: a ramp's 0.2, whose selection and union cost far more than the rule's levels,
    would otherwise price every sparse level; a forced DENSE, with no selection in it, is)."""

    level: float = DENSE
    measured: int = -1  # the first step at a level is not measured
    compute: float = 0.0
    exchange: float = 0.0
    seconds: dict[float, float] = field(default_factory=dict)
    changes: int = 0
    link: float = 0.0
    links: dict[float, float] = field(default_factory=dict)
    norm: float = 0.0
    last_norm: Optional[float] = None
    forced: bool = False

    @property
    def due(self) -> bool:
        """Whether a window is complete: the next step starts with :meth:`decide`."""
        return self.measured >= WINDOW

    def observe(self, compute: Optional[float], exchange: float, link: Optional[float] = None,
                norm: float = 0.0) -> None:
        """Counts one step at :attr:`level`: ``compute`` seconds before it (None: unknown, e.g.
        the first step), ``exchange`` seconds of the engine step, ``link`` seconds of its
        collectives where they ran beside backward (None: the exchange's), and this rank's
        gradient norm ‖g‖ (``critical`` only; else 0)."""
        if compute is None:
            return
        if self.measured < 0:
            self.measured = 0
            return
        self.measured += 1
        self.compute += compute
        self.exchange += exchange
        self.link += exchange if link is None else link
        self.norm += norm

    def window(self) -> np.ndarray:
        """This rank's window as the (5,) float64 the ranks share: [compute, exchange, link, steps,
        norm] sums."""
        return np.array([self.compute, self.exchange, self.link, self.measured, self.norm], dtype=np.float64)

    def decide(self, share: Callable[[np.ndarray], np.ndarray], wire: Callable[[float], float],
               budget: float, step: int = 0, ramp: int = 0, critical: float = 0.0) -> float:
        """Ends the window under ``budget``: ``share`` gathers every rank's (5,) [compute, exchange,
        link, steps, norm] as (P, 5) (one allgather, collective); the level is then chosen from
        them (:func:`choose`: the slowest rank's compute, the least exchange and link; then
        :func:`schedule` at ``step`` steps applied, with the ``ramp`` and, where ``critical`` η > 0,
        the regime from the ranks' mean gradient norm), the same on every rank. Returns the new
        level."""
        every = np.asarray(share(self.window()), dtype=np.float64).reshape(-1, 5)
        steps = np.maximum(every[:, 3], 1.0)
        if not self.forced or self.level == DENSE:  # a sparse level the schedule forced: not the rule's to learn
            self.seconds[self.level] = float((every[:, 1] / steps).min())
            self.links[self.level] = float((every[:, 2] / steps).min())
        ruled = choose(budget, float((every[:, 0] / steps).max()), self.seconds, wire, self.links)
        regime = False  # Accordion's critical regime
        if critical:
            norm, last = float((every[:, 4] / steps).mean()), self.last_norm
            regime = last is not None and norm != last and abs(norm - last) >= critical * last
            self.last_norm = norm
        chosen = schedule(ruled, step, ramp, regime)
        self.forced = chosen != ruled
        if chosen != self.level:
            self.level, self.changes, self.measured = chosen, self.changes + 1, -1
        else:
            self.measured = 0
        self.compute = self.exchange = self.link = self.norm = 0.0
        return self.level

    def restart(self) -> None:
        """Forgets every measurement and starts at DENSE again (every rank alike)."""
        self.level, self.measured, self.compute, self.exchange, self.seconds = DENSE, -1, 0.0, 0.0, {}
        self.link, self.links, self.norm, self.last_norm, self.forced = 0.0, {}, 0.0, None, False

    def state_dict(self) -> dict[str, Any]:
        """Plain floats and ints (checkpoint-safe)."""
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Density:
        """The saved state; raises ValueError on an unknown level."""
        level = float(state["level"])
        if not any(math.isclose(level, c) for c in CHOICES):
            raise ValueError(f"saved density level {level} is not one of {CHOICES}")
        last = state.get("last_norm")
        return cls(level, int(state["measured"]), float(state["compute"]), float(state["exchange"]),
                   {float(k): float(v) for k, v in state["seconds"].items()}, int(state["changes"]),
                   float(state.get("link", state["exchange"])),
                   {float(k): float(v) for k, v in state.get("links", {}).items()},
                   float(state.get("norm", 0.0)), None if last is None else float(last),
                   bool(state.get("forced", False)))
