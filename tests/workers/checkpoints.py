"""Runs under ``horovodrun``: checkpoints of GsSketch on real ranks, the same scenarios for
torch and TensorFlow; one JSON per rank.

    horovodrun -np P -H localhost:P --gloo python tests/workers/checkpoints.py OUT_DIR FRAMEWORK [--other CKPT] [NAME]

FRAMEWORK: ``torch`` or ``tf``. NAME: any number of scenarios, below in the order they run (none: all of them,
``other_world_size`` only with ``--other``), e.g. the one-file-per-rank resume alone:

    horovodrun -np 2 -H localhost:2 --gloo python tests/workers/checkpoints.py /tmp/out torch resume_local

- ``resume``: the Horovod way, for each exchange (named; results under ``result[exchange]``):
  every rank calls ``state_dict()``, rank 0 writes ``OUT_DIR/checkpoint_<exchange>.pt`` (a
  pickle); fresh objects, rank 0 reads it, every rank calls ``load_state_dict`` (rank 0 with
  the state, the others None; rank 0 alone: tests/workers/idioms.py);
- ``mistakes``: loads that must fail (or resume wrong) from ``OUT_DIR/checkpoint_sketch.pt``
  (written first if ``resume`` did not run);
- ``resume_local``, ``resume_mid_warmup``: one file per rank, ``local_state_dict()`` /
  ``load_local_state_dict()``, ``reset()``, and a resume in the middle of the warm-up;
- ``other_world_size``: ``--other CKPT``, a checkpoint written by a run with another number of
  ranks: its GsSketch state must be refused on rank 0, at once;
- ``class_form``: ``compression=GsSketch`` against an instance, its bytes counted as handed to
  Horovod (torch: tests/workers/handed_over.py).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import os
import pickle
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from rank_result import write_result
from scenario import Scenarios, each

OPTIONS = dict(ratio=0.05, min_size=64, momentum=0.5)
EXCHANGES = ("sketch", "allgather", "sparse")  # named: at 2-3 ranks "auto" would pick the allgather
SKETCH = {**OPTIONS, "exchange": "sketch"}  # the exchange of the exchange-independent scenarios
N = 4


class TorchTrainer:
    """An MLP on this rank's digits shard, SGD through Horovod's DistributedOptimizer."""

    @staticmethod
    def start() -> tuple[Any, type]:
        import horovod.torch as hvd
        import torch

        from gs_horovod.torch import GsSketch

        hvd.init()
        torch.set_num_threads(1)
        return hvd, GsSketch

    def __init__(self, seed: int, gs: Any, saved: dict | None = None, from_rank0: bool = False) -> None:
        """``saved``: what :meth:`weights` gave, loaded here; ``from_rank0``: only rank 0 has it
        (None elsewhere) and broadcasts it."""
        import horovod.torch as hvd
        from torch_reliability import step
        from torch_scenarios import digits_shard, distributed, mlp

        self.x, self.y = digits_shard()
        self.model, self._step = mlp(seed), step
        if saved is not None:
            self.model.load_state_dict(saved["model"])
        if from_rank0:
            hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        self.opt = distributed(self.model, "r.", gs)
        if saved is not None:
            self.opt.load_state_dict(saved["opt"])
        if from_rank0:
            hvd.broadcast_optimizer_state(self.opt, root_rank=0)

    def train(self, steps: range) -> None:
        for i in steps:
            self._step(self.model, self.opt, self.x, self.y, i)

    def digest(self) -> str:
        from torch_scenarios import digest

        return digest(self.model)

    def flat(self) -> list[float]:
        from torch_scenarios import flat

        return flat(self.model).tolist()

    def weights(self) -> dict:
        return copy.deepcopy({"model": self.model.state_dict(), "opt": self.opt.state_dict()})

    def variables(self) -> list:
        return list(self.model.parameters())

    @staticmethod
    def residuals(local: dict) -> dict[str, np.ndarray]:
        return {n: t["residual"].numpy() for n, t in local["tensors"].items()}

    @staticmethod
    def counting() -> Any:
        """Counts the bytes handed to Horovod's collectives while entered."""
        from handed_over import HandedOver

        return HandedOver(gs_sketch=True)

    @staticmethod
    def steps(local: dict) -> list[int]:
        return sorted(t["steps"] for t in local["tensors"].values())


class TfTrainer:
    """The same MLP and shard in TensorFlow, SGD through DistributedGradientTape."""

    @staticmethod
    def start() -> tuple[Any, type]:
        os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # as tf_scenarios: Horovod's Keras layer needs tf-keras
        import horovod.tensorflow as hvd
        import tensorflow as tf

        from gs_horovod.tensorflow import GsSketch

        hvd.init()
        tf.config.threading.set_intra_op_parallelism_threads(1)
        return hvd, GsSketch

    def __init__(self, seed: int, gs: Any, saved: dict | None = None, from_rank0: bool = False) -> None:
        import horovod.tensorflow as hvd
        from sklearn.datasets import load_digits
        from tf_scenarios import Mlp, make_step

        x, y = load_digits(return_X_y=True)
        self.x = (x / 16.0).astype(np.float32)[hvd.rank()::hvd.size()]
        self.y = y.astype(np.int64)[hvd.rank()::hvd.size()]
        self.model = Mlp(seed)
        if saved is not None:
            for v, value in zip(self.model.variables, saved["model"]):
                v.assign(value)
        if from_rank0:
            hvd.broadcast_variables(self.model.variables, root_rank=0)
        self._step = make_step(self.model, gs)

    def train(self, steps: range) -> None:
        from tf_scenarios import run

        run(self.model, self._step, self.x, self.y, steps)

    def digest(self) -> str:
        from tf_scenarios import digest

        return digest(self.model)

    def flat(self) -> list[float]:
        return np.concatenate([v.numpy().reshape(-1) for v in self.model.variables]).tolist()

    def weights(self) -> dict:
        return {"model": [v.numpy() for v in self.model.variables]}

    def variables(self) -> list:
        return list(self.model.trainable_variables)

    @staticmethod
    def residuals(local: dict) -> dict[str, np.ndarray]:
        return {n: v["residual"] for n, v in local["variables"].items()}

    @staticmethod
    def counting() -> Any:
        """None: the collectives run inside Horovod's traced graph, where sizes are not counted."""
        return contextlib.nullcontext()

    @staticmethod
    def steps(local: dict) -> list[int]:
        return sorted(local["steps"].values())


def load_gs(gs: Any, ckpt: dict | None) -> str | None:
    """``gs.load_state_dict`` as every rank calls it; the error text, if any (rank 0 checks
    what it holds at once; the others pass None and have nothing to check)."""
    try:
        gs.load_state_dict(ckpt["gs"] if ckpt is not None else None)
    except ValueError as e:
        return str(e)
    return None


def read(hvd: Any, path: str) -> dict | None:
    """Rank 0 reads the checkpoint file; the other ranks get None."""
    if hvd.rank() != 0:
        return None
    with open(path, "rb") as f:
        return pickle.load(f)


def residuals(trainer: type, local: dict) -> dict[str, list]:
    """Per tensor a digest of the residual's bytes and the sum of its |values| (compared across
    runs: a failure shows which tensor differs, and by how much)."""
    return {n: [hashlib.sha256(r.tobytes()).hexdigest()[:16], float(np.abs(r).sum())]
            for n, r in sorted(trainer.residuals(local).items())}


def summary(trainer: type, local: dict) -> dict:
    """Per tensor the sum of |residual|, and the sorted step counts."""
    return {**{n: float(np.abs(r).sum()) for n, r in trainer.residuals(local).items()},
            "steps": trainer.steps(local)}


@dataclass
class Job:
    """What every scenario runs with: the framework's Horovod, GsSketch and trainer; where files go."""

    hvd: Any
    GsSketch: type
    trainer: type
    out_dir: str
    other: str | None  # --other: a checkpoint of another number of ranks

    def path(self, exchange: str) -> str:
        return os.path.join(self.out_dir, f"checkpoint_{exchange}.pt")


SCENARIOS = Scenarios(own=("resume", "mistakes", "resume_local", "resume_mid_warmup", "class_form"))


@SCENARIOS
@each(EXCHANGES)
def resume(result: dict, exchange: str, job: Job) -> None:
    """2N steps straight vs N steps, saved by rank 0 only to ``job.path(exchange)``, fresh
    objects, N more steps."""
    saved_and_resumed(result, job, {**OPTIONS, "exchange": exchange})


def saved_and_resumed(result: dict, job: Job, options: dict) -> None:
    hvd, GsSketch, trainer, path = job.hvd, job.GsSketch, job.trainer, job.path(options["exchange"])
    straight_gs = GsSketch(**options)
    straight = trainer(9, straight_gs)
    straight.train(range(2 * N))
    result["straight"] = straight.digest()

    gs = GsSketch(**options)
    first = trainer(9, gs)
    first.train(range(N))
    gs_state = gs.state_dict()  # a collective: every rank calls it
    result["state_dict_is_none"] = gs_state is None
    if hvd.rank() == 0:
        with open(path, "wb") as f:
            pickle.dump({**first.weights(), "gs": gs_state}, f)

    # a fresh process would start here: new objects, only rank 0 reads the file
    hvd.broadcast_object(0, root_rank=0, name="file_written")  # the file is complete before anyone reads it
    ckpt = read(hvd, path)
    gs = GsSketch(**options)
    fresh = trainer(123, gs, ckpt, from_rank0=True)  # other weights: everything must come from the file
    result["load_error"] = load_gs(gs, ckpt)
    fresh.train(range(N, 2 * N))  # the first step restores every rank's residuals from rank 0
    result["resumed"] = fresh.digest()
    # each rank's own residuals are back (not rank 0's): the straight run's and the resumed one's
    result["residuals_straight"] = residuals(trainer, straight_gs.local_state_dict())
    result["residuals_resumed"] = residuals(trainer, gs.local_state_dict())


@SCENARIOS
def mistakes(result: dict, job: Job) -> None:
    """What goes wrong, from the checkpoint :func:`resume` saved under the sketch exchange
    (saved first if it did not run)."""
    hvd, GsSketch, trainer, options = job.hvd, job.GsSketch, job.trainer, SKETCH
    if not hvd.broadcast_object(os.path.exists(job.path("sketch")), root_rank=0, name="ckpt_exists"):
        saved_and_resumed({}, job, SKETCH)
    ckpt = read(hvd, job.path("sketch"))
    # the old mistake, for contrast: rank 0's residuals loaded on every rank
    part0 = hvd.broadcast_object(ckpt["gs"]["ranks"][0] if ckpt is not None else None, root_rank=0, name="part0")
    weights = hvd.broadcast_object(None if ckpt is None else {k: v for k, v in ckpt.items() if k != "gs"},
                                   root_rank=0, name="weights")
    gs = GsSketch(**options)
    part0["rank"] = hvd.rank()
    gs.load_local_state_dict(part0)
    everywhere = trainer(123, gs, weights)
    everywhere.train(range(N, 2 * N))
    result["rank0_everywhere"] = everywhere.digest()

    result["wrong_options_error"] = load_gs(GsSketch(**{**options, "ratio": 0.1, "seed": 3}), ckpt)
    result["local_state_to_collective_error"] = load_gs(
        GsSketch(**options), {"gs": gs.local_state_dict()} if hvd.rank() == 0 else None)
    try:
        GsSketch(**options).load_local_state_dict(ckpt["gs"] if ckpt is not None else gs.local_state_dict())
        result["local_gathered_error"] = None
    except ValueError as e:
        result["local_gathered_error"] = str(e)


@SCENARIOS
def resume_local(result: dict, job: Job) -> None:
    """One file per rank: N steps, ``local_state_dict()`` kept, new objects restored from it,
    N more steps against 2N straight ones; then ``reset()`` and one step."""
    GsSketch, trainer = job.GsSketch, job.trainer
    gs = GsSketch(**SKETCH)
    first = trainer(9, gs)
    first.train(range(N))
    saved = {**first.weights(), "gs": copy.deepcopy(gs.local_state_dict())}
    gs = GsSketch(**SKETCH)
    gs.load_local_state_dict(saved["gs"])
    restored = trainer(123, gs, saved)
    restored.train(range(N, 2 * N))
    result["local_resumed"] = restored.digest()
    gs.reset()  # as a Horovod elastic reset callback would: residuals start again
    after = summary(trainer, gs.local_state_dict())
    result["reset_total"] = sum(v for k, v in after.items() if k != "steps") + sum(after["steps"])
    restored.train(range(2 * N, 2 * N + 1))
    result["reset_then_steps"] = sorted(set(trainer.steps(gs.local_state_dict())))
    try:
        GsSketch(**{**SKETCH, "seed": 1}).load_local_state_dict(saved["gs"])
    except ValueError as e:
        result["local_wrong_options_error"] = str(e)


@SCENARIOS
def resume_mid_warmup(result: dict, job: Job) -> None:
    """One file per rank, saved after N of N + 2 warm-up steps: the resumed run is bitwise the
    straight one (2 more dense steps, then compressed ones)."""
    GsSketch, trainer = job.GsSketch, job.trainer
    options = {**SKETCH, "warmup_steps": N + 2}
    straight = trainer(9, GsSketch(**options))
    straight.train(range(2 * N + 2))
    gs = GsSketch(**options)
    first = trainer(9, gs)
    first.train(range(N))
    saved = {**first.weights(), "gs": copy.deepcopy(gs.local_state_dict())}
    gs = GsSketch(**options)
    gs.load_local_state_dict(saved["gs"])
    restored = trainer(123, gs, saved)
    restored.train(range(N, 2 * N + 2))
    result["warmup_straight"], result["warmup_resumed"] = straight.digest(), restored.digest()
    plain = trainer(123, GsSketch(**options), saved)  # the same weights, no GsSketch state
    plain.train(range(N, 2 * N + 2))
    result["warmup_not_loaded"] = plain.digest()


@SCENARIOS
def other_world_size(result: dict, job: Job) -> None:
    """Loads ``--other``, a checkpoint of another number of ranks."""
    if job.other is None:
        raise SystemExit("other_world_size needs --other CKPT (a checkpoint of another number of ranks)")
    result["world_size_error"] = load_gs(job.GsSketch(**SKETCH), read(job.hvd, job.other))


@SCENARIOS
def class_form(result: dict, job: Job) -> None:
    """``compression=GsSketch`` (the class) against an instance with the same (default) options."""
    GsSketch, trainer = job.GsSketch, job.trainer
    instance = GsSketch()
    for form, gs in (("class", GsSketch), ("instance", instance)):
        run = trainer(11, gs)
        with trainer.counting() as counted:
            run.train(range(3))
        result[f"{form}_counted"] = None if counted is None else counted.engine()
        result[f"{form}_digest"] = run.digest()
        result[f"{form}_params"] = run.flat()
        result[f"{form}_bytes_per_step"] = gs.bytes_per_step(run.variables())
        state = gs.state_dict()
        result[f"{form}_stats"] = asdict(gs.stats)
        result[f"{form}_merge_stats"] = asdict(gs.merge_stats)
        result[f"{form}_gathered_ranks"] = None if state is None else len(state["ranks"])
        local = gs.local_state_dict()
        result[f"{form}_local"] = summary(trainer, local)
        gs.reset()
        after = summary(trainer, gs.local_state_dict())
        result[f"{form}_after_reset"] = sum(v for k, v in after.items() if k != "steps") + sum(after["steps"])
        gs.load_local_state_dict(local)
        result[f"{form}_reloaded"] = summary(trainer, gs.local_state_dict())
        gs.load_state_dict(state)  # rank 0 keeps it for the next step
        gs.reset()  # which this drops


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("framework", choices=("torch", "tf"))
    parser.add_argument("--other", help="a checkpoint written by a run with another number of ranks")
    parser.add_argument("names", nargs="*", metavar="NAME", help=SCENARIOS.known())
    args = parser.parse_intermixed_args(argv)
    trainer = {"torch": TorchTrainer, "tf": TfTrainer}[args.framework]
    names = args.names or (["own"] if args.other is None else [])
    SCENARIOS.selected(names)  # an unknown name ends the job before Horovod starts
    os.makedirs(args.out_dir, exist_ok=True)  # run alone, the worker may be given a new folder
    hvd, GsSketch = trainer.start()
    result: dict = {"rank": hvd.rank(), "size": hvd.size()}
    job = Job(hvd, GsSketch, trainer, args.out_dir, args.other)
    result["scenarios"] = SCENARIOS.run(names, result, job)
    write_result(args.out_dir, hvd.rank(), result)


if __name__ == "__main__":
    main()
