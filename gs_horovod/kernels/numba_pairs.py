"""The compact pair formats (:mod:`.pair_format`) compiled by Numba for the CPU: one serial pass
over the pairs of every message (a message of k pairs is a few tens of kB, too small to be worth
a thread pool) for the indices, one for the values, the same bytes as the NumPy reference. The
torch ops (CPU tensors) and the TensorFlow ops (through ``tf.numpy_function``) run these;
:mod:`.torch_pairs` is the vectorised torch version for other devices."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from . import pair_format
from .pair_format import E4M3, E4M3_CLAMP, E4M3_MIN_SCALE, HEADER, SCALE_BYTES, check_wire, message_bytes, value_bytes

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
def _bf16_values(bits: np.ndarray, out: np.ndarray) -> None:
    """The ``"compact"`` values sections of float32 ``bits`` (n,) into out (2n,) uint8."""
    for i in range(bits.shape[0]):
        half = _bf16(bits[i])
        out[2 * i] = half & 0xFF
        out[2 * i + 1] = half >> 8


@njit(cache=True)
def _bf16_read(data: np.ndarray, out: np.ndarray) -> None:
    """The float32 bits (n,) of ``"compact"`` values sections (2n,) uint8."""
    for i in range(out.shape[0]):
        out[i] = (np.uint32(data[2 * i]) | (np.uint32(data[2 * i + 1]) << 8)) << 16


@njit(cache=True)
def _scale_exponent(vals: np.ndarray, first: int, n: int) -> int:
    """:func:`.pair_format.scale_exponents` of vals[first:first + n]."""
    largest = np.float32(0)
    for i in range(first, first + n):
        a = abs(vals[i])
        if a == a and a != np.inf:
            a = min(a, np.float32(E4M3_CLAMP))
            largest = max(largest, a)
    if largest == 0:
        return 0
    f, E = math.frexp(largest)
    return max(E - 9 if f <= 0.875 else E - 8, E4M3_MIN_SCALE)


@njit(inline="always", cache=True)
def _e4m3(x: np.float32, a: np.float32, u: np.int64) -> int:
    """:func:`.pair_format.e4m3_codes` of one value x, given a = min(|x|, clamp)·2^−e (0 for NaN)
    and u its float32 bits: from 2^−6 on, its bits rounded to 3 mantissa bits (nearest even),
    exponent rebased from 127 to 7; below, rint(512a)."""
    if x != x:
        return 0x80
    if x == np.inf:
        return 0x7F
    if x == -np.inf:
        return 0xFF
    q = int(np.rint(a * np.float32(512))) if a < 2.0**-6 else ((u + ((u >> 20) & 1) + 0x7FFFF) >> 20) - (120 << 3)
    return q | 0x80 if x < 0 and q > 0 else q


@njit(inline="always", cache=True)
def _scaled(x: np.float32, down: np.float32) -> np.float32:
    """min(|x|, clamp)·down, 0 for NaN."""
    a = min(abs(x), np.float32(E4M3_CLAMP)) * down
    return a if a == a else np.float32(0)


@njit(cache=True)
def _e4m3_values(vals: np.ndarray, counts: np.ndarray, out: np.ndarray) -> None:
    """The ``"compact8"`` values sections of runs of counts (M,) values of vals (n,) f32 into out."""
    first, at = 0, 0
    scratch = np.empty(1, np.float32)
    bits = scratch.view(np.uint32)
    for m in range(counts.shape[0]):
        n = counts[m]
        e = _scale_exponent(vals, first, n)
        out[at], out[at + 1] = e & 0xFF, (e >> 8) & 0xFF
        down = np.float32(2.0 ** -e)
        for i in range(n):
            x = vals[first + i]
            scratch[0] = _scaled(x, down)
            out[at + SCALE_BYTES + i] = _e4m3(x, scratch[0], np.int64(bits[0]))
        first += n
        at += SCALE_BYTES + n


@njit(cache=True)
def _e4m3_read(data: np.ndarray, counts: np.ndarray, table: np.ndarray, out: np.ndarray, scales: np.ndarray) -> None:
    """The values (n,) f32 of ``"compact8"`` values sections laid end to end in data, and each
    section's scale exponent (M,)."""
    first, at = 0, 0
    for m in range(counts.shape[0]):
        n = counts[m]
        e = np.int64(data[at]) | (np.int64(data[at + 1]) << 8)
        e = e - 65536 if e >= 32768 else e
        scales[m] = e
        up = np.float32(2.0 ** e)
        for i in range(n):
            out[first + i] = table[data[at + SCALE_BYTES + i]] * up
        first += n
        at += SCALE_BYTES + n


def encode_values(vals: np.ndarray, counts: np.ndarray, wire: str) -> np.ndarray:
    """:func:`.pair_format.encode_values`."""
    check_wire(wire)
    vals, counts = np.ascontiguousarray(vals, np.float32), np.ascontiguousarray(counts, np.int64)
    out = np.empty(sum(value_bytes(n, wire) for n in counts.tolist()), np.uint8)
    if wire == "compact":
        _bf16_values(vals.view(np.uint32), out)
    else:
        _e4m3_values(vals, counts, out)
    return out


def decode_values(data: np.ndarray, counts: np.ndarray, wire: str) -> np.ndarray:
    """:func:`.pair_format.decode_values`."""
    check_wire(wire)
    counts, data = np.ascontiguousarray(counts, np.int64), np.ascontiguousarray(data, np.uint8)
    if wire == "compact":
        bits = np.empty(int(counts.sum()), np.uint32)
        _bf16_read(data, bits)
        return bits.view(np.float32)
    out = np.empty(int(counts.sum()), np.float32)
    scales = np.empty(counts.size, np.int64)
    _e4m3_read(data, counts, E4M3, out, scales)
    pair_format.check_scales(scales)
    return out


@njit(cache=True)
def _e4m3_rounded(vals: np.ndarray, table: np.ndarray, out: np.ndarray) -> None:
    """vals (n,) f32 coded and read back as one ``"compact8"`` message, into out (n,) f32."""
    e = _scale_exponent(vals, 0, vals.shape[0])
    down, up = np.float32(2.0 ** -e), np.float32(2.0 ** e)
    bits = out.view(np.uint32)
    for i in range(vals.shape[0]):
        out[i] = _scaled(vals[i], down)  # out[i]'s bits: the scaled value's, until it is overwritten
        out[i] = table[_e4m3(vals[i], out[i], np.int64(bits[i]))] * up


def rounded(vals: np.ndarray, wire: str) -> np.ndarray:
    """:func:`.pair_format.rounded`: vals (n,) f32 as one message carries them."""
    check_wire(wire)
    vals = np.ascontiguousarray(vals, np.float32)
    if wire == "compact":
        counts = np.array([vals.size], np.int64)
        return decode_values(encode_values(vals, counts, wire), counts, wire)
    out = np.empty_like(vals)
    _e4m3_rounded(vals, E4M3, out)
    return out


@njit(cache=True)
def _write(out: np.ndarray, idx: np.ndarray, values: np.ndarray, counts: np.ndarray, starts: np.ndarray,
           universe: int, low: int) -> bool:
    """Every message of ``counts`` pairs into the zeroed ``out`` at ``starts`` (its bytes), its
    values section copied from ``values`` (every message's, laid end to end); False, with the
    message left unfinished, at an index out of [0, universe) or not above the one before it in
    its message."""
    first, value_at = 0, 0
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
        if held:
            out[byte] = acc & 0xFF
        end = starts[m + 1] if m + 1 < starts.shape[0] else out.shape[0]
        out[val_at:end] = values[value_at:value_at + end - val_at]
        value_at += end - val_at
        first += n
    return True


def encode(idx: np.ndarray, vals: np.ndarray, counts: np.ndarray, universe: int,
           low: int, wire: str = "compact") -> tuple[np.ndarray, np.ndarray]:
    """:func:`.pair_format.encode`: (messages (m,) uint8, bytes of each (M,) int32). Raises
    ValueError for pairs the format cannot hold (indices not ascending and distinct within a
    message, or outside [0, universe); counts that do not add up to the pairs)."""
    if low > WIDEST_LOW:
        return pair_format.encode(idx, vals, counts, universe, low, wire)
    counts = np.asarray(counts, np.int64)
    idx, vals = np.ascontiguousarray(idx, np.int64), np.ascontiguousarray(vals, np.float32)
    if idx.shape != vals.shape or int(counts.sum()) != idx.size or (counts < 0).any():
        raise ValueError(f"compact pairs: {idx.size} indices and {vals.size} values for messages of {counts.tolist()}")
    sizes = np.array([message_bytes(n, universe, low, wire) for n in counts.tolist()], np.int64)
    out = np.zeros(int(sizes.sum()), np.uint8)
    values = encode_values(vals, counts, wire)
    if not _write(out, idx, values, counts, np.cumsum(sizes) - sizes, int(universe), int(low)):
        raise ValueError(f"compact pairs: a message's indices are not ascending, distinct and in [0, {universe})")
    return out, sizes.astype(np.int32)


@njit(cache=True)
def _message_counts(buf: np.ndarray, universe: int, low: int, per_value: int, scale: int) -> np.ndarray:
    """Each message's pair count, read header by header (a values section: ``scale`` +
    ``per_value``·n bytes); -1 last if a message runs past buf."""
    counts = []
    at = 0
    while at < buf.shape[0]:
        if at + HEADER > buf.shape[0]:
            counts.append(-1)
            break
        n = 0
        for b in range(HEADER):
            n |= np.int64(buf[at + b]) << (8 * b)
        at += HEADER + (n * low + 7) // 8 + ((n + ((universe - 1) >> low) + 1 + 7) // 8 if n else 0) + \
            scale + per_value * n
        counts.append(n if at <= buf.shape[0] else -1)
        if at > buf.shape[0]:
            break
    return np.array(counts, np.int64)


@njit(cache=True)
def _read(buf: np.ndarray, counts: np.ndarray, universe: int, low: int, per_value: int, scale: int,
          idx: np.ndarray, values: np.ndarray) -> bool:
    """Every message's indices into ``idx`` and its values section into ``values`` (laid end to
    end); False if a high section does not hold exactly its count of set bits."""
    first, value_at = 0, 0
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
        size = scale + per_value * n
        values[value_at:value_at + size] = buf[val_at:val_at + size]
        value_at += size
        first += n
        at = val_at + size
    return True


def decode(buf: np.ndarray, universe: int, low: int,
           wire: str = "compact") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`.pair_format.decode`: (idx (n,) int64, vals (n,) f32, pairs of each message (M,) int32).
    Raises ValueError for bytes that are not messages of this format (one running past the
    buffer, or a high section that disagrees with its count)."""
    buf = np.ascontiguousarray(buf, np.uint8)
    if low > WIDEST_LOW:
        return pair_format.decode(buf, universe, low, wire)
    per_value, scale = value_bytes(1, wire) - value_bytes(0, wire), value_bytes(0, wire)
    counts = _message_counts(buf, int(universe), int(low), per_value, scale)
    if counts.size and counts[-1] < 0:
        raise ValueError(f"compact pairs: a message runs past the end of the {buf.size}-byte buffer")
    total = int(counts.sum())
    idx, values = np.empty(total, np.int64), np.empty(per_value * total + scale * counts.size, np.uint8)
    if not _read(buf, counts, int(universe), int(low), per_value, scale, idx, values):
        raise ValueError("compact pairs: a message's high bits disagree with its pair count")
    return idx, decode_values(values, counts, wire), counts.astype(np.int32)
