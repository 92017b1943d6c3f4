"""The one hash every backend computes: bucket and sign of (seed, row, index).

For row ``j`` the key is ``key_j = fmix32((fmix32(seed_lo ^ seed_hi) + j * GOLDEN) mod 2^32)``
(computed once, in Python integers). For a global coordinate ``g`` (int64, may exceed 2^32)::

    x      = ((g mod 2^32) XOR key_j) + (g >> 32) * GOLDEN        (mod 2^32)
    h      = fmix32(x)                                            (MurmurHash3's finaliser)
    bucket = (h * cols) >> 32                                     (Lemire's range reduction)
    sign   = +1 if h is even else -1

``fmix32`` is a bijection with full avalanche, so each row is a well-mixed permutation of the
index space folded onto ``cols`` buckets; the sign uses the low bit and the bucket the high bits.
Everything is exact integer arithmetic mod 2^32, so torch, NumPy, Numba (CPU and CUDA) and
TensorFlow produce bitwise-identical buckets and signs, and nothing of size d is stored.
"""

from __future__ import annotations

import numpy as np

MASK32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B9
MIX1 = 0x85EBCA6B
MIX2 = 0xC2B2AE35
MAX_COLS = 2**31 - 1

_U_MASK32 = np.uint64(MASK32)
_U_GOLDEN = np.uint64(GOLDEN)
_U_MIX1 = np.uint64(MIX1)
_U_MIX2 = np.uint64(MIX2)
_U16 = np.uint64(16)
_U13 = np.uint64(13)
_U32 = np.uint64(32)
_U1 = np.uint64(1)


def fmix32(x: int) -> int:
    """MurmurHash3's 32-bit finaliser on a Python int in [0, 2^32)."""
    x ^= x >> 16
    x = (x * MIX1) & MASK32
    x ^= x >> 13
    x = (x * MIX2) & MASK32
    x ^= x >> 16
    return x


def row_keys(seed: int, rows: int) -> np.ndarray:
    """Per-row hash keys, shape (rows,), dtype int64 (values in [0, 2^32)), from a 64-bit seed."""
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    base = fmix32((seed & MASK32) ^ (seed >> 32))
    return np.array([fmix32((base + j * GOLDEN) & MASK32) for j in range(rows)], dtype=np.int64)


def element_hash(g: np.uint64, key: np.uint64) -> np.uint64:
    """h for one coordinate ``g`` and row key ``key`` (both uint64). Compiled by Numba for
    the CPU (``njit``) and the GPU (``cuda.jit(device=True)``); runs as plain NumPy too."""
    x = (((g & _U_MASK32) ^ key) + (g >> _U32) * _U_GOLDEN) & _U_MASK32
    x ^= x >> _U16
    x = (x * _U_MIX1) & _U_MASK32
    x ^= x >> _U13
    x = (x * _U_MIX2) & _U_MASK32
    x ^= x >> _U16
    return x


def sorted_median(buf: np.ndarray, rows: int) -> np.float32:
    """Median of ``buf[:rows]`` (float32); for even rows the mean of the two middle values.
    3 and 5 rows use branch-free min/max networks (the result is one of the inputs, as with
    sorting); other counts sort ``buf`` in place by insertion. Compiled by Numba for CPU and
    GPU, so every backend's estimate is the same expression."""
    if rows == 3:
        return max(min(buf[0], buf[1]), min(max(buf[0], buf[1]), buf[2]))
    if rows == 5:
        f = max(min(buf[0], buf[1]), min(buf[2], buf[3]))
        g = min(max(buf[0], buf[1]), max(buf[2], buf[3]))
        return max(min(buf[4], f), min(max(buf[4], f), g))
    for a in range(1, rows):
        v = buf[a]
        b = a - 1
        while b >= 0 and buf[b] > v:
            buf[b + 1] = buf[b]
            b -= 1
        buf[b + 1] = v
    if rows % 2 == 1:
        return buf[rows // 2]
    return (buf[rows // 2 - 1] + buf[rows // 2]) * np.float32(0.5)


def reference_buckets_signs(
    keys: np.ndarray, cols: int, offset: int, length: int
) -> tuple[np.ndarray, np.ndarray]:
    """NumPy reference: buckets (rows, length) int64 and signs (rows, length) float32."""
    g = np.arange(offset, offset + length, dtype=np.uint64)
    h = element_hash(g[None, :], keys.astype(np.uint64)[:, None])
    buckets = ((h * np.uint64(cols)) >> _U32).astype(np.int64)
    signs = np.where((h & _U1) == 0, 1.0, -1.0).astype(np.float32)
    return buckets, signs

HASH_VERSION = 1
