"""``exchange="sparse"`` (Ok-Topk / SparDL style): the union's sums of the allgather exchange,
bit for bit, with wire bytes flat in P.

1. alltoall: coordinate i belongs to rank owner(i), a hash of i (:meth:`ArrayOps.owner_of`:
   spread evenly whatever the layers' sizes and strides); rank r sends each of its pairs
   (F_r, a_r[F_r]) to its owner, which adds what it receives in rank order.
2. threshold: per group, the owners' histograms of the order key of |s| (NaN highest:
   :meth:`ArrayOps.abs_key`), 8 high bits, then 8 more bits within the bin that holds the
   (m·k)-th largest, each summed by one allreduce (the counts packed, :meth:`Sparse.count_bits`
   bits apiece, into int64 words), give the 16-bit key prefix t of the
   (m·k)-th largest, how many lie above it, and so how many ``ties`` of prefix t to take.
3. allgather: each owner sends its pairs above t and its best ``ties`` of prefix t (by key,
   then lower index); every rank sorts what it gathers by index and keeps the above ones and
   the best ``ties`` of all prefix-t pairs: the same m·k coordinates everywhere. A pair above
   t lies in every rank's selection, so NaN/Inf anywhere in the sums reaches every rank.

Payload: the L·k pairs of each group into the alltoall, each destination's as one message of
the wire format (:mod:`gs_horovod.codecs`, laid out for an even share); 2 × 256 counts per
group (b bits each, ⌊63/b⌋ to an int64 word: 2 × 512 bytes a group while a group's union has
fewer than 2^15 coordinates, 2 × 2 KiB at most); and this rank's share of the m·k selected
pairs as one message (planned: an even share; ties at the threshold's prefix can take more).
Where the format rounds, the owners select on their sums rounded as they will travel, and each
owner keeps in its residual what rounding took from the sums it had applied: P·(s − s̃) (s − s̃
when the transport sums), so nothing is lost over steps.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from ...array_ops import Array
from .base import Collective, Context, Exchange, ExchangePlan, Nominated, Nominees, Options, union_sum

RADIX_BINS = 256  # histogram bins per group in each of the two threshold rounds


class Sparse(Exchange):
    name = "sparse"
    collectives = (Collective("gs_horovod.sparse", "alltoall", "alltoall"),
                   Collective("gs_horovod.select.high", "allreduce", "select"),
                   Collective("gs_horovod.select.low", "allreduce", "select"),
                   Collective("gs_horovod.sparse.selected", "allgather", "gather"))
    sends_pairs = True
    auto_worth = 1.0

    def payload(self, plan: ExchangePlan, config: Options, measured: Optional[tuple[Any, Any]]) -> dict[str, int]:
        """Measured: (routed, gathered) bytes as the step handed them over; planned (None): the
        pairs spread evenly over the P owners, and an even share of the m·k selected."""
        fed, chosen, P = sum(g.fed for g in plan.groups), sum(g.nominated for g in plan.groups), plan.ranks
        select = 2 * 8 * -(-RADIX_BINS * len(plan.groups) // (63 // self.count_bits(plan)))
        if measured is not None:
            routed, gathered = measured
        else:
            routed = config.codec.planned_bytes(fed, P, plan.total)
            gathered = -(-config.codec.planned_bytes(chosen, P, plan.total) // P)
        return {"alltoall": routed, "select": select, "gather": gathered}

    @staticmethod
    def count_bits(plan: ExchangePlan) -> int:
        """Bits of the largest count a histogram bin can reach: a group's union, at most
        P·L·k of its coordinates and at most all of them."""
        return max(min(plan.ranks * g.fed, g.size) for g in plan.groups).bit_length()

    def nominate(self, ctx: Context, plan: ExchangePlan, a: Array, fed: list[Array]) -> Nominated:
        """Candidates: the top-(m·k) of the union's sums per group, on every rank alike; finite:
        they are; routed / gathered: the bytes of this rank's alltoall and allgather. With
        ``wire="fp32"`` or ``"compact"`` nothing here depends on which rank owns what: the sums
        are the allgather exchange's, bit for bit (with the compact wire: of the same rounded
        values); with ``"compact8"`` an owner's sums are rounded at the scale of its largest, so
        their rounding depends on the owners' hash."""
        ops, comm, codec = ctx.ops, ctx.comm, ctx.codec
        mine = ops.concat(fed)
        own = codec.rounded(ops, ops.take(a, mine))  # one scale for all
        owner = ops.owner_of(mine, comm.size, ctx.keys)
        order = ops.stable_order(owner)  # by owner; ascending within each
        routed, routed_vals = ops.take(mine, order), ops.take(own, order)
        share = math.ceil(sum(g.fed for g in plan.groups) / plan.ranks)  # each destination's, planned
        idx, vals, counts, routed_bytes = codec.alltoall(ops, comm, routed, routed_vals, ops.count(owner, comm.size),
                                                         plan.total, share, "gs_horovod.sparse")
        union, exact_sums = union_sum(ctx, idx, vals, counts, plan.total)
        sums = codec.rounded(ops, exact_sums)  # select on what travels
        starts = ops.from_numpy(np.array([g.start for g in plan.groups] + [plan.total], np.int64), union)
        wanted = ops.from_numpy(np.array([g.nominated for g in plan.groups], np.int32), union)
        bins, bits = len(plan.groups) * RADIX_BINS, self.count_bits(plan)

        def histogram(counts: Array, name: str) -> Array:  # every owner's counts, summed
            return ops.unpack_counts(comm.allreduce_sum(ops.pack_counts(counts, bits), name), bits, bins)

        group, key = ops.bucket(union, starts), ops.abs_key(sums)
        high = ops.key_bits(key, 23, 8)  # exponent: 8 bits
        cut_high, above = ops.radix_cut(histogram(ops.count(group * RADIX_BINS + high, bins), "gs_horovod.select.high"),
                                        wanted)
        in_cut = ops.equal_at(high, ops.take(cut_high, group))
        low = ops.key_bits(key, 15, 8)  # 8 more bits: the 16-bit prefix pins |s| to 2^-8
        cut_low, above_low = ops.radix_cut(histogram(ops.count(group * RADIX_BINS + low, bins, in_cut),
                                                     "gs_horovod.select.low"), wanted - above)
        prefix, ties = cut_high * RADIX_BINS + cut_low, wanted - above - above_low
        keep = ops.keep_top(ops.key_bits(key, 15, 16), key, group, prefix, ties)
        chosen, chosen_sums = ops.take(union, keep), ops.take(sums, keep)
        share = math.ceil(sum(g.nominated for g in plan.groups) / plan.ranks)  # each owner's, planned
        out_idx, out_vals, gathered_bytes = codec.allgather(ops, comm, chosen, chosen_sums, plan.total, share,
                                                            "gs_horovod.sparse.selected")
        ascending = ops.stable_order(out_idx)
        out_idx, out_vals = ops.take(out_idx, ascending), ops.take(out_vals, ascending)
        out_key, out_group = ops.abs_key(out_vals), ops.bucket(out_idx, starts)
        keep = ops.keep_top(ops.key_bits(out_key, 15, 16), out_key, out_group, prefix, ties)
        sel, est = ops.take(out_idx, keep), ops.take(out_vals, keep)
        nominated, first = [], 0
        for grp in plan.groups:
            nominated.append(Nominees(ops.slice(sel, first, grp.nominated), ops.slice(est, first, grp.nominated)))
            first += grp.nominated
        sent = None
        if not codec.lossless:  # what this rank gave, less what rounding took from the sums it owns (its residual's)
            lost = (exact_sums - sums) * (comm.size if comm.averages else 1)
            sent = ops.take_sorted(mine, own, sel, plan.total) - ops.take_sorted(union, lost, sel, plan.total)
        return Nominated(nominated, ops.all_finite(est), sent, ops.count_of(routed_bytes), ops.count_of(gathered_bytes))
