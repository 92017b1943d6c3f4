"""The DDP side of the method registry (:mod:`.methods`): :func:`register_hook` registers a
method's communication hook and returns its :class:`~gs_horovod.bench.methods.Meter` (ring
allreduce for all of them); torch's PowerSGD hook, counted as it issues its allreduces:

- ``gs``: :func:`gs_horovod.ddp.gs_hook` (options: :class:`~gs_horovod.gs_sgd.GsConfig`'s);
- ``powersgd``: torch's ``powerSGD_hook`` (options: ``PowerSGDState``'s, ``rank`` standing for
  ``matrix_approximation_rank``; ``start_powerSGD_iter`` defaults to 2, the least torch
  allows with error feedback): per bucket one allreduce of the uncompressed tensors, one of
  the P factors and one of the Q factors, counted as the hook issues them;
- ``fp16``: torch's ``fp16_compress_hook``; ``none``: DDP's built-in allreduce.

(No ``from __future__ import annotations``: DDP checks a hook's annotations as objects.)
"""

from typing import Any, Optional

import torch
import torch.distributed as dist

from ..wire import Collective, Traffic
from .methods import METHODS, Meter, method

DDP_METHODS = tuple(name for name, m in METHODS.items() if m.under_ddp)


def register_hook(name: str, ddp_model: Any, module: torch.nn.Module, ratio: Optional[float] = None,
                  **options: Any) -> Meter:
    """Registers method ``name``'s communication hook on ``ddp_model`` (which wraps ``module``)
    and returns the meter of its bytes. ``ratio``: gs only (None: GsSketch's default)."""
    m = method(name)
    if not m.under_ddp:
        raise ValueError(f"method must be one of {DDP_METHODS} under DDP, got {name!r}")
    m.check(ratio, options)
    return m.ddp(ddp_model, module, ratio, options)


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
