"""``exchange="allgather"``: one allgather of every rank's pre-filtered (index, value) pairs;
every rank adds them up in rank order (the union's partial sums, the same bits everywhere).
Its own defaults are no exact round and the whole union applied: top-k allgather. Payload:
the L·k pairs of every group as one message of the wire format (:mod:`gs_horovod.codecs`;
every rank's message has the same size)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ...array_ops import Array
from .base import Collective, Context, Exchange, ExchangePlan, Nominated, Nominees, Options, union_sum


class Allgather(Exchange):
    name = "allgather"
    collectives = (Collective("gs_horovod.gather", "allgather", "gather"),)
    sends_pairs = True
    # "auto" keeps the allgather while its wire bytes are at most twice the sparse exchange's
    # (worth 1): measured by delivered mass per wire byte, docs/design.md "`auto`'s rule, measured"
    auto_worth = 2.0

    def default_apply(self, exact: bool) -> str:
        """Without the exact round the whole union is applied (top-k allgather)."""
        return "topk" if exact else "all"

    def payload(self, plan: ExchangePlan, config: Options, measured: Optional[tuple[Any, Any]]) -> dict[str, int]:
        return {"gather": config.codec.planned_bytes(sum(g.fed for g in plan.groups), 1, plan.total)}

    def nominate(self, ctx: Context, plan: ExchangePlan, a: Array, fed: list[Array]) -> Nominated:
        """Candidates: the m·k of largest |partial sum| in the union of every rank's ``fed`` set
        (the whole union with ``apply="all"`` and no exact round); the estimate is the partial
        sum as ``allreduce`` reduces (mean or sum) of what the ranks sent; finite: every
        gathered value is."""
        ops, P, codec = ctx.ops, ctx.comm.size, ctx.codec
        mine = ops.concat(fed)
        n = sum(g.fed for g in plan.groups)
        own = codec.rounded(ops, ops.take(a, mine))
        idx, vals, _ = codec.allgather(ops, ctx.comm, mine, own, plan.total, n, "gs_horovod.gather")
        union, sums = union_sum(ctx, idx, vals, ops.from_numpy(np.full(P, n, np.int32)), plan.total)
        groups = []
        for grp, (first, size) in zip(plan.groups, ops.spans(union, [g.start for g in plan.groups])):
            g_union, g_sums = ops.slice(union, first, size), ops.slice(sums, first, size)
            if not plan.whole:
                best = ops.top_abs(g_sums, grp.nominated)
                g_union, g_sums = ops.take(g_union, best), ops.take(g_sums, best)
            groups.append(Nominees(g_union, g_sums))
        sent = None if codec.lossless else ops.take_sorted(mine, own, ops.concat([c.idx for c in groups]), plan.total)
        return Nominated(groups, ops.all_finite(vals), sent, ops.count_of(0), ops.count_of(0))
