"""The compact pair format (:mod:`.pair_format`) in torch ops, vectorised over a message's
pairs (and over equal-sized messages): the same bytes as the NumPy reference."""

from __future__ import annotations

import torch

from .pair_format import BF16_MAX, HEADER, high_bits, low_bits, message_bytes, sections


def _bf16_bits(vals: torch.Tensor) -> torch.Tensor:
    """vals (n,) f32 → (n,) int32 holding the bfloat16 bits the reference writes: finite values
    clamped, rounded to nearest even; every NaN as 0x7FC0 (torch's own cast may keep its sign)."""
    kept = torch.where(torch.isfinite(vals), vals.clamp(-BF16_MAX, BF16_MAX), vals)
    u = kept.view(torch.int32).long() & 0xFFFFFFFF
    half = ((u + ((u >> 16) & 1) + 0x7FFF) >> 16).int()
    return torch.where(torch.isnan(vals), 0x7FC0, half)


def rounded(vals: torch.Tensor) -> torch.Tensor:
    """vals (n,) f32 as the values section carries them: clamped, rounded to bfloat16, as f32."""
    return (_bf16_bits(vals) << 16).view(torch.float32)


def _pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """bits (b,) of 0/1 → (⌈b/8⌉,) uint8, bit j of byte i = bits[8i + j]."""
    pad = (-bits.numel()) % 8
    rows = torch.cat([bits.to(torch.uint8), bits.new_zeros(pad, dtype=torch.uint8)]).view(-1, 8)
    return (rows << torch.arange(8, dtype=torch.uint8, device=bits.device)).sum(1, dtype=torch.uint8)


def _bits(rows: torch.Tensor) -> torch.Tensor:
    """rows (..., B) uint8 → (..., 8B) uint8 of 0/1, little-endian within each byte."""
    shifts = torch.arange(8, dtype=torch.uint8, device=rows.device)
    return ((rows.unsqueeze(-1) >> shifts) & 1).flatten(-2)


def encode(idx: torch.Tensor, vals: torch.Tensor, universe: int) -> torch.Tensor:
    """The message (m,) uint8 of idx (n,) int64 (sorted, distinct, in [0, universe)) and vals (n,) f32."""
    n = idx.numel()
    if n == 0:
        return idx.new_zeros(0, dtype=torch.uint8)
    low = low_bits(n, universe)
    steps = torch.arange(n, device=idx.device)
    lows = ((idx.unsqueeze(1) >> torch.arange(low, device=idx.device)) & 1).reshape(-1)
    high = idx.new_zeros(high_bits(n, universe), dtype=torch.uint8)
    high[(idx >> low) + steps] = 1
    values = _bf16_bits(vals).to(torch.int16).view(torch.uint8)
    return torch.cat([_pack_bits(lows), _pack_bits(high), values])


def decode(buf: torch.Tensor, messages: int, n: int, universe: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(idx (messages·n,) int64, vals (messages·n,) f32) of ``messages`` messages of n pairs each."""
    if n == 0 or messages == 0:
        return buf.new_zeros(0, dtype=torch.int64), buf.new_zeros(0, dtype=torch.float32)
    low = low_bits(n, universe)
    low_b, high_b, _ = sections(n, universe)
    rows = buf.view(messages, -1)
    lows = _bits(rows[:, :low_b])[:, :n * low].reshape(messages, n, low).long()
    low_part = (lows << torch.arange(low, device=buf.device)).sum(-1)
    high = _bits(rows[:, low_b:low_b + high_b])[:, :high_bits(n, universe)]
    positions = high.nonzero()[:, 1].view(messages, n)
    idx = ((positions - torch.arange(n, device=buf.device)) << low) | low_part
    vals = (rows[:, low_b + high_b:].reshape(-1).clone().view(torch.int16).int() << 16).view(torch.float32)
    return idx.reshape(-1), vals.reshape(-1)


def encode_framed(idx: torch.Tensor, vals: torch.Tensor, counts: torch.Tensor,
                  universe: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`.pair_format.encode_framed` in torch: (messages (m,) uint8, bytes of each (P,) int32)."""
    out, sizes, first = [], [], 0
    for n in counts.tolist():
        msg = encode(idx[first:first + n], vals[first:first + n], universe)
        out += [torch.tensor([n], dtype=torch.int64).view(torch.uint8)[:HEADER].to(idx.device), msg]
        sizes.append(HEADER + msg.numel())
        first += n
    return torch.cat(out), torch.tensor(sizes, dtype=torch.int32)


def decode_framed(buf: torch.Tensor, universe: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`.pair_format.decode_framed` in torch: (idx, vals, pairs of each message (P,) int32)."""
    host = buf[:0].cpu()
    idx, vals, counts, at = [], [], [], 0
    while at < buf.numel():
        n = int(buf[at:at + HEADER].cpu().clone().view(torch.int32)[0]) & 0xFFFFFFFF
        size = message_bytes(n, universe)
        i, v = decode(buf[at + HEADER:at + HEADER + size], 1, n, universe)
        idx.append(i)
        vals.append(v)
        counts.append(n)
        at += HEADER + size
    if not counts:
        return host.new_zeros(0, dtype=torch.int64), host.new_zeros(0, dtype=torch.float32), \
            torch.zeros(0, dtype=torch.int32)
    return torch.cat(idx), torch.cat(vals), torch.tensor(counts, dtype=torch.int32)
