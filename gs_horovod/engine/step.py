"""The gs-SGD step on one rank, written once for every framework (arrays and kernels come
from an :class:`~gs_horovod.array_ops.ArrayOps`, collectives from a
:class:`~gs_horovod.transports.protocol.Collectives`, the candidates from the plan's exchange,
:mod:`gs_horovod.engine.exchanges`).

A step takes the gradients g of all compressed tensors (each flattened to float32, in name
order) and works on groups of coordinates: with ``scope="global"`` one group of all D
coordinates (the tensors concatenated), with ``scope="layer"`` one group per tensor. For a
group of n coordinates with k = ceil(ratio · n) (or the fixed ``k``)::

    u_t   = m · u_{t-1} + g_t                (momentum correction; u = g when m = 0)
    a_t   = e_{t-1} + u_t                    (error feedback: what was not sent before)
    F_t   = top-(L·k) of |a_t|               (pre-filter; F_t = everything when L = 0)
    C_t   = the exchange's m·k candidates, with estimates, the same on every rank
    v_t   = mean over ranks of a_t[C_t]      (the exact round: ONE allreduce of all candidates)
    I_t   = top-k of |v_t| within C_t (``apply="topk"``) or all of C_t (``apply="all"``)
    Δ_t   = v_t[I_t] scattered into zeros
    e_t   = a_t − a_t[I_t]   (this rank's a_t at I_t went into Δ_t); u_t[I_t] = 0 when m > 0

The exchanges: the Count-Sketch of a_t on F_t merged by one allreduce (``"sketch"``, the
paper's method), or the exact partial sums of the union of the ranks' F_t, by one allgather of
pairs (``"allgather"``) or by their owners (``"sparse"``, flat in P). Without the exact round
(``exact=False``, m = 1): I_t = C_t, Δ_t = the estimates, and a rank only drops the
coordinates of I_t it fed the exchange (I_t ∩ F_t); under the allgather with ``apply="all"``,
C_t is the whole union (so every rank drops all of F_t: top-k allgather). With the exact
round Σ_ranks e_t + P · Δ_t = Σ_ranks a_t exactly: nothing is lost, only delayed.

During the first ``warmup_steps`` steps, and at the DENSE level of ``ratio="auto"`` (in
float16, :mod:`gs_horovod.engine.density`), a_t itself is averaged and e_t = 0. A merged
payload with NaN/Inf means some rank's a_t was not finite (the pre-filter ranks NaN/Inf as the
largest magnitudes, so they always reach the exchange): ``nonfinite="raise"`` raises on every
rank naming the tensors, ``"skip"`` returns zero updates; either way nothing is committed.

The step is functional: it returns the new state and the adapter stores it, so TensorFlow can
run it as graph code (``ops.cond`` is ``tf.cond`` there and a plain ``if`` in torch).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, NamedTuple, Optional

from ..array_ops import Array, ArrayOps
from ..kernels.hashing import hash_keys
from ..transports.protocol import Collectives
from .config import GsConfig
from .exchanges import EXCHANGES
from .exchanges.base import Context, Nominated
from .guard import nonfinite_parts, options_differ
from .plan import Plan, starts_of


class StepResult(NamedTuple):
    """What one step returns: ``update`` (D + dense,) f32, every tensor's update in
    ``plan.all_names`` order at ``plan.all_offsets``; the state to store: ``residual`` (D,)
    f32, ``momentum`` (D,) f32 (None when m = 0) and ``steps``; ``applied``, a predicate, false
    when ``nonfinite="skip"`` dropped the step; ``routed`` / ``gathered``: the bytes this rank
    handed to the exchange's alltoall / allgather where their size depends on the data (the
    sparse exchange's; 0 otherwise).
    Under TensorFlow every tensor here carries a control dependency on the step's checks
    (options, NaN/Inf, selections)."""

    update: Array
    residual: Array
    momentum: Optional[Array]
    steps: Any
    applied: Any
    routed: Any = 0
    gathered: Any = 0


class Prior(NamedTuple):
    """The state before the step (kept as it is when ``nonfinite="skip"`` drops the step):
    residual e (D,) f32, momentum (D,) f32 or None, steps done."""

    residual: Array
    momentum: Optional[Array]
    steps: Any


class Accumulated(NamedTuple):
    """This step's vectors: ``a`` = e + u (D,) f32 (None without compressed tensors), ``u`` the
    momentum-corrected gradient (D,) f32 (None when m = 0), ``dense`` the tensors sent exactly,
    concatenated (n,) f32 (None without any)."""

    a: Optional[Array]
    u: Optional[Array]
    dense: Optional[Array]


class Selection(NamedTuple):
    """What a compressed step applies: ``idx`` (n,) int64 in the step's vector, ``values`` (n,)
    f32 (the exact means, or the estimates), ``sent`` (n,) f32 what this rank's a gave to them,
    ``dense_mean`` the small tensors' mean (or None), and whether every merged payload was finite."""

    idx: Array
    values: Array
    sent: Array
    dense_mean: Optional[Array]
    finite: Any


class GsSgd:
    """gs-SGD for one optimizer on one rank: config, array ops and collectives; stateless
    itself (:class:`gs_horovod.engine.state.EngineState`, or TF's variables, keep what a step
    returns). The exchange is handed a :class:`~gs_horovod.engine.exchanges.base.Context` and
    the plan's :attr:`Plan.for_exchange`, never this object."""

    def __init__(self, config: GsConfig, ops: ArrayOps, comm: Collectives) -> None:
        self.config, self.ops, self.comm = config, ops, comm
        self.keys = hash_keys(config.seed)

    @property
    def context(self) -> Context:
        """What an exchange works with: ops, collectives, options, wire format, hash keys."""
        return Context(self.ops, self.comm, self.config, self.config.codec, self.keys)

    def step(self, plan: Plan, grads: list[Array], residual: Array, momentum: Optional[Array], steps: Any,
             check_options: Any, dense: list[Array] = ()) -> StepResult:
        """One step of every tensor of ``plan``: ``grads`` (d_i,) f32 of the compressed tensors
        in its order, their ``residual`` e (D,) f32 and ``momentum`` (D,) f32 (None when m = 0),
        and ``dense`` (d_j,) f32, the tensors sent exactly. ``steps``: steps done so far (int or
        scalar tensor); ``check_options``: a predicate, true at an optimizer's first step, to
        compare the options' digest across ranks first. a = e + u is the one (D,) buffer the
        step writes: it becomes the new residual in place."""
        cfg, ops = self.config, self.ops
        checks = [ops.when(check_options, self._check_options)]
        a = u = None
        if plan.names:
            if cfg.momentum:
                u = ops.add_parts(momentum * cfg.momentum, grads)
                a = residual + u
            else:
                a = ops.add_parts(residual, grads)
        acc = Accumulated(a, u, ops.concat(list(dense)) if plan.dense_names else None)
        prior = Prior(residual, momentum, steps)
        if not plan.groups:
            return self._dense(plan, acc, prior, checks)
        if cfg.warmup_steps:
            return ops.cond(steps < cfg.warmup_steps, lambda: self._dense(plan, acc, prior, checks),
                            lambda: self._compressed(plan, acc, prior, checks))
        return self._compressed(plan, acc, prior, checks)

    def _check_options(self) -> Any:
        same = self.comm.same_on_every_rank(self.config.digest(), "gs_horovod.options")
        return self.ops.fail_unless(same, ValueError, lambda: [options_differ(self.config)])

    def _dense(self, plan: Plan, acc: Accumulated, prior: Prior, checks: list[Any]) -> StepResult:
        """Warm-up, steps with nothing to compress and the DENSE density level: everything
        averaged in ``plan.dense_dtype``; residual and momentum restart at zero."""
        ops = self.ops
        full = ops.concat([x for x in (acc.a, acc.dense) if x is not None])
        mean = ops.cast(self.comm.allreduce(ops.cast(full, plan.dense_dtype), "gs_horovod.dense"), "float32")
        return self._dense_result(plan, mean, partial(self._parts, plan, acc), prior, checks)

    def dense_from_mean(self, plan: Plan, mean: Array, local: list[Array], prior: Prior,
                        check_options: Any) -> StepResult:
        """A DENSE-level step whose allreduce the adapter's framework already ran: ``mean``
        (D + dense,) f32 is the ranks' mean (or sum, as the collectives' op) of every tensor's
        a = g in ``plan.all_names`` order, sent in float16 as backward produced it; ``local``:
        this rank's (d_i,) f32 gradients in that order (named on the NaN/Inf error path only).
        Only valid where residual and momentum are zero (:meth:`EngineState.dense_ahead`)."""
        checks = [self.ops.when(check_options, self._check_options)]
        return self._dense_result(plan, mean, lambda: local, prior, checks, prior_is_zero=True)

    def _dense_result(self, plan: Plan, mean: Array, local: Callable[[], list[Array]], prior: Prior,
                      checks: list[Any], prior_is_zero: bool = False) -> StepResult:
        """The dense step from its mean (D + dense,) f32: the update is the mean; residual and
        momentum restart at zero (``prior_is_zero``: the prior's, kept rather than allocated again)."""
        ops = self.ops
        finite = ops.all_finite(mean)
        checks = [*checks, self._fail_unless_finite(plan, finite, local, prior.steps)]
        residual, momentum = prior.residual, prior.momentum
        if not prior_is_zero:
            residual = ops.zeros((plan.total,), mean)
            momentum = ops.zeros((plan.total,), mean) if self.config.momentum else None
        applied = StepResult(mean, residual, momentum, prior.steps + 1, finite, ops.count_of(0), ops.count_of(0))
        return self._finish(plan, applied, prior, checks)

    def _parts(self, plan: Plan, acc: Accumulated) -> list[Array]:
        """This rank's a_t of every compressed tensor, then its small tensors, in
        ``plan.all_names`` order (views)."""
        ops = self.ops
        parts = [ops.slice(acc.a, o, d) for o, d in zip(plan.offsets, plan.sizes)]
        return parts + [ops.slice(acc.dense, o, d) for o, d in zip(starts_of(plan.dense_sizes), plan.dense_sizes)]

    def _compressed(self, plan: Plan, acc: Accumulated, prior: Prior, checks: list[Any]) -> StepResult:
        cfg, ops = self.config, self.ops
        exchange = EXCHANGES[plan.exchange]
        fed = [ops.top_abs(ops.slice(acc.a, g.start, g.size), g.fed) + g.start for g in plan.groups] \
            if cfg.prefilter or exchange.sends_pairs else []
        nominated = exchange.nominate(self.context, plan.for_exchange, acc.a, fed)
        local = partial(self._parts, plan, acc)
        checks = [*checks, self._fail_unless_finite(plan, nominated.finite, local, prior.steps)]
        if plan.exact:
            chosen = self._exact_round(plan, acc, nominated, checks, prior.steps)
        else:
            chosen = self._estimated(plan, acc, nominated, fed, checks, prior.steps)
        if cfg.check_every:
            checks.append(ops.when(prior.steps % cfg.check_every == 0,
                                   lambda: self._check_selection(chosen.idx, prior.steps)))
        new_momentum = ops.scatter_sub(acc.u, chosen.idx, ops.take(acc.u, chosen.idx)) if cfg.momentum else None
        new_residual = ops.scatter_sub(acc.a, chosen.idx, chosen.sent)
        update = ops.scatter(plan.total, chosen.idx, chosen.values, acc.a, chosen.dense_mean)
        applied = StepResult(update, new_residual, new_momentum, prior.steps + 1, chosen.finite, nominated.routed,
                             nominated.gathered)
        return self._finish(plan, applied, prior, checks)

    def _exact_round(self, plan: Plan, acc: Accumulated, nominated: Nominated, checks: list[Any],
                     steps: Any) -> Selection:
        """One allreduce of a at every group's candidates (and of the small tensors); applies all
        of them (``apply="all"``) or each group's top k of the exact means."""
        ops = self.ops
        cand = ops.concat([c.idx for c in nominated.groups])
        ncand = sum(grp.nominated for grp in plan.groups)
        local = ops.take(acc.a, cand) if acc.dense is None else ops.concat([ops.take(acc.a, cand), acc.dense])
        reduced = self.comm.allreduce(local, "gs_horovod.exact")
        exact, dense_mean = ops.slice(reduced, 0, ncand), ops.slice(reduced, ncand, sum(plan.dense_sizes))
        finite = ops.logical_and(nominated.finite, ops.all_finite(reduced))
        checks.append(self._fail_unless_finite(plan, finite, partial(self._parts, plan, acc), steps))
        if plan.apply == "all":
            sel, values = cand, exact
        else:
            chosen, kept, first = [], [], 0
            for grp in plan.groups:
                vals = ops.slice(exact, first, grp.nominated)
                best = ops.top_abs(vals, grp.k)
                chosen.append(ops.take(ops.slice(cand, first, grp.nominated), best))
                kept.append(ops.take(vals, best))
                first += grp.nominated
            sel, values = ops.concat(chosen), ops.concat(kept)
        return Selection(sel, values, ops.take(acc.a, sel), dense_mean, finite)

    def _estimated(self, plan: Plan, acc: Accumulated, nominated: Nominated, fed: list[Array], checks: list[Any],
                   steps: Any) -> Selection:
        """No exact round: the candidates' estimates are applied; a rank gave only the
        coordinates it fed (as the exchange sent them); the small tensors are averaged by an
        allreduce of their own."""
        ops = self.ops
        sel = ops.concat([c.idx for c in nominated.groups])
        values = ops.concat([c.est for c in nominated.groups])
        sent = nominated.sent
        if sent is None:
            sent = ops.take(acc.a, sel)
            if fed:
                sent = ops.where(ops.isin_sorted(sel, ops.concat(fed)), sent, ops.zeros_like(sent))
        finite, dense_mean = nominated.finite, None
        if acc.dense is not None:
            dense_mean = self.comm.allreduce(acc.dense, "gs_horovod.dense")
            finite = ops.logical_and(finite, ops.all_finite(dense_mean))
            checks.append(self._fail_unless_finite(plan, finite, partial(self._parts, plan, acc), steps))
        return Selection(sel, values, sent, dense_mean, finite)

    def _finish(self, plan: Plan, applied: StepResult, prior: Prior, checks: list[Any]) -> StepResult:
        """``applied`` after ``checks``; under nonfinite="skip" a non-finite step keeps the prior
        state and returns a zero update (on every rank alike: the merged payloads are the same
        everywhere)."""
        ops = self.ops
        if self.config.nonfinite == "skip":
            zeros = ops.zeros((plan.total + sum(plan.dense_sizes),), applied.update)
            skipped = applied._replace(update=zeros, residual=prior.residual, momentum=prior.momentum,
                                       steps=prior.steps)
            applied = ops.cond(applied.applied, lambda: applied, lambda: skipped)
        return ops.after(checks, applied)

    def _fail_unless_finite(self, plan: Plan, finite: Any, local: Callable[[], list[Array]], steps: Any) -> Any:
        """Under nonfinite="raise", fails on every rank (the merged payload is the same
        everywhere) naming the tensors whose a_t (``local()``, in ``plan.all_names`` order) is
        NaN/Inf on some rank; one small allreduce, on the error path only."""
        ops = self.ops
        if self.config.nonfinite != "raise":
            return ops.when(False, lambda: None)

        def message() -> list[Any]:
            flags = [ops.not_finite(x) for x in local()]
            anywhere = self.comm.allreduce(ops.stack(flags), "gs_horovod.nonfinite")
            return nonfinite_parts(ops.join_names(plan.all_names, anywhere), steps, plan.dense_dtype == "float16")

        return ops.fail_unless(finite, FloatingPointError, message)

    def _check_selection(self, sel: Array, steps: Any) -> Any:
        same = self.comm.same_on_every_rank(self.ops.checksum(sel), "gs_horovod.selections")
        return self.ops.fail_unless(same, RuntimeError, lambda: [
            "GsSketch: ranks selected different coordinates at step ", steps,
            " (checked because check_every is set); their models are diverging"])
