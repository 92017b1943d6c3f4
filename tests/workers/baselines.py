"""Runs under ``horovodrun``: every baseline exchange on real ranks, one JSON per rank."""

from __future__ import annotations

import sys

import horovod.torch as hvd
import torch
from rank_result import write_result
from torch_scenarios import digest, digits_shard, distributed, flat, mlp, train

from gs_horovod.baselines import ExchangeOptimizer
from gs_horovod.bench.methods import METHODS
from gs_horovod.compressor import HorovodCollectives
from gs_horovod.kernels.torch_ops import TorchOps
from gs_horovod.wire import Traffic, total_wire_bytes

# variant: (method, options); "full" runs use ratio 1 (PowerSGD: a rank as large as the matrices)
VARIANTS = {
    "topk": ("topk", {}), "topk-layer": ("topk", {"scope": "layer"}),
    "gtopk": ("gtopk", {}), "gtopk-layer": ("gtopk", {"scope": "layer"}),
    "sketched": ("sketched", {}), "powersgd-r1": ("powersgd", {"rank": 1}), "powersgd-r4": ("powersgd", {"rank": 4}),
}


def run(variant: str, ratio: float, seed: int, steps: int, x, y, **extra) -> tuple:
    method, options = VARIANTS[variant]
    baseline = METHODS[method]
    exchange = baseline.exchange(ratio if baseline.takes_ratio else None, {**options, **extra})
    comm = HorovodCollectives(hvd, TorchOps(), hvd.Sum, hvd.global_process_set, Traffic(hvd.size()))
    model = mlp(seed)
    opt = ExchangeOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), exchange, comm)
    train(model, opt, x, y, steps=steps)
    return model, exchange, comm


def main(out_dir: str) -> None:
    hvd.init()
    torch.set_num_threads(1)
    x, y = digits_shard()
    result: dict = {"rank": hvd.rank(), "size": hvd.size()}
    dense = mlp(0)
    train(dense, distributed(dense, "dense.", hvd.Compression.none), x, y, steps=3)
    for variant, (method, _) in VARIANTS.items():
        full, _, _ = run(variant, 1.0, 0, 3, x, y, **({"rank": 64} if method == "powersgd" else {}))
        result[f"{variant}_full_max_abs_diff"] = (flat(full) - flat(dense)).abs().max().item()
        model, exchange, comm = run(variant, 0.05, 1, 4, x, y)
        result[f"{variant}_digest"] = digest(model)
        shapes = [tuple(p.shape) for _, p in sorted(model.named_parameters())]
        planned = exchange.planned(shapes, hvd.size())
        result[f"{variant}_collectives"] = comm.traffic.last_step
        result[f"{variant}_planned"] = planned
        result[f"{variant}_wire"] = comm.traffic.per_step()[1]
        result[f"{variant}_planned_wire"] = total_wire_bytes(planned, hvd.size())
    write_result(out_dir, hvd.rank(), result)


if __name__ == "__main__":
    main(sys.argv[1])
