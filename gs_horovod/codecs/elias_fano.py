"""The index layout of the compact wire formats (:class:`EliasFano`), on every backend; each
format subclasses it with its values section (:mod:`.compact`, :mod:`.compact8`).

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
4. values: the format's (:meth:`EliasFano.value_bytes` of n).

With l = ⌊log2(U / n)⌋ an index costs 2 to 3 + l bits. The NumPy reference writes each message
in turn; Numba writes every message in one serial pass (a message of k pairs is a few tens of
kB, too small to be worth a thread pool); torch computes every bit position at once (one
scatter, one pack), on any device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from numba import njit

from .base import MessageCodec

if TYPE_CHECKING:
    import torch

HEADER = 4
"""Bytes of a message's header: its pair count, uint32 little-endian."""
WIDEST_LOW = 56
"""The most low bits an index may have here (they stream through a 64-bit accumulator: l ≤ 56
keeps its top bit clear); wider ones, from universes of 2^56 and more, run the NumPy reference."""

_SET_BITS = np.array([bin(b).count("1") for b in range(256)], np.int64)
"""How many bits of each byte value are set."""
_SET_AT = np.array([[j for j in range(8) if b >> j & 1] + [0] * (8 - bin(b).count("1")) for b in range(256)],
                   np.int64)
"""Where they are, lowest first (row b, the first ``_SET_BITS[b]`` entries)."""



def low_bits(n: int, universe: int) -> int:
    """l for messages expected to hold n indices in [0, universe): ⌊log2(universe / n)⌋ (0 when n ≥ universe)."""
    return max(0, (int(universe) // int(n)).bit_length() - 1) if n else 0


def high_bits(n: int, universe: int, low: int) -> int:
    """Bits of the high-bits section of a message of n indices (0 for an empty message)."""
    return int(n) + ((int(universe) - 1) >> low) + 1 if n else 0


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




def _pack(bits: np.ndarray) -> np.ndarray:
    return np.packbits(bits.astype(np.uint8), bitorder="little")


def _unpack(data: np.ndarray, count: int) -> np.ndarray:
    return np.unpackbits(data, bitorder="little")[:count]


def _message_of(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the message of each pair (n,), its place within its message (n,))."""
    import torch

    message = torch.repeat_interleave(torch.arange(len(counts), device=counts.device), counts)
    first = torch.cumsum(counts, 0) - counts
    return message, torch.arange(len(message), device=counts.device) - first[message]


class EliasFano(MessageCodec):
    """Elias–Fano indices; a subclass writes the values section: :meth:`value_bytes` (of the
    form a + b·n), its NumPy reference (:meth:`encode_values`, :meth:`decode_values`,
    :meth:`rounded_numpy`) and, where it has them, its Numba and torch kernels."""

    def layout(self, expected: int, universe: int) -> int:
        return low_bits(expected, universe)

    def value_bytes(self, n: Any) -> Any:
        """Bytes of the values section of a message of n pairs (an int, or an array of counts)."""
        raise NotImplementedError

    def encode_values(self, vals: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """The values sections (uint8, :meth:`value_bytes` of each run) of consecutive runs of
        counts (M,) values of vals (n,) f32, laid end to end."""
        raise NotImplementedError

    def decode_values(self, data: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """(n,) f32: the values of values sections of runs of counts (M,) pairs laid end to end
        in data (uint8). Raises ValueError for bytes no encoder writes."""
        raise NotImplementedError

    def encode_values_numba(self, vals: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """:meth:`encode_values`."""
        return self.encode_values(vals, counts)

    def decode_values_numba(self, data: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """:meth:`decode_values`."""
        return self.decode_values(data, counts)

    def encode_values_torch(self, vals: torch.Tensor, counts: torch.Tensor, message: torch.Tensor,
                            place: torch.Tensor) -> torch.Tensor:
        """:meth:`encode_values` on vals' device, as int64 bytes; ``message`` / ``place``: each
        pair's message (n,) and its place in it (n,)."""
        import torch

        return torch.from_numpy(self.encode_values_numba(vals.detach().cpu().numpy(), counts.cpu().numpy())).to(
            vals.device, torch.int64)

    def decode_values_torch(self, data: torch.Tensor, counts: torch.Tensor, message: torch.Tensor,
                            place: torch.Tensor) -> torch.Tensor:
        """:meth:`decode_values` of data (uint8) on its device; ``message`` / ``place`` as for
        :meth:`encode_values_torch`."""
        import torch

        return torch.from_numpy(self.decode_values_numba(data.cpu().numpy(), counts.cpu().numpy())).to(data.device)

    def sections(self, n: int, universe: int, low: int) -> tuple[int, int, int, int]:
        """Bytes of the (header, low bits, high bits, values) sections of a message of n pairs."""
        return HEADER, -(-int(n) * low // 8), -(-high_bits(n, universe, low) // 8), self.value_bytes(int(n))

    def message_bytes(self, n: int, universe: int, low: int) -> int:
        return sum(self.sections(n, universe, low))

    # the NumPy reference
    def encode(self, idx: np.ndarray, vals: np.ndarray, counts: np.ndarray, universe: int,
               low: int) -> tuple[np.ndarray, np.ndarray]:
        idx, vals = np.asarray(idx, np.int64), np.asarray(vals, np.float32)
        out, sizes, first = [], [], 0
        for n in np.asarray(counts).tolist():
            i, v = idx[first:first + n], vals[first:first + n]
            high = np.zeros(high_bits(n, universe, low), np.uint8)
            high[(i >> low) + np.arange(n)] = 1
            lows = _pack(((i[:, None] >> np.arange(low)) & 1).ravel())
            msg = np.concatenate([np.array([n], "<u4").view(np.uint8), lows, _pack(high),
                                  self.encode_values(v, np.array([n]))])
            out.append(msg)
            sizes.append(msg.size)
            first += n
        return (np.concatenate(out) if out else np.zeros(0, np.uint8)), np.array(sizes, np.int32)

    def decode(self, buf: np.ndarray, universe: int, low: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        buf = np.asarray(buf, np.uint8)
        idx, vals, counts, at = [], [], [], 0
        while at < buf.size:
            n = int(buf[at:at + HEADER].copy().view("<u4")[0])
            _, low_b, high_b, val_b = self.sections(n, universe, low)
            lows = _unpack(buf[at + HEADER:at + HEADER + low_b], n * low).reshape(n, low).astype(np.int64)
            start = at + HEADER + low_b
            positions = np.flatnonzero(_unpack(buf[start:start + high_b], high_bits(n, universe, low)))
            idx.append(((positions - np.arange(n)) << low) | (lows << np.arange(low)).sum(1))
            vals.append(self.decode_values(buf[start + high_b:start + high_b + val_b], np.array([n])))
            counts.append(n)
            at = start + high_b + val_b
        if not counts:
            return np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.int32)
        return np.concatenate(idx), np.concatenate(vals), np.array(counts, np.int32)

    # Numba
    def encode_numba(self, idx: np.ndarray, vals: np.ndarray, counts: np.ndarray, universe: int,
                     low: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`encode`. Raises ValueError for pairs the format cannot hold (indices not
        ascending and distinct within a message, or outside [0, universe); counts that do not
        add up to the pairs)."""
        if low > WIDEST_LOW:
            return self.encode(idx, vals, counts, universe, low)
        counts = np.asarray(counts, np.int64)
        idx, vals = np.ascontiguousarray(idx, np.int64), np.ascontiguousarray(vals, np.float32)
        if idx.shape != vals.shape or int(counts.sum()) != idx.size or (counts < 0).any():
            raise ValueError(f"compact pairs: {idx.size} indices and {vals.size} values for messages of "
                             f"{counts.tolist()}")
        sizes = np.array([self.message_bytes(n, universe, low) for n in counts.tolist()], np.int64)
        out = np.zeros(int(sizes.sum()), np.uint8)
        values = self.encode_values_numba(vals, counts)
        if not _write(out, idx, values, counts, np.cumsum(sizes) - sizes, int(universe), int(low)):
            raise ValueError(f"compact pairs: a message's indices are not ascending, distinct and in [0, {universe})")
        return out, sizes.astype(np.int32)

    def decode_numba(self, buf: np.ndarray, universe: int, low: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`decode`. Raises ValueError for bytes that are not messages of this format (one
        running past the buffer, or a high section that disagrees with its count)."""
        buf = np.ascontiguousarray(buf, np.uint8)
        if low > WIDEST_LOW:
            return self.decode(buf, universe, low)
        per_value, scale = self.value_bytes(1) - self.value_bytes(0), self.value_bytes(0)
        counts = _message_counts(buf, int(universe), int(low), per_value, scale)
        if counts.size and counts[-1] < 0:
            raise ValueError(f"compact pairs: a message runs past the end of the {buf.size}-byte buffer")
        total = int(counts.sum())
        idx, values = np.empty(total, np.int64), np.empty(per_value * total + scale * counts.size, np.uint8)
        if not _read(buf, counts, int(universe), int(low), per_value, scale, idx, values):
            raise ValueError("compact pairs: a message's high bits disagree with its pair count")
        return idx, self.decode_values_numba(values, counts), counts.astype(np.int32)

    # torch
    def _layout(self, counts: torch.Tensor, universe: int, low: int) -> tuple[torch.Tensor, ...]:
        """Per message (M,) int64: the byte where it starts, the bits where its low and high
        sections start, the byte where its values start, its high section's length in bits, and
        its bytes."""
        import torch

        high_len = torch.where(counts > 0, counts + ((universe - 1) >> low) + 1, 0)
        low_b, high_b = (counts * low + 7) // 8, (high_len + 7) // 8
        size = HEADER + low_b + high_b + self.value_bytes(counts)
        start = torch.cumsum(size, 0) - size
        low_at = 8 * (start + HEADER)
        high_at = low_at + 8 * low_b
        return start, low_at, high_at, start + HEADER + low_b + high_b, high_len, size

    def _value_places(self, counts: torch.Tensor, val_at: torch.Tensor) -> torch.Tensor:
        """The byte of every values section's bytes, message after message."""
        section, at_in = _message_of(self.value_bytes(counts))
        return val_at[section] + at_in

    def encode_torch(self, idx: torch.Tensor, vals: torch.Tensor, counts: torch.Tensor, universe: int,
                     low: int) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        device = idx.device
        counts = counts.to(device, torch.int64)
        start, low_at, high_at, val_at, _, size = self._layout(counts, universe, low)
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
        out[self._value_places(counts, val_at)] = self.encode_values_torch(vals, counts, message, place).to(torch.uint8)
        return out, size.int().cpu()

    def _counts_of(self, buf: torch.Tensor, universe: int, low: int) -> torch.Tensor:
        """Each message's pair count, read header by header (on the host: a short loop over messages)."""
        import torch

        host, counts, at = buf.cpu().numpy(), [], 0
        while at < host.size:
            n = int(host[at:at + HEADER].copy().view("<u4")[0])
            counts.append(n)
            at += HEADER + (n * low + 7) // 8 + ((n + ((universe - 1) >> low) + 1 + 7) // 8 if n else 0) + \
                self.value_bytes(n)
        return torch.tensor(counts, dtype=torch.int64, device=buf.device)

    def decode_torch(self, buf: torch.Tensor, universe: int,
                     low: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        import torch

        device = buf.device
        counts = self._counts_of(buf, universe, low)
        if not len(counts):
            return (torch.zeros(0, dtype=torch.int64, device=device), torch.zeros(0, device=device),
                    torch.zeros(0, dtype=torch.int32))
        _, low_at, high_at, val_at, high_len, _ = self._layout(counts, universe, low)
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
        vals = self.decode_values_torch(buf[self._value_places(counts, val_at)], counts, message, place)
        return (high << low) | low_part, vals, counts.int().cpu()
