"""torch's PowerSGD DDP hook, counted as it issues its allreduces (the ``powersgd`` method of
:mod:`.methods` under DDP): options are ``PowerSGDState``'s, ``rank`` standing for
``matrix_approximation_rank``; ``start_powerSGD_iter`` defaults to 2, the least torch allows
with error feedback; per bucket one allreduce of the uncompressed tensors, one of the P
factors and one of the Q factors.

(No ``from __future__ import annotations``: DDP checks a hook's annotations as objects.)
"""

from typing import Any

import torch
import torch.distributed as dist

from gs_horovod.transports.collective_cost import Collective, Traffic


def register_powersgd_hook(ddp_model: Any, **options: Any) -> Traffic:
    """Registers torch's ``powerSGD_hook`` on ``ddp_model`` with ``PowerSGDState`` options
    (``rank``: ``matrix_approximation_rank``); returns the Traffic its allreduces are counted in."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    rename = {"matrix_approximation_rank": options.pop("rank")} if "rank" in options else {}
    state = powerSGD_hook.PowerSGDState(None, **{"start_powerSGD_iter": 2, **options, **rename})
    traffic = Traffic(dist.get_world_size())
    previous: list[torch.futures.Future] = []

    def counted(state: powerSGD_hook.PowerSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        if previous:  # gloo: one bucket's chain of allreduces at a time (see powersgd_collectives)
            previous.pop().wait()
        for collective in powersgd_collectives(state, bucket):
            traffic.add(*collective)
        future = powerSGD_hook.powerSGD_hook(state, bucket)
        if bucket.is_last():
            traffic.end_step()
        else:
            previous.append(future)
        return future

    ddp_model.register_comm_hook(state, counted)
    return traffic


def powersgd_collectives(state: Any, bucket: Any) -> list[Collective]:
    """The allreduces ``powerSGD_hook`` issues for ``bucket`` (payload bytes per rank): the whole
    buffer before ``start_powerSGD_iter``; then the uncompressed tensors, P (n×r) and Q (m×r)
    of the compressed ones (an n×m gradient is compressed when (n + m)·r·min_compression_rate
    < n·m, r = min(n, m, rank)), as torch's hook decides.

    torch's hook issues a bucket's P and Q allreduces from callbacks of the previous allreduce;
    with two buckets in flight over gloo, ranks interleaved the two chains differently and gloo
    aborted ("Received data size doesn't match expected size", torch 2.13, 2 ranks, the MNIST
    CNN in 2 buckets). :func:`register_powersgd_hook` therefore waits for a bucket's future before it
    runs the next bucket's hook."""
    buffer = bucket.buffer()
    itemsize = buffer.element_size()
    if state.iter < state.start_powerSGD_iter:
        return [("allreduce", float(buffer.numel() * itemsize))]
    dense = ps = qs = 0
    for grad in bucket.gradients():
        n = grad.shape[0]
        m = grad.numel() // n
        r = min(n, m, state.matrix_approximation_rank)
        if (n + m) * r * state.min_compression_rate < n * m:
            ps, qs = ps + n * r, qs + m * r
        else:
            dense += grad.numel()
    return [("allreduce", float(count * itemsize)) for count in (dense, ps, qs)]
