"""``exchange="sparse"`` (Ok-Topk / SparDL style): the union's sums of the allgather exchange,
bit for bit, with wire bytes flat in P.

1. alltoall: coordinate i belongs to rank owner(i), a hash of i (:meth:`ArrayOps.owner_of`:
   spread evenly whatever the layers' sizes and strides); rank r sends each of its pairs
   (F_r, a_r[F_r]) to its owner, which adds what it receives in rank order.
2. threshold: per group, the owners' histograms of the order key of |s| (NaN highest:
   :meth:`ArrayOps.abs_key`), 8 high bits, then 8 more bits within the bin that holds the
   (m·k)-th largest, each summed by one allreduce, give the 16-bit key prefix t of the
   (m·k)-th largest, how many lie above it, and so how many ``ties`` of prefix t to take.
3. allgather: each owner sends its pairs above t and its best ``ties`` of prefix t (by key,
   then lower index); every rank sorts what it gathers by index and keeps the above ones and
   the best ``ties`` of all prefix-t pairs: the same m·k coordinates everywhere. A pair above
   t lies in every rank's selection, so NaN/Inf anywhere in the sums reaches every rank.

Payload: 8 bytes a pair into the alltoall (L·k per group), 2 × 256 int32 bins per group, and
this rank's share of the m·k selected pairs (planned: an even share). About 32(P−1)/P·L·k
bytes through a rank plus 2 KB of histograms a group.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from ...array_ops import Array
from ..payload import Payload
from .base import Candidates, Exchange, Nominated, union_sum

if TYPE_CHECKING:
    from ..config import GsConfig
    from ..plan import Plan
    from ..step import GsSgd

RADIX_BINS = 256  # histogram bins per group in each of the two threshold rounds


class Sparse(Exchange):
    name = "sparse"
    sends_pairs = True

    def payload(self, plan: Plan, config: GsConfig, gathered: Optional[Any]) -> Payload:
        """The allgather is what this rank sent, 8 bytes for each of the ``gathered`` pairs (an
        int or a scalar tensor), or, planned (None), an even share of 8·m·k/P bytes."""
        fed = sum(8 * g.fed for g in plan.groups)
        share = math.ceil(sum(8 * g.candidates for g in plan.groups) / plan.ranks) if gathered is None \
            else 8 * gathered
        return Payload(gather=share, alltoall=fed, select=2 * 4 * RADIX_BINS * len(plan.groups))

    def nominate(self, engine: GsSgd, plan: Plan, a: Array, fed: list[Array]) -> Nominated:
        """Candidates: the top-(m·k) of the union's sums per group, on every rank alike; finite:
        they are; gathered: the pairs this rank allgathered. Nothing here depends on which rank
        owns what: the sums are the allgather exchange's, bit for bit."""
        ops, comm = engine.ops, engine.comm
        mine = ops.concat(fed)
        owner = ops.owner_of(mine, comm.size, engine.keys)
        routed = ops.take(mine, ops.stable_order(owner))  # by owner; ascending within each
        splits = ops.count(owner, comm.size) * 2  # two floats a pair
        received, got = comm.alltoall(ops.pairs(routed, ops.take(a, routed)), splits, "gs_horovod.sparse")
        idx, vals = ops.unpairs(received)
        union, sums = union_sum(engine, idx, vals, got // 2)
        starts = ops.from_numpy(np.array([g.start for g in plan.groups] + [plan.total], np.int64), union)
        wanted = ops.from_numpy(np.array([g.candidates for g in plan.groups], np.int32), union)
        groups = len(plan.groups)
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
        nominated, first = [], 0
        for grp in plan.groups:
            nominated.append(Candidates(ops.slice(sel, first, grp.candidates), ops.slice(est, first, grp.candidates)))
            first += grp.candidates
        return Nominated(nominated, ops.all_finite(est), ops.count_of(ops.size_of(chosen)))
