"""The compact pair formats (:mod:`.pair_format`) in torch ops: every pair of every message in
one vectorised pass (bit positions computed for all at once, one scatter, one pack; the values
sections written byte by byte), the same bytes as the NumPy reference."""

from __future__ import annotations

import torch

from .pair_format import (
    BF16_MAX,
    E4M3,
    E4M3_CLAMP,
    E4M3_MIN_SCALE,
    HEADER,
    SCALE_BYTES,
    check_scales,
    check_wire,
    value_bytes,
)


def _bf16_bits(vals: torch.Tensor) -> torch.Tensor:
    """vals (n,) f32 → (n,) int64 holding the bfloat16 bits the reference writes: finite values
    clamped, rounded to nearest even; every NaN as 0x7FC0 (torch's own cast may keep its sign)."""
    kept = torch.where(torch.isfinite(vals), vals.clamp(-BF16_MAX, BF16_MAX), vals)
    u = kept.view(torch.int32).long() & 0xFFFFFFFF
    half = (u + ((u >> 16) & 1) + 0x7FFF) >> 16
    return torch.where(torch.isnan(vals), 0x7FC0, half)


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """2^e as float32, exactly, for integer e (int64) in [−126, 127]."""
    return ((e + 127) << 23).to(torch.int32).view(torch.float32)


def _finite_abs(vals: torch.Tensor) -> torch.Tensor:
    """|vals| (n,) f32 clamped to E4M3_CLAMP; 0 where not finite."""
    return torch.where(torch.isfinite(vals), vals.abs().clamp_max(E4M3_CLAMP), 0.0)


def _largest(vals: torch.Tensor, message: torch.Tensor, messages: int) -> torch.Tensor:
    """(messages,) f32: the largest finite |v| (clamped) of each message (0 for none)."""
    return torch.zeros(messages, device=vals.device).scatter_reduce_(0, message, _finite_abs(vals), "amax")


def _scale_exponents(largest: torch.Tensor) -> torch.Tensor:
    """:func:`.pair_format.scale_exponents`: (M,) int64."""
    f, E = torch.frexp(largest)
    e = torch.where(f <= 0.875, E - 9, E - 8).long().clamp_min(E4M3_MIN_SCALE)
    return torch.where(largest > 0, e, 0)


def _e4m3_codes(vals: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """:func:`.pair_format.e4m3_codes`: (n,) int64 bytes of vals (n,) f32 at exponents e (n,) int64."""
    a = _finite_abs(vals) * _pow2(-e)
    u = a.view(torch.int32).long()
    normal = ((u + ((u >> 20) & 1) + 0x7FFFF) >> 20) - (120 << 3)
    q = torch.where(a < 2.0**-6, torch.round(a * 512).long(), normal)  # round: half to even
    code = torch.where(torch.signbit(vals) & (q > 0), q | 0x80, q)
    code = torch.where(torch.isposinf(vals), 0x7F, torch.where(torch.isneginf(vals), 0xFF, code))
    return torch.where(torch.isnan(vals), 0x80, code)


def _e4m3_values(codes: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """(n,) f32 that ``"compact8"`` bytes codes (n,) int64 stand for at exponents e (n,) int64."""
    return torch.from_numpy(E4M3).to(codes.device)[codes] * _pow2(e)


def rounded(vals: torch.Tensor, wire: str = "compact") -> torch.Tensor:
    """vals (n,) f32 as the values section of one message carries them, as f32 (bfloat16; or
    E4M3 at the scale of their largest finite |v|)."""
    check_wire(wire)
    if wire == "compact":
        return (_bf16_bits(vals) << 16).to(torch.int32).view(torch.float32)
    e = _scale_exponents(_largest(vals, torch.zeros_like(vals, dtype=torch.int64), 1)).expand(vals.shape)
    return _e4m3_values(_e4m3_codes(vals, e), e)


def _layout(counts: torch.Tensor, universe: int, low: int, wire: str) -> tuple[torch.Tensor, ...]:
    """Per message (M,) int64: the byte where it starts, the bits where its low and high sections
    start, the byte where its values start, its high section's length in bits, and its bytes."""
    high_len = torch.where(counts > 0, counts + ((universe - 1) >> low) + 1, 0)
    low_b, high_b = (counts * low + 7) // 8, (high_len + 7) // 8
    size = HEADER + low_b + high_b + value_bytes(counts, wire)
    start = torch.cumsum(size, 0) - size
    low_at = 8 * (start + HEADER)
    high_at = low_at + 8 * low_b
    return start, low_at, high_at, start + HEADER + low_b + high_b, high_len, size


def _message_of(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the message of each pair (n,), its place within its message (n,))."""
    message = torch.repeat_interleave(torch.arange(len(counts), device=counts.device), counts)
    first = torch.cumsum(counts, 0) - counts
    return message, torch.arange(len(message), device=counts.device) - first[message]


def _value_places(counts: torch.Tensor, val_at: torch.Tensor, wire: str) -> torch.Tensor:
    """The byte of every values section's bytes, message after message."""
    section, at_in = _message_of(value_bytes(counts, wire))
    return val_at[section] + at_in


def encode(idx: torch.Tensor, vals: torch.Tensor, counts: torch.Tensor, universe: int,
           low: int, wire: str = "compact") -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`.pair_format.encode`: (messages (m,) uint8, bytes of each (M,) int32)."""
    check_wire(wire)
    device = idx.device
    counts = counts.to(device, torch.int64)
    start, low_at, high_at, val_at, _, size = _layout(counts, universe, low, wire)
    message, place = _message_of(counts)
    bits = torch.zeros(8 * int(size.sum()), dtype=torch.uint8, device=device)
    header = torch.arange(8 * HEADER, device=device)
    bits[(8 * start[:, None] + header).reshape(-1)] = ((counts[:, None] >> header) & 1).reshape(-1).to(torch.uint8)
    if low:
        t = torch.arange(low, device=device)
        bits[(low_at[message][:, None] + place[:, None] * low + t).reshape(-1)] = \
            ((idx[:, None] >> t) & 1).reshape(-1).to(torch.uint8)
    bits[high_at[message] + (idx >> low) + place] = 1
    weights = (1 << torch.arange(8, device=device)).to(torch.uint8)
    out = (bits.view(-1, 8) * weights).sum(1, dtype=torch.uint8)
    if wire == "compact":
        half = _bf16_bits(vals)
        values = torch.stack([half & 0xFF, half >> 8], 1).reshape(-1)
    else:
        e = _scale_exponents(_largest(vals, message, len(counts)))
        scale = e & 0xFFFF
        values = torch.zeros(int(value_bytes(counts, wire).sum()), dtype=torch.int64, device=device)
        first = torch.cumsum(counts + SCALE_BYTES, 0) - counts - SCALE_BYTES
        values[first], values[first + 1] = scale & 0xFF, scale >> 8
        values[first[message] + SCALE_BYTES + place] = _e4m3_codes(vals, e[message])
    out[_value_places(counts, val_at, wire)] = values.to(torch.uint8)
    return out, size.int().cpu()


def _counts_of(buf: torch.Tensor, universe: int, low: int, wire: str) -> torch.Tensor:
    """Each message's pair count, read header by header (on the host: a short loop over messages)."""
    host, counts, at = buf.cpu().numpy(), [], 0
    while at < host.size:
        n = int(host[at:at + HEADER].copy().view("<u4")[0])
        counts.append(n)
        at += HEADER + (n * low + 7) // 8 + ((n + ((universe - 1) >> low) + 1 + 7) // 8 if n else 0) + \
            value_bytes(n, wire)
    return torch.tensor(counts, dtype=torch.int64, device=buf.device)


def decode(buf: torch.Tensor, universe: int, low: int,
           wire: str = "compact") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`.pair_format.decode`: (idx (n,) int64, vals (n,) f32, pairs of each message (M,) int32)."""
    check_wire(wire)
    device = buf.device
    counts = _counts_of(buf, universe, low, wire)
    if not len(counts):
        return (torch.zeros(0, dtype=torch.int64, device=device), torch.zeros(0, device=device),
                torch.zeros(0, dtype=torch.int32))
    _, low_at, high_at, val_at, high_len, _ = _layout(counts, universe, low, wire)
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
    if wire == "compact":
        at = val_at[message] + 2 * place
        vals = ((buf[at].long() | (buf[at + 1].long() << 8)) << 16).to(torch.int32).view(torch.float32)
    else:
        e = (buf[val_at].long() | (buf[val_at + 1].long() << 8)).to(torch.int16).long()
        check_scales(e.cpu().numpy())
        vals = _e4m3_values(buf[val_at[message] + SCALE_BYTES + place].long(), e[message])
    return (high << low) | low_part, vals, counts.int().cpu()
