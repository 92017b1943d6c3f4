"""Steps per second of one method variant training the byte-level LSTM language model
(``workloads.LstmLM``) on the standard library's ``.py`` sources (``workloads.stdlib_text``,
this rank's shard of the training files). Launched by ``scripts/bench/bench_throughput.sh`` on ranks
in separate network namespaces; runs as well under plain horovodrun (a smoke test):

    horovodrun -np 2 -H localhost:2 --gloo python scripts/bench/bench_throughput.py --hidden 32 --steps 2 --warmup 1

One launch runs a phase per link setting (``--labels``; with ``--sync`` it waits between phases
while the .sh reshapes the links), each ``--warmup`` untimed then ``--steps`` timed steps.
Rank 0 appends one JSON line per phase to ``--out``: the variant (``method``, ``options``,
``variant`` as ``scripts/bench/cost_model.py`` parses it), ``label`` (the link setting) and
``repeat``, steps/s, the payload and wire bytes per step and the collectives of one step
(``[kind, payload bytes]``, :mod:`gs_horovod.transports.collective_cost`'s kinds) from the method's meter,
``run_id`` (``--run-id``: the .sh gives one per study) and ``code`` (the commit). An existing
``--out`` is refused unless ``--append`` is given (the .sh passes it to every launch of a study).

The full run (the headline variants; 3 repeats × 20 timed steps per cell; estimated 22 min on
the idle 2-core VM, 18–30 min given the estimate's spread: it adds up CPU times per launch and
per step measured here under other jobs' load, not an idle timing of the whole run):

    RATIO=0.001 bash scripts/bench/bench_throughput.sh docs/throughput_lm.jsonl "100mbit 1gbit" \
        "gs gtopk gtopk:scope=layer topk sketched powersgd:rank=1 powersgd:rank=4 none fp16" "2 4" 3 \
        --hidden 512 --steps 20 --warmup 2
    python scripts/bench/cost_model.py --validate docs/throughput_lm.jsonl

Why these sizes: 54 launches (3 repeats × 2 P × 9 variants) of 3 phases each. A launch costs
6–8 s of CPU per rank before its first timed step (imports, MPI and Horovod init, Numba's
cached kernels), and 4 ranks share 2 cores, so launches alone take ~11 of the minutes. At hidden 512 (1.77M
parameters, a 7.1 MB dense gradient) a step costs 40–130 ms of CPU per rank at P = 2 (dense
fastest, gs-SGD / gTop-k (global) / Sketched-SGD slowest) and twice that at P = 4; dense's
allreduce is then ~90 % of its step at 100 Mbit/s and 55–60 % at 1 Gbit/s by the cost model,
but ~20 % or less at 10 Gbit/s (the veth pair tops out near 6 Gbit/s here), so 10gbit would add
minutes and hardly a row that the model's check counts. Hidden 1024 (5.58M) would take ~45 min. CPU compute is
far slower than a GPU's, so what these rates stand for is a ratio of bytes to compute, not a
link speed.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Optional

import horovod.torch as hvd
import torch
import torch.nn.functional as F

from gs_bench.cli import add_compression_flags, append_jsonl, method_options, torch_distributed_optimizer, wire_of
from gs_bench.methods import METHODS
from gs_bench.runs import add_out_flags, check_out, stamp
from gs_bench.variants import variant_word
from gs_bench.workloads import LstmLM, stdlib_text, text_batch


def wait_for_links(sync: Optional[Path], label: str) -> None:
    """Before a phase: with ``sync``, rank 0 creates ``sync/ready.LABEL`` and waits (up to 10
    min) for ``sync/go.LABEL``, which the .sh creates once the links are shaped; then all ranks
    meet."""
    if sync is not None and hvd.rank() == 0:
        (sync / f"ready.{label}").touch()
        deadline = time.monotonic() + 600
        while not (sync / f"go.{label}").exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {sync / f'go.{label}'} after 10 min")
            time.sleep(0.05)
    hvd.allreduce(torch.zeros(1), name=f"links.{label}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (``scripts/check_docs.py`` parses every documented command with it)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_compression_flags(p, list(METHODS))
    p.add_argument("--batch", type=int, default=2, help="windows per rank per step")
    p.add_argument("--seq", type=int, default=16, help="bytes per window")
    p.add_argument("--hidden", type=int, default=512, help="LSTM units (512: 1.77M parameters; 1536: 11.48M)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per phase")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before each phase's timed ones")
    p.add_argument("--labels", nargs="+", default=["local"],
                   help="one phase per link setting, in order (e.g. local 100mbit 1gbit); a JSON line each")
    p.add_argument("--sync", type=Path, help="directory for the ready/go handshake with bench_throughput.sh")
    p.add_argument("--repeat", type=int, default=1, help="which repeat of the matrix this launch belongs to")
    add_out_flags(p, "one JSON line per phase", run_id=True)
    args = p.parse_args(argv)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    check_out(args.out, args.append)
    run_fields = stamp(args.run_id)
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    corpus = stdlib_text(hvd.rank(), hvd.size())
    model = LstmLM(hidden=args.hidden)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    named = list(model.named_parameters())
    opt, meter = torch_distributed_optimizer(args, torch.optim.SGD(model.parameters(), lr=0.01), named)
    ratio, options = method_options(args)
    g = torch.Generator().manual_seed(hvd.rank())

    def step() -> None:
        inputs, targets = text_batch(corpus.train, args.batch, args.seq, g)
        opt.zero_grad()
        logits = model(inputs)
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).backward()
        opt.step()

    for label in args.labels:
        wait_for_links(args.sync, label)
        for _ in range(args.warmup):
            step()
        hvd.allreduce(torch.zeros(1), name=f"start.{label}")
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        hvd.allreduce(torch.zeros(1), name=f"end.{label}")
        seconds = time.perf_counter() - start
        if hvd.rank() != 0:
            continue
        payload, wire = meter.per_step()
        row = {"kind": "run", "label": label, "repeat": args.repeat, "method": args.compression,
               "options": options, "variant": variant_word(args.compression, options), "ratio": ratio,
               "ranks": hvd.size(), "cpu_count": os.cpu_count(), "batch": args.batch, "seq": args.seq,
               "hidden": args.hidden, "params": sum(q.numel() for _, q in named), "warmup": args.warmup,
               "steps": args.steps, "seconds": seconds, "steps_per_s": args.steps / seconds,
               "bytes_per_step": payload, "wire_bytes_per_step": wire, "wire": wire_of(args),
               "collectives": [list(c) for c in meter.collectives()], **run_fields}
        append_jsonl(args.out, row)


if __name__ == "__main__":
    main()
