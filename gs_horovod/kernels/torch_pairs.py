"""The compact pair format (:mod:`.pair_format`) in torch ops: every pair of every message in
one vectorised pass (bit positions computed for all at once, one scatter, one pack), the same
bytes as the NumPy reference."""

from __future__ import annotations

import torch

from .pair_format import BF16_MAX, HEADER


def _bf16_bits(vals: torch.Tensor) -> torch.Tensor:
    """vals (n,) f32 → (n,) int64 holding the bfloat16 bits the reference writes: finite values
    clamped, rounded to nearest even; every NaN as 0x7FC0 (torch's own cast may keep its sign)."""
    kept = torch.where(torch.isfinite(vals), vals.clamp(-BF16_MAX, BF16_MAX), vals)
    u = kept.view(torch.int32).long() & 0xFFFFFFFF
    half = (u + ((u >> 16) & 1) + 0x7FFF) >> 16
    return torch.where(torch.isnan(vals), 0x7FC0, half)


def rounded(vals: torch.Tensor) -> torch.Tensor:
    """vals (n,) f32 as the values section carries them: clamped, rounded to bfloat16, as f32."""
    return (_bf16_bits(vals) << 16).to(torch.int32).view(torch.float32)


def _layout(counts: torch.Tensor, universe: int, low: int) -> tuple[torch.Tensor, ...]:
    """Per message (M,) int64: the bit where its low, high and value sections start, its high
    section's length in bits, and its bytes."""
    high_len = torch.where(counts > 0, counts + ((universe - 1) >> low) + 1, 0)
    low_b, high_b = (counts * low + 7) // 8, (high_len + 7) // 8
    size = HEADER + low_b + high_b + 2 * counts
    start = torch.cumsum(size, 0) - size
    low_at = 8 * (start + HEADER)
    high_at = low_at + 8 * low_b
    return start, low_at, high_at, high_at + 8 * high_b, high_len, size


def _message_of(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the message of each pair (n,), its place within its message (n,))."""
    message = torch.repeat_interleave(torch.arange(len(counts), device=counts.device), counts)
    first = torch.cumsum(counts, 0) - counts
    return message, torch.arange(len(message), device=counts.device) - first[message]


def encode(idx: torch.Tensor, vals: torch.Tensor, counts: torch.Tensor, universe: int,
           low: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`.pair_format.encode`: (messages (m,) uint8, bytes of each (M,) int32)."""
    device = idx.device
    counts = counts.to(device, torch.int64)
    start, low_at, high_at, val_at, _, size = _layout(counts, universe, low)
    message, place = _message_of(counts)
    bits = torch.zeros(8 * int(size.sum()), dtype=torch.uint8, device=device)
    header = torch.arange(8 * HEADER, device=device)
    bits[(8 * start[:, None] + header).reshape(-1)] = ((counts[:, None] >> header) & 1).reshape(-1).to(torch.uint8)
    if low:
        t = torch.arange(low, device=device)
        bits[(low_at[message][:, None] + place[:, None] * low + t).reshape(-1)] = \
            ((idx[:, None] >> t) & 1).reshape(-1).to(torch.uint8)
    bits[high_at[message] + (idx >> low) + place] = 1
    b = torch.arange(16, device=device)
    bits[(val_at[message][:, None] + 16 * place[:, None] + b).reshape(-1)] = \
        ((_bf16_bits(vals)[:, None] >> b) & 1).reshape(-1).to(torch.uint8)
    weights = (1 << torch.arange(8, device=device)).to(torch.uint8)
    return (bits.view(-1, 8) * weights).sum(1, dtype=torch.uint8), size.int().cpu()


def _counts_of(buf: torch.Tensor, universe: int, low: int) -> torch.Tensor:
    """Each message's pair count, read header by header (on the host: a short loop over messages)."""
    host, counts, at = buf.cpu().numpy(), [], 0
    while at < host.size:
        n = int(host[at:at + HEADER].copy().view("<u4")[0])
        counts.append(n)
        at += HEADER + (n * low + 7) // 8 + ((n + ((universe - 1) >> low) + 1 + 7) // 8 if n else 0) + 2 * n
    return torch.tensor(counts, dtype=torch.int64, device=buf.device)


def decode(buf: torch.Tensor, universe: int, low: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`.pair_format.decode`: (idx (n,) int64, vals (n,) f32, pairs of each message (M,) int32)."""
    device = buf.device
    counts = _counts_of(buf, universe, low)
    if not len(counts):
        return (torch.zeros(0, dtype=torch.int64, device=device), torch.zeros(0, device=device),
                torch.zeros(0, dtype=torch.int32))
    _, low_at, high_at, val_at, high_len, _ = _layout(counts, universe, low)
    message, place = _message_of(counts)
    bits = ((buf[:, None] >> torch.arange(8, dtype=torch.uint8, device=device)) & 1).reshape(-1)
    low_part = torch.zeros(len(message), dtype=torch.int64, device=device)
    if low:
        t = torch.arange(low, device=device)
        low_part = (bits[low_at[message][:, None] + place[:, None] * low + t].long() << t).sum(1)
    # every message's high section, laid end to end: its set bits, in order, are the pairs'
    section, at_in = _message_of(high_len)
    set_bits = torch.nonzero(bits[high_at[section] + at_in]).reshape(-1)
    high = at_in[set_bits] - place
    b = torch.arange(16, device=device)
    value_bits = (bits[val_at[message][:, None] + 16 * place[:, None] + b].long() << b).sum(1)
    vals = (value_bits << 16).to(torch.int32).view(torch.float32)
    return (high << low) | low_part, vals, counts.int().cpu()
