"""Data-parallel training of a byte-level LSTM language model on the Python standard library's
own ``.py`` sources with Horovod or DDP.

    horovodrun -np 2 -H localhost:2 --gloo python scripts/bench/train_lm.py --compression gs --steps 60
    torchrun --standalone --nproc_per_node 2 scripts/bench/train_lm.py --compression gs --steps 60

Data: ``gs_bench.workloads.stdlib_text``: about 10 % of the files held out, the training files' bytes
cut into one contiguous shard per rank; each step takes random windows of its shard. Model:
``gs_bench.workloads.LstmLM`` (11.48M parameters by default). Every ``--eval-every`` steps: mean
training loss and the per-byte perplexity on the first ``--eval-windows`` windows of the
held-out files; at the end, bytes per step against dense and steps/s. Same ``--compression``
switch and GsSketch flags as ``scripts/bench/train_torch.py``, and the same DDP hooks under
torchrun.

The benchmark harness's entry point (it imports gs_bench); the example to copy:
``scripts/examples/train_lm.py``.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch
import torch.nn.functional as F

from gs_bench.cli import Report, add_simulated_flag, check_lm_budget, lm_arguments, local_bytes, run_on_ranks
from gs_bench.methods import METHODS
from gs_bench.workloads import LstmLM, perplexity, stdlib_text, text_batch
from gs_horovod.transports import DEFAULT_TRANSPORT, TRANSPORTS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = lm_arguments(__doc__, list(METHODS))
    p.add_argument("--transport", "--merge", dest="transport", choices=list(TRANSPORTS), default=DEFAULT_TRANSPORT,
                   help="gs: the transport its collectives run on (gs_horovod.transports.TRANSPORTS; mpi: the MPI "
                        "tree over mpi4py, needs --mpi); --merge is its former name")
    add_simulated_flag(p)
    return check_lm_budget(p, p.parse_args(argv))


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    return run_on_ranks(args, lambda ranks: train(args, ranks))


def train(args: argparse.Namespace, ranks: Any) -> dict:
    """One rank's training (``ranks``: gs_bench.cli's HorovodRanks, TorchRanks or
    SimulatedTrainingRanks, or train_fsdp.py's FsdpRanks); its Report's result."""
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    corpus = stdlib_text(ranks.rank, ranks.size)
    model = LstmLM(embed=args.embed, hidden=args.hidden, layers=args.layers)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    net, optimizer, meter = ranks.distribute(args, model, optimizer, optimizer_state=False)

    dense_bytes = local_bytes(model)
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
