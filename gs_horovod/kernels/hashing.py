"""Hash v2: the bucket and sign of every (sketch, row, coordinate), computed bit for bit alike
by every backend (NumPy reference here, Numba CPU and CUDA, torch ops, TensorFlow ops).

A sketch's ``keys`` is ``hash_keys(seed)``: an int64 array of shape (1,) holding the 64-bit
key ``K = splitmix64(seed)`` (two's complement). For a global coordinate ``g`` in [0, 2^62),
one 64-bit mix per coordinate gives every row (all arithmetic mod 2^64, ``>>`` logical)::

    z      = mix64(g XOR K)                 mix64(x): x ^= x >> 30; x *= M1; x ^= x >> 27; x *= M2; x ^= x >> 31
    h1     = z mod 2^32                     (low word)
    h2     = (z >> 32) | 1                  (high word, odd)
    w      = (z XOR (z >> 29)) * M3         (the sign word: a cheap re-mix of z)
    row j: u_j      = (h1 + j * h2) mod 2^32                   (double hashing)
           bucket_j = (u_j * cols) >> 32                       (Lemire's range reduction)
           sign_j   = -1 if bit (63 - j) of w is set else +1   (rows <= MAX_ROWS = 64)

``mix64`` is splitmix64's finaliser (a bijection), so distinct coordinates get distinct ``z``.
Row 0's bucket needs only ``h1``; each further row one add and one multiply. The signs come from
the top bits of a separate multiply of ``z``, so they are neither the low bits of ``u_j``
(which alternate with j, as ``h2`` is odd) nor an arithmetic progression in j.

The estimate of a coordinate is the median over rows of ``sign_j * table[j, bucket_j]``; for
even rows the mean ``(a + b) * 0.5`` of the two middle values (float32), as :func:`median_of`.
"""

from __future__ import annotations

import math

import numpy as np

HASH_VERSION = 2
MAX_COLS = 2**31 - 1  # cols * u < 2^63: the bucket product fits in int64 (torch, TensorFlow)
MAX_ROWS = 64  # one sign bit per row from the 64-bit sign word

MASK32 = 0xFFFFFFFF
MASK64 = 0xFFFFFFFFFFFFFFFF
GAMMA = 0x9E3779B97F4A7C15  # splitmix64's increment (seed -> key)
M1 = 0xBF58476D1CE4E5B9
M2 = 0x94D049BB133111EB
M3 = 0xD6E8FEB86659FD93
NAN_KEY = 0x7F800001  # every NaN's |x| order key (top_abs): one above +Inf's bits 0x7F800000

_U = np.uint64
_UM32, _UM1, _UM2, _UM3 = _U(MASK32), _U(M1), _U(M2), _U(M3)
_U1, _U29, _U30, _U27, _U31, _U32, _U63 = _U(1), _U(29), _U(30), _U(27), _U(31), _U(32), _U(63)


def to_int64(u: int) -> int:
    """The int64 (two's complement) holding the 64-bit unsigned ``u``."""
    u &= MASK64
    return u - (1 << 64) if u >> 63 else u


def splitmix64(x: int) -> int:
    """splitmix64 of a Python int: the finaliser of ``x + GAMMA``, a uint64 as a Python int."""
    z = (x + GAMMA) & MASK64
    z = ((z ^ (z >> 30)) * M1) & MASK64
    z = ((z ^ (z >> 27)) * M2) & MASK64
    return z ^ (z >> 31)


def hash_keys(seed: int) -> np.ndarray:
    """The keys a sketch's kernels take: int64 (1,) holding ``splitmix64(seed mod 2^64)``."""
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    return np.array([to_int64(splitmix64(int(seed) & MASK64))], dtype=np.int64)


def mix(g: np.uint64, key: np.uint64) -> np.uint64:
    """z = mix64(g XOR key) (uint64 in, uint64 out). Compiled by Numba for the CPU and the GPU;
    runs elementwise on NumPy uint64 arrays too."""
    z = g ^ key
    z = (z ^ (z >> _U30)) * _UM1
    z = (z ^ (z >> _U27)) * _UM2
    return z ^ (z >> _U31)


def sign_word(z: np.uint64) -> np.uint64:
    """w = (z XOR (z >> 29)) * M3: row j's sign is bit 63 - j of w."""
    return (z ^ (z >> _U29)) * _UM3


def row_sign(w: np.uint64, j: int) -> bool:
    """Whether row ``j``'s sign is -1 (bit 63 - j of the sign word ``w``)."""
    return ((w >> (_U63 - _U(j))) & _U1) != _U(0)


def signed_cells(table: np.ndarray, z: np.uint64, buf: np.ndarray) -> None:
    """buf[j] = sign_j · table[j, bucket_j] for every row j of the coordinate whose mix is z:
    the values whose median is its estimate (``median_of(buf, rows)``). table: (rows, cols) f32;
    buf: (>= rows,) f32. Compiled by Numba for CPU and GPU (the row loop of every scan)."""
    ucols = np.uint64(table.shape[1])
    h2 = (z >> _U32) | _U1
    w = (z ^ (z >> _U29)) * _UM3
    u = z & _UM32
    for j in range(table.shape[0]):
        v = table[j, (u * ucols) >> _U32]
        buf[j] = -v if ((w >> (_U63 - np.uint64(j))) & _U1) != np.uint64(0) else v
        u = (u + h2) & _UM32


def median_of(buf: np.ndarray, rows: int) -> np.float32:
    """Median of ``buf[:rows]`` (float32); for even rows ``(a + b) * 0.5`` of the two middle
    values. 3 and 5 rows use min/max networks (the result is one of the inputs, as with sorting);
    other counts sort ``buf`` in place by insertion. Compiled by Numba for CPU and GPU."""
    if rows == 1:
        return buf[0]
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


def needed_hits(rows: int) -> int:
    """Rows whose |cell| must reach T for |median| >= T to be possible: (rows + 1) // 2.

    Odd r: the median is one of the values, so (r+1)/2 of them lie on its side of ±T.
    Even r: fl((a + b) * 0.5) >= T > 0 needs b >= T (rounding is monotone and a <= b), and with
    it the r/2 values from b up; symmetrically a <= -T for <= -T. Both give (r + 1) // 2.
    """
    return (rows + 1) // 2


def reference_hashes(keys: np.ndarray, cols: int, idx: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """NumPy reference: buckets (rows, n) int64 and signs (rows, n) float32 of the global
    coordinates ``idx`` (n,) int64 in [0, 2^62)."""
    z = mix(np.asarray(idx).astype(np.uint64), keys.astype(np.uint64)[0])
    h1, h2 = z & _UM32, (z >> _U32) | _U1
    w = sign_word(z)
    j = np.arange(rows, dtype=np.uint64)[:, None]
    u = (h1[None, :] + j * h2[None, :]) & _UM32
    buckets = ((u * _U(cols)) >> _U32).astype(np.int64)
    signs = np.where(((w[None, :] >> (_U63 - j)) & _U1) == 0, 1.0, -1.0).astype(np.float32)
    return buckets, signs


def reference_buckets_signs(keys: np.ndarray, cols: int, offset: int, length: int,
                            rows: int) -> tuple[np.ndarray, np.ndarray]:
    """NumPy reference: buckets (rows, length) int64 and signs (rows, length) float32 of the
    coordinates offset..offset+length-1."""
    return reference_hashes(keys, cols, np.arange(offset, offset + length, dtype=np.int64), rows)


def first_threshold_rank(cells: int, length: int, count: int, slack: float, rows: int) -> int:
    """How many of ``cells`` cells of |table| (all, or an even sample) the pruning threshold T
    leaves at or above it: T is that order statistic of the cells.

    A noise coordinate (one not in the sketched support) sees r random cells; if a fraction p of
    cells has |cell| >= T, its signed values pass ±T on one side in ~2·P(Binom(r, p/2) >= need)
    of cases. p is chosen so that ``length`` times this is ``slack · count``: enough survivors
    to fill ``count`` without a rescan, few enough that medians stay rare.
    """
    need = needed_hits(rows)
    target = min(1.0, slack * count / max(length, 1))

    def survive(p: float) -> float:
        q = p / 2
        return 2 * sum(math.comb(rows, i) * q**i * (1 - q) ** (rows - i) for i in range(need, rows + 1))

    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if survive(mid) < target else (lo, mid)
    return max(1, min(cells, math.ceil(hi * cells)))
