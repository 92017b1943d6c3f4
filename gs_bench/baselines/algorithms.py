"""The baseline exchanges, each as its authors describe it (see the package docstring), on
the error-fed vector a (D,) f32 of :class:`~gs_bench.baselines.reducer.Exchange`, through a
:class:`~gs_horovod.transports.protocol.Collectives`. Sums over ranks are divided by P: updates are means."""

from __future__ import annotations

import math

import torch

from gs_bench.one_receiver import gather, pairwise
from gs_horovod.codecs import CODECS
from gs_horovod.kernels import torch_ops
from gs_horovod.kernels.hashing import hash_keys
from gs_horovod.kernels.torch_ops import TorchOps
from gs_horovod.transports.collective_cost import Collective
from gs_horovod.transports.protocol import Collectives

from .reducer import Reducer, Span


def _power_of_two(P: int, method: str) -> None:
    if P & (P - 1):
        raise ValueError(f"the {method} baseline needs a power-of-two number of ranks, got {P}")


def _sum_pairs(idx: torch.Tensor, vals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(unique indices ascending, summed values) of (index, value) pairs: O(n log n), no D-sized
    temporary."""
    uniq, inverse = torch.unique(idx, sorted=True, return_inverse=True)
    return uniq, torch.zeros(len(uniq), dtype=vals.dtype).index_add_(0, inverse, vals)


class TopKAllgather(Reducer):
    """Top-k allgather (DGC-style, Lin et al. 2018): each rank sends its top-k (int32 index,
    f32 value) of every span; all ranks allgather them and apply the mean of the P sparse sets
    (up to P·k coordinates). Payload 8k per span; ring allgather: 2(P−1)·8k through a rank."""

    def _reduce(self, names: list[str], a: torch.Tensor, spans: list[Span], update: torch.Tensor,
                  comm: Collectives) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.cat([self.top_abs(a[s.start:s.start + s.size], s.k) + s.start for s in spans])
        vals = a[idx]
        all_idx = comm.allgather(idx.to(torch.int32), "topk.idx").reshape(-1).long()
        all_vals = comm.allgather(vals, "topk.val").reshape(-1)
        update.index_add_(0, all_idx, all_vals / comm.size)
        return idx, vals

    def _planned(self, shapes: list[tuple[int, ...]], ranks: int) -> list[Collective]:
        k = sum(s.k for s in self.spans([math.prod(x) for x in shapes]))
        return [("allgather", 4.0 * k), ("allgather", 4.0 * k)]


class GTopK(Reducer):
    """gTop-k (Shi et al. 2019): local top-k sets merged by recursive doubling. In round i a
    rank swaps its current k-sparse set (int32 indices, f32 values) with rank ⊕ 2^i, sums the
    two sets pairwise (≤ 2k pairs, sparse) and keeps their top k. After log2 P rounds every rank
    holds the same global top-k set; its mean is applied, and a rank's own top-k coordinates
    that are in the final set leave its residual. P must be a power of two (as published).
    Payload 8k per span per round.

    ``wire="compact"`` (not the authors' format: a labelled variant, to tell what the encoding
    alone buys) sends each round's set in the engine's compact pair format
    (:mod:`gs_horovod.codecs.compact`: Elias–Fano indices, bfloat16 values), one message
    of every span's pairs; both partners sum the values as they travel, so they still agree.
    A rank's own values are rounded before the first round and the rounding stays in its
    residual; the rounding of later rounds' sums is lost (kept by no rank)."""

    WIRES = ("fp32", "compact")

    def __init__(self, ratio: float = 0.01, scope: str = "global", min_size: int = 1024, backend: str = "auto",
                 wire: str = "fp32") -> None:
        super().__init__(ratio, scope, min_size, backend)
        if wire not in self.WIRES:
            raise ValueError(f"wire must be one of {self.WIRES}, got {wire!r}")
        self.wire = wire

    def _swap(self, comm: Collectives, idx: torch.Tensor, vals: torch.Tensor, D: int,
              mask: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The partner's (indices (n,) int64, values (n,) f32) for ours, in this reducer's wire format."""
        n = len(idx)
        if self.wire == "compact":  # the engine's codec and its dispatch (Numba on the CPU)
            ops, codec = TorchOps(self.backend), CODECS[self.wire]
            low = codec.layout(n, D)
            buf, _ = ops.pack_pairs(idx, vals, torch.tensor([n]), D, low, codec)
            theirs = pairwise(comm, buf, comm.rank ^ mask, f"gtopk.{mask}")
            their_idx, their_vals, _ = ops.unpack_pairs(theirs, 1, D, low, codec)
            return their_idx, their_vals
        theirs = pairwise(comm, torch.cat([idx.to(torch.int32), vals.view(torch.int32)]), comm.rank ^ mask,
                          f"gtopk.{mask}")
        return theirs[:n].long(), theirs[n:].view(torch.float32)

    def _reduce(self, names: list[str], a: torch.Tensor, spans: list[Span], update: torch.Tensor,
                  comm: Collectives) -> tuple[torch.Tensor, torch.Tensor]:
        P = comm.size
        _power_of_two(P, "gTop-k")
        sets = []
        for s in spans:
            i = self.top_abs(a[s.start:s.start + s.size], s.k) + s.start
            sets.append((i, self._rounded(a[i])))
        mine = torch.cat([i for i, _ in sets])
        sent = torch.cat([v for _, v in sets])
        mask = 1
        while mask < P:
            idx = torch.cat([i for i, _ in sets])
            vals = self._rounded(torch.cat([v for _, v in sets]))
            their_idx, their_vals = self._swap(comm, idx, vals, len(a), mask)
            sets = [(i, v) for (i, _), v in zip(sets, torch.split(vals, [len(i) for i, _ in sets]))]
            merged, start = [], 0
            for (i, v), s in zip(sets, spans):
                uniq, summed = _sum_pairs(torch.cat([i, their_idx[start:start + s.k]]),
                                          torch.cat([v, their_vals[start:start + s.k]]))
                best = self.top_abs(summed, s.k)
                merged.append((uniq[best], summed[best]))
                start += s.k
            sets = merged
            mask <<= 1
        final = torch.cat([i for i, _ in sets])
        update[final] = torch.cat([v for _, v in sets]) / P
        kept = torch.isin(mine, final)
        return mine[kept], sent[kept]

    def _rounded(self, vals: torch.Tensor) -> torch.Tensor:
        return CODECS[self.wire].rounded_torch(vals) if self.wire == "compact" else vals

    def _planned(self, shapes: list[tuple[int, ...]], ranks: int) -> list[Collective]:
        D = sum(math.prod(x) for x in shapes)
        k = sum(s.k for s in self.spans([math.prod(x) for x in shapes]))
        size = CODECS[self.wire].planned_bytes(k, 1, D) if self.wire == "compact" else 8.0 * k
        return [("pairwise", float(size))] * int(math.log2(ranks))


class SketchedSGD(Reducer):
    """Sketched-SGD (Ivkin et al. 2019), whole-model as published: every rank sends a rows ×
    ceil(width·k) f32 Count-Sketch of its whole a (per span) to rank 0 (a star, rank 0 in the
    parameter server's place), which sums them and finds the ``p2``·k heavy hitters; rank 0
    broadcasts those candidates (int32), an allreduce sums the exact a there, and every rank
    applies the top k of the candidates. Published sizes: 5 rows, width 10 (cols = 10k), p2 = 4
    (:data:`PUBLISHED`). Sketching, heavy hitters and selection use gs-SGD's kernels."""

    PUBLISHED = {"rows": 5, "width": 10.0, "p2": 4}

    def __init__(self, ratio: float = 0.01, scope: str = "global", min_size: int = 1024, backend: str = "auto",
                 rows: int = 5, width: float = 10.0, p2: int = 4, seed: int = 0) -> None:
        super().__init__(ratio, scope, min_size, backend)
        if rows < 1 or width <= 0 or p2 < 1:
            raise ValueError(f"rows, width and p2 must be positive, got rows={rows}, width={width}, p2={p2}")
        self.rows, self.width, self.p2 = rows, width, p2
        self.keys = hash_keys(seed)

    def cols(self, s: Span) -> int:
        return max(1, math.ceil(self.width * s.k))

    def candidates(self, s: Span) -> int:
        return min(s.size, self.p2 * s.k)

    def _reduce(self, names: list[str], a: torch.Tensor, spans: list[Span], update: torch.Tensor,
                  comm: Collectives) -> tuple[torch.Tensor, torch.Tensor]:
        tables = []
        for s in spans:
            table = torch.zeros(self.rows, self.cols(s))
            torch_ops.accumulate(self.backend, table, a[s.start:s.start + s.size], self.keys, 0)
            tables.append(table.reshape(-1))
        gathered = gather(comm, torch.cat(tables), "sketched.tables")
        counts = [self.candidates(s) for s in spans]
        if gathered is not None:
            merged, cands, start = gathered.sum(0), [], 0
            for s, c in zip(spans, counts):
                table = merged[start:start + self.rows * self.cols(s)].view(self.rows, self.cols(s))
                start += table.numel()
                cands.append(torch_ops.heavy_hitters(self.backend, table, self.keys, s.size, c)[0] + s.start)
            cand = torch.cat(cands).to(torch.int32)
        else:
            cand = torch.zeros(sum(counts), dtype=torch.int32)
        cand = comm.broadcast(cand, "sketched.candidates").long()
        exact = comm.allreduce_sum(a[cand], "sketched.values")
        chosen, start = [], 0
        for s, c in zip(spans, counts):
            best = self.top_abs(exact[start:start + c], s.k) + start
            chosen.append(best)
            start += c
        best = torch.cat(chosen)
        idx = cand[best]
        update[idx] = exact[best] / comm.size
        return idx, a[idx]

    def _planned(self, shapes: list[tuple[int, ...]], ranks: int) -> list[Collective]:
        spans = self.spans([math.prod(x) for x in shapes])
        cells = sum(self.rows * self.cols(s) for s in spans)
        cands = sum(self.candidates(s) for s in spans)
        return [("gather", 4.0 * cells), ("broadcast", 4.0 * cands), ("allreduce", 4.0 * cands)]


class PowerSGD(Reducer):
    """Rank-r PowerSGD (Vogels et al. 2019) with error feedback and warm start: a tensor as an
    n×m matrix M (first dimension × the rest); P = M·Q, allreduce-mean P, orthonormalise
    (QR); Q = Mᵀ·P, allreduce-mean Q; the update is P·Qᵀ and this rank's sent part P·(Mᵀ·P)ᵀ.
    Matrices that would not shrink (min(n, m) ≤ r, e.g. 1-D tensors) are averaged uncompressed
    in one allreduce. It takes no ``ratio`` or ``scope``: the rank sets the size, per matrix.
    ``start_iter``: steps averaged uncompressed first (no error feedback), as torch's
    ``start_powerSGD_iter``."""

    def __init__(self, rank: int = 4, min_size: int = 1024, backend: str = "auto", seed: int = 0,
                 start_iter: int = 0) -> None:
        super().__init__(1.0, "layer", min_size, backend)
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"rank must be an int >= 1, got {rank!r}")
        if isinstance(start_iter, bool) or not isinstance(start_iter, int) or start_iter < 0:
            raise ValueError(f"start_iter must be an int >= 0, got {start_iter!r}")
        self.rank, self.seed, self.start_iter, self.steps = rank, seed, start_iter, 0
        self.qs: dict[str, torch.Tensor] = {}

    @staticmethod
    def matrix(shape: tuple[int, ...]) -> tuple[int, int]:
        n = shape[0] if shape else 1
        return n, math.prod(shape) // max(1, n)

    def _reduce(self, names: list[str], a: torch.Tensor, spans: list[Span], update: torch.Tensor,
                  comm: Collectives) -> None:
        P = comm.size
        self.steps += 1
        if self.steps <= self.start_iter:
            update.copy_(comm.allreduce_sum(a, "powersgd.vanilla") / P)
            a.zero_()
            return
        mats, flat, start = [], [], 0
        for name in names:
            n, m = self.matrix(self.shapes[name])
            (mats if min(n, m) > self.rank else flat).append((name, start, n, m))
            start += n * m
        if flat:
            parts = torch.cat([a[s:s + n * m] for _, s, n, m in flat])
            mean = comm.allreduce_sum(parts, "powersgd.dense") / P
            for (_, s, n, m), u in zip(flat, torch.split(mean, [n * m for *_, n, m in flat])):
                update[s:s + n * m] = u
                a[s:s + n * m] = 0  # sent uncompressed: nothing stays behind
        if mats:
            ms = [a[s:s + n * m].view(n, m) for _, s, n, m in mats]
            qs = []
            for i, (name, _, _, m) in enumerate(mats):
                q = self.qs.get(name)
                if q is None:
                    q = torch.randn(m, self.rank, generator=torch.Generator().manual_seed(self.seed + i))
                qs.append(q)
            ps = [torch.linalg.qr(p).Q for p in self._mean([mat @ q for mat, q in zip(ms, qs)], comm, "powersgd.p")]
            local = [mat.T @ p for mat, p in zip(ms, ps)]
            for (name, s, n, m), p, q, q_local in zip(mats, ps, self._mean(local, comm, "powersgd.q"), local):
                self.qs[name] = q
                update[s:s + n * m] = (p @ q.T).reshape(-1)
                a[s:s + n * m] -= (p @ q_local.T).reshape(-1)  # this rank's part of the update

    @staticmethod
    def _mean(mats: list[torch.Tensor], comm: Collectives, name: str) -> list[torch.Tensor]:
        mean = comm.allreduce_sum(torch.cat([x.reshape(-1) for x in mats]), name) / comm.size
        return [u.view_as(x) for u, x in zip(torch.split(mean, [x.numel() for x in mats]), mats)]

    def _planned(self, shapes: list[tuple[int, ...]], ranks: int) -> list[Collective]:
        dims = [self.matrix(s) for s in shapes]
        flat = sum(n * m for n, m in dims if min(n, m) <= self.rank)
        low = [(n, m) for n, m in dims if min(n, m) > self.rank]
        out = [("allreduce", 4.0 * flat)] if flat else []
        if low:
            out += [("allreduce", 4.0 * self.rank * sum(n for n, _ in low)),
                    ("allreduce", 4.0 * self.rank * sum(m for _, m in low))]
        return out
