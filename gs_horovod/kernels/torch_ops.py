"""Count-Sketch kernels over torch tensors, the dispatch of torch tensors to every backend, and
:class:`TorchOps`, the engine's array operations on torch tensors.

One contract for every backend (see :mod:`.hashing` for the hash; ``keys`` = ``hash_keys(seed)``)::

    accumulate(backend, table, vec, keys, offset)           # table (rows, cols) f32 += sketch of vec (n,) f32
    accumulate_at(backend, table, idx, vals, keys)          # ... of vals (n,) f32 at coordinates idx (n,) int64
    heavy_hitters(backend, table, keys, length, count, offset=0) -> (idx (count,) int64, est (count,) f32)
    top_abs(backend, x, count) -> idx (count,) int64        # the count largest |x|

Orders are exact and deterministic: ``heavy_hitters`` and ``top_abs`` select under (|value|
desc, index asc), NaN above ±Inf above finite values, and return indices ascending. Additions
into a cell run in coordinate (``idx``) order on the CPU backends, so "torch" and "numba"
tables are bitwise equal; "cuda" adds with float atomics (last bits may vary between runs).

``"torch"`` uses torch ops (CPU or CUDA) in chunks of ``_CHUNK`` coordinates, so temporaries
stay O(chunk); its ``heavy_hitters`` computes every estimate of a chunk (no pruning) and keeps
a running top ``count``. ``"numba"`` runs :mod:`.numba_cpu` on zero-copy NumPy views;
``"cuda"`` runs :mod:`.numba_cuda` on zero-copy ``__cuda_array_interface__`` views (NumPy views
under the CUDA simulator), with its ``top_abs`` and the final ordering of ``heavy_hitters``'
candidates in torch ops. ``"auto"`` picks ``"numba"`` for CPU tensors, ``"cuda"`` for CUDA ones.
"""

from __future__ import annotations

import zlib
from typing import Any, Callable, ContextManager, Optional

import numpy as np
import torch

from .. import threads
from ..array_ops import MessageCodec
from . import BACKENDS
from .hashing import M1, M2, M3, MASK32, NAN_KEY, first_threshold_rank, to_int64

_DTYPES = {"float16": torch.float16, "float32": torch.float32}
_CHUNK = 1 << 20  # coordinates hashed per torch step: bounds temporaries to ~40 MB per row
# On the CPU, union_sum / take_sorted go through a (universe,) table instead of a sort or a
# binary search once the pairs are at least 1/_DENSE_UNION of the universe (the two cost the same
# near there on these CPUs: 2^20 coordinates, 2 and 4 vectors, one thread; not measured on GPUs)
_DENSE_UNION = 32
_M1, _M2, _M3 = to_int64(M1), to_int64(M2), to_int64(M3)


def _srl(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def hashes(g: torch.Tensor, keys: np.ndarray, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Buckets (rows, n) int64 and sign bits (rows, n) bool (True: -1) of coordinates g (n,)
    int64, in int64 ops (multiplication wraps mod 2^64)."""
    z = g ^ int(keys[0])
    z = (z ^ _srl(z, 30)) * _M1
    z = (z ^ _srl(z, 27)) * _M2
    z = z ^ _srl(z, 31)
    h1, h2 = z & MASK32, _srl(z, 32) | 1
    w = (z ^ _srl(z, 29)) * _M3
    j = torch.arange(rows, dtype=torch.int64, device=g.device)[:, None]
    buckets = (((h1 + j * h2) & MASK32) * cols) >> 32
    return buckets, ((w >> (63 - j)) & 1).bool()


def _abs_key(x: torch.Tensor) -> torch.Tensor:
    """int32 key ordering |x| (float32 bits without the sign; every NaN one key above +Inf)."""
    k = x.view(torch.int32) & 0x7FFFFFFF
    return torch.where(k > 0x7F800000, torch.full_like(k, NAN_KEY), k)


def _top_keys(key: torch.Tensor, count: int) -> torch.Tensor:
    """Positions (count,) int64 ascending of the ``count`` largest keys, ties to smaller positions."""
    cut = torch.topk(key, count, sorted=False).values.min()
    above = torch.nonzero(key > cut).flatten()
    ties = torch.nonzero(key == cut).flatten()[: count - above.numel()]
    return torch.cat([above, ties]).sort().values


def torch_top_abs(x: torch.Tensor, count: int) -> torch.Tensor:
    """Indices (count,) int64 ascending of the ``count`` largest |x| of x (n,) f32 (NaN above
    Inf above finite; ties: lower index), by torch ops."""
    return _top_keys(_abs_key(x), count)


def torch_accumulate_at(table: torch.Tensor, idx: torch.Tensor, vals: torch.Tensor, keys: np.ndarray) -> None:
    """Adds the sketch of ``vals`` (n,) f32 at coordinates ``idx`` (n,) int64 into ``table``
    (rows, cols) f32 in place (``index_add_``: each cell's additions in ``idx`` order)."""
    rows, cols = table.shape
    for start in range(0, idx.numel(), _CHUNK):
        v = vals[start:start + _CHUNK]
        buckets, neg = hashes(idx[start:start + _CHUNK], keys, rows, cols)
        for j in range(rows):
            table[j].index_add_(0, buckets[j], torch.where(neg[j], -v, v))


def torch_accumulate(table: torch.Tensor, vec: torch.Tensor, keys: np.ndarray, offset: int) -> None:
    """Adds the sketch of the dense ``vec`` (n,) f32, at coordinates offset..offset+n, into
    ``table`` in place (:func:`torch_accumulate_at`)."""
    for start in range(0, vec.numel(), _CHUNK):
        v = vec[start:start + _CHUNK]
        g = torch.arange(offset + start, offset + start + v.numel(), dtype=torch.int64, device=vec.device)
        torch_accumulate_at(table, g, v, keys)


def _estimates(table: torch.Tensor, g: torch.Tensor, keys: np.ndarray) -> torch.Tensor:
    rows, cols = table.shape
    buckets, neg = hashes(g, keys, rows, cols)
    v = table.gather(1, buckets)
    est = torch.where(neg, -v, v).sort(dim=0).values
    if rows % 2:
        return est[rows // 2]
    return (est[rows // 2 - 1] + est[rows // 2]) * 0.5


def torch_heavy_hitters(table: torch.Tensor, keys: np.ndarray, length: int, count: int,
                        offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(idx (count,) int64 ascending, estimates (count,) f32): the ``count`` coordinates of
    [0, length) (read at offset + i in ``table``) with the largest |median estimate| (ties:
    lower index), scanned in chunks."""
    idx = torch.empty(0, dtype=torch.int64, device=table.device)
    est = torch.empty(0, dtype=torch.float32, device=table.device)
    for start in range(0, length, _CHUNK):
        g = torch.arange(start, min(length, start + _CHUNK), dtype=torch.int64, device=table.device)
        idx, est = torch.cat([idx, g]), torch.cat([est, _estimates(table, g + offset, keys)])
        if idx.numel() > count:
            keep = _top_keys(_abs_key(est), count)
            idx, est = idx[keep], est[keep]
    return idx, est


def _numba_threads() -> None:
    """Numba's CPU kernels use the node's cores shared among its ranks, or the count the user set
    (:func:`gs_horovod.threads.kernel_threads`, decided at the first kernel call)."""
    threads.numba_threads()


def _numba_accumulate(table: torch.Tensor, vec: torch.Tensor, keys: np.ndarray, offset: int) -> None:
    from . import numba_cpu

    _numba_threads()
    numba_cpu.accumulate(table.numpy(), vec.numpy(), keys, offset)


def _numba_accumulate_at(table: torch.Tensor, idx: torch.Tensor, vals: torch.Tensor, keys: np.ndarray) -> None:
    from . import numba_cpu

    _numba_threads()
    numba_cpu.accumulate_at(table.numpy(), idx.numpy(), vals.numpy(), keys)


def _numba_heavy_hitters(table: torch.Tensor, keys: np.ndarray, length: int, count: int,
                         offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    from . import numba_cpu

    _numba_threads()
    idx, est = numba_cpu.heavy_hitters(table.numpy(), keys, length, count, offset)
    return torch.from_numpy(idx), torch.from_numpy(est)


def _numba_top_abs(x: torch.Tensor, count: int) -> torch.Tensor:
    from . import numba_cpu

    _numba_threads()
    return torch.from_numpy(numba_cpu.top_abs(x.numpy(), count))


def _cuda_view(t: torch.Tensor):
    from numba import config, cuda

    if t.is_cuda:
        return cuda.as_cuda_array(t)
    if config.ENABLE_CUDASIM:
        return t.numpy()
    raise ValueError("the 'cuda' sketch backend needs CUDA tensors (or NUMBA_ENABLE_CUDASIM=1)")


def _cuda_accumulate(table: torch.Tensor, vec: torch.Tensor, keys: np.ndarray, offset: int) -> None:
    from . import numba_cuda

    numba_cuda.accumulate(_cuda_view(table), _cuda_view(vec), keys, offset)


def _cuda_accumulate_at(table: torch.Tensor, idx: torch.Tensor, vals: torch.Tensor, keys: np.ndarray) -> None:
    from . import numba_cuda

    numba_cuda.accumulate_at(_cuda_view(table), _cuda_view(idx), _cuda_view(vals), keys)


def _cuda_heavy_hitters(table: torch.Tensor, keys: np.ndarray, length: int, count: int,
                        offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Scans with thresholds [lo, hi): survivors are appended (atomically, in any order) to a
    buffer of ``cap``; an overflow raises lo to the count-th |est| buffered, too few survivors
    lower it (the next scan takes [lo', lo)). Candidates are then ordered in torch ops."""
    from . import numba_cuda

    rows, cols = table.shape
    cells = table.abs().flatten()
    cells = cells[:: max(1, cells.numel() // (1 << 16))].sort(descending=True).values
    cap = count + max(count // 2, 1024)
    buf_idx = torch.empty(cap, dtype=torch.int64, device=table.device)
    buf_est = torch.empty(cap, dtype=torch.float32, device=table.device)
    counter = torch.zeros(1, dtype=torch.int64, device=table.device)
    idx, est = buf_idx[:0], buf_est[:0]
    hi, slack = float("inf"), 2.0
    rank = first_threshold_rank(cells.numel(), length, count, slack, rows)
    lo = float(cells[rank - 1]) if rank < cells.numel() else 0.0
    while True:
        counter.zero_()
        numba_cuda.scan(_cuda_view(table), keys, offset, length, lo, hi, _cuda_view(buf_idx), _cuda_view(buf_est),
                        _cuda_view(counter))
        found = int(counter.item())
        if found > cap:  # at least cap >= count of them reach lo: the count-th best is a safe lo
            cut = float(torch.topk(buf_est.abs(), count - idx.numel()).values.min())
            if cut == lo:  # more than cap ties at lo: order the rest in torch ops
                rest_idx, rest_est = torch_heavy_hitters(table, keys, length, count, offset)
                return rest_idx, rest_est
            lo = cut
            continue
        idx, est = torch.cat([idx, buf_idx[:found]]), torch.cat([est, buf_est[:found]])
        if idx.numel() >= count or lo == 0.0:
            break
        slack *= 8
        rank = first_threshold_rank(cells.numel(), length, count, slack, rows)
        lower = float(cells[rank - 1]) if rank < cells.numel() else 0.0
        hi, lo = lo, (lower if lower < lo else 0.0)
    order = idx.sort().indices
    idx, est = idx[order], est[order]
    keep = _top_keys(_abs_key(est), count)
    return idx[keep], est[keep]


def _cuda_top_abs(x: torch.Tensor, count: int) -> torch.Tensor:
    return torch_top_abs(x, count)


_KERNELS: dict[str, dict[str, Callable]] = {
    "torch": {"accumulate": torch_accumulate, "accumulate_at": torch_accumulate_at,
              "heavy_hitters": torch_heavy_hitters, "top_abs": torch_top_abs},
    "numba": {"accumulate": _numba_accumulate, "accumulate_at": _numba_accumulate_at,
              "heavy_hitters": _numba_heavy_hitters, "top_abs": _numba_top_abs},
    "cuda": {"accumulate": _cuda_accumulate, "accumulate_at": _cuda_accumulate_at,
             "heavy_hitters": _cuda_heavy_hitters, "top_abs": _cuda_top_abs},
}


def resolve(backend: str, device: torch.device) -> str:
    """The concrete backend for ``backend`` on ``device`` (``"auto"`` → numba on CPU, cuda on GPU)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "cuda" if device.type == "cuda" else "numba"
    if backend == "numba" and device.type != "cpu":
        raise ValueError(f"the 'numba' sketch backend runs on CPU tensors, got a {device.type} tensor")
    return backend


def accumulate(backend: str, table: torch.Tensor, vec: torch.Tensor, keys: np.ndarray, offset: int) -> None:
    """Adds, in place, the sketch of ``vec`` (n,) f32 at coordinates offset..offset+n-1 into
    ``table`` (rows, cols) f32 (both contiguous)."""
    _KERNELS[resolve(backend, table.device)]["accumulate"](table, vec, keys, offset)


def accumulate_at(backend: str, table: torch.Tensor, idx: torch.Tensor, vals: torch.Tensor, keys: np.ndarray) -> None:
    """Adds, in place, the sketch of the sparse vector with ``vals`` (n,) f32 at global
    coordinates ``idx`` (n,) int64 in [0, 2^62) into ``table`` (rows, cols) f32, in idx order."""
    _KERNELS[resolve(backend, table.device)]["accumulate_at"](table, idx, vals, keys)


def heavy_hitters(backend: str, table: torch.Tensor, keys: np.ndarray, length: int, count: int,
                  offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``count`` coordinates of offset..offset+length-1 with the largest |median-of-rows
    estimate| (ties: smaller index): (idx (count,) int64 ascending in [0, length), est (count,)
    f32). ``table`` (rows, cols) f32 must be finite; needs (rows+1)//2 cells >= T to reach T."""
    if not 1 <= count <= length:
        raise ValueError(f"count must be in [1, length={length}], got {count}")
    return _KERNELS[resolve(backend, table.device)]["heavy_hitters"](table, keys, length, count, offset)


def top_abs(backend: str, x: torch.Tensor, count: int) -> torch.Tensor:
    """Indices (count,) int64 ascending of the ``count`` largest |x| of x (n,) f32 (ties: smaller
    index; NaN above ±Inf above every finite value)."""
    if not 1 <= count <= x.numel():
        raise ValueError(f"count must be in [1, n={x.numel()}], got {count}")
    return _KERNELS[resolve(backend, x.device)]["top_abs"](x, count)


class TorchOps:
    """:class:`gs_horovod.array_ops.ArrayOps` for torch tensors, with the kernels of ``backend``."""

    def __init__(self, backend: str = "auto") -> None:
        self.backend = backend

    def zeros(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        return torch.zeros(shape, dtype=torch.float32, device=like.device)

    def zeros_like(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)

    def from_numpy(self, x: np.ndarray, like: Optional[torch.Tensor] = None) -> torch.Tensor:
        return torch.from_numpy(x) if like is None else torch.from_numpy(x).to(like.device)

    def copy(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    def moved(self, x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return x.to(like.device, torch.float32, copy=True)

    def own_threads(self) -> ContextManager[int]:
        return threads.engine_share()

    def wait(self, x: torch.Tensor) -> None:
        if x.is_cuda:
            torch.cuda.synchronize(x.device)

    def concat(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return xs[0] if len(xs) == 1 else torch.cat(xs)

    def add_parts(self, base: torch.Tensor, parts: list[torch.Tensor]) -> torch.Tensor:
        out, start = torch.empty_like(base), 0
        for p in parts:
            torch.add(base[start:start + p.numel()], p, out=out[start:start + p.numel()])
            start += p.numel()
        return out

    def slice(self, x: torch.Tensor, start: int, size: int) -> torch.Tensor:
        return x[start:start + size]

    def reshape(self, x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        return x.reshape(shape)

    def stack(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(xs)

    def dtype_name(self, x: torch.Tensor) -> str:
        return str(x.dtype).removeprefix("torch.")

    def plus_minus(self, value: int) -> torch.Tensor:
        return torch.tensor([value, -value], dtype=torch.int64)

    def equal(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        return int(a) == int(b)

    def cast(self, x: torch.Tensor, dtype: str) -> torch.Tensor:
        return x.to(_DTYPES[dtype])

    def take(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return x[idx]

    def scatter(self, n: int, idx: torch.Tensor, vals: torch.Tensor, like: torch.Tensor,
                tail: Optional[torch.Tensor] = None) -> torch.Tensor:
        out = torch.zeros(n + (0 if tail is None else tail.numel()), dtype=torch.float32, device=like.device)
        out[:n].index_copy_(0, idx, vals)
        if tail is not None:
            out[n:] = tail
        return out

    def scatter_sub(self, x: torch.Tensor, idx: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
        return x.index_add_(0, idx, vals, alpha=-1)

    def where(self, mask: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.where(mask, a, b)

    def isin_sorted(self, x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        pos = torch.searchsorted(ref, x).clamp_(max=max(0, len(ref) - 1))
        return ref[pos] == x if len(ref) else torch.zeros_like(x, dtype=torch.bool)

    def all_finite(self, x: torch.Tensor) -> bool:
        """One reduction: the least and greatest element are finite exactly when every element
        is (both propagate NaN; an infinity is one of them). A tenth of ``isfinite(x).all()``'s
        time on a CPU, which writes a bool per element first."""
        if x.numel() == 0:
            return True
        low, high = torch.aminmax(x)
        return bool(torch.isfinite(low) & torch.isfinite(high))

    def not_finite(self, x: torch.Tensor) -> torch.Tensor:
        return (~torch.isfinite(x)).any().float()

    def sum_squares(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        return torch.dot(x, x)

    def logical_and(self, a: bool, b: bool) -> bool:
        return bool(a) and bool(b)

    def top_abs(self, x: torch.Tensor, count: int) -> torch.Tensor:
        return top_abs(self.backend, x, count)

    def sketch_accumulate(self, table: torch.Tensor, vec: torch.Tensor, keys: np.ndarray, offset: int) -> torch.Tensor:
        accumulate(self.backend, table, vec.contiguous(), keys, offset)
        return table

    def sketch_accumulate_at(self, table: torch.Tensor, idx: torch.Tensor, vals: torch.Tensor,
                             keys: np.ndarray) -> torch.Tensor:
        accumulate_at(self.backend, table, idx.contiguous(), vals.contiguous(), keys)
        return table

    def heavy_hitters(self, table: torch.Tensor, keys: np.ndarray, length: int,
                      count: int) -> tuple[torch.Tensor, torch.Tensor]:
        return heavy_hitters(self.backend, table.contiguous(), keys, length, count)

    def pairs(self, idx: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
        return torch.stack([idx.to(torch.int32).view(torch.float32), vals], 1).reshape(-1)

    def unpairs(self, buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        both = buf.view(-1, 2)
        return both[:, 0].contiguous().view(torch.int32).long(), both[:, 1].contiguous()

    def wire_rounded(self, vals: torch.Tensor, codec: MessageCodec) -> torch.Tensor:
        """The codec's Numba kernel on the CPU (backend "auto" or "numba"), its torch one elsewhere (same bits)."""
        if resolve(self.backend, vals.device) == "numba":
            return torch.from_numpy(codec.rounded_numba(vals.detach().numpy()))
        return codec.rounded_torch(vals)

    def pack_pairs(self, idx: torch.Tensor, vals: torch.Tensor, counts: torch.Tensor, universe: int,
                   low: int, codec: MessageCodec) -> tuple[torch.Tensor, torch.Tensor]:
        """The codec's Numba kernel on the CPU (backend "auto" or "numba"), its torch one elsewhere (same bytes)."""
        if resolve(self.backend, idx.device) == "numba":
            buf, sizes = codec.encode_numba(idx.contiguous().numpy(), vals.detach().contiguous().numpy(),
                                            counts.contiguous().numpy(), universe, low)
            return torch.from_numpy(buf), torch.from_numpy(sizes)
        return codec.encode_torch(idx, vals, counts, universe, low)

    def unpack_pairs(self, buf: torch.Tensor, messages: int, universe: int,
                     low: int, codec: MessageCodec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if resolve(self.backend, buf.device) == "numba":
            idx, vals, counts = map(torch.from_numpy, codec.decode_numba(buf.contiguous().numpy(), universe, low))
        else:
            idx, vals, counts = codec.decode_torch(buf, universe, low)
        if len(counts) != messages:
            raise ValueError(f"expected {messages} compact messages, read {len(counts)}")
        return idx, vals, counts

    def take_sorted(self, keys: torch.Tensor, vals: torch.Tensor, x: torch.Tensor, universe: int) -> torch.Tensor:
        if not len(keys):
            return torch.zeros(x.shape, dtype=vals.dtype, device=x.device)
        if x.device.type == "cpu" and (len(keys) + len(x)) * _DENSE_UNION >= universe:  # distinct keys: one write each
            table = torch.zeros(universe, dtype=vals.dtype, device=x.device)
            table[keys] = vals
            return table[x]
        pos = torch.searchsorted(keys, x).clamp_(max=len(keys) - 1)
        return torch.where(keys[pos] == x, vals[pos], torch.zeros((), dtype=vals.dtype, device=vals.device))

    def union_sum(self, idx: torch.Tensor, vals: torch.Tensor, counts: torch.Tensor,
                  universe: int) -> tuple[torch.Tensor, torch.Tensor]:
        if len(idx) * _DENSE_UNION >= universe and vals.dtype == torch.float32 \
                and resolve(self.backend, idx.device) == "numba":
            from . import numba_cpu

            return tuple(map(torch.from_numpy, numba_cpu.union_sum_dense(idx.numpy(), vals.numpy(), universe)))
        # One stable sort: the copies of a coordinate end up adjacent, in vector order (a
        # vector's indices are distinct, so a run holds at most one pair of each vector); the
        # j-th pair of every run longer than j is added in pass j, left to right. The vectors'
        # order is their order in idx, so ``counts`` is not needed here.
        ordered = torch.sort(idx, stable=True)
        keys, v = ordered.values, vals[ordered.indices]
        first = torch.ones(len(keys), dtype=torch.bool, device=keys.device)
        first[1:] = keys[1:] != keys[:-1]
        starts = torch.nonzero(first).flatten()
        lengths = torch.diff(starts, append=starts.new_tensor([len(keys)]))
        sums = v[starts] + 0.0  # as 0 + v: a lone -0.0 sums to +0.0, as added to zeros
        for j in range(1, int(lengths.max()) if len(starts) else 0):
            runs = torch.nonzero(lengths > j).flatten()
            sums[runs] = sums[runs] + v[starts[runs] + j]
        return keys[starts], sums

    def spans(self, x: torch.Tensor, starts: list[int]) -> list[tuple[int, int]]:
        edges = torch.searchsorted(x, torch.tensor(starts, dtype=x.dtype, device=x.device)).tolist() + [len(x)]
        return [(first, end - first) for first, end in zip(edges[:-1], edges[1:])]

    def owner_of(self, idx: torch.Tensor, ranks: int, keys: np.ndarray) -> torch.Tensor:
        return hashes(idx, keys, 1, ranks)[0][0]

    def stable_order(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sort(x, stable=True).indices

    def bucket(self, x: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
        edges = edges.to(x.device)
        return (torch.searchsorted(edges, x, right=True) - 1).clamp_(0, len(edges) - 2)

    def count(self, bins: torch.Tensor, n: int, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return torch.bincount(bins if mask is None else bins[mask], minlength=n).int()

    def pack_counts(self, counts: torch.Tensor, bits: int) -> torch.Tensor:
        lanes = 63 // bits
        words = -(-len(counts) // lanes)
        padded = torch.zeros(lanes * words, dtype=torch.int64, device=counts.device)
        padded[:len(counts)] = counts
        shifts = torch.arange(lanes, dtype=torch.int64, device=counts.device) * bits
        return (padded.view(lanes, words) << shifts[:, None]).sum(0)

    def unpack_counts(self, words: torch.Tensor, bits: int, n: int) -> torch.Tensor:
        shifts = torch.arange(63 // bits, dtype=torch.int64, device=words.device) * bits
        return ((words.long()[None, :] >> shifts[:, None]) & ((1 << bits) - 1)).reshape(-1)[:n]

    def abs_key(self, x: torch.Tensor) -> torch.Tensor:
        return _abs_key(x).long()

    def key_bits(self, key: torch.Tensor, shift: int, bits: int) -> torch.Tensor:
        return (key >> shift) & ((1 << bits) - 1)

    def radix_cut(self, counts: torch.Tensor, wanted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hist = counts.view(len(wanted), -1).long()
        from_top = hist.flip(1).cumsum(1).flip(1)  # [g, b]: how many lie in bins b and above
        wanted = wanted.to(hist.device).long()
        cut = (from_top >= wanted[:, None]).sum(1) - 1
        beyond = torch.cat([from_top, torch.zeros_like(from_top[:, :1])], 1)
        return cut, beyond.gather(1, (cut + 1)[:, None])[:, 0].int()

    def equal_at(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a == b

    def keep_top(self, prefix: torch.Tensor, key: torch.Tensor, group: torch.Tensor, cut: torch.Tensor,
                 ties: torch.Tensor) -> torch.Tensor:
        at = cut.to(prefix.device)[group]
        mask = prefix > at
        tied = torch.nonzero(prefix == at).flatten()
        if tied.numel():
            g = group[tied]
            order = torch.sort((g << 32) + (0x7FFFFFFF - key[tied]), stable=True).indices
            g = g[order]
            rank = torch.arange(len(g), device=g.device) - torch.searchsorted(g, g)
            mask[tied[order[rank < ties.to(g.device)[g]]]] = True
        return torch.nonzero(mask).flatten()

    def host_int32(self, x: torch.Tensor) -> torch.Tensor:
        return x.to("cpu", torch.int32)

    def size_of(self, x: torch.Tensor) -> int:
        return x.numel()

    def count_of(self, n: Any) -> int:
        return int(n)

    def checksum(self, idx: torch.Tensor) -> int:
        return zlib.crc32(idx.cpu().numpy().tobytes())

    def join_names(self, names: tuple[str, ...], flags: torch.Tensor) -> str:
        return ", ".join(repr(n) for n, f in zip(names, flags.tolist()) if f > 0)

    def cond(self, pred: Any, true_fn: Callable[[], Any], false_fn: Callable[[], Any]) -> Any:
        return true_fn() if bool(pred) else false_fn()

    def when(self, pred: Any, fn: Callable[[], Any]) -> None:
        if bool(pred):
            fn()

    def fail_unless(self, pred: Any, error: type, message: Callable[[], list[Any]]) -> None:
        if not bool(pred):
            raise error("".join(str(part) for part in message()))

    def after(self, checks: list[Any], values: Any) -> Any:
        return values  # torch checks raise at once
