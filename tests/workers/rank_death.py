"""Runs under ``horovodrun``: rank 1 kills itself (SIGKILL) at step 5 of GsSketch training;
the surviving ranks must exit, not hang. Prints nothing of interest: the test times it.

One scenario per launch, no arguments:

    horovodrun -np 2 -H localhost:2 --gloo python tests/workers/rank_death.py
"""

from __future__ import annotations

import os
import signal
import sys

import horovod.torch as hvd
import torch
from torch_scenarios import digits_shard, distributed, mlp, train

from gs_horovod.torch import GsSketch

if __name__ == "__main__":
    hvd.init()
    torch.set_num_threads(1)
    x, y = digits_shard()
    model = mlp(0)
    opt = distributed(model, "death.", GsSketch(ratio=0.05, min_size=64))
    train(model, opt, x, y, steps=5)
    print(f"rank {hvd.rank()} pid {os.getpid()} reached step 5", flush=True)
    if hvd.rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    train(model, opt, x, y, steps=1000)
    sys.exit(0)  # not reached when the job is torn down
