"""Count-Sketch kernels for the CPU, compiled by Numba (``@njit(parallel=True)``).

Arrays are NumPy (torch CPU tensors are passed as zero-copy ``.numpy()`` views).
``accumulate`` runs one thread per row, so no two threads write the same cell; ``query`` runs
threads over blocks of coordinates, each writing only its own outputs. Sums within a row run
in coordinate order, so the table is deterministic.

Unless ``NUMBA_THREADING_LAYER`` is set, this module selects Numba's ``workqueue`` layer:
OpenMP's spinning workers beside torch's own OpenMP pool made a 2-rank demo on 2 cores about
5× slower (48.9 s against 10.5 s for ``scripts/train_torch.py --epochs 30``).
"""

from __future__ import annotations

import os

import numba
import numpy as np
from numba import njit, prange

if "NUMBA_THREADING_LAYER" not in os.environ:
    numba.config.THREADING_LAYER = "workqueue"

from .hashing import element_hash, sorted_median

_hash = njit(inline="always", cache=True)(element_hash)
_median = njit(inline="always", cache=True)(sorted_median)
_QUERY_BLOCK = 4096


@njit(parallel=True, cache=True)
def accumulate(table: np.ndarray, vec: np.ndarray, keys: np.ndarray, offset: int) -> None:
    """table[j, bucket_j(offset+i)] += sign_j(offset+i) * vec[i] for every row j and i < len(vec).

    table: (rows, cols) float32, updated in place; vec: (n,) float32; keys: (rows,) int64.
    """
    rows, cols = table.shape
    ucols = np.uint64(cols)
    n = vec.shape[0]
    for j in prange(rows):
        key = np.uint64(keys[j])
        for i in range(n):
            h = _hash(np.uint64(offset + i), key)
            b = (h * ucols) >> np.uint64(32)
            if h & np.uint64(1):
                table[j, b] -= vec[i]
            else:
                table[j, b] += vec[i]


@njit(parallel=True, cache=True)
def query(table: np.ndarray, keys: np.ndarray, offset: int, out: np.ndarray) -> None:
    """out[i] = median_j sign_j(offset+i) * table[j, bucket_j(offset+i)]; out: (n,) float32.

    Per block of coordinates, one row at a time (a tight loop over coordinates for a fixed
    key), then the medians: about 5× faster than all rows per coordinate.
    """
    rows, cols = table.shape
    ucols = np.uint64(cols)
    n = out.shape[0]
    nblocks = (n + _QUERY_BLOCK - 1) // _QUERY_BLOCK
    for blk in prange(nblocks):
        start = blk * _QUERY_BLOCK
        stop = min(n, start + _QUERY_BLOCK)
        est = np.empty((stop - start, rows), dtype=np.float32)
        for j in range(rows):
            key = np.uint64(keys[j])
            for i in range(start, stop):
                h = _hash(np.uint64(offset + i), key)
                v = table[j, (h * ucols) >> np.uint64(32)]
                est[i - start, j] = -v if h & np.uint64(1) else v
        for i in range(start, stop):
            out[i] = _median(est[i - start], rows)
