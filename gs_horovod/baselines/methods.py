"""The baseline exchanges (see the package docstring). Each works on a = e + g per tensor
(flattened f32), in name order, identically on every rank, with Horovod's collectives."""

from __future__ import annotations

import math

import horovod.torch as hvd
import torch

from ..sketch import CountSketch
from ..torch import TorchOps
from .exchange import Exchange

Tensors = list[torch.Tensor]


def ring_allreduce(nbytes: float, ranks: int) -> float:
    """Sent + received by each rank of a ring allreduce of ``nbytes``."""
    return 4 * (ranks - 1) / ranks * nbytes


def _topk(a: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.topk(a.abs(), k, sorted=False).indices.sort().values
    return idx, a[idx]


def _sent(a: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(a).index_copy_(0, idx, a[idx])


class TopKAllgather(Exchange):
    """Each rank sends its local top-k (int32 index, f32 value) of every tensor; all ranks
    allgather them and average. Payload 8k per tensor; ring allgather: 2(P−1)·8k through a rank."""

    def _exchange(self, names: list[str], accs: Tensors) -> tuple[Tensors, Tensors]:
        picks = [_topk(a, self.k_for(a.numel())) for a in accs]
        idx = torch.cat([i for i, _ in picks]).to(torch.int32)
        val = torch.cat([v for _, v in picks])
        self.bytes_sent += idx.numel() * 4 + val.numel() * 4
        all_idx = hvd.allgather(idx, name="topk.idx").view(hvd.size(), -1).long()
        all_val = hvd.allgather(val, name="topk.val").view(hvd.size(), -1)
        updates, start = [], 0
        for a, (i, _) in zip(accs, picks):
            k = len(i)
            u = torch.zeros_like(a).index_add_(0, all_idx[:, start:start + k].reshape(-1),
                                               all_val[:, start:start + k].reshape(-1))
            updates.append(u / hvd.size())
            start += k
        return updates, [_sent(a, i) for a, (i, _) in zip(accs, picks)]

    def bytes_per_step(self, sizes: list[int], ranks: int) -> int:
        return sum(8 * self.k_for(d) for d in sizes)

    def wire_bytes(self, sizes: list[int], ranks: int) -> float:
        return 2 * (ranks - 1) * self.bytes_per_step(sizes, ranks)


class GTopK(Exchange):
    """gTop-k: local top-k sets merged by recursive doubling: in round i a rank swaps its
    current k-sparse set with rank ⊕ 2^i (one ``alltoall`` with only that split non-empty), sums
    the two and keeps the top k. After log2 P rounds every rank holds the same global top-k of
    the sum; it is averaged, and a rank's coordinates in the final set leave its residual.
    P must be a power of two (as in the original). Payload 8k per tensor per round."""

    def _exchange(self, names: list[str], accs: Tensors) -> tuple[Tensors, Tensors]:
        P, rank = hvd.size(), hvd.rank()
        if P & (P - 1):
            raise ValueError(f"the gTop-k baseline needs a power-of-two number of ranks, got {P}")
        ks = [self.k_for(a.numel()) for a in accs]
        sets = [_topk(a, k) for a, k in zip(accs, ks)]
        local = [i for i, _ in sets]
        mask = 1
        while mask < P:
            partner = rank ^ mask
            idx = torch.cat([i for i, _ in sets]).to(torch.int32)
            val = torch.cat([v for _, v in sets])
            splits = [len(idx) if r == partner else 0 for r in range(P)]
            self.bytes_sent += idx.numel() * 8
            their_idx, _ = hvd.alltoall(idx, splits=torch.tensor(splits, dtype=torch.int32), name=f"gtopk.idx.{mask}")
            their_val, _ = hvd.alltoall(val, splits=torch.tensor(splits, dtype=torch.int32), name=f"gtopk.val.{mask}")
            merged, start = [], 0
            for a, (i, v), k in zip(accs, sets, ks):
                dense = torch.zeros_like(a).index_add_(0, i, v)
                dense.index_add_(0, their_idx[start:start + k].long(), their_val[start:start + k])
                merged.append(_topk(dense, k))
                start += k
            sets = merged
            mask <<= 1
        updates = [torch.zeros_like(a).index_copy_(0, i, v / P) for a, (i, v) in zip(accs, sets)]
        sent = []
        for a, mine, (final, _) in zip(accs, local, sets):
            keep = mine[torch.isin(mine, final)]
            sent.append(_sent(a, keep))
        return updates, sent

    def bytes_per_step(self, sizes: list[int], ranks: int) -> int:
        return int(math.log2(ranks)) * sum(8 * self.k_for(d) for d in sizes)

    def wire_bytes(self, sizes: list[int], ranks: int) -> float:
        return 2 * self.bytes_per_step(sizes, ranks)


class SketchedSGD(Exchange):
    """Sketched-SGD's star: every rank sends its Count-Sketch of a to rank 0 (``alltoall`` with
    only rank 0's split non-empty); rank 0 sums them and broadcasts the ``p2·k`` candidate
    coordinates; an allreduce sums the exact a at the candidates; every rank keeps the top k.
    Payload: rows·cols·4 + 4·p2·k (+ the broadcast on rank 0); rank 0 receives (P−1) sketches."""

    def __init__(self, ratio: float, rows: int = 5, width: float = 4.0, p2: int = 4, seed: int = 0) -> None:
        super().__init__(ratio)
        self.rows, self.width, self.p2, self.seed = rows, width, p2, seed
        self.ops = TorchOps("auto")

    def _cols(self, d: int) -> int:
        return max(1, math.ceil(self.width * self.k_for(d)))

    def _exchange(self, names: list[str], accs: Tensors) -> tuple[Tensors, Tensors]:
        P = hvd.size()
        tables = [CountSketch.zeros(self.rows, self._cols(a.numel()), self.seed, self.ops, a).accumulate(a).table
                  for a in accs]
        flat = torch.cat([t.reshape(-1) for t in tables])
        splits = torch.tensor([flat.numel() if r == 0 else 0 for r in range(P)], dtype=torch.int32)
        self.bytes_sent += flat.numel() * 4
        gathered, _ = hvd.alltoall(flat, splits=splits, name="sketched.tables")  # returns (data, splits)
        cands = []
        for a, t in zip(accs, tables):
            c = min(a.numel(), self.p2 * self.k_for(a.numel()))
            if hvd.rank() == 0:
                merged = gathered.view(P, -1)[:, :t.numel()].sum(0).view_as(t)
                gathered = gathered.view(P, -1)[:, t.numel():].reshape(-1)
                cand, _ = CountSketch(self.rows, t.shape[1], self.seed, self.ops, merged).heavy_hitters(c, a.numel())
            else:
                cand = torch.zeros(c, dtype=torch.int64)
            cands.append(cand)
        cand_all = hvd.broadcast(torch.cat(cands), root_rank=0, name="sketched.cands")
        if hvd.rank() == 0:
            self.bytes_sent += cand_all.numel() * 8
        starts = torch.tensor([0] + [len(c) for c in cands]).cumsum(0).tolist()
        cands = [cand_all[s:e] for s, e in zip(starts[:-1], starts[1:])]
        values = torch.cat([a[c] for a, c in zip(accs, cands)])
        self.bytes_sent += values.numel() * 4
        summed = hvd.allreduce(values, op=hvd.Sum, name="sketched.values")
        updates, sent, start = [], [], 0
        for a, c in zip(accs, cands):
            v = summed[start:start + len(c)]
            start += len(c)
            top = torch.topk(v.abs(), self.k_for(a.numel()), sorted=False).indices
            idx = c[top]
            updates.append(torch.zeros_like(a).index_copy_(0, idx, v[top] / P))
            sent.append(_sent(a, idx))
        return updates, sent

    def bytes_per_step(self, sizes: list[int], ranks: int) -> int:
        return sum(4 * self.rows * self._cols(d) + 4 * min(d, self.p2 * self.k_for(d)) for d in sizes)

    def wire_bytes(self, sizes: list[int], ranks: int) -> float:
        sketch = sum(4 * self.rows * self._cols(d) for d in sizes)
        cands = sum(min(d, self.p2 * self.k_for(d)) for d in sizes)
        # rank 0 receives P−1 sketches, broadcasts int64 candidates (binomial tree: log2 P sends),
        # and takes part in the ring allreduce of the f32 values
        return (ranks - 1) * sketch + math.ceil(math.log2(ranks)) * 8 * cands + ring_allreduce(4 * cands, ranks)


class PowerSGD(Exchange):
    """Rank-r PowerSGD with error feedback: a tensor as an n×m matrix M (1-D tensors are sent
    dense); P = M·Q, allreduce-mean P, orthonormalise; Q = Mᵀ·P, allreduce-mean Q; update P·Qᵀ.
    Q is kept between steps (warm start). ``ratio`` is unused: the rank sets the size."""

    def __init__(self, ratio: float = 1.0, rank: int = 4, seed: int = 0) -> None:
        super().__init__(ratio)
        self.rank, self.seed = rank, seed
        self.qs: dict[str, torch.Tensor] = {}
        self.shapes: dict[str, tuple[int, int]] = {}

    def exchange(self, named: list[tuple[str, torch.Tensor]]) -> list[torch.Tensor]:
        for name, g in named:
            self.shapes[name] = (g.shape[0], g.numel() // g.shape[0]) if g.dim() >= 2 else (g.numel(), 1)
        return super().exchange(named)

    def _exchange(self, names: list[str], accs: Tensors) -> tuple[Tensors, Tensors]:
        updates: Tensors = [torch.empty(0)] * len(accs)
        low = [i for i, n in enumerate(names) if min(self.shapes[n]) > self.rank]
        dense = [i for i in range(len(accs)) if i not in low]
        if dense:
            flat = torch.cat([accs[i] for i in dense])
            self.bytes_sent += flat.numel() * 4
            mean = hvd.allreduce(flat, name="powersgd.dense")
            start = 0
            for i in dense:
                updates[i] = mean[start:start + accs[i].numel()].clone()
                start += accs[i].numel()
        if low:
            ms = [accs[i].view(self.shapes[names[i]]) for i in low]
            qs = []
            for i, m in zip(low, ms):
                q = self.qs.get(names[i])
                if q is None:
                    gen = torch.Generator().manual_seed(self.seed + i)
                    q = torch.randn(m.shape[1], self.rank, generator=gen)
                qs.append(q)
            ps = self._allreduce([m @ q for m, q in zip(ms, qs)], "powersgd.p")
            ps = [torch.linalg.qr(p).Q for p in ps]
            local_qs = [m.T @ p for m, p in zip(ms, ps)]
            qs = self._allreduce(local_qs, "powersgd.q")
            sent: Tensors = list(accs)  # dense tensors: all of a was sent
            for i, p, q, q_local in zip(low, ps, qs, local_qs):
                self.qs[names[i]] = q
                updates[i] = (p @ q.T).reshape(-1)
                sent[i] = (p @ q_local.T).reshape(-1)  # this rank's own part: M_w projected on P
            return updates, sent
        return updates, list(accs)

    def _allreduce(self, mats: Tensors, name: str) -> Tensors:
        flat = torch.cat([m.reshape(-1) for m in mats])
        self.bytes_sent += flat.numel() * 4
        mean = hvd.allreduce(flat, name=name)
        out, start = [], 0
        for m in mats:
            out.append(mean[start:start + m.numel()].view_as(m))
            start += m.numel()
        return out

    def bytes_per_step(self, sizes: list[int], ranks: int) -> int:
        """``sizes`` here are (n, m) pairs or plain element counts of 1-D tensors."""
        total = 0
        for s in sizes:
            n, m = s if isinstance(s, tuple) else (s, 1)
            total += 4 * self.rank * (n + m) if min(n, m) > self.rank else 4 * n * m
        return total

    def wire_bytes(self, sizes: list[int], ranks: int) -> float:
        return ring_allreduce(self.bytes_per_step(sizes, ranks), ranks)
