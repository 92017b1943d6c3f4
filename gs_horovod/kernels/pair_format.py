"""The compact wire format for (index, value) pairs (``wire="compact"``), its sizes and its
NumPy reference; :mod:`.torch_pairs` writes the same bytes vectorised over every pair of every
message, TensorFlow runs this reference through ``tf.numpy_function``.

A collective carries one message per rank (the allgather's) or per destination (the
alltoall's), laid end to end. Every message of one collective uses the same l, which every
rank derives from the plan (:func:`low_bits` of the pairs a message is expected to hold, so
no message needs to say it). A message of n pairs, indices sorted, distinct and in [0, U) (U:
the step's vector length, int64: any model size), is four byte-aligned sections, bits
little-endian within a byte (bit j of byte b is bit 8b + j of the section):

1. header: n, uint32 little-endian (a message holds fewer than 2^32 pairs);
2. low bits (Elias–Fano): the l low bits of each index, index i's bit t at bit i·l + t;
3. high bits: one set bit for each index, at bit (idx_i >> l) + i of a vector of
   n + ((U − 1) >> l) + 1 bits (none when n = 0), so the i-th set bit gives idx_i >> l back;
4. values: bfloat16, 2 bytes each, little-endian: float32 rounded to nearest even, finite
   values first clamped to bfloat16's largest finite (so none overflows), NaN as 0x7FC0, ±Inf kept.

With l = ⌊log2(U / n)⌋ about 2 + l bits an index and 16 bits a value: at n = U/1000, 28 bits a
pair against 64 for an int32 index and a float32 value. What rounding takes from a rank's
own value stays in that rank's residual (the engine subtracts what was sent, not what it had).
"""

from __future__ import annotations

import numpy as np

BF16_MAX = float(np.frombuffer(np.array([0x7F7F0000], np.uint32).tobytes(), np.float32)[0])
"""bfloat16's largest finite value, 3.3895e38: finite values are clamped to ±this before rounding."""
HEADER = 4
"""Bytes of a message's header: its pair count, uint32 little-endian."""


def low_bits(n: int, universe: int) -> int:
    """l for messages expected to hold n indices in [0, universe): ⌊log2(universe / n)⌋ (0 when n ≥ universe)."""
    return max(0, (int(universe) // int(n)).bit_length() - 1) if n else 0


def high_bits(n: int, universe: int, low: int) -> int:
    """Bits of the high-bits section of a message of n indices (0 for an empty message)."""
    return int(n) + ((int(universe) - 1) >> low) + 1 if n else 0


def sections(n: int, universe: int, low: int) -> tuple[int, int, int, int]:
    """Bytes of the (header, low bits, high bits, values) sections of a message of n pairs."""
    return HEADER, -(-int(n) * low // 8), -(-high_bits(n, universe, low) // 8), 2 * int(n)


def message_bytes(n: int, universe: int, low: int) -> int:
    """Bytes of a message of n pairs with indices in [0, universe) and ``low`` low bits."""
    return sum(sections(n, universe, low))


def rounded(vals: np.ndarray) -> np.ndarray:
    """What the values section carries, as float32: vals (n,) f32 clamped and rounded to bfloat16."""
    return (_bf16_bits(vals).astype(np.uint32) << 16).view(np.float32)


def _bf16_bits(vals: np.ndarray) -> np.ndarray:
    x = np.asarray(vals, np.float32)
    x = np.where(np.isfinite(x), np.clip(x, -BF16_MAX, BF16_MAX), x).astype(np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    half = ((u + ((u >> 16) & 1) + 0x7FFF) >> 16).astype(np.uint16)  # to nearest, ties to even
    return np.where(np.isnan(x), np.uint16(0x7FC0), half).astype(np.uint16)


def _pack(bits: np.ndarray) -> np.ndarray:
    return np.packbits(bits.astype(np.uint8), bitorder="little")


def _unpack(data: np.ndarray, count: int) -> np.ndarray:
    return np.unpackbits(data, bitorder="little")[:count]


def encode(idx: np.ndarray, vals: np.ndarray, counts: np.ndarray, universe: int,
           low: int) -> tuple[np.ndarray, np.ndarray]:
    """Consecutive runs of ``counts`` (M,) pairs of idx (n,) int64 / vals (n,) f32, each run a
    message: (the messages laid end to end (m,) uint8, the bytes of each (M,) int32)."""
    idx, vals = np.asarray(idx, np.int64), np.asarray(vals, np.float32)
    out, sizes, first = [], [], 0
    for n in np.asarray(counts).tolist():
        i, v = idx[first:first + n], vals[first:first + n]
        high = np.zeros(high_bits(n, universe, low), np.uint8)
        high[(i >> low) + np.arange(n)] = 1
        msg = np.concatenate([np.array([n], "<u4").view(np.uint8), _pack(((i[:, None] >> np.arange(low)) & 1).ravel()),
                              _pack(high), _bf16_bits(v).astype("<u2").view(np.uint8)])
        out.append(msg)
        sizes.append(msg.size)
        first += n
    return (np.concatenate(out) if out else np.zeros(0, np.uint8)), np.array(sizes, np.int32)


def decode(buf: np.ndarray, universe: int, low: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(idx (n,) int64, vals (n,) f32, the pairs of each message (M,) int32) of messages laid
    end to end in buf (uint8), each read from its header."""
    buf = np.asarray(buf, np.uint8)
    idx, vals, counts, at = [], [], [], 0
    while at < buf.size:
        n = int(buf[at:at + HEADER].copy().view("<u4")[0])
        _, low_b, high_b, val_b = sections(n, universe, low)
        lows = _unpack(buf[at + HEADER:at + HEADER + low_b], n * low).reshape(n, low).astype(np.int64)
        start = at + HEADER + low_b
        positions = np.flatnonzero(_unpack(buf[start:start + high_b], high_bits(n, universe, low)))
        idx.append(((positions - np.arange(n)) << low) | (lows << np.arange(low)).sum(1))
        values = buf[start + high_b:start + high_b + val_b].copy().view("<u2").astype(np.uint32) << 16
        vals.append(values.view(np.float32))
        counts.append(n)
        at = start + high_b + val_b
    if not counts:
        return np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.int32)
    return np.concatenate(idx), np.concatenate(vals), np.array(counts, np.int32)
