"""Count-Sketch kernels for NVIDIA GPUs, compiled by Numba (``@cuda.jit``).

Arrays are anything Numba's CUDA target takes: device arrays, or torch CUDA tensors passed
zero-copy through ``__cuda_array_interface__`` (``numba.cuda.as_cuda_array``). Under the CUDA
simulator (``NUMBA_ENABLE_CUDASIM=1``) the same kernels run on the CPU over NumPy arrays,
which is how they are tested without a GPU. One thread per coordinate, one hash mix per thread.
``accumulate``/``accumulate_at`` add with float atomics, so the order of additions within a
cell (and the last bits) may vary between runs; ``scan`` appends survivors in any order (the
caller orders them). ``keys`` is :func:`.hashing.hash_keys` (host NumPy; passed by value).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda

from .hashing import MAX_ROWS, median_of, mix, row_sign, sign_word, signed_cells

_mix = cuda.jit(device=True)(mix)
_sign_word = cuda.jit(device=True)(sign_word)
_row_sign = cuda.jit(device=True)(row_sign)
_median = cuda.jit(device=True)(median_of)
_signed_cells = cuda.jit(device=True)(signed_cells)
_THREADS = 256
_M32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_ONE = np.uint64(1)


@cuda.jit
def _scatter_kernel(table, idx, vals, key, offset, dense):
    i = cuda.grid(1)
    if i < vals.shape[0]:
        ucols = np.uint64(table.shape[1])
        z = _mix(np.uint64(offset + i) if dense else np.uint64(idx[i]), key)
        h2 = (z >> _S32) | _ONE
        w = _sign_word(z)
        u = z & _M32
        x = vals[i]
        for j in range(table.shape[0]):
            cuda.atomic.add(table, (j, (u * ucols) >> _S32), -x if _row_sign(w, j) else x)
            u = (u + h2) & _M32


@cuda.jit
def _scan_kernel(table, key, offset, length, lo, hi, out_idx, out_est, counter):
    i = cuda.grid(1)
    if i < length:
        rows = table.shape[0]
        ucols = np.uint64(table.shape[1])
        misses_allowed = rows - (rows + 1) // 2
        z = _mix(np.uint64(offset + i), key)
        h2 = (z >> _S32) | _ONE
        u = z & _M32
        misses = 0
        for j in range(rows):
            if abs(table[j, (u * ucols) >> _S32]) < lo:
                misses += 1
                if misses > misses_allowed:
                    return
            u = (u + h2) & _M32
        buf = cuda.local.array(MAX_ROWS, dtype=np.float32)
        _signed_cells(table, z, buf)
        e = _median(buf, rows)
        if lo <= abs(e) < hi:
            slot = cuda.atomic.add(counter, 0, 1)
            if slot < out_idx.shape[0]:
                out_idx[slot] = i
                out_est[slot] = e


def _blocks(n: int) -> int:
    return (n + _THREADS - 1) // _THREADS


def accumulate(table: Any, vec: Any, keys: np.ndarray, offset: int) -> None:
    """table (rows, cols) f32 += sketch of vec (n,) f32 at coordinates offset..offset+n-1 (atomics)."""
    if vec.shape[0]:
        _scatter_kernel[_blocks(vec.shape[0]), _THREADS](table, vec, vec, np.uint64(keys[0]), offset, True)


def accumulate_at(table: Any, idx: Any, vals: Any, keys: np.ndarray) -> None:
    """table (rows, cols) f32 += sketch of vals (n,) f32 at global coordinates idx (n,) int64 (atomics)."""
    if vals.shape[0]:
        _scatter_kernel[_blocks(vals.shape[0]), _THREADS](table, idx, vals, np.uint64(keys[0]), 0, False)


def scan(table: Any, keys: np.ndarray, offset: int, length: int, lo: float, hi: float,
         out_idx: Any, out_est: Any, counter: Any) -> None:
    """Pruned query of coordinates offset + [0, length): each i with lo <= |est_i| < hi is
    appended at slot ``counter[0]++`` of out_idx (cap,) int64 / out_est (cap,) f32 while slots
    remain; ``counter`` (1,) int64 ends at the number found (which may exceed cap). A
    coordinate is dropped after more than rows - (rows+1)//2 of its cells fall below lo."""
    if length:
        _scan_kernel[_blocks(length), _THREADS](table, np.uint64(keys[0]), offset, length, np.float32(lo),
                                                np.float32(hi), out_idx, out_est, counter)
