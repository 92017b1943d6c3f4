"""Count-Sketch kernels for NVIDIA GPUs, compiled by Numba (``@cuda.jit``).

Arrays are anything Numba's CUDA target takes: device arrays, or torch CUDA tensors passed
zero-copy through ``__cuda_array_interface__`` (``numba.cuda.as_cuda_array``). Under the CUDA
simulator (``NUMBA_ENABLE_CUDASIM=1``) the same kernels run on the CPU over NumPy arrays,
which is how they are tested without a GPU. One thread per coordinate; ``accumulate`` adds
with float atomics, so the order of additions within a cell (and the last bits) may vary.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda

from .hashing import element_hash, sorted_median

_hash = cuda.jit(device=True)(element_hash)
_median = cuda.jit(device=True)(sorted_median)
_THREADS = 256
MAX_ROWS = 32  # size of the per-thread buffer for the median in ``query``


@cuda.jit
def _accumulate_kernel(table, vec, keys, offset):
    i = cuda.grid(1)
    if i < vec.shape[0]:
        rows = table.shape[0]
        ucols = np.uint64(table.shape[1])
        g = np.uint64(offset + i)
        x = vec[i]
        for j in range(rows):
            h = _hash(g, np.uint64(keys[j]))
            b = (h * ucols) >> np.uint64(32)
            cuda.atomic.add(table, (j, b), -x if h & np.uint64(1) else x)


@cuda.jit
def _query_kernel(table, keys, offset, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        rows = table.shape[0]
        ucols = np.uint64(table.shape[1])
        g = np.uint64(offset + i)
        buf = cuda.local.array(MAX_ROWS, dtype=np.float32)
        for j in range(rows):
            h = _hash(g, np.uint64(keys[j]))
            v = table[j, (h * ucols) >> np.uint64(32)]
            buf[j] = -v if h & np.uint64(1) else v
        out[i] = _median(buf, rows)


def accumulate(table: Any, vec: Any, keys: Any, offset: int) -> None:
    """Same contract as :func:`numba_cpu.accumulate`, on device arrays; ``keys`` on the device."""
    n = vec.shape[0]
    if n:
        _accumulate_kernel[(n + _THREADS - 1) // _THREADS, _THREADS](table, vec, keys, offset)


def query(table: Any, keys: Any, offset: int, out: Any) -> None:
    """Same contract as :func:`numba_cpu.query`, on device arrays; rows <= ``MAX_ROWS``."""
    if table.shape[0] > MAX_ROWS:
        raise ValueError(f"the CUDA query kernel supports rows <= {MAX_ROWS}, got {table.shape[0]}")
    n = out.shape[0]
    if n:
        _query_kernel[(n + _THREADS - 1) // _THREADS, _THREADS](table, keys, offset, out)
