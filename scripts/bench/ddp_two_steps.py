"""The smallest DDP job with gs_horovod: two ranks, ``GsState`` and ``gs_hook``, two SGD steps,
``destroy_process_group()``; for counting how often such a job exits 0 under torchrun
(:mod:`exit_codes`). ``--hook none``: the same script without gs_horovod (torch's DDP alone).

    torchrun --standalone --nproc_per_node 2 scripts/bench/ddp_two_steps.py [--hook none]
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hook", choices=["gs", "none"], default="gs")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(64, 10))
    if args.hook == "gs":
        from gs_horovod.ddp import GsState, gs_hook

        model.register_comm_hook(GsState(model=model, ratio=0.1, min_size=16), gs_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        g = torch.Generator().manual_seed(step * 100 + dist.get_rank())
        opt.zero_grad()
        model(torch.randn(8, 64, generator=g)).square().mean().backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
