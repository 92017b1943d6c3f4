"""The compact wire format for (index, value) pairs (``wire="compact"``), its sizes and its
NumPy reference; :class:`~gs_horovod.kernels.torch_ops.TorchOps` encodes the same bytes
vectorised, TensorFlow runs this reference through ``tf.numpy_function``.

A message carries n pairs whose indices are sorted, distinct and in [0, U) (U: the step's
vector length, int64: any model size), in three byte-aligned sections, bits little-endian
within a byte (bit j of byte b is bit 8b + j of the section):

1. low bits: Elias–Fano with l = ⌊log2(U / n)⌋ (0 when n ≥ U): the l low bits of each index,
   index i's bit t at bit i·l + t (n·l bits);
2. high bits: one set bit for each index, at bit (idx_i >> l) + i of a vector of
   n + ((U − 1) >> l) + 1 bits (so the i-th set bit gives idx_i >> l back);
3. values: bfloat16, 2 bytes each, little-endian: float32 rounded to nearest even, finite
   values first clamped to bfloat16's largest finite (so none overflows), NaN and ±Inf kept.

About 2 + ⌈log2(U / n)⌉ bits an index and 16 bits a value: at n = U/1000, 28 bits a pair
against 64 for an int32 index and a float32 value. What rounding takes from a rank's own value
stays in that rank's residual (the engine subtracts what was sent, not what it had).
"""

from __future__ import annotations

import numpy as np

BF16_MAX = float(np.frombuffer(np.array([0x7F7F0000], np.uint32).tobytes(), np.float32)[0])
"""bfloat16's largest finite value, 3.3895e38: finite values are clamped to ±this before rounding."""


def low_bits(n: int, universe: int) -> int:
    """l: the low bits of each index kept verbatim for n indices in [0, universe)."""
    return max(0, (int(universe) // int(n)).bit_length() - 1) if n else 0


def high_bits(n: int, universe: int) -> int:
    """Bits of the high-bits vector for n indices in [0, universe) (0 for an empty message)."""
    return n + ((universe - 1) >> low_bits(n, universe)) + 1 if n else 0


def sections(n: int, universe: int) -> tuple[int, int, int]:
    """Bytes of the (low bits, high bits, values) sections of a message of n pairs."""
    return -(-n * low_bits(n, universe) // 8), -(-high_bits(n, universe) // 8), 2 * n


def message_bytes(n: int, universe: int) -> int:
    """Bytes of a message of n pairs with indices in [0, universe)."""
    return sum(sections(n, universe))


def rounded(vals: np.ndarray) -> np.ndarray:
    """What the values section carries, as float32: vals (n,) f32 clamped and rounded to bfloat16."""
    bits = _bf16_bits(vals)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _bf16_bits(vals: np.ndarray) -> np.ndarray:
    x = np.asarray(vals, np.float32)
    x = np.where(np.isfinite(x), np.clip(x, -BF16_MAX, BF16_MAX), x).astype(np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    nan = np.isnan(x)
    up = ((u >> 16) & 1) + 0x7FFF  # round to nearest, ties to even
    half = ((u + up) >> 16).astype(np.uint16)
    return np.where(nan, np.uint16(0x7FC0), half).astype(np.uint16)


def _pack_bits(bits: np.ndarray) -> np.ndarray:
    return np.packbits(bits.astype(np.uint8), bitorder="little")


def encode(idx: np.ndarray, vals: np.ndarray, universe: int) -> np.ndarray:
    """The message (m,) uint8 of indices idx (n,) int64 (sorted, distinct, in [0, universe))
    and values vals (n,) f32."""
    idx = np.asarray(idx, np.int64)
    n = idx.size
    if n == 0:
        return np.zeros(0, np.uint8)
    low = low_bits(n, universe)
    lows = ((idx[:, None] >> np.arange(low)) & 1).reshape(-1)
    high = np.zeros(high_bits(n, universe), np.uint8)
    high[(idx >> low) + np.arange(n)] = 1
    values = _bf16_bits(vals).astype("<u2").view(np.uint8)
    return np.concatenate([_pack_bits(lows), _pack_bits(high), values])


def decode(buf: np.ndarray, messages: int, n: int, universe: int) -> tuple[np.ndarray, np.ndarray]:
    """(idx (messages·n,) int64, vals (messages·n,) f32) of ``messages`` messages of n pairs
    each, laid end to end in buf (uint8)."""
    if n == 0 or messages == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    low = low_bits(n, universe)
    low_b, high_b, _ = sections(n, universe)
    rows = np.asarray(buf, np.uint8).reshape(messages, -1)
    lows = np.unpackbits(rows[:, :low_b], axis=1, bitorder="little")[:, :n * low].reshape(messages, n, low)
    low_part = (lows.astype(np.int64) << np.arange(low)).sum(-1)
    high = np.unpackbits(rows[:, low_b:low_b + high_b], axis=1, bitorder="little")[:, :high_bits(n, universe)]
    positions = np.nonzero(high)[1].reshape(messages, n)
    idx = ((positions - np.arange(n)) << low) | low_part
    bits = rows[:, low_b + high_b:].copy().view("<u2").astype(np.uint32) << 16
    return idx.reshape(-1), bits.view(np.float32).reshape(-1)


HEADER = 4
"""Bytes before each message of a variable count (the sparse exchange's): its n, uint32
little-endian (a rank sends fewer than 2^32 pairs to one owner)."""


def encode_framed(idx: np.ndarray, vals: np.ndarray, counts: np.ndarray, universe: int) -> tuple[np.ndarray,
                                                                                                   np.ndarray]:
    """Consecutive runs of ``counts`` (P,) pairs of idx/vals, each framed as an n header and its
    message: (the framed messages laid end to end (m,) uint8, the bytes of each (P,) int32)."""
    out, sizes, first = [], [], 0
    for n in np.asarray(counts).tolist():
        msg = encode(idx[first:first + n], vals[first:first + n], universe)
        out += [np.array([n], "<u4").view(np.uint8), msg]
        sizes.append(HEADER + msg.size)
        first += n
    return np.concatenate(out) if out else np.zeros(0, np.uint8), np.array(sizes, np.int32)


def decode_framed(buf: np.ndarray, universe: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(idx, vals, the pairs of each framed message (P,) int32) of framed messages laid end to end."""
    buf = np.asarray(buf, np.uint8)
    idx, vals, counts, at = [], [], [], 0
    while at < buf.size:
        n = int(buf[at:at + HEADER].copy().view("<u4")[0])
        size = message_bytes(n, universe)
        i, v = decode(buf[at + HEADER:at + HEADER + size], 1, n, universe)
        idx.append(i)
        vals.append(v)
        counts.append(n)
        at += HEADER + size
    if not counts:
        return np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.int32)
    return np.concatenate(idx), np.concatenate(vals), np.array(counts, np.int32)
