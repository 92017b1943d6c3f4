"""gs-SGD's engine and the dense mean as reducers (``reduce(named, comm)`` → updates) for
:class:`gs_bench.baselines.ReducerOptimizer` on simulated ranks, beside the baselines."""

from __future__ import annotations

from typing import Any

import torch

from gs_horovod.engine.config import GsConfig
from gs_horovod.engine.state import CommStats, EngineState
from gs_horovod.engine.step import GsSgd
from gs_horovod.kernels.torch_ops import TorchOps
from gs_horovod.transports.simulated import SimulatedComm


class EngineReducer:
    """One :class:`~gs_horovod.engine.state.EngineState` on ``comm`` with GsSketch's ``options``;
    ``ratio="auto"`` measures on the rank's modelled clock (:meth:`SimulatedComm.clock`)."""

    def __init__(self, comm: SimulatedComm, **options: Any) -> None:
        config = GsConfig.from_options(options)
        self.state = EngineState(GsSgd(config, TorchOps(config.backend), comm), CommStats(), clock=comm.clock)

    def reduce(self, named: list[tuple[str, torch.Tensor]], comm: SimulatedComm) -> list[torch.Tensor]:
        out = self.state.step({n: g.detach().reshape(-1).float() for n, g in named})
        comm.traffic.end_step()
        return [out[n].view_as(g).to(g.dtype) for n, g in named]


class MeanReducer:
    """The exact mean of every gradient, one allreduce (dense data parallelism)."""

    def reduce(self, named: list[tuple[str, torch.Tensor]], comm: SimulatedComm) -> list[torch.Tensor]:
        mean = comm.allreduce(torch.cat([g.detach().reshape(-1).float() for _, g in named]), "dense")
        comm.traffic.end_step()
        return [m.view_as(g).to(g.dtype) for m, (_, g) in zip(torch.split(mean, [g.numel() for _, g in named]), named)]
