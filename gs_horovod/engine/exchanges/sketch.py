"""``exchange="sketch"``, the paper's method: one Count-Sketch (rows × cols per group, hashed
alike on every rank) of each rank's pre-filtered a, merged by one allreduce (sketches are
linear: the merged sketch is the sketch of the mean); each group's top-(m·k) of the merged
median estimates are its candidates, the same on every rank. Payload: rows · cols values of
``sketch_dtype`` per group."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from ...array_ops import Array
from ..payload import Payload
from .base import Exchange, Nominated, Nominees

if TYPE_CHECKING:
    from ..config import GsConfig
    from ..plan import Plan
    from ..step import GsSgd


class Sketch(Exchange):
    name = "sketch"
    exact_by_default = True

    def payload(self, plan: Plan, config: GsConfig, measured: Optional[tuple[Any, Any]]) -> Payload:
        itemsize = 2 if config.sketch_dtype == "float16" else 4
        return Payload(sketch=sum(config.rows * g.cols for g in plan.groups) * itemsize)

    def nominate(self, sgd: GsSgd, plan: Plan, a: Array, fed: list[Array]) -> Nominated:
        """Candidates (idx ascending, the merged median estimates f32) of the sketch of a
        restricted to ``fed`` (every coordinate when empty); finite: the merged tables are."""
        cfg, ops = sgd.config, sgd.ops
        tables = []
        for i, grp in enumerate(plan.groups):
            table = ops.zeros((cfg.rows, grp.cols), a)
            if fed:
                table = ops.sketch_accumulate_at(table, fed[i] - grp.start, ops.take(a, fed[i]), sgd.keys)
            else:
                table = ops.sketch_accumulate(table, ops.slice(a, grp.start, grp.size), sgd.keys, 0)
            tables.append(ops.reshape(table, (-1,)))
        merged = ops.cast(sgd.comm.allreduce(ops.cast(ops.concat(tables), cfg.sketch_dtype), "gs_horovod.sketch"),
                          "float32")
        groups, start = [], 0
        for grp in plan.groups:
            table = ops.reshape(ops.slice(merged, start, cfg.rows * grp.cols), (cfg.rows, grp.cols))
            start += cfg.rows * grp.cols
            idx, est = ops.heavy_hitters(table, sgd.keys, grp.size, grp.nominated)
            groups.append(Nominees(idx + grp.start, est))
        return Nominated(groups, ops.all_finite(merged), None, ops.count_of(0), ops.count_of(0))
