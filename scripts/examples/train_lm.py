"""Data-parallel training of a byte-level LSTM language model on the Python standard library's own
``.py`` sources with Horovod, GsSketch as the ``compression`` of ``hvd.DistributedOptimizer``.

    horovodrun -np 2 -H localhost:2 --gloo python scripts/examples/train_lm.py

Each rank trains on its own shard of the training files' bytes; every ``--eval-every`` steps rank
0 prints the per-byte perplexity on held-out files. ``--ratio R`` fixes the fraction of
coordinates sent a step (default: GsSketch's ``ratio="auto"``). The benchmark harness's version,
with every baseline and the byte counts: scripts/bench/train_lm.py.
"""

from __future__ import annotations

import argparse
import math

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from data import LstmLM, stdlib_bytes, text_batch

from gs_horovod.torch import GsSketch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ratio", type=float, help="k / d (default: GsSketch's ratio='auto')")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8, help="windows of --seq bytes per rank and step")
    p.add_argument("--seq", type=int, default=64)
    return p.parse_args(argv)


def main() -> None:
    args = parse_args()
    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    train, test = stdlib_bytes(hvd.rank(), hvd.size())

    model = LstmLM(hidden=args.hidden)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    options = {} if args.ratio is None else {"ratio": args.ratio}
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=GsSketch(**options))

    g = torch.Generator().manual_seed(hvd.rank())
    held_out = text_batch(test, 32, 128, torch.Generator().manual_seed(0))  # the same windows every time
    for step in range(1, args.steps + 1):
        inputs, targets = text_batch(train, args.batch_size, args.seq, g)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        loss.backward()
        optimizer.step()
        if step % args.eval_every == 0 and hvd.rank() == 0:
            with torch.no_grad():
                held = F.cross_entropy(model(held_out[0]).flatten(0, 1), held_out[1].flatten()).item()
            print(f"step {step}  loss {loss.item():.3f}  held-out perplexity {math.exp(held):.2f}", flush=True)


if __name__ == "__main__":
    main()
