"""What a wire format for (index, value) pairs is (:class:`PairCodec`), and the shape most take:
self-delimiting byte messages with a NumPy reference (:class:`MessageCodec`).

The exchanges that send pairs see only :class:`PairCodec`: what rounding does to a value
(:meth:`~PairCodec.rounded`), one allgather or one alltoall of pairs, and the bytes a plan
sends. A message codec implements its kernels once per backend: the NumPy reference (the
spec), Numba (the CPU engine, TensorFlow through ``tf.numpy_function``) and torch (tensors on
any device); the last two default to the reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from ..array_ops import Array, ArrayOps
from ..transports.protocol import Collectives

if TYPE_CHECKING:
    import torch


class PairCodec:
    """One wire format for (index, value) pairs.

    ``name``: the ``wire=`` option; ``lossless``: values travel as they are (no rounding, so
    nothing for a residual to keep); ``max_coordinates``: a step's vector must be shorter
    (None: any int64 length); ``one_scale``: a message scales all its values by one factor (so a group far quieter
    than another in the same message may flush to zero: not for ``scope="layer"``)."""

    name: str
    lossless: bool = False
    max_coordinates: Optional[int] = None
    one_scale: bool = False

    def holds(self, universe: int) -> bool:
        """Whether it can send indices of a vector of ``universe`` coordinates."""
        return self.max_coordinates is None or universe < self.max_coordinates

    def planned_bytes(self, pairs: int, messages: int, universe: int) -> int:
        """Bytes of ``pairs`` pairs with indices in [0, universe), spread evenly over ``messages``
        messages (each laid out for ⌈pairs / messages⌉ pairs)."""
        raise NotImplementedError

    def rounded(self, ops: ArrayOps, vals: Array) -> Array:
        """vals (n,) f32 as one message carries them, as f32 (vals itself when lossless)."""
        raise NotImplementedError

    def allgather(self, ops: ArrayOps, comm: Collectives, idx: Array, vals: Array, universe: int, expected: int,
                  name: str) -> tuple[Array, Array, Any]:
        """Every rank's pairs idx (n,) int64 ascending in [0, universe) / vals (n,) f32 as one
        message each, laid out for ``expected`` pairs; returns (idx, vals) of every rank in rank
        order and the bytes this rank handed over."""
        raise NotImplementedError

    def alltoall(self, ops: ArrayOps, comm: Collectives, idx: Array, vals: Array, counts: Array, universe: int,
                 expected: int, name: str) -> tuple[Array, Array, Array, Any]:
        """Runs of counts (P,) int32 pairs of idx (n,) int64 (each run ascending) / vals (n,)
        f32, run r to rank r as one message laid out for ``expected`` pairs; returns (idx,
        vals) received in rank order, the pairs from each rank (P,) int32, and the bytes this
        rank handed over."""
        raise NotImplementedError


class MessageCodec(PairCodec):
    """A format of self-delimiting messages of bytes: each holds its own pair count, so messages
    laid end to end decode without their sizes. ``low``: the layout parameter every rank derives
    from the plan (:meth:`layout`), passed to every kernel (ignored by formats without one)."""

    def layout(self, expected: int, universe: int) -> int:
        """The layout parameter of messages expected to hold ``expected`` pairs (none: 0)."""
        return 0

    def message_bytes(self, n: int, universe: int, low: int) -> int:
        """Bytes of a message of n pairs with indices in [0, universe)."""
        raise NotImplementedError

    def planned_bytes(self, pairs: int, messages: int, universe: int) -> int:
        share = -(-pairs // messages)
        return messages * self.message_bytes(share, universe, self.layout(share, universe))

    # the NumPy reference: the spec
    def rounded_numpy(self, vals: np.ndarray) -> np.ndarray:
        """(n,) f32: vals (n,) f32 as the values of one message carry them."""
        raise NotImplementedError

    def encode(self, idx: np.ndarray, vals: np.ndarray, counts: np.ndarray, universe: int,
               low: int) -> tuple[np.ndarray, np.ndarray]:
        """Consecutive runs of counts (M,) pairs of idx (n,) int64 (each run ascending, distinct,
        in [0, universe)) / vals (n,) f32, each run a message: (the messages laid end to end (m,)
        uint8, the bytes of each (M,) int32)."""
        raise NotImplementedError

    def decode(self, buf: np.ndarray, universe: int, low: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(idx (n,) int64, vals (n,) f32, the pairs of each message (M,) int32) of messages laid
        end to end in buf (m,) uint8. Raises ValueError for bytes no encoder writes."""
        raise NotImplementedError

    # Numba: the CPU engine's and TensorFlow's (NumPy arrays in and out, the reference's bytes)
    def rounded_numba(self, vals: np.ndarray) -> np.ndarray:
        """:meth:`rounded_numpy`."""
        return self.rounded_numpy(vals)

    def encode_numba(self, idx: np.ndarray, vals: np.ndarray, counts: np.ndarray, universe: int,
                     low: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`encode`."""
        return self.encode(idx, vals, counts, universe, low)

    def decode_numba(self, buf: np.ndarray, universe: int, low: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`decode`."""
        return self.decode(buf, universe, low)

    # torch: tensors on any device (the reference's bytes; by default through the host)
    def rounded_torch(self, vals: torch.Tensor) -> torch.Tensor:
        """:meth:`rounded_numpy` of a tensor, on its device."""
        import torch

        return torch.from_numpy(self.rounded_numba(vals.detach().cpu().numpy())).to(vals.device)

    def encode_torch(self, idx: torch.Tensor, vals: torch.Tensor, counts: torch.Tensor, universe: int,
                     low: int) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`encode`: (messages (m,) uint8 on idx's device, bytes of each (M,) int32 on the host)."""
        import torch

        buf, sizes = self.encode_numba(idx.cpu().numpy(), vals.detach().cpu().numpy(), counts.cpu().numpy(),
                                       universe, low)
        return torch.from_numpy(buf).to(idx.device), torch.from_numpy(sizes)

    def decode_torch(self, buf: torch.Tensor, universe: int,
                     low: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`decode`: (idx, vals on buf's device, pairs of each message (M,) int32 on the host)."""
        import torch

        idx, vals, counts = self.decode_numba(buf.cpu().numpy(), universe, low)
        return torch.from_numpy(idx).to(buf.device), torch.from_numpy(vals).to(buf.device), torch.from_numpy(counts)

    # what the exchanges call: the framework's ops pick the backend
    def rounded(self, ops: ArrayOps, vals: Array) -> Array:
        return ops.wire_rounded(vals, self)

    def allgather(self, ops: ArrayOps, comm: Collectives, idx: Array, vals: Array, universe: int, expected: int,
                  name: str) -> tuple[Array, Array, Any]:
        low = self.layout(expected, universe)
        message, _ = ops.pack_pairs(idx, vals, ops.count(idx * 0, 1), universe, low, self)  # one message
        got_idx, got_vals, _ = ops.unpack_pairs(comm.allgather(message, name), comm.size, universe, low, self)
        return got_idx, got_vals, ops.size_of(message)

    def alltoall(self, ops: ArrayOps, comm: Collectives, idx: Array, vals: Array, counts: Array, universe: int,
                 expected: int, name: str) -> tuple[Array, Array, Array, Any]:
        low = self.layout(expected, universe)
        message, splits = ops.pack_pairs(idx, vals, counts, universe, low, self)
        received, _ = comm.alltoall(message, splits, name)
        got_idx, got_vals, got_counts = ops.unpack_pairs(received, comm.size, universe, low, self)
        return got_idx, got_vals, got_counts, ops.size_of(message)
