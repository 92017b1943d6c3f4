"""The compact pair format (:mod:`.pair_format`) compiled by Numba for the CPU: one serial pass
over the pairs of every message (a message of k pairs is a few tens of kB, too small to be worth
a thread pool), the same bytes as the NumPy reference. The torch ops (CPU tensors) and the
TensorFlow ops (through ``tf.numpy_function``) run these; :mod:`.torch_pairs` is the
vectorised torch version for other devices."""

from __future__ import annotations

import numpy as np
from numba import njit

from . import pair_format
from .pair_format import HEADER, message_bytes

WIDEST_LOW = 56
"""The most low bits an index may have here (they stream through a 64-bit accumulator: l ≤ 56
keeps its top bit clear); wider ones, from universes of 2^56 and more, run the NumPy reference."""

_SET_BITS = np.array([bin(b).count("1") for b in range(256)], np.int64)
"""How many bits of each byte value are set."""
_SET_AT = np.array([[j for j in range(8) if b >> j & 1] + [0] * (8 - bin(b).count("1")) for b in range(256)],
                   np.int64)
"""Where they are, lowest first (row b, the first ``_SET_BITS[b]`` entries)."""


@njit(inline="always", cache=True)
def _bf16(u: np.uint32) -> int:
    """The bfloat16 bits of the float32 with bits u, as the reference writes them: a finite value
    clamped to ±bfloat16's largest finite (0x7F7F0000) and rounded to nearest even; NaN 0x7FC0."""
    u = np.int64(u)
    if (u & 0x7F800000) == 0x7F800000:
        return 0x7FC0 if u & 0x007FFFFF else u >> 16
    if (u & 0x7FFFFFFF) > 0x7F7F0000:
        u = (u & 0x80000000) | 0x7F7F0000
    return (u + ((u >> 16) & 1) + 0x7FFF) >> 16


@njit(cache=True)
def _write(out: np.ndarray, idx: np.ndarray, bits: np.ndarray, counts: np.ndarray, starts: np.ndarray,
           universe: int, low: int) -> bool:
    """Every message of ``counts`` pairs (values as float32 ``bits``) into the zeroed ``out`` at
    ``starts`` (its bytes); False, with the message left unfinished, at an index out of
    [0, universe) or not above the one before it in its message."""
    first = 0
    mask = (1 << low) - 1
    for m in range(counts.shape[0]):
        n = counts[m]
        at = starts[m]
        for b in range(HEADER):
            out[at + b] = (n >> (8 * b)) & 0xFF
        low_at = at + HEADER
        high_at = low_at + (n * low + 7) // 8
        val_at = high_at + ((n + ((universe - 1) >> low) + 1 + 7) // 8 if n else 0)
        acc, held, byte = 0, 0, low_at  # the low bits stream out through a 64-bit accumulator
        last = -1
        for i in range(n):
            x = idx[first + i]
            if x <= last or x >= universe:
                return False
            last = x
            acc |= (x & mask) << held
            held += low
            while held >= 8:
                out[byte] = acc & 0xFF
                acc >>= 8
                held -= 8
                byte += 1
            h = (x >> low) + i
            out[high_at + h // 8] |= np.uint8(1 << (h % 8))
            half = _bf16(bits[first + i])
            out[val_at + 2 * i] = half & 0xFF
            out[val_at + 2 * i + 1] = half >> 8
        if held:
            out[byte] = acc & 0xFF
        first += n
    return True


def encode(idx: np.ndarray, vals: np.ndarray, counts: np.ndarray, universe: int,
           low: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`.pair_format.encode`: (messages (m,) uint8, bytes of each (M,) int32). Raises
    ValueError for pairs the format cannot hold (indices not ascending and distinct within a
    message, or outside [0, universe); counts that do not add up to the pairs)."""
    if low > WIDEST_LOW:
        return pair_format.encode(idx, vals, counts, universe, low)
    counts = np.asarray(counts, np.int64)
    idx, vals = np.ascontiguousarray(idx, np.int64), np.ascontiguousarray(vals, np.float32)
    if idx.shape != vals.shape or int(counts.sum()) != idx.size or (counts < 0).any():
        raise ValueError(f"compact pairs: {idx.size} indices and {vals.size} values for messages of {counts.tolist()}")
    sizes = np.array([message_bytes(n, universe, low) for n in counts.tolist()], np.int64)
    out = np.zeros(int(sizes.sum()), np.uint8)
    if not _write(out, idx, vals.view(np.uint32), counts, np.cumsum(sizes) - sizes, int(universe), int(low)):
        raise ValueError(f"compact pairs: a message's indices are not ascending, distinct and in [0, {universe})")
    return out, sizes.astype(np.int32)


@njit(cache=True)
def _message_counts(buf: np.ndarray, universe: int, low: int) -> np.ndarray:
    """Each message's pair count, read header by header; -1 last if a message runs past buf."""
    counts = []
    at = 0
    while at < buf.shape[0]:
        if at + HEADER > buf.shape[0]:
            counts.append(-1)
            break
        n = 0
        for b in range(HEADER):
            n |= np.int64(buf[at + b]) << (8 * b)
        at += HEADER + (n * low + 7) // 8 + ((n + ((universe - 1) >> low) + 1 + 7) // 8 if n else 0) + 2 * n
        counts.append(n if at <= buf.shape[0] else -1)
        if at > buf.shape[0]:
            break
    return np.array(counts, np.int64)


@njit(cache=True)
def _read(buf: np.ndarray, counts: np.ndarray, universe: int, low: int, idx: np.ndarray,
          bits: np.ndarray) -> bool:
    """Every message's indices into ``idx`` and bfloat16 values (as float32 bits) into ``bits``;
    False if a high section does not hold exactly its count of set bits."""
    first = 0
    at = 0
    mask = (1 << low) - 1
    for m in range(counts.shape[0]):
        n = counts[m]
        low_at = at + HEADER
        high_at = low_at + (n * low + 7) // 8
        high_bytes = (n + ((universe - 1) >> low) + 1 + 7) // 8 if n else 0
        val_at = high_at + high_bytes
        acc, held, byte = 0, 0, low_at  # the low bits stream in through a 64-bit accumulator
        for i in range(n):
            while held < low:
                acc |= np.int64(buf[byte]) << held
                held += 8
                byte += 1
            idx[first + i] = acc & mask
            acc >>= low
            held -= low
        i = 0
        for at_byte in range(high_bytes):
            b = buf[high_at + at_byte]
            if i + _SET_BITS[b] > n:
                return False
            for j in range(_SET_BITS[b]):
                idx[first + i] |= (at_byte * 8 + _SET_AT[b, j] - i) << low
                i += 1
        if i != n:
            return False
        for i in range(n):
            bits[first + i] = (np.uint32(buf[val_at + 2 * i]) | (np.uint32(buf[val_at + 2 * i + 1]) << 8)) << 16
        first += n
        at = val_at + 2 * n
    return True


def decode(buf: np.ndarray, universe: int, low: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`.pair_format.decode`: (idx (n,) int64, vals (n,) f32, pairs of each message (M,) int32).
    Raises ValueError for bytes that are not messages of this format (one running past the
    buffer, or a high section that disagrees with its count)."""
    buf = np.ascontiguousarray(buf, np.uint8)
    if low > WIDEST_LOW:
        return pair_format.decode(buf, universe, low)
    counts = _message_counts(buf, int(universe), int(low))
    if counts.size and counts[-1] < 0:
        raise ValueError(f"compact pairs: a message runs past the end of the {buf.size}-byte buffer")
    total = int(counts.sum())
    idx, bits = np.empty(total, np.int64), np.empty(total, np.uint32)
    if not _read(buf, counts, int(universe), int(low), idx, bits):
        raise ValueError("compact pairs: a message's high bits disagree with its pair count")
    return idx, bits.view(np.float32), counts.astype(np.int32)
