"""What the harness's training entry points (``scripts/bench/train_*.py``) share: flags,
GsSketch options as the user gave them, the optimizer switch over gs-SGD and the baselines, the
progress report and the final summary, so all of them print and save the same things."""

from __future__ import annotations

import argparse
import ast
import json
import sys
import time
from typing import Any, Callable, Iterator

import psutil
from tqdm import tqdm

from .runs import code_version


def demo_arguments(description: str, compressions: list[str]) -> argparse.ArgumentParser:
    """The flags both demos take (data, model, optimizer, output) and :func:`add_compression_flags`."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, help="default: the model's (see the script)")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9, help="of the SGD optimizer")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the per-epoch history to this file (rank 0)")
    add_compression_flags(p, compressions)
    return p


def lm_arguments(description: str, compressions: list[str]) -> argparse.ArgumentParser:
    """The flags of the LSTM language-model examples (``train_lm.py``, ``train_fsdp.py --model
    lm``): step budget, data, model, Adam, output, and :func:`add_compression_flags`."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    add_compression_flags(p, compressions)
    return p


def check_lm_budget(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """``args``, once ``--steps`` is a multiple of ``--eval-every`` (else ``p.error``)."""
    if args.steps % args.eval_every:
        p.error(f"--steps {args.steps} is not a multiple of --eval-every {args.eval_every}")
    return args


def local_bytes(model: Any) -> int:
    """Bytes of this rank's parameters: each one's local tensor (under FSDP, this rank's shard)."""
    from torch.distributed.tensor import DTensor

    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() * p.element_size() for p in model.parameters())


def add_compression_flags(p: argparse.ArgumentParser, compressions: list[str]) -> None:
    """--compression and GsSketch's options. A GsSketch option the user does not give is not
    passed, so GsSketch's own defaults apply; ``--gs NAME=VALUE`` passes any other option."""
    p.add_argument("--compression", choices=compressions, default="gs",
                   help="gs: GsSketch; none / fp16: Horovod's; others: baselines (torch only)")
    p.add_argument("--ratio", type=float, help="k / d (gs: GsSketch's default; baselines: 0.01)")
    p.add_argument("--rows", type=int, help="gs: sketch rows")
    p.add_argument("--width", type=float, help="gs: sketch columns / k")
    p.add_argument("--no-exact", dest="exact", action="store_false", default=None, help="gs: skip the second round")
    p.add_argument("--warmup-steps", type=int, help="gs: dense steps first")
    p.add_argument("--gs", action="append", default=[], metavar="NAME=VALUE",
                   help="gs: any other GsSketch option, e.g. --gs scope=layer --gs candidates=2 (repeatable)")
    p.add_argument("--opt", action="append", default=[], metavar="NAME=VALUE",
                   help="baselines: a constructor option, e.g. --opt scope=layer, --opt rank=1 (PowerSGD), "
                        "--opt width=4 (Sketched-SGD) (repeatable)")


def _name_values(items: list[str], flag: str) -> dict[str, Any]:
    """``NAME=VALUE`` items as a dict, VALUE read as a Python literal when it is one, else a string."""
    options: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"{flag} takes NAME=VALUE, got {item!r}")
        try:
            options[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            options[name] = value
    return options


def gs_options(args: argparse.Namespace) -> dict[str, Any]:
    """The GsSketch options the user gave: the named flags that are set, then each ``--gs
    NAME=VALUE``."""
    options = {name: getattr(args, name) for name in ("ratio", "rows", "width", "exact", "warmup_steps")
               if getattr(args, name, None) is not None}
    if getattr(args, "transport", "horovod") != "horovod":
        options["transport"] = args.transport
    return {**options, **_name_values(args.gs, "--gs")}


def method_options(args: argparse.Namespace) -> tuple[float | None, dict[str, Any]]:
    """(ratio, options) for ``args.compression`` (:data:`gs_bench.methods.METHODS`): from
    the flag the method takes its options with (GsSketch's as the user gave them,
    :func:`gs_options`; a baseline's ``--opt`` items) and ``--ratio`` if it takes one. A flag the
    method does not take is an error (none/fp16 refuse both): no flag is silently ignored."""
    from .methods import method

    m = method(args.compression)
    if args.opt and m.option_flag != "--opt":
        raise SystemExit(f"--opt is for the baselines; --compression {args.compression} does not take it"
                         + (f" (its options go with {m.option_flag} NAME=VALUE)" if m.option_flag else ""))
    if m.option_flag == "--gs":
        options = gs_options(args)
        return options.pop("ratio", None), options
    if args.ratio is not None and not m.takes_ratio:
        raise SystemExit(f"--compression {args.compression} does not select k coordinates: it takes no --ratio")
    return args.ratio, _name_values(args.opt, "--opt")


def wire_of(args: argparse.Namespace) -> str:
    """The wire format ``args.compression`` runs with (:meth:`gs_bench.methods.Method.wire`)."""
    from .methods import method

    return method(args.compression).wire(method_options(args)[1])


def torch_distributed_optimizer(args: argparse.Namespace, optimizer: Any, named_parameters: Any) -> tuple[Any, Any]:
    """(optimizer, :class:`gs_bench.methods.Meter`) for ``args.compression`` in a torch
    demo under horovodrun (:func:`gs_bench.methods.distributed_optimizer` with
    :func:`method_options`)."""
    from .methods import distributed_optimizer

    ratio, options = method_options(args)
    return distributed_optimizer(args.compression, optimizer, list(named_parameters), ratio, **options)


class HorovodRanks:
    """A torch demo's ranks under horovodrun: init, the model and optimizer made distributed
    (:func:`torch_distributed_optimizer`), the min and mean of a number over ranks."""

    def __init__(self) -> None:
        import horovod.torch as hvd

        hvd.init()
        self.hvd, self.rank, self.size = hvd, hvd.rank(), hvd.size()

    def close(self) -> None:
        """Nothing: Horovod shuts down at exit."""

    def distribute(self, args: argparse.Namespace, model: Any, optimizer: Any,
                   optimizer_state: bool = True) -> tuple[Any, Any, Any]:
        """(the model to call, the optimizer to step, its Meter); rank 0's weights everywhere, and
        its optimizer state with ``optimizer_state`` (Horovod makes Adam's state by a zero step,
        so the LM leaves it out)."""
        self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        if optimizer_state:
            self.hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        return (model, *torch_distributed_optimizer(args, optimizer, model.named_parameters()))

    def min(self, value: int) -> int:
        import torch

        return int(self.hvd.allreduce(torch.tensor(value), op=self.hvd.Min, name="min").item())

    def mean(self, value: float) -> float:
        import torch

        return float(self.hvd.allreduce(torch.tensor(value), name="mean").item())


class TorchRanks:
    """The same under torchrun: ``torch.distributed`` over gloo (the demos run on the CPU) and
    DistributedDataParallel with the communication hook of ``--compression``
    (:func:`gs_bench.methods.register_hook`)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        from gs_horovod.torchrun import init_process_group

        init_process_group("gloo")  # with the exit handler that lets gloo's threads finish
        self.dist, self.rank, self.size = dist, dist.get_rank(), dist.get_world_size()

    def close(self) -> None:
        """Destroys the process group before the interpreter exits."""
        self.dist.destroy_process_group()

    def distribute(self, args: argparse.Namespace, model: Any, optimizer: Any,
                   optimizer_state: bool = True) -> tuple[Any, Any, Any]:
        """As :meth:`HorovodRanks.distribute`; every rank's optimizer starts alike (DDP keeps
        the weights equal, so no optimizer state is sent)."""
        from torch.nn.parallel import DistributedDataParallel

        from .methods import register_hook

        ratio, options = method_options(args)
        ddp = DistributedDataParallel(model)  # broadcasts rank 0's weights
        return ddp, optimizer, register_hook(args.compression, ddp, model, ratio, **options)

    def _reduce(self, value: float, op: Any) -> float:
        import torch

        t = torch.tensor([float(value)], dtype=torch.float64)
        self.dist.all_reduce(t, op=op)
        return float(t.item())

    def min(self, value: int) -> int:
        return int(self._reduce(value, self.dist.ReduceOp.MIN))

    def mean(self, value: float) -> float:
        return self._reduce(value, self.dist.ReduceOp.SUM) / self.size


class SimulatedTrainingRanks:
    """A torch demo's rank r of P ranks simulated in one process (``--simulated-ranks P``,
    :class:`gs_horovod.transports.simulated.SimulatedRanks`: one thread per rank, taking turns), with the
    calls of :class:`HorovodRanks`. Gradients are exchanged at ``optimizer.step()`` through the
    rank's :class:`~gs_horovod.transports.simulated.SimulatedComm`, by the method's simulated exchange
    (:meth:`gs_bench.methods.Method.simulated`: gs-SGD by the engine itself, a
    baseline by its ``Reducer``, "none" by the exact mean);
    so the process computes what P processes would, up to the order of floating-point sums."""

    def __init__(self, comm: Any) -> None:
        self.comm, self.rank, self.size = comm, comm.rank, comm.size

    def distribute(self, args: argparse.Namespace, model: Any, optimizer: Any,
                   optimizer_state: bool = True) -> tuple[Any, Any, Any]:
        """(model, optimizer, Meter); every rank builds the same weights from the same seed."""
        from .baselines import ReducerOptimizer
        from .methods import METHODS, Meter

        ratio, options = method_options(args)
        m = METHODS[args.compression]
        if not m.simulated_too:
            raise SystemExit(f"--simulated-ranks runs {[n for n, x in METHODS.items() if x.simulated_too]}, not "
                             f"--compression {args.compression}")
        m.check(ratio, options)
        opt = ReducerOptimizer(optimizer, model.named_parameters(), m.simulated(self.comm, ratio, options), self.comm)
        return model, opt, Meter.of_traffic(self.comm.traffic)

    def min(self, value: int) -> int:
        return int(min(self.comm.values(value, "min")))

    def mean(self, value: float) -> float:
        values = self.comm.values(value, "mean")
        return sum(values) / len(values)


LINK_LATENCY = 5e-5
"""Seconds each round of a modelled collective costs before its bytes (a switched LAN's order)."""


def link_of(rate: str) -> tuple[float, float]:
    """(latency seconds, bytes per second) of a modelled link at a tc-style ``rate``
    ("100mbit", "1gbit", "2.5gbit": bits per second with k/m/g), with :data:`LINK_LATENCY`."""
    import re

    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg])bit", rate)
    if not match:
        raise argparse.ArgumentTypeError(f"a link rate like 100mbit or 1gbit, got {rate!r}")
    bits = float(match[1]) * {"k": 1e3, "m": 1e6, "g": 1e9}[match[2]]
    return LINK_LATENCY, bits / 8


def add_simulated_flag(p: argparse.ArgumentParser) -> None:
    """``--simulated-ranks P`` and ``--simulated-link RATE`` (see :func:`run_on_ranks`)."""
    p.add_argument("--simulated-ranks", type=int, metavar="P",
                   help="run P ranks in this one process instead of under a launcher (gs-SGD's engine and the "
                        "baselines on simulated collectives; no horovodrun or torchrun)")
    p.add_argument("--simulated-link", type=link_of, metavar="RATE",
                   help="with --simulated-ranks: the modelled link (e.g. 100mbit) that ratio='auto' measures "
                        "each collective on (50 us + bytes / rate a round); without it collectives take no "
                        "time and ratio='auto' stays dense")


def run_on_ranks(args: argparse.Namespace, train: Callable[[Any], dict]) -> dict:
    """``train(ranks)`` for this process's rank under horovodrun or torchrun
    (:func:`ranks_from_env`), or with ``--simulated-ranks P`` for each of P ranks simulated in
    this process (:class:`SimulatedTrainingRanks`, on the ``--simulated-link`` model); this
    process's (rank 0's) result."""
    if args.simulated_link and args.simulated_ranks is None:
        raise SystemExit("--simulated-link needs --simulated-ranks")
    if args.simulated_ranks is None:
        ranks = ranks_from_env()
        try:
            return train(ranks)
        finally:
            ranks.close()
    if args.simulated_ranks < 1:
        raise SystemExit(f"--simulated-ranks must be >= 1, got {args.simulated_ranks}")
    from gs_horovod.transports.simulated import SimulatedRanks

    group = SimulatedRanks(args.simulated_ranks, link=args.simulated_link)
    return group.run(lambda rank, comm: train(SimulatedTrainingRanks(comm)))[0]


def ranks_from_env() -> HorovodRanks | TorchRanks:
    """TorchRanks when the launcher set ``RANK`` and ``WORLD_SIZE`` (torchrun), else HorovodRanks."""
    import os

    return TorchRanks() if "RANK" in os.environ and "WORLD_SIZE" in os.environ else HorovodRanks()


def append_jsonl(path: str | None, row: dict) -> None:
    """Prints ``row`` as one JSON line and appends it to ``path`` (if given)."""
    print(json.dumps(row), flush=True)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


class Report:
    """What a demo shows, on rank 0 only: one progress bar over all steps, a line per period
    (epoch, or evaluation interval), and a closing summary (held-out metric, bytes per step
    against dense, wall time), all on stdout so that they stay in order through horovodrun;
    also the JSON history. ``periods()`` yields the period numbers, ``step()`` advances the bar.
    ``metric`` is "accuracy" (higher is better) or "perplexity" (lower is better);
    ``per_step()`` gives (payload, wire) bytes per step per rank so far (a ``Meter``'s)."""

    def __init__(self, args: Any, rank: int, size: int, dense_bytes: int,
                 per_step: Callable[[], tuple[float, float]],
                 steps_per_period: int, periods: int, period: str = "epoch", metric: str = "accuracy") -> None:
        self.args, self.rank, self.size = args, rank, size
        self.dense_bytes, self.per_step, self.steps = dense_bytes, per_step, steps_per_period
        self.count, self.period, self.metric = periods, period, metric
        self.history: list[dict] = []
        self.start = time.perf_counter()
        self.bar = tqdm(total=periods * steps_per_period, desc="training", unit="step", disable=rank != 0,
                        file=sys.stdout, ncols=80,
                        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}]")

    def periods(self) -> Iterator[int]:
        return iter(range(1, self.count + 1))

    def step(self) -> None:
        self.bar.update()

    def record(self, number: int, loss: float, value: float) -> None:
        """The end of period ``number``: mean training loss and the held-out metric."""
        sent, wire = self.per_step()
        self.history.append({"epoch": number, "loss": loss, self.metric: value, "bytes_per_step": sent,
                             "wire_bytes_per_step": wire,
                             "steps": self.steps, "seconds": time.perf_counter() - self.start})
        if self.rank == 0:
            self.bar.write(f"{self.period} {number:3d}/{self.count}  loss {loss:.4f}  "
                           f"held-out {self.metric} {value:.4f}", file=sys.stdout)
            sys.stdout.flush()

    def finish(self) -> dict:
        self.bar.close()
        seconds = time.perf_counter() - self.start
        result = {"args": vars(self.args), "ranks": self.size, "dense_bytes_per_step": self.dense_bytes,
                  "seconds": seconds, "history": self.history, "code": code_version(), "wire": wire_of(self.args)}
        if self.rank == 0:
            (sent, wire), last = self.per_step(), self.history[-1][self.metric]
            values = [h[self.metric] for h in self.history]
            best = min(values) if self.metric == "perplexity" else max(values)
            wall = time.time() - psutil.Process().create_time()
            against = (f"{self.dense_bytes / max(sent, 1):.1f}x fewer than dense, {self.dense_bytes:,}"
                       if sent < self.dense_bytes else "dense")
            steps = self.count * self.steps
            print(f"\nsummary ({self.size} ranks, --compression {self.args.compression})\n"
                  f"  held-out {self.metric:<11}{last:.4f} after {steps} steps (best {best:.4f})\n"
                  f"  bytes/step/rank     {sent:,.0f} ({against}); {wire:,.0f} on the wire\n"
                  f"  wall time           {wall:.0f} s per rank, {seconds:.0f} s of it training "
                  f"({steps / seconds:.2f} steps/s)", flush=True)
            if self.args.json:
                with open(self.args.json, "w") as f:
                    json.dump(result, f, indent=1)
        return result
