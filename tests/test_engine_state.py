"""EngineState's restore and roll-back on one simulated rank: a partial restore keeps the
tensors it does not name, and a roll-back replaces everything, step count included."""

from __future__ import annotations

import torch

from gs_horovod.engine import CommStats, GsConfig
from gs_horovod.engine.state import EngineState
from gs_horovod.engine.step import GsSgd
from gs_horovod.kernels.torch_ops import TorchOps
from gs_horovod.transports.simulated import SimulatedRanks

SIZES = {"a": 300, "b": 500}


def trained_state(steps: int) -> EngineState:
    comm = SimulatedRanks(1).comms[0]
    state = EngineState(GsSgd(GsConfig(ratio=0.05, min_size=1, momentum=0.5), TorchOps(), comm), CommStats())
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        state.step({n: torch.randn(d, generator=g) for n, d in SIZES.items()})
    return state


def test_a_partial_restore_keeps_the_other_tensors():
    state = trained_state(3)
    before = state.tensors()
    saved_a = {"residual": torch.full((300,), 2.0), "momentum": torch.full((300,), 3.0), "steps": 3}
    state.restore({"a": saved_a})
    after = state.tensors()
    assert torch.equal(after["a"]["residual"], saved_a["residual"])
    assert torch.equal(after["a"]["momentum"], saved_a["momentum"])
    assert torch.equal(after["b"]["residual"], before["b"]["residual"])  # not named: kept
    assert torch.equal(after["b"]["momentum"], before["b"]["momentum"])
    assert before["b"]["residual"].abs().sum() > 0


def test_a_roll_back_replaces_every_tensor_and_the_steps():
    state = trained_state(2)
    committed = state.tensors()
    g = torch.Generator().manual_seed(1)
    state.step({n: torch.randn(d, generator=g) for n, d in SIZES.items()})
    assert state.steps == 3
    state.roll_back({"a": committed["a"]})
    assert state.steps == 0  # until laid out: the saved tensors' steps come back with them
    rolled = state.tensors()
    assert torch.equal(rolled["a"]["residual"], committed["a"]["residual"]) and "b" not in rolled
    state.step({n: torch.zeros(d) for n, d in SIZES.items()})
    assert state.steps == 3  # the committed 2, then this one
    state.roll_back({})
    assert state.tensors() == {} and state.steps == 0
