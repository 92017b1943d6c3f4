"""Steps per second of one method on an LSTM language model (synthetic tokens: no text corpus
ships inside an installed package here). Launched by ``scripts/bench_throughput.sh`` on ranks
in separate network namespaces; rank 0 appends one JSON line to ``--out``.

Model: embedding vocab × dim, one LSTM layer dim → dim, decoder tied to the embedding
(vocab 50,000 × dim 1,024: 59.6M parameters, 51.2M of them in one tensor).
"""

from __future__ import annotations

import argparse
import json
import time

import horovod.torch as hvd
import torch
import torch.nn.functional as F

from gs_horovod.baselines import distributed_optimizer


class LstmLM(torch.nn.Module):
    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.lstm = torch.nn.LSTM(dim, dim, batch_first=True)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embed(tokens))
        return hidden @ self.embed.weight.T  # tied decoder


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--method", default="gs")
    p.add_argument("--ratio", type=float, default=0.001)
    p.add_argument("--vocab", type=int, default=50_000)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--seq", type=int, default=8)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--label", default="")
    p.add_argument("--out")
    args = p.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = LstmLM(args.vocab, args.dim)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt, bytes_per_step = distributed_optimizer(args.method, torch.optim.SGD(model.parameters(), lr=0.1),
                                                model.named_parameters(), ratio=args.ratio, min_size=1024)
    g = torch.Generator().manual_seed(hvd.rank())

    def step() -> None:
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
        opt.zero_grad()
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1)).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    hvd.allreduce(torch.zeros(1), name="barrier.start")
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    hvd.allreduce(torch.zeros(1), name="barrier.end")
    seconds = time.perf_counter() - start
    if hvd.rank() == 0:
        row = {"label": args.label, "method": args.method, "ratio": args.ratio, "ranks": hvd.size(),
               "params": sum(q.numel() for q in model.parameters()), "steps_per_s": args.steps / seconds,
               "bytes_per_step": bytes_per_step()}
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
