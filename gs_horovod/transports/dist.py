"""torch.distributed as a transport: :class:`DistCollectives` on a process group (gloo or
NCCL), blocking, for the DDP hook."""

from __future__ import annotations

import atexit
import time
from typing import Any, Optional

import numpy as np
import torch
import torch.distributed as dist

from ..kernels.torch_ops import TorchOps
from .collective_cost import Traffic
from .deadline import poll_until
from .protocol import count, half_prescaled

EXIT_GRACE = 0.1
"""Seconds the exit handler of :func:`release_gloo_workers_at_exit` lets go of the GIL for."""

_exit_handler_registered = False


def _release_gil_briefly() -> None:
    time.sleep(EXIT_GRACE)


def release_gloo_workers_at_exit() -> None:
    """Registers (once) an exit handler that lets go of the GIL for :data:`EXIT_GRACE` seconds,
    so that gloo's worker threads drop their last works (which hold Python objects) before the
    interpreter finalizes: a thread that asks for the GIL after that is ended inside a noexcept
    destructor and the rank aborts after its work is done (:mod:`gs_horovod.torchrun`)."""
    global _exit_handler_registered
    if not _exit_handler_registered:
        atexit.register(_release_gil_briefly)
        _exit_handler_registered = True


def comm_device(group: Optional[dist.ProcessGroup]) -> torch.device:
    """Where the group's collectives take tensors: the current GPU under NCCL, else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class DistCollectives:
    """:class:`~gs_horovod.transports.protocol.Collectives` over ``torch.distributed`` on ``group``
    (None: the default group), blocking: ``all_reduce`` (the mean as the sum divided by the
    group's size), ``all_gather`` of exchanged lengths, ``all_to_all_single``, ``broadcast``;
    counted into ``traffic``. ``ops``: the array ops its float16 rule uses (default TorchOps)."""

    allreduce_kind = "allreduce"  # gloo's and NCCL's large allreduces: ring

    def __init__(self, group: Optional[dist.ProcessGroup], ops: Optional[TorchOps] = None) -> None:
        self.group, self.ops = group, TorchOps() if ops is None else ops
        self.rank, self.size, self.averages = dist.get_rank(group), dist.get_world_size(group), True
        self.device = comm_device(group)
        self.traffic = Traffic(self.size)
        if dist.get_backend(group) == "gloo":
            release_gloo_workers_at_exit()

    def allreduce(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """x (n,) f32 → the mean (n,) f32; f16 (the sketch) is scaled by 1/P before the sum, as
        Horovod's prescale does, so the f16 sum cannot overflow where the mean does not."""
        count(self.traffic, "allreduce", x)
        if x.dtype == torch.float16:
            out = half_prescaled(self.ops, x, self.size)
            dist.all_reduce(out, group=self.group)
            return out
        out = x.clone()
        dist.all_reduce(out, group=self.group)
        return out.div_(self.size)

    def allreduce_async(self, x: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """x (n,) f32 → (out (n,) f16, work): once ``work.wait()`` returns, out is the mean of
        the ranks' x in float16 (scaled by 1/P before the sum, as :meth:`allreduce` does)."""
        out = half_prescaled(self.ops, x, self.size)
        count(self.traffic, "allreduce", out)
        return out, dist.all_reduce(out, group=self.group, async_op=True)

    def allreduce_sum(self, x: torch.Tensor, name: str) -> torch.Tensor:
        count(self.traffic, "allreduce", x)
        out = x.clone()
        dist.all_reduce(out, group=self.group)
        return out

    def allreduce_sum_within(self, x: torch.Tensor, name: str, timeout: float) -> Optional[torch.Tensor]:
        """:meth:`allreduce_sum`, or None when not every rank joined within ``timeout`` seconds
        (its work stays pending; polled on this thread, :mod:`~gs_horovod.transports.deadline`)."""
        count(self.traffic, "allreduce", x)
        out = x.clone()
        work = dist.all_reduce(out, group=self.group, async_op=True)

        def result() -> torch.Tensor:
            work.wait()
            return out

        return poll_until(work.is_completed, result, timeout)

    def allgather(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """Every rank's x (n_r,) concatenated in rank order: the lengths by one ``all_gather``,
        then x padded to the longest by another."""
        count(self.traffic, "allgather", x)
        sizes = self._gather_padded(torch.tensor([x.numel()], dtype=torch.int64, device=x.device)).flatten()
        longest = int(sizes.max())
        padded = torch.cat([x, x.new_zeros(longest - x.numel())])
        rows = self._gather_padded(padded)
        return torch.cat([row[:n] for row, n in zip(rows, sizes.tolist())])

    def _gather_padded(self, x: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.stack(parts)

    def alltoall(self, x: torch.Tensor, splits: torch.Tensor, name: str,
                 kind: str = "alltoall") -> tuple[torch.Tensor, torch.Tensor]:
        """``all_to_all_single`` of the counts (int64), then of x with those splits."""
        count(self.traffic, kind, x)
        sent = splits.to(x.device, torch.int64)
        got = torch.empty_like(sent)
        dist.all_to_all_single(got, sent, group=self.group)
        out = x.new_empty(int(got.sum()))
        dist.all_to_all_single(out, x.contiguous(), got.tolist(), sent.tolist(), group=self.group)
        return out, got.int()

    def broadcast(self, x: torch.Tensor, name: str) -> torch.Tensor:
        count(self.traffic, "broadcast", x)
        out = x.clone()
        dist.broadcast(out, dist.get_global_rank(self.group, 0) if self.group is not None else 0, group=self.group)
        return out

    def same_on_every_rank(self, value: int, name: str) -> bool:
        """One all_reduce MIN of (v, −v): equal everywhere iff min v = max v."""
        both = torch.tensor([value, -value], dtype=torch.int64, device=self.device)
        dist.all_reduce(both, op=dist.ReduceOp.MIN, group=self.group)
        return int(both[0]) == -int(both[1])

    def from_host(self, x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x).to(self.device)

    def to_host(self, x: torch.Tensor) -> np.ndarray:
        return x.cpu().numpy()
