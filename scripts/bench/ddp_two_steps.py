"""The smallest DDP job with gs_horovod: two ranks, ``GsState`` and ``gs_hook``, two SGD steps,
``destroy_process_group()``; for counting how often such a job exits 0 under torchrun
(:mod:`exit_codes`). ``--hook none``: the same script without gs_horovod (torch's DDP alone).
``--killed``: under ``torchrun --max-restarts 1``, rank 1 of the first attempt sends itself
SIGKILL after the first step, and the restarted group runs the two steps; ``--init torch``
makes the group with ``dist.init_process_group`` instead of gs_horovod's (for a restart).

    torchrun --standalone --nproc_per_node 2 scripts/bench/ddp_two_steps.py [--hook none]
    torchrun --standalone --nproc_per_node 2 --max-restarts 1 scripts/bench/ddp_two_steps.py --killed
"""

from __future__ import annotations

import argparse
import os
import signal
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hook", choices=["gs", "none"], default="gs")
    p.add_argument("--killed", action="store_true", help="rank 1 of the first attempt dies after step 1")
    p.add_argument("--init", choices=["torch", "gs_horovod"], default=None,
                   help="how the group is made (default: torch's, or gs_horovod's with --killed)")
    return p.parse_args(argv)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    if (args.init or ("gs_horovod" if args.killed else "torch")) == "torch":
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    else:
        from gs_horovod.torchrun import init_process_group

        init_process_group("gloo", timeout=timedelta(seconds=60))
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
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
        if args.killed and first_attempt and dist.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
