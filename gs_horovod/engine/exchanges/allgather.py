"""``exchange="allgather"``: one allgather of every rank's pre-filtered (index, value) pairs;
every rank adds them up in rank order (the union's partial sums, the same bits everywhere).
Its own defaults are no exact round and the whole union applied: top-k allgather. Payload:
L·k pairs per group, 8 bytes a pair (``wire="fp32"``, 16(P−1)·L·k bytes through a rank) or one
compact message of them (``wire="compact"`` or ``"compact8"``: every rank's message has the
same size)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from ...array_ops import Array
from ...kernels.pair_format import low_bits, message_bytes
from ..payload import Payload
from .base import Exchange, Nominated, Nominees, union_sum

if TYPE_CHECKING:
    from ..config import GsConfig
    from ..plan import Plan
    from ..step import GsSgd


class Allgather(Exchange):
    name = "allgather"
    sends_pairs = True

    def default_apply(self, exact: bool) -> str:
        """Without the exact round the whole union is applied (top-k allgather)."""
        return "topk" if exact else "all"

    def payload(self, plan: Plan, config: GsConfig, measured: Optional[tuple[Any, Any]]) -> Payload:
        fed = sum(g.fed for g in plan.groups)
        if config.wire == "fp32":
            return Payload(gather=8 * fed)
        return Payload(gather=message_bytes(fed, plan.total, low_bits(fed, plan.total), config.wire))

    def nominate(self, sgd: GsSgd, plan: Plan, a: Array, fed: list[Array]) -> Nominated:
        """Candidates: the m·k of largest |partial sum| in the union of every rank's ``fed`` set
        (the whole union with ``apply="all"`` and no exact round); the estimate is the partial
        sum as ``allreduce`` reduces (mean or sum) of what the ranks sent; finite: every
        gathered value is."""
        ops, P, wire = sgd.ops, sgd.comm.size, sgd.config.wire
        mine = ops.concat(fed)
        n = sum(g.fed for g in plan.groups)
        if wire != "fp32":
            own, low = ops.wire_rounded(ops.take(a, mine), wire), low_bits(n, plan.total)
            message, _ = ops.pack_pairs(mine, own, ops.count(mine * 0, 1), plan.total, low, wire)  # one message
            idx, vals, _ = ops.unpack_pairs(sgd.comm.allgather(message, "gs_horovod.gather"), P, plan.total, low,
                                            wire)
        else:
            own = None
            idx, vals = ops.unpairs(ops.reshape(sgd.comm.allgather(ops.pairs(mine, ops.take(a, mine)),
                                                                      "gs_horovod.gather"), (-1,)))
        union, sums = union_sum(sgd, idx, vals, ops.from_numpy(np.full(P, n, np.int32)))
        whole = plan.apply == "all" and not plan.exact
        groups = []
        for grp, (first, size) in zip(plan.groups, ops.spans(union, [g.start for g in plan.groups])):
            g_union, g_sums = ops.slice(union, first, size), ops.slice(sums, first, size)
            if not whole:
                best = ops.top_abs(g_sums, grp.nominated)
                g_union, g_sums = ops.take(g_union, best), ops.take(g_sums, best)
            groups.append(Nominees(g_union, g_sums))
        sent = None if own is None else ops.take_sorted(mine, own, ops.concat([c.idx for c in groups]))
        return Nominated(groups, ops.all_finite(vals), sent, ops.count_of(0), ops.count_of(0))
