"""HSDP training with FSDP2: shard within a group of ranks, replicate across groups, the
cross-replica reduction by gs-SGD or dense; the demo's CNN on real MNIST digits, or the LSTM
language model on the standard library's sources.

    torchrun --standalone --nproc_per_node 4 scripts/bench/train_fsdp.py --compression gs
    torchrun --standalone --nproc_per_node 4 scripts/bench/train_fsdp.py --compression none
    torchrun --standalone --nproc_per_node 4 scripts/bench/train_fsdp.py --model lm --hidden 512 --compression gs

The job's ranks form an R × S mesh (``--replicas R``, S = ranks / R): ``fully_shard`` on each
module that holds parameters itself (the CNN's conv and linear layers; the LM's embedding, LSTM
and decoder) and the root over the S ranks of a row. ``--compression gs``: FSDP on the 1-D
shard mesh, ``gs_horovod.fsdp.GsFsdpState`` across the R replicas of each shard (GsSketch's
options as ``--ratio``, ``--gs NAME=VALUE``, ...; those not given keep GsSketch's defaults).
``--compression none``: plain HSDP, FSDP on the 2-D mesh, its own dense all-reduce.

The training is ``train_torch.py``'s (``--model cnn``, the default: MNIST-5k, 4,000 training
images split across all R·S ranks, each rank its own batch; ``gs_bench.workloads.MnistCNN``,
824,458 parameters; its flags) or ``train_lm.py``'s (``--model lm``: each rank its own shard of
the training bytes and its own windows; ``gs_bench.workloads.LstmLM``; its flags), run on
:class:`FsdpRanks`. Every epoch (interval) reports the mean loss and the held-out accuracy
(perplexity); at the end, the bytes a rank handed to the cross-replica collectives per step
against its shard's, counted as they receive them (gs: the ``DistCollectives``' traffic of
the replicate group, the engine's payload beside it; none: each FSDP module's reduce output
as its all-reduce hook receives it after FSDP's all-reduce), and on the wire (ring all-reduce
among R).

The benchmark harness's entry point (it imports gs_bench); the example to copy:
``scripts/examples/train_fsdp.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from gs_bench.cli import TorchRanks, check_lm_budget, demo_arguments, lm_arguments, local_bytes, method_options
from gs_bench.methods import Meter
from gs_horovod.fsdp import GsFsdpState, register_fsdp_hooks
from gs_horovod.transports.collective_cost import Traffic

sys.path.insert(0, str(Path(__file__).resolve().parent))

import train_lm  # noqa: E402
import train_torch  # noqa: E402

COMPRESSIONS = ["gs", "none"]
TRAIN: dict[str, Callable[[argparse.Namespace, Any], dict]] = {"cnn": train_torch.train, "lm": train_lm.train}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags of ``--model``'s example (train_torch.py's for cnn, train_lm.py's for lm), its
    GsSketch flags, ``--replicas``."""
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--model", choices=sorted(TRAIN), default="cnn")
    model = first.parse_known_args(argv)[0].model
    p = demo_arguments(__doc__, COMPRESSIONS) if model == "cnn" else lm_arguments(__doc__, COMPRESSIONS)
    p.add_argument("--model", choices=sorted(TRAIN), default="cnn",
                   help="cnn: MNIST-5k CNN, train_torch.py's flags (default); lm: stdlib-source LSTM, train_lm.py's")
    p.add_argument("--replicas", type=int, default=2, help="R: the mesh's replicas; S = ranks / R shard each")
    args = p.parse_args(argv)
    if model == "lm":
        return check_lm_budget(p, args)
    if args.epochs is None:
        args.epochs = train_torch.EPOCHS["cnn"]
    return args


def shard(model: torch.nn.Module, mesh: Any) -> torch.nn.Module:
    """fully_shard on each module that holds parameters itself, then the root, over ``mesh``."""
    for module in list(model.modules())[1:]:
        if any(True for _ in module.parameters(recurse=False)):
            fully_shard(module, mesh=mesh)
    return fully_shard(model, mesh=mesh)


class NativeAllReduceCount:
    """Counts plain HSDP's own cross-replica all-reduce: each FSDP module's reduce output, as its
    all-reduce hook receives it once FSDP's all-reduce is done; ``traffic`` as a transport's, a
    step ending when every module's has come."""

    def __init__(self, model: torch.nn.Module, replicas: int) -> None:
        self.traffic = Traffic(replicas)
        self.modules = self.received_now = 0
        for module in model.modules():
            if isinstance(module, FSDPModule) and any(True for _ in module.parameters(recurse=False)):
                module.set_all_reduce_hook(self.received)
                self.modules += 1

    def received(self, reduce_output: torch.Tensor) -> None:
        self.traffic.add("allreduce", reduce_output.numel() * reduce_output.element_size())
        self.received_now += 1
        if self.received_now == self.modules:
            self.traffic.end_step()
            self.received_now = 0


class FsdpRanks(TorchRanks):
    """The ranks of a ``torchrun`` job (gloo) as an R × S mesh, with :class:`gs_bench.cli.TorchRanks`'
    calls: ``distribute`` shards the model for ``--compression`` instead of DDP."""

    def __init__(self, replicas: int) -> None:
        super().__init__()
        if replicas < 1 or self.size % replicas:
            raise SystemExit(f"--replicas must divide the {self.size} ranks, got {replicas}")
        self.replicas, self.shards = replicas, self.size // replicas
        self.model: torch.nn.Module | None = None
        self.state: GsFsdpState | None = None

    def distribute(self, args: argparse.Namespace, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                   optimizer_state: bool = True) -> tuple[torch.nn.Module, torch.optim.Optimizer, Meter]:
        """(the sharded model, ``optimizer`` built anew over its sharded parameters, the meter of
        the cross-replica traffic); every rank starts from the same weights (the same seed), so
        no state is sent."""
        if optimizer.state:
            raise ValueError("FsdpRanks.distribute rebuilds the optimizer over the shards: give it one not yet stepped")
        mesh = init_device_mesh("cpu", (self.replicas, self.shards), mesh_dim_names=("replicate", "shard"))
        ratio, options = method_options(args)
        self.model = model
        if args.compression == "none":
            traffic = NativeAllReduceCount(shard(model, mesh), self.replicas).traffic
        else:
            shard(model, mesh["shard"])
            self.state = GsFsdpState(mesh.get_group("replicate"), model=model,
                                     **({} if ratio is None else {"ratio": ratio}), **options)
            register_fsdp_hooks(model, self.state)
            traffic = self.state.comm.traffic
        return model, type(optimizer)(model.parameters(), **optimizer.defaults), Meter.of_traffic(traffic)

    def summary(self) -> str:
        """The closing lines: the mesh and this rank's shard; gs: the engine's payload and exchange."""
        line = (f"  mesh                {self.replicas} replicas × {self.shards} shards; dense = this rank's shard, "
                f"{local_bytes(self.model):,} bytes")
        if self.state is None:
            return line
        stats = self.state.stats
        return (f"{line}\n  engine payload      {stats.total_bytes / max(1, stats.steps):,.0f} bytes/step (CommStats); "
                f"exchange {self.state.engine.plan.exchange!r} among {self.replicas} replicas")


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    ranks = FsdpRanks(args.replicas)
    try:
        result = TRAIN[args.model](args, ranks)
        if ranks.rank == 0:
            print(ranks.summary(), flush=True)
        return result
    finally:
        ranks.close()


if __name__ == "__main__":
    main()
