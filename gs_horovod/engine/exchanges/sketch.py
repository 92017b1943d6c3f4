"""``exchange="sketch"``, the paper's method: one Count-Sketch (rows × cols per group, hashed
alike on every rank) of each rank's pre-filtered a, merged by one allreduce (sketches are
linear: the merged sketch is the sketch of the mean); each group's top-(m·k) of the merged
median estimates are its candidates, the same on every rank. Payload: rows · cols values of
``sketch_dtype`` per group."""

from __future__ import annotations

from typing import Any, Optional

from ...array_ops import Array
from .base import Collective, Context, Exchange, ExchangePlan, Nominated, Nominees, Options


class Sketch(Exchange):
    name = "sketch"
    collectives = (Collective("gs_horovod.sketch", "allreduce", "sketch"),)
    exact_by_default = True

    def payload(self, plan: ExchangePlan, config: Options, measured: Optional[tuple[Any, Any]]) -> dict[str, int]:
        itemsize = 2 if config.sketch_dtype == "float16" else 4
        return {"sketch": sum(config.rows * g.cols for g in plan.groups) * itemsize}

    def nominate(self, ctx: Context, plan: ExchangePlan, a: Array, fed: list[Array]) -> Nominated:
        """Candidates (idx ascending, the merged median estimates f32) of the sketch of a
        restricted to ``fed`` (every coordinate when empty); finite: the merged tables are."""
        cfg, ops = ctx.config, ctx.ops
        tables = []
        for i, grp in enumerate(plan.groups):
            table = ops.zeros((cfg.rows, grp.cols), a)
            if fed:
                table = ops.sketch_accumulate_at(table, fed[i] - grp.start, ops.take(a, fed[i]), ctx.keys)
            else:
                table = ops.sketch_accumulate(table, ops.slice(a, grp.start, grp.size), ctx.keys, 0)
            tables.append(ops.reshape(table, (-1,)))
        merged = ops.cast(ctx.comm.allreduce(ops.cast(ops.concat(tables), cfg.sketch_dtype), "gs_horovod.sketch"),
                          "float32")
        groups, start = [], 0
        for grp in plan.groups:
            table = ops.reshape(ops.slice(merged, start, cfg.rows * grp.cols), (cfg.rows, grp.cols))
            start += cfg.rows * grp.cols
            idx, est = ops.heavy_hitters(table, ctx.keys, grp.size, grp.nominated)
            groups.append(Nominees(idx + grp.start, est))
        return Nominated(groups, ops.all_finite(merged), None, ops.count_of(0), ops.count_of(0))
