"""Data-parallel training of a byte-level LSTM language model on the Python standard library's
own ``.py`` sources with Horovod or DDP.

    horovodrun -np 2 -H localhost:2 --gloo python scripts/examples/train_lm.py --compression gs --steps 60
    torchrun --standalone --nproc_per_node 2 scripts/examples/train_lm.py --compression gs --steps 60

Data: ``gs_bench.workloads.stdlib_text``: about 10 % of the files held out, the training files' bytes
cut into one contiguous shard per rank; each step takes random windows of its shard. Model:
``gs_bench.workloads.LstmLM`` (11.48M parameters by default). Every ``--eval-every`` steps: mean
training loss and the per-byte perplexity on the first ``--eval-windows`` windows of the
held-out files; at the end, bytes per step against dense and steps/s. Same ``--compression``
switch and GsSketch flags as ``scripts/examples/train_torch.py``, and the same DDP hooks under
torchrun.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch
import torch.nn.functional as F

from gs_bench.cli import Report, add_compression_flags, add_simulated_flag, run_on_ranks
from gs_bench.methods import METHODS
from gs_bench.workloads import LstmLM, perplexity, stdlib_text, text_batch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=60, help="training steps (a multiple of --eval-every)")
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=8, help="windows per rank per step")
    p.add_argument("--seq", type=int, default=64, help="bytes per training window")
    p.add_argument("--lr", type=float, default=2e-3, help="Adam's learning rate")
    p.add_argument("--embed", type=int, default=256)
    p.add_argument("--hidden", type=int, default=1536)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--eval-windows", type=int, default=32, help="held-out windows of --eval-seq bytes")
    p.add_argument("--eval-seq", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the history to this file (rank 0)")
    add_compression_flags(p, list(METHODS))
    p.add_argument("--merge", choices=["horovod", "mpi"], default="horovod",
                   help="gs: merge sketches with Horovod's allreduce or gs_horovod's MPI tree (needs --mpi)")
    add_simulated_flag(p)
    args = p.parse_args(argv)
    if args.steps % args.eval_every:
        p.error(f"--steps {args.steps} is not a multiple of --eval-every {args.eval_every}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    return run_on_ranks(args, lambda ranks: train(args, ranks))


def train(args: argparse.Namespace, ranks: Any) -> dict:
    """One rank's training (``ranks``: gs_bench.cli's HorovodRanks, TorchRanks or
    SimulatedTrainingRanks); its Report's result."""
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    corpus = stdlib_text(ranks.rank, ranks.size)
    model = LstmLM(embed=args.embed, hidden=args.hidden, layers=args.layers)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    net, optimizer, meter = ranks.distribute(args, model, optimizer, optimizer_state=False)

    dense_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    g = torch.Generator().manual_seed(args.seed + ranks.rank)
    report = Report(args, ranks.rank, ranks.size, dense_bytes, meter.per_step, args.eval_every,
                    args.steps // args.eval_every, period="interval", metric="perplexity")
    for interval in report.periods():
        model.train()
        total = 0.0
        for _ in range(args.eval_every):
            inputs, targets = text_batch(corpus.train, args.batch_size, args.seq, g)
            optimizer.zero_grad()
            logits = net(inputs)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
            loss.backward()
            optimizer.step()
            total += loss.item()
            report.step()
        train_loss = ranks.mean(total / args.eval_every)
        ppl = perplexity(model, corpus.test, seq=args.eval_seq, max_windows=args.eval_windows)
        report.record(interval, train_loss, ppl)
    result = report.finish()
    if ranks.rank == 0:
        print(f"  model               {sum(p.numel() for p in model.parameters()):,} parameters; "
              f"{len(corpus.train_files)} training files, {len(corpus.test_files)} held out "
              f"(train loss {result['history'][-1]['loss']:.3f} nats = {math.exp(result['history'][-1]['loss']):.2f} "
              "perplexity)", flush=True)
    return result


if __name__ == "__main__":
    main()
