"""``wire="compact"``: Elias–Fano indices (:mod:`.elias_fano`) and bfloat16 values, 2 bytes
each, little-endian: float32 rounded to nearest even, finite values first clamped to
bfloat16's largest finite (so none overflows), NaN as 0x7FC0, ±Inf kept. At n = U/1000 about
28 bits a pair, against 64 for ``"fp32"``; what rounding takes from a rank's own value stays
in that rank's residual (the engine subtracts what was sent, not what it had)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from numba import njit

from .elias_fano import EliasFano

if TYPE_CHECKING:
    import torch

BF16_MAX = float(np.frombuffer(np.array([0x7F7F0000], np.uint32).tobytes(), np.float32)[0])
"""bfloat16's largest finite value, 3.3895e38: finite values are clamped to ±this before rounding."""


def _bf16_bits(vals: np.ndarray) -> np.ndarray:
    """(n,) uint16: the bfloat16 bits of vals (n,) f32 (clamped, to nearest even, NaN 0x7FC0)."""
    x = np.asarray(vals, np.float32)
    x = np.where(np.isfinite(x), np.clip(x, -BF16_MAX, BF16_MAX), x).astype(np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    half = ((u + ((u >> 16) & 1) + 0x7FFF) >> 16).astype(np.uint16)  # to nearest, ties to even
    return np.where(np.isnan(x), np.uint16(0x7FC0), half).astype(np.uint16)


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
    """The values sections of float32 ``bits`` (n,) into out (2n,) uint8."""
    for i in range(bits.shape[0]):
        half = _bf16(bits[i])
        out[2 * i] = half & 0xFF
        out[2 * i + 1] = half >> 8


@njit(cache=True)
def _bf16_read(data: np.ndarray, out: np.ndarray) -> None:
    """The float32 bits (n,) of values sections (2n,) uint8."""
    for i in range(out.shape[0]):
        out[i] = (np.uint32(data[2 * i]) | (np.uint32(data[2 * i + 1]) << 8)) << 16


def _bf16_bits_torch(vals: torch.Tensor) -> torch.Tensor:
    """vals (n,) f32 → (n,) int64 holding the bfloat16 bits the reference writes (torch's own
    cast may keep a NaN's sign)."""
    import torch

    kept = torch.where(torch.isfinite(vals), vals.clamp(-BF16_MAX, BF16_MAX), vals)
    u = kept.view(torch.int32).long() & 0xFFFFFFFF
    half = (u + ((u >> 16) & 1) + 0x7FFF) >> 16
    return torch.where(torch.isnan(vals), 0x7FC0, half)


class Compact(EliasFano):
    name = "compact"

    def value_bytes(self, n: Any) -> Any:
        return 2 * n

    def rounded_numpy(self, vals: np.ndarray) -> np.ndarray:
        return (_bf16_bits(vals).astype(np.uint32) << 16).view(np.float32)

    def encode_values(self, vals: np.ndarray, counts: np.ndarray) -> np.ndarray:
        return _bf16_bits(vals).astype("<u2").view(np.uint8)

    def decode_values(self, data: np.ndarray, counts: np.ndarray) -> np.ndarray:
        return (np.asarray(data, np.uint8).copy().view("<u2").astype(np.uint32) << 16).view(np.float32)

    def rounded_numba(self, vals: np.ndarray) -> np.ndarray:
        vals = np.ascontiguousarray(vals, np.float32)
        counts = np.array([vals.size], np.int64)
        return self.decode_values_numba(self.encode_values_numba(vals, counts), counts)

    def encode_values_numba(self, vals: np.ndarray, counts: np.ndarray) -> np.ndarray:
        vals = np.ascontiguousarray(vals, np.float32)
        out = np.empty(2 * vals.size, np.uint8)
        _bf16_values(vals.view(np.uint32), out)
        return out

    def decode_values_numba(self, data: np.ndarray, counts: np.ndarray) -> np.ndarray:
        bits = np.empty(int(np.asarray(counts).sum()), np.uint32)
        _bf16_read(np.ascontiguousarray(data, np.uint8), bits)
        return bits.view(np.float32)

    def rounded_torch(self, vals: torch.Tensor) -> torch.Tensor:
        import torch

        return (_bf16_bits_torch(vals) << 16).to(torch.int32).view(torch.float32)

    def encode_values_torch(self, vals: torch.Tensor, counts: torch.Tensor, message: torch.Tensor,
                            place: torch.Tensor) -> torch.Tensor:
        import torch

        half = _bf16_bits_torch(vals)
        return torch.stack([half & 0xFF, half >> 8], 1).reshape(-1)

    def decode_values_torch(self, data: torch.Tensor, counts: torch.Tensor, message: torch.Tensor,
                            place: torch.Tensor) -> torch.Tensor:
        import torch

        pairs = data.view(-1, 2).long()
        return ((pairs[:, 0] | (pairs[:, 1] << 8)) << 16).to(torch.int32).view(torch.float32)
