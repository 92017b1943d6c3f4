"""``wire="compact8"``: Elias–Fano indices (:mod:`.elias_fano`) and 8-bit values at one scale a
message. The values section is the message's scale exponent e (int16 little-endian), then one
byte a value: v·2^−e in OCP FP8 E4M3 (1 sign, 4 exponent bits with bias 7, 3 mantissa bits;
subnormals 2^−9·m), rounded to nearest even, except that 0x7F is +Inf, 0xFF −Inf and 0x80
(E4M3's −0) NaN.

e is chosen from the message's largest finite |v| = f·2^E (f in [0.5, 1)) so that it maps into
(224, 448]: e = E − 9 if f ≤ 0.875 else E − 8, and −117 ≤ e (so every decoded value is a normal
float32 or zero; finite |v| first clamped to 1.875·2^127, so that none rounds up past float32's
largest, which keeps e ≤ 120). While e > −117 every finite value keeps 3 mantissa bits
(relative error at most 2^−4) down to 2^−13 of the largest, and from 2^−17.8 to 2^−18.8 of it
down it flushes to zero; at e = −117 everything below 2^−127 flushes.

Rounding is idempotent under a finer scale: values rounded with exponent e travel unchanged in
a message whose own e' ≤ e, so the engine rounds a rank's whole outgoing set once and encodes
any of its subsets losslessly.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
from numba import njit

from .elias_fano import EliasFano

if TYPE_CHECKING:
    import torch

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



@njit(cache=True)
def _scale_exponent(vals: np.ndarray, first: int, n: int) -> int:
    """:func:`scale_exponents` of vals[first:first + n]."""
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
    """:func:`e4m3_codes` of one value x, given a = min(|x|, clamp)·2^−e (0 for NaN)
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


@njit(cache=True)
def _e4m3_rounded(vals: np.ndarray, table: np.ndarray, out: np.ndarray) -> None:
    """vals (n,) f32 coded and read back as one ``"compact8"`` message, into out (n,) f32."""
    e = _scale_exponent(vals, 0, vals.shape[0])
    down, up = np.float32(2.0 ** -e), np.float32(2.0 ** e)
    bits = out.view(np.uint32)
    for i in range(vals.shape[0]):
        out[i] = _scaled(vals[i], down)  # out[i]'s bits: the scaled value's, until it is overwritten
        out[i] = table[_e4m3(vals[i], out[i], np.int64(bits[i]))] * up


def _pow2_torch(e: torch.Tensor) -> torch.Tensor:
    """2^e as float32, exactly, for integer e (int64) in [−126, 127]."""
    import torch

    return ((e + 127) << 23).to(torch.int32).view(torch.float32)


def _finite_abs_torch(vals: torch.Tensor) -> torch.Tensor:
    """|vals| (n,) f32 clamped to E4M3_CLAMP; 0 where not finite."""
    import torch

    return torch.where(torch.isfinite(vals), vals.abs().clamp_max(E4M3_CLAMP), 0.0)


def _largest_torch(vals: torch.Tensor, message: torch.Tensor, messages: int) -> torch.Tensor:
    """(messages,) f32: the largest finite |v| (clamped) of each message (0 for none)."""
    import torch

    return torch.zeros(messages, device=vals.device).scatter_reduce_(0, message, _finite_abs_torch(vals), "amax")


def _scale_exponents_torch(largest: torch.Tensor) -> torch.Tensor:
    """:func:`scale_exponents`: (M,) int64."""
    import torch

    f, E = torch.frexp(largest)
    e = torch.where(f <= 0.875, E - 9, E - 8).long().clamp_min(E4M3_MIN_SCALE)
    return torch.where(largest > 0, e, 0)


def _e4m3_codes_torch(vals: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """:func:`e4m3_codes`: (n,) int64 bytes of vals (n,) f32 at exponents e (n,) int64."""
    import torch

    a = _finite_abs_torch(vals) * _pow2_torch(-e)
    u = a.view(torch.int32).long()
    normal = ((u + ((u >> 20) & 1) + 0x7FFFF) >> 20) - (120 << 3)
    q = torch.where(a < 2.0**-6, torch.round(a * 512).long(), normal)  # round: half to even
    code = torch.where(torch.signbit(vals) & (q > 0), q | 0x80, q)
    code = torch.where(torch.isposinf(vals), 0x7F, torch.where(torch.isneginf(vals), 0xFF, code))
    return torch.where(torch.isnan(vals), 0x80, code)


def _e4m3_values_torch(codes: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """(n,) f32 that bytes codes (n,) int64 stand for at exponents e (n,) int64."""
    import torch

    return torch.from_numpy(E4M3).to(codes.device)[codes] * _pow2_torch(e)


class Compact8(EliasFano):
    name = "compact8"
    one_scale = True

    def value_bytes(self, n: Any) -> Any:
        return SCALE_BYTES + n

    def rounded_numpy(self, vals: np.ndarray) -> np.ndarray:
        """At the scale of their largest finite |v|."""
        vals = np.asarray(vals, np.float32)
        e = scale_exponents(_largest(vals, np.zeros(vals.size, np.int64), 1))
        return E4M3[e4m3_codes(vals, np.repeat(e, vals.size))] * pow2(e)[0]

    def encode_values(self, vals: np.ndarray, counts: np.ndarray) -> np.ndarray:
        vals, counts = np.asarray(vals, np.float32), np.asarray(counts, np.int64)
        message = np.repeat(np.arange(counts.size), counts)
        e = scale_exponents(_largest(vals, message, counts.size))
        out = np.empty(int(counts.sum()) + SCALE_BYTES * counts.size, np.uint8)
        first = np.cumsum(counts + SCALE_BYTES) - counts - SCALE_BYTES  # where each section starts
        scale = e.astype("<i2").view(np.uint8).reshape(-1, 2)
        out[first], out[first + 1] = scale[:, 0], scale[:, 1]
        out[first[message] + SCALE_BYTES + np.arange(vals.size) - (np.cumsum(counts) - counts)[message]] = \
            e4m3_codes(vals, e[message])
        return out

    def decode_values(self, data: np.ndarray, counts: np.ndarray) -> np.ndarray:
        data, counts = np.asarray(data, np.uint8), np.asarray(counts, np.int64)
        message = np.repeat(np.arange(counts.size), counts)
        first = np.cumsum(counts + SCALE_BYTES) - counts - SCALE_BYTES
        e = (data[first].astype(np.int64) | (data[first + 1].astype(np.int64) << 8)).astype(np.uint16).view(np.int16)
        check_scales(e)
        codes = data[first[message] + SCALE_BYTES + np.arange(message.size) - (np.cumsum(counts) - counts)[message]]
        return (E4M3[codes] * pow2(e.astype(np.int64))[message]).astype(np.float32)

    def rounded_numba(self, vals: np.ndarray) -> np.ndarray:
        vals = np.ascontiguousarray(vals, np.float32)
        out = np.empty_like(vals)
        _e4m3_rounded(vals, E4M3, out)
        return out

    def encode_values_numba(self, vals: np.ndarray, counts: np.ndarray) -> np.ndarray:
        vals, counts = np.ascontiguousarray(vals, np.float32), np.ascontiguousarray(counts, np.int64)
        out = np.empty(int(counts.sum()) + SCALE_BYTES * counts.size, np.uint8)
        _e4m3_values(vals, counts, out)
        return out

    def decode_values_numba(self, data: np.ndarray, counts: np.ndarray) -> np.ndarray:
        counts, data = np.ascontiguousarray(counts, np.int64), np.ascontiguousarray(data, np.uint8)
        out = np.empty(int(counts.sum()), np.float32)
        scales = np.empty(counts.size, np.int64)
        _e4m3_read(data, counts, E4M3, out, scales)
        check_scales(scales)
        return out

    def rounded_torch(self, vals: torch.Tensor) -> torch.Tensor:
        import torch

        e = _scale_exponents_torch(_largest_torch(vals, torch.zeros_like(vals, dtype=torch.int64), 1))
        e = e.expand(vals.shape)
        return _e4m3_values_torch(_e4m3_codes_torch(vals, e), e)

    def encode_values_torch(self, vals: torch.Tensor, counts: torch.Tensor, message: torch.Tensor,
                            place: torch.Tensor) -> torch.Tensor:
        import torch

        e = _scale_exponents_torch(_largest_torch(vals, message, len(counts)))
        scale = e & 0xFFFF
        values = torch.zeros(int(self.value_bytes(counts).sum()), dtype=torch.int64, device=vals.device)
        first = torch.cumsum(counts + SCALE_BYTES, 0) - counts - SCALE_BYTES
        values[first], values[first + 1] = scale & 0xFF, scale >> 8
        values[first[message] + SCALE_BYTES + place] = _e4m3_codes_torch(vals, e[message])
        return values

    def decode_values_torch(self, data: torch.Tensor, counts: torch.Tensor, message: torch.Tensor,
                            place: torch.Tensor) -> torch.Tensor:
        import torch

        first = torch.cumsum(counts + SCALE_BYTES, 0) - counts - SCALE_BYTES
        e = (data[first].long() | (data[first + 1].long() << 8)).to(torch.int16).long()
        check_scales(e.cpu().numpy())
        return _e4m3_values_torch(data[first[message] + SCALE_BYTES + place].long(), e[message])
