"""Runs under ``horovodrun``: every baseline exchange on real ranks, one JSON per rank.

    horovodrun -np P -H localhost:P --gloo python tests/workers/baselines.py OUT_DIR [NAME ...]

NAME: a variant of :data:`VARIANTS` (``topk`` ... ``powersgd-r4``: its full-ratio run against
Horovod's dense allreduce, then 4 compressed steps; results under ``<variant>_*``) or
``powersgd_against_svd``; none: all of them. E.g. the layer-wise gTop-k alone:

    horovodrun -np 2 -H localhost:2 --gloo python tests/workers/baselines.py /tmp/out gtopk-layer
"""

from __future__ import annotations

import hashlib
import sys

import horovod.torch as hvd
import torch
from rank_result import write_result
from scenario import Scenarios
from torch_scenarios import digest, digits_shard, distributed, flat, mlp, train

from gs_bench.baselines import ReducerOptimizer
from gs_bench.methods import METHODS
from gs_horovod.kernels.torch_ops import TorchOps
from gs_horovod.transports.collective_cost import Traffic, total_wire_bytes
from gs_horovod.transports.horovod import HorovodCollectives

# variant: (method, options); "full" runs use ratio 1 (PowerSGD: a rank as large as the matrices)
VARIANTS = {
    "topk": ("topk", {}), "topk-layer": ("topk", {"scope": "layer"}),
    "gtopk": ("gtopk", {}), "gtopk-layer": ("gtopk", {"scope": "layer"}),
    "sketched": ("sketched", {}), "powersgd-r1": ("powersgd", {"rank": 1}), "powersgd-r4": ("powersgd", {"rank": 4}),
}


def run(variant: str, ratio: float, seed: int, steps: int, x, y, **extra) -> tuple:
    method, options = VARIANTS[variant]
    baseline = METHODS[method]
    exchange = baseline.reducer(ratio if baseline.takes_ratio else None, {**options, **extra})
    comm = HorovodCollectives(hvd, TorchOps(), hvd.Sum, hvd.global_process_set, Traffic(hvd.size()))
    model = mlp(seed)
    opt = ReducerOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), exchange, comm)
    train(model, opt, x, y, steps=steps)
    return model, exchange, comm


SCENARIOS = Scenarios()


class Data:
    """This rank's digits shard and, made on first use, the dense run every variant's full-ratio
    run is compared with (3 steps of Horovod's allreduce)."""

    def __init__(self) -> None:
        self.x, self.y = digits_shard()
        self._dense: torch.Tensor | None = None

    def dense(self) -> torch.Tensor:
        if self._dense is None:
            dense = mlp(0)
            train(dense, distributed(dense, "dense.", hvd.Compression.none), self.x, self.y, steps=3)
            self._dense = flat(dense)
        return self._dense


def variant_scenario(variant: str) -> None:
    """Registers ``variant``'s scenario: ratio 1 against the dense run, then ratio 0.05."""

    def scenario(result: dict, data: Data) -> None:
        method, _ = VARIANTS[variant]
        dense = data.dense()
        full, _, _ = run(variant, 1.0, 0, 3, data.x, data.y, **({"rank": 64} if method == "powersgd" else {}))
        result[f"{variant}_full_max_abs_diff"] = (flat(full) - dense).abs().max().item()
        model, exchange, comm = run(variant, 0.05, 1, 4, data.x, data.y)
        result[f"{variant}_digest"] = digest(model)
        shapes = [tuple(p.shape) for _, p in sorted(model.named_parameters())]
        planned = exchange.planned(shapes, hvd.size())
        result[f"{variant}_collectives"] = comm.traffic.last_step
        result[f"{variant}_planned"] = planned
        result[f"{variant}_wire"] = comm.traffic.per_step()[1]
        result[f"{variant}_planned_wire"] = total_wire_bytes(planned, hvd.size())

    scenario.__name__ = variant
    SCENARIOS(scenario)


for _variant in VARIANTS:
    variant_scenario(_variant)


@SCENARIOS
def powersgd_against_svd(result: dict, data: Data) -> None:
    """PowerSGD on one 64 × 48 matrix whose rank mean has a known SVD, each rank's error-fed
    matrix held at its own full-rank M_r every step (g = M_r − e): "exact" (mean of rank 2,
    PowerSGD rank 4, one step) and "truncation" (singular values 50, 40, 30 and a tail of 45
    below 1, rank 3, four warm-started steps). Records the last update against the dense mean
    (Horovod's allreduce) and against its SVD truncation, and the collectives of the last step."""
    from gs_bench.baselines import PowerSGD

    cases = {"exact": ([30.0, 20.0], 4, 1), "truncation": ([50.0, 40.0, 30.0] + [0.95**i for i in range(45)], 3, 4)}
    for case, (singular, rank, steps) in cases.items():
        g = torch.Generator().manual_seed(7)  # the same U, V on every rank
        u = torch.linalg.qr(torch.randn(64, 64, generator=g)).Q[:, :len(singular)]
        v = torch.linalg.qr(torch.randn(48, 48, generator=g)).Q[:, :len(singular)]
        noise = torch.randn(64, 48, generator=torch.Generator().manual_seed(100 + hvd.rank()))
        mine = u @ torch.diag(torch.tensor(singular)) @ v.T + noise - hvd.allreduce(noise, name=f"noise.{case}")
        mean = hvd.allreduce(mine, name=f"mean.{case}")
        exchange = PowerSGD(rank=rank)
        comm = HorovodCollectives(hvd, TorchOps(), hvd.Sum, hvd.global_process_set, Traffic(hvd.size()))
        for _ in range(steps):
            e = 0 if exchange.residual is None else exchange.residual.view(64, 48)
            update = exchange.reduce([("w", mine - e)], comm)[0]
        left, values, right = torch.linalg.svd(mean)
        best = left[:, :rank] @ torch.diag(values[:rank]) @ right[:rank]
        result[f"powersgd_{case}"] = {
            "rank_of_mine": int(torch.linalg.matrix_rank(mine)), "q_shape": list(exchange.qs["w"].shape),
            "max_abs_from_mean": (update - mean).abs().max().item(),
            "max_abs_from_truncation": (update - best).abs().max().item(),
            "error_over_tail": ((update - mean).norm() / values[rank:].norm()).item(),
            "collectives": comm.traffic.last_step, "digest": hashlib.sha256(update.numpy().tobytes()).hexdigest()}


def main(out_dir: str, *names: str) -> None:
    SCENARIOS.selected(names)  # an unknown name ends the job before Horovod starts
    hvd.init()
    torch.set_num_threads(1)
    result: dict = {"rank": hvd.rank(), "size": hvd.size()}
    result["scenarios"] = SCENARIOS.run(names, result, Data())
    write_result(out_dir, hvd.rank(), result)


if __name__ == "__main__":
    main(*sys.argv[1:])
