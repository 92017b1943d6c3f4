"""The compact wire formats for (index, value) pairs (``wire="compact"`` and ``"compact8"``),
their sizes and their NumPy reference; :mod:`.torch_pairs` writes the same bytes vectorised over
every pair of every message, :mod:`.numba_pairs` in one serial pass, TensorFlow runs the latter
through ``tf.numpy_function``.

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
4. values, little-endian:

   - ``"compact"``: bfloat16, 2 bytes each: float32 rounded to nearest even, finite values first
     clamped to bfloat16's largest finite (so none overflows), NaN as 0x7FC0, ±Inf kept;
   - ``"compact8"``: the message's scale exponent e (int16), then one byte a value: v·2^−e in
     OCP FP8 E4M3 (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; subnormals 2^−9·m),
     rounded to nearest even, except that 0x7F is +Inf, 0xFF −Inf and 0x80 (E4M3's −0) NaN.
     e is chosen from the message's largest finite |v| = f·2^E (f in [0.5, 1)) so that it maps
     into (224, 448]: e = E − 9 if f ≤ 0.875 else E − 8, and −117 ≤ e (so every decoded value is
     a normal float32 or zero; finite |v| first clamped to 1.875·2^127, so that none rounds up
     past float32's largest, which keeps e ≤ 120). While e > −117 (a largest above about
     2^−109) every finite value keeps 3 mantissa bits (relative error at most 2^−4) down to
     2^−13 of the largest, and from 2^−17.8 to 2^−18.8 of it down (where the scale puts the
     largest) it flushes to zero; at e = −117 everything below 2^−127 flushes.

With l = ⌊log2(U / n)⌋ 2 to 3 + l bits an index: at n = U/1000, 28 bits a pair with bfloat16
values and 20 with E4M3 ones, against 64 for an int32 index and a float32 value. What rounding
takes from a rank's own value stays in that rank's residual (the engine subtracts what was
sent, not what it had). Rounding is idempotent under a finer scale: values :func:`rounded`
with exponent e travel unchanged in a message whose own e' ≤ e, so the engine rounds a rank's
whole outgoing set once and encodes any of its subsets losslessly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

PAIR_WIRES = ("compact", "compact8")
"""The encoded pair formats; ``wire="fp32"`` sends int32 / float32 pairs instead."""
BF16_MAX = float(np.frombuffer(np.array([0x7F7F0000], np.uint32).tobytes(), np.float32)[0])
"""bfloat16's largest finite value, 3.3895e38: finite values are clamped to ±this before rounding."""
HEADER = 4
"""Bytes of a message's header: its pair count, uint32 little-endian."""
SCALE_BYTES = 2
"""Bytes of a ``"compact8"`` message's scale exponent, int16 little-endian, before its values."""
E4M3_MIN_SCALE = -117
"""The smallest scale exponent: E4M3's smallest subnormal 2^−9 times 2^e stays a normal float32."""
E4M3_MAX_SCALE = 120
"""The largest scale exponent (that of a message whose largest is the clamp, 1.875·2^127)."""
E4M3_CLAMP = 1.875 * 2.0**127
"""The largest float32 with 4 significant bits, 3.19e38: finite |v| are clamped to it (so none
rounds up past float32's largest and overflows)."""


def _e4m3_table() -> np.ndarray:
    """(256,) f32: the value of each ``"compact8"`` byte at scale exponent 0."""
    mag = np.arange(128)
    exp, man = mag >> 3, mag & 7
    pos = np.where(exp == 0, man * 2.0**-9, (8 + man) * 2.0 ** (exp - 10)).astype(np.float32)
    table = np.concatenate([pos, -pos]).astype(np.float32)
    table[0x7F], table[0xFF], table[0x80] = np.inf, -np.inf, np.nan
    return table


E4M3 = _e4m3_table()
"""What each ``"compact8"`` value byte means at scale exponent 0 (0x80: NaN, 0x7F / 0xFF: ±Inf)."""


def check_scales(e: np.ndarray) -> None:
    """Raises ValueError for scale exponents no encoder writes (bytes that are not messages of this format)."""
    if e.size and (e.min() < E4M3_MIN_SCALE or e.max() > E4M3_MAX_SCALE):
        raise ValueError(f"compact8 pairs: a message's scale exponent is outside [{E4M3_MIN_SCALE}, {E4M3_MAX_SCALE}]")


def check_wire(wire: str) -> None:
    if wire not in PAIR_WIRES:
        raise ValueError(f"pair wire format {wire!r}: expected one of {PAIR_WIRES}")


def low_bits(n: int, universe: int) -> int:
    """l for messages expected to hold n indices in [0, universe): ⌊log2(universe / n)⌋ (0 when n ≥ universe)."""
    return max(0, (int(universe) // int(n)).bit_length() - 1) if n else 0


def high_bits(n: int, universe: int, low: int) -> int:
    """Bits of the high-bits section of a message of n indices (0 for an empty message)."""
    return int(n) + ((int(universe) - 1) >> low) + 1 if n else 0


def value_bytes(n: Any, wire: str) -> Any:
    """Bytes of the values section of a message of n pairs (an int, or an array of counts)."""
    return 2 * n if wire == "compact" else SCALE_BYTES + n


def sections(n: int, universe: int, low: int, wire: str = "compact") -> tuple[int, int, int, int]:
    """Bytes of the (header, low bits, high bits, values) sections of a message of n pairs."""
    return HEADER, -(-int(n) * low // 8), -(-high_bits(n, universe, low) // 8), value_bytes(int(n), wire)


def message_bytes(n: int, universe: int, low: int, wire: str = "compact") -> int:
    """Bytes of a message of n pairs with indices in [0, universe) and ``low`` low bits."""
    return sum(sections(n, universe, low, wire))


def pow2(e: np.ndarray) -> np.ndarray:
    """2^e as float32, exactly, for integer e in [−126, 127]."""
    return ((np.asarray(e, np.int64) + 127) << 23).astype(np.uint32).view(np.float32)


def scale_exponents(largest: np.ndarray) -> np.ndarray:
    """(M,) int64: each message's scale exponent e from its largest finite |v| (M,) f32 (0: e = 0)."""
    f, E = np.frexp(np.asarray(largest, np.float32))
    e = np.where(f <= 0.875, E - 9, E - 8).astype(np.int64)
    return np.where(np.asarray(largest) > 0, np.maximum(e, E4M3_MIN_SCALE), 0)


def e4m3_codes(vals: np.ndarray, e: np.ndarray) -> np.ndarray:
    """(n,) uint8: vals (n,) f32 at scale exponents e (n,) int64 as ``"compact8"`` bytes."""
    x = np.asarray(vals, np.float32)
    a = _finite_abs(x) * pow2(-e)
    u = a.view(np.uint32).astype(np.int64)
    normal = ((u + ((u >> 20) & 1) + 0x7FFFF) >> 20) - (120 << 3)
    q = np.where(a < 2.0**-6, np.rint(a * np.float32(512)).astype(np.int64), normal)
    code = np.where(np.signbit(x) & (q > 0), q | 0x80, q)
    code = np.where(np.isposinf(x), 0x7F, np.where(np.isneginf(x), 0xFF, code))
    return np.where(np.isnan(x), 0x80, code).astype(np.uint8)


def _finite_abs(x: np.ndarray) -> np.ndarray:
    """|x| (n,) f32, clamped to :data:`E4M3_CLAMP`; 0 where x is not finite."""
    return np.where(np.isfinite(x), np.minimum(np.abs(x), np.float32(E4M3_CLAMP)), 0).astype(np.float32)


def _largest(vals: np.ndarray, message: np.ndarray, messages: int) -> np.ndarray:
    """(messages,) f32: the largest finite |v| (clamped) of each message (0 for none)."""
    out = np.zeros(messages, np.float32)
    np.maximum.at(out, message, _finite_abs(np.asarray(vals, np.float32)))
    return out


def rounded(vals: np.ndarray, wire: str = "compact") -> np.ndarray:
    """What the values section carries, as float32, of vals (n,) f32 sent as one message (for
    ``"compact8"``: at the scale of their largest finite |v|)."""
    check_wire(wire)
    if wire == "compact":
        return (_bf16_bits(vals).astype(np.uint32) << 16).view(np.float32)
    vals = np.asarray(vals, np.float32)
    e = scale_exponents(_largest(vals, np.zeros(vals.size, np.int64), 1))
    return E4M3[e4m3_codes(vals, np.repeat(e, vals.size))] * pow2(e)[0]


def _bf16_bits(vals: np.ndarray) -> np.ndarray:
    x = np.asarray(vals, np.float32)
    x = np.where(np.isfinite(x), np.clip(x, -BF16_MAX, BF16_MAX), x).astype(np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    half = ((u + ((u >> 16) & 1) + 0x7FFF) >> 16).astype(np.uint16)  # to nearest, ties to even
    return np.where(np.isnan(x), np.uint16(0x7FC0), half).astype(np.uint16)


def encode_values(vals: np.ndarray, counts: np.ndarray, wire: str) -> np.ndarray:
    """The values sections of consecutive runs of counts (M,) values of vals (n,) f32, laid end
    to end (uint8, :func:`value_bytes` of each run)."""
    check_wire(wire)
    vals, counts = np.asarray(vals, np.float32), np.asarray(counts, np.int64)
    if wire == "compact":
        return _bf16_bits(vals).astype("<u2").view(np.uint8)
    message = np.repeat(np.arange(counts.size), counts)
    e = scale_exponents(_largest(vals, message, counts.size))
    out = np.empty(int(counts.sum()) + SCALE_BYTES * counts.size, np.uint8)
    first = np.cumsum(counts + SCALE_BYTES) - counts - SCALE_BYTES  # where each section starts
    scale = e.astype("<i2").view(np.uint8).reshape(-1, 2)
    out[first], out[first + 1] = scale[:, 0], scale[:, 1]
    out[first[message] + SCALE_BYTES + np.arange(vals.size) - (np.cumsum(counts) - counts)[message]] = \
        e4m3_codes(vals, e[message])
    return out


def decode_values(data: np.ndarray, counts: np.ndarray, wire: str) -> np.ndarray:
    """(n,) f32: the values of the values sections of runs of counts (M,) pairs laid end to end in data (uint8)."""
    check_wire(wire)
    data, counts = np.asarray(data, np.uint8), np.asarray(counts, np.int64)
    if wire == "compact":
        return (data.copy().view("<u2").astype(np.uint32) << 16).view(np.float32)
    message = np.repeat(np.arange(counts.size), counts)
    first = np.cumsum(counts + SCALE_BYTES) - counts - SCALE_BYTES
    e = (data[first].astype(np.int64) | (data[first + 1].astype(np.int64) << 8)).astype(np.uint16).view(np.int16)
    check_scales(e)
    codes = data[first[message] + SCALE_BYTES + np.arange(message.size) - (np.cumsum(counts) - counts)[message]]
    return (E4M3[codes] * pow2(e.astype(np.int64))[message]).astype(np.float32)


def _pack(bits: np.ndarray) -> np.ndarray:
    return np.packbits(bits.astype(np.uint8), bitorder="little")


def _unpack(data: np.ndarray, count: int) -> np.ndarray:
    return np.unpackbits(data, bitorder="little")[:count]


def encode(idx: np.ndarray, vals: np.ndarray, counts: np.ndarray, universe: int,
           low: int, wire: str = "compact") -> tuple[np.ndarray, np.ndarray]:
    """Consecutive runs of ``counts`` (M,) pairs of idx (n,) int64 / vals (n,) f32, each run a
    message: (the messages laid end to end (m,) uint8, the bytes of each (M,) int32)."""
    idx, vals = np.asarray(idx, np.int64), np.asarray(vals, np.float32)
    out, sizes, first = [], [], 0
    for n in np.asarray(counts).tolist():
        i, v = idx[first:first + n], vals[first:first + n]
        high = np.zeros(high_bits(n, universe, low), np.uint8)
        high[(i >> low) + np.arange(n)] = 1
        msg = np.concatenate([np.array([n], "<u4").view(np.uint8), _pack(((i[:, None] >> np.arange(low)) & 1).ravel()),
                              _pack(high), encode_values(v, np.array([n]), wire)])
        out.append(msg)
        sizes.append(msg.size)
        first += n
    return (np.concatenate(out) if out else np.zeros(0, np.uint8)), np.array(sizes, np.int32)


def decode(buf: np.ndarray, universe: int, low: int,
           wire: str = "compact") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(idx (n,) int64, vals (n,) f32, the pairs of each message (M,) int32) of messages laid
    end to end in buf (uint8), each read from its header."""
    buf = np.asarray(buf, np.uint8)
    idx, vals, counts, at = [], [], [], 0
    while at < buf.size:
        n = int(buf[at:at + HEADER].copy().view("<u4")[0])
        _, low_b, high_b, val_b = sections(n, universe, low, wire)
        lows = _unpack(buf[at + HEADER:at + HEADER + low_b], n * low).reshape(n, low).astype(np.int64)
        start = at + HEADER + low_b
        positions = np.flatnonzero(_unpack(buf[start:start + high_b], high_bits(n, universe, low)))
        idx.append(((positions - np.arange(n)) << low) | (lows << np.arange(low)).sum(1))
        vals.append(decode_values(buf[start + high_b:start + high_b + val_b], np.array([n]), wire))
        counts.append(n)
        at = start + high_b + val_b
    if not counts:
        return np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.int32)
    return np.concatenate(idx), np.concatenate(vals), np.array(counts, np.int32)
