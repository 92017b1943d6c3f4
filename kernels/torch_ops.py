"""Count-Sketch kernels over torch tensors, and the dispatch of torch tensors to every backend.

Three backends share one contract (see :mod:`.hashing` for the hash)::

    accumulate(table, vec, keys, offset)   # table (rows, cols) f32 += sketch of vec (n,) f32
    query(table, keys, offset, out)        # out (n,) f32 = median-of-rows estimate

``"torch"`` uses torch ops (CPU or CUDA), in chunks so temporaries stay O(chunk);
``"numba"`` runs the Numba CPU kernels on zero-copy NumPy views; ``"cuda"`` runs the Numba
CUDA kernels on zero-copy ``__cuda_array_interface__`` views (NumPy views under the CUDA
simulator). ``"auto"`` picks ``"numba"`` for CPU tensors and ``"cuda"`` for CUDA tensors.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from . import BACKENDS
from .hashing import GOLDEN, MASK32, MIX1, MIX2

_CHUNK = 1 << 20  # coordinates hashed per torch step: bounds temporaries to ~40 MB


def _mul32(x: torch.Tensor, m: int) -> torch.Tensor:
    """(x * m) mod 2^32 for x in [0, 2^32) without int64 overflow (m split in 16-bit halves)."""
    return (x * (m & 0xFFFF) + (((x * (m >> 16)) & 0xFFFF) << 16)) & MASK32


def _hash(lo: torch.Tensor, hi_mix: torch.Tensor, key: int) -> torch.Tensor:
    x = ((lo ^ key) + hi_mix) & MASK32
    x = x ^ (x >> 16)
    x = _mul32(x, MIX1)
    x = x ^ (x >> 13)
    x = _mul32(x, MIX2)
    return x ^ (x >> 16)


def _chunks(offset: int, n: int, device: torch.device):
    """Yields (start, stop, low word, high word * GOLDEN mod 2^32) per chunk of coordinates."""
    for start in range(0, n, _CHUNK):
        stop = min(n, start + _CHUNK)
        g = torch.arange(offset + start, offset + stop, dtype=torch.int64, device=device)
        yield start, stop, g & MASK32, ((g >> 32) * GOLDEN) & MASK32


def torch_accumulate(table: torch.Tensor, vec: torch.Tensor, keys: np.ndarray, offset: int) -> None:
    cols = table.shape[1]
    for start, stop, lo, hi_mix in _chunks(offset, vec.numel(), vec.device):
        x = vec[start:stop]
        for j, key in enumerate(keys.tolist()):
            h = _hash(lo, hi_mix, key)
            table[j].index_add_(0, (h * cols) >> 32, torch.where((h & 1).bool(), -x, x))


def torch_query(table: torch.Tensor, keys: np.ndarray, offset: int, out: torch.Tensor) -> None:
    rows, cols = table.shape
    for start, stop, lo, hi_mix in _chunks(offset, out.numel(), out.device):
        est = torch.empty((rows, stop - start), dtype=table.dtype, device=table.device)
        for j, key in enumerate(keys.tolist()):
            h = _hash(lo, hi_mix, key)
            v = table[j][(h * cols) >> 32]
            est[j] = torch.where((h & 1).bool(), -v, v)
        est = est.sort(dim=0).values
        if rows % 2:
            out[start:stop] = est[rows // 2]
        else:
            out[start:stop] = (est[rows // 2 - 1] + est[rows // 2]) * 0.5


def _numba_threads() -> None:
    """Numba's CPU kernels use as many threads as torch's intra-op pool (``torch.set_num_threads``),
    so ranks sharing a host are not oversubscribed by Numba's default of one thread per core."""
    import numba

    numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))


def _numba_accumulate(table: torch.Tensor, vec: torch.Tensor, keys: np.ndarray, offset: int) -> None:
    from . import numba_cpu

    _numba_threads()
    numba_cpu.accumulate(table.numpy(), vec.numpy(), keys, offset)


def _numba_query(table: torch.Tensor, keys: np.ndarray, offset: int, out: torch.Tensor) -> None:
    from . import numba_cpu

    _numba_threads()
    numba_cpu.query(table.numpy(), keys, offset, out.numpy())


def _cuda_view(t: torch.Tensor):
    from numba import config, cuda

    if t.is_cuda:
        return cuda.as_cuda_array(t)
    if config.ENABLE_CUDASIM:
        return t.numpy()
    raise ValueError("the 'cuda' sketch backend needs CUDA tensors (or NUMBA_ENABLE_CUDASIM=1)")


def _cuda_keys(keys: np.ndarray, like: torch.Tensor):
    return _cuda_view(torch.from_numpy(keys).to(like.device))


def _cuda_accumulate(table: torch.Tensor, vec: torch.Tensor, keys: np.ndarray, offset: int) -> None:
    from . import numba_cuda

    numba_cuda.accumulate(_cuda_view(table), _cuda_view(vec), _cuda_keys(keys, table), offset)


def _cuda_query(table: torch.Tensor, keys: np.ndarray, offset: int, out: torch.Tensor) -> None:
    from . import numba_cuda

    numba_cuda.query(_cuda_view(table), _cuda_keys(keys, table), offset, _cuda_view(out))


_KERNELS: dict[str, tuple[Callable, Callable]] = {
    "torch": (torch_accumulate, torch_query),
    "numba": (_numba_accumulate, _numba_query),
    "cuda": (_cuda_accumulate, _cuda_query),
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
    """Adds the sketch of ``vec`` (n,) f32 at coordinates offset..offset+n-1 into ``table``."""
    _KERNELS[resolve(backend, table.device)][0](table, vec, keys, offset)


def query(backend: str, table: torch.Tensor, keys: np.ndarray, offset: int, out: torch.Tensor) -> None:
    """Writes the estimates of coordinates offset..offset+n-1 into ``out`` (n,) f32."""
    _KERNELS[resolve(backend, table.device)][1](table, keys, offset, out)


def accumulate_at(backend: str, table: torch.Tensor, idx: torch.Tensor, vals: torch.Tensor, keys: np.ndarray) -> None:
    """Adds the sketch of the sparse vector with ``vals`` (n,) f32 at coordinates ``idx`` (n,) int64."""
    cols = table.shape[1]
    lo, hi_mix = idx & MASK32, ((idx >> 32) * GOLDEN) & MASK32
    for j, key in enumerate(keys.tolist()):
        h = _hash(lo, hi_mix, key)
        table[j].index_add_(0, (h * cols) >> 32, torch.where((h & 1).bool(), -vals, vals))


def heavy_hitters(backend: str, table: torch.Tensor, keys: np.ndarray, length: int, count: int,
                  offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(idx (count,) int64 ascending, estimates (count,) f32): the count largest |estimate| of
    coordinates offset..offset+length-1 (indices relative to offset; ties: lower index)."""
    est = torch.empty(length, dtype=torch.float32, device=table.device)
    query(backend, table.contiguous(), keys, offset, est)
    idx = top_abs(backend, est, count)
    return idx, est[idx]


def top_abs(backend: str, x: torch.Tensor, count: int) -> torch.Tensor:
    """int64 (count,) ascending: the count largest |x| (NaN and ±Inf largest; ties: lower index)."""
    mag = torch.where(torch.isnan(x), torch.full_like(x, float("inf")), x.abs())
    return torch.argsort(mag, descending=True, stable=True)[:count].sort().values
