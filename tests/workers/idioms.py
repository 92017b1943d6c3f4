"""Runs under ``horovodrun`` (torch, TF) or ``torchrun`` (DDP): the checkpoint idioms users
already write, one JSON file per rank (tests/test_idioms.py asserts).

    horovodrun -np P -H localhost:P --gloo python tests/workers/idioms.py OUT_DIR {horovod,tf} EXCHANGE [NAME ...]
    torchrun --standalone --nproc_per_node P tests/workers/idioms.py OUT_DIR ddp EXCHANGE [NAME ...]
    torchrun --standalone --nproc_per_node P tests/workers/idioms.py OUT_DIR killed EXCHANGE

NAME: any number of the mode's scenarios (none: all of them), e.g. the rank-0-only save alone:

    horovodrun -np 2 -H localhost:2 --gloo python tests/workers/idioms.py /tmp/out horovod sparse alone_save

- ``resume``: save the Horovod way (every rank calls ``state_dict()``, rank 0 writes the file)
  at step 3 of 6; a fresh job-like set of objects where **rank 0 alone** loads the file (model,
  optimizer, GsSketch / GsState) as Horovod's examples do, then 3 steps: bitwise the
  uninterrupted run; the same, every rank loading the file; the control, not loading it;
- ``rollback`` (horovod): a rank-0-only load mid-run, into the uninterrupted run's objects;
- ``wrong_options`` (horovod, ddp): a state of other options (ddp: of named tensors into one
  keyed by order) loaded on rank 0 alone: ValueError at once, nothing waits;
- ``alone_save``: **rank 0 alone** calls ``state_dict()`` (``if rank == 0: save(gs.state_dict())``):
  a RuntimeError on rank 0 within ``checkpoint_timeout``, and the next step raises on every rank;
- ``killed`` (one scenario per launch): rank 1 SIGKILLs itself inside a step; the others must
  exit (torchrun non-zero).

``resume``, ``rollback`` and ``wrong_options`` share the save (done once, by the first of them
to run); each records the uninterrupted run's digest as ``straight``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

import torch
from rank_result import write_result
from scenario import Scenarios

TIMEOUT = 5.0  # checkpoint_timeout of the rank-0-only save (seconds)
OPTIONS = dict(ratio=0.05, min_size=64)


def caught(fn: Any) -> tuple[Any, str | None, float]:
    """(fn()'s value or None, the error text or None, seconds it took)."""
    start = time.monotonic()
    try:
        return fn(), None, time.monotonic() - start
    except Exception as error:  # the message is the result
        return None, f"{type(error).__name__}: {error}", time.monotonic() - start


def waiting_threads() -> list[str]:
    """The threads of gs_horovod alive now (a checkpoint arrival that timed out must leave none
    waiting where the framework can poll: such a waiter can abort the rank at exit)."""
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("gs_horovod"))


class Horovod:
    """horovodrun, torch: Horovod's DistributedOptimizer with GsSketch."""

    scenarios = Scenarios()

    def __init__(self, out_dir: str, exchange: str) -> None:
        import horovod.torch as hvd
        from torch_scenarios import digits_shard

        hvd.init()
        torch.set_num_threads(1)
        self.hvd, self.rank, self.path = hvd, hvd.rank(), os.path.join(out_dir, "checkpoint.pt")
        self.x, self.y = digits_shard()
        self.options = dict(OPTIONS, exchange=exchange)
        self.straight: tuple[str, Any, Any, Any] | None = None

    def job(self, **extra: Any) -> tuple[Any, Any, Any]:
        from torch_scenarios import distributed, mlp

        from gs_horovod.torch import GsSketch

        model = mlp(0)
        gs = GsSketch(**self.options, **extra)
        return model, distributed(model, "idiom.", gs), gs

    def train(self, model: Any, opt: Any, steps: int) -> None:
        from torch_scenarios import train

        train(model, opt, self.x, self.y, steps=steps)

    def saved(self, result: dict) -> tuple[Any, Any, Any]:
        """3 steps, every rank calls ``state_dict()``, rank 0 writes the file, 3 more steps
        (once); records their digest as ``straight``; the objects of that run."""
        from torch_scenarios import digest

        if self.straight is None:
            model, opt, gs = self.job()
            self.train(model, opt, 3)
            gs_state = gs.state_dict()  # every rank
            if self.rank == 0:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "gs": gs_state}, self.path)
            self.train(model, opt, 3)
            self.straight = (digest(model), model, opt, gs)
        result["straight"] = self.straight[0]
        return self.straight[1:]

    def resumed(self, model: Any, opt: Any, gs: Any, every_rank: bool, load_gs: bool = True) -> str:
        from torch_scenarios import digest

        ckpt = torch.load(self.path, weights_only=False) if self.rank == 0 or every_rank else None
        if ckpt is not None:
            model.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["opt"])
            if load_gs:
                gs.load_state_dict(ckpt["gs"])
        self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        self.hvd.broadcast_optimizer_state(opt, root_rank=0)
        self.train(model, opt, 3)
        return digest(model)

    @scenarios
    def resume(self, result: dict) -> None:
        self.saved(result)
        result["rank0_load"] = self.resumed(*self.job(), every_rank=False)
        result["every_rank_load"] = self.resumed(*self.job(), every_rank=True)
        # the control: GsSketch's state not loaded
        result["not_loaded"] = self.resumed(*self.job(), every_rank=True, load_gs=False)

    @scenarios
    def rollback(self, result: dict) -> None:
        result["rank0_rollback"] = self.resumed(*self.saved(result), every_rank=False)  # the same objects, mid-run

    @scenarios
    def wrong_options(self, result: dict) -> None:
        self.saved(result)
        other = self.job(seed=1)[2]
        if self.rank == 0:
            saved = torch.load(self.path, weights_only=False)["gs"]
            _, result["wrong_options_error"], _ = caught(lambda: other.load_state_dict(saved))

    @scenarios
    def alone_save(self, result: dict) -> None:
        model, opt, gs = self.job(checkpoint_timeout=TIMEOUT)
        self.train(model, opt, 2)
        if self.rank == 0:
            _, result["alone_save_error"], result["alone_save_seconds"] = caught(gs.state_dict)
        _, result["next_step_error"], _ = caught(lambda: self.train(model, opt, 1))
        result["waiting_threads"] = waiting_threads()


class Tf:
    """The same under ``horovod.tensorflow`` (DistributedGradientTape, checkpoints.TfTrainer);
    the checkpoint stays in memory."""

    scenarios = Scenarios()

    def __init__(self, out_dir: str, exchange: str) -> None:
        from checkpoints import TfTrainer

        self.hvd, self.GsSketch = TfTrainer.start()
        self.rank, self.options = self.hvd.rank(), dict(OPTIONS, exchange=exchange)
        self.straight: tuple[str, Any, Any] | None = None

    def saved(self, result: dict) -> tuple[Any, Any]:
        """3 steps, every rank calls ``state_dict()``, rank 0 keeps the weights, 3 more steps
        (once); records their digest as ``straight``; the state and the weights kept."""
        from checkpoints import TfTrainer

        if self.straight is None:
            gs = self.GsSketch(**self.options)
            trainer = TfTrainer(0, gs)
            trainer.train(range(3))
            gs_state = gs.state_dict()  # every rank
            weights = trainer.weights() if self.rank == 0 else None
            trainer.train(range(3, 6))
            self.straight = (trainer.digest(), gs_state, weights)
        result["straight"] = self.straight[0]
        return self.straight[1:]

    def resumed(self, gs_state: Any, weights: Any, every_rank: bool, load_gs: bool = True) -> str:
        from checkpoints import TfTrainer

        fresh = self.GsSketch(**self.options)
        resumed = TfTrainer(1, fresh, weights, from_rank0=True)
        if load_gs and (self.rank == 0 or every_rank):
            fresh.load_state_dict(gs_state)  # None on the other ranks
        resumed.train(range(3, 6))
        return resumed.digest()

    @scenarios
    def resume(self, result: dict) -> None:
        saved = self.saved(result)
        result["rank0_load"], result["every_rank_load"] = self.resumed(*saved, False), self.resumed(*saved, True)
        # the control: the weights, not GsSketch's state
        result["not_loaded"] = self.resumed(*saved, True, load_gs=False)

    @scenarios
    def alone_save(self, result: dict) -> None:
        from checkpoints import TfTrainer

        gs = self.GsSketch(checkpoint_timeout=TIMEOUT, **self.options)
        trainer = TfTrainer(0, gs)
        trainer.train(range(2))
        if self.rank == 0:
            _, result["alone_save_error"], result["alone_save_seconds"] = caught(gs.state_dict)
        _, result["next_step_error"], _ = caught(lambda: trainer.train(range(2, 3)))


class Ddp:
    """torchrun: DDP with GsState as its communication hook."""

    scenarios = Scenarios()

    def __init__(self, out_dir: str, exchange: str) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        torch.set_num_threads(1)
        self.rank, self.path = dist.get_rank(), os.path.join(out_dir, "checkpoint.pt")
        self.options = dict(OPTIONS, exchange=exchange)
        self.straight: tuple[str, list[str]] | None = None

    def saved(self, result: dict) -> None:
        """3 steps, every rank calls ``state_dict()``, rank 0 writes the file, 3 more steps
        (once); records their digest as ``straight`` and the state's tensor keys."""
        from ddp_scenarios import ddp as wrap
        from ddp_scenarios import digest, mlp, run

        from gs_horovod.ddp import GsState

        if self.straight is None:
            module = mlp(0)
            state = GsState(**self.options)  # PowerSGDState's idiom: no model, the default group
            model = wrap(module, state)
            run(module, model, range(3), self.rank)
            gs_state = state.state_dict()  # every rank
            if self.rank == 0:
                torch.save({"model": module.state_dict(), "gs": gs_state}, self.path)
            run(module, model, range(3, 6), self.rank)
            self.straight = (digest(module), sorted(state.local_state_dict()["tensors"]))
        result["straight"], result["keys"] = self.straight

    def resumed(self, every_rank: bool, named: bool = False, load_gs: bool = True) -> tuple[str | None, str | None]:
        from ddp_scenarios import ddp as wrap
        from ddp_scenarios import digest, mlp, run

        from gs_horovod.ddp import GsState

        fresh = mlp(1)  # other weights: only the checkpoint (through DDP's broadcast) can make them equal
        ckpt = torch.load(self.path, weights_only=False) if self.rank == 0 or every_rank else None
        restored = GsState(model=fresh, **self.options) if named else GsState(**self.options)
        error = None
        if ckpt is not None:
            fresh.load_state_dict(ckpt["model"])  # before DDP: its constructor broadcasts rank 0's weights
            if load_gs:
                _, error, _ = caught(lambda: restored.load_state_dict(ckpt["gs"]))
        if named:
            return None, error
        run(fresh, wrap(fresh, restored), range(3, 6), self.rank)
        return digest(fresh), error

    @scenarios
    def resume(self, result: dict) -> None:
        self.saved(result)
        result["rank0_load"], _ = self.resumed(every_rank=False)
        result["every_rank_load"], _ = self.resumed(every_rank=True)
        # the control: GsState's state not loaded
        result["not_loaded"], _ = self.resumed(every_rank=True, load_gs=False)

    @scenarios
    def wrong_options(self, result: dict) -> None:
        self.saved(result)
        _, result["named_into_order_error"] = self.resumed(every_rank=False, named=True)

    @scenarios
    def alone_save(self, result: dict) -> None:
        from ddp_scenarios import ddp as wrap
        from ddp_scenarios import mlp, run

        from gs_horovod.ddp import GsState

        module = mlp(0)
        state = GsState(checkpoint_timeout=TIMEOUT, **self.options)
        model = wrap(module, state)
        run(module, model, range(2), self.rank)
        if self.rank == 0:
            _, result["alone_save_error"], result["alone_save_seconds"] = caught(state.state_dict)
        _, result["next_step_error"], _ = caught(lambda: run(module, model, range(2, 3), self.rank))
        result["waiting_threads"] = waiting_threads()


def killed(out_dir: str, exchange: str) -> None:
    """Rank 1 SIGKILLs itself inside its third step's hook (mid-step: its buckets recorded, the
    exchange not begun); the others wait in that step's collectives."""
    import torch.distributed as dist
    from ddp_scenarios import ddp as wrap
    from ddp_scenarios import mlp, run

    from gs_horovod.ddp import GsState

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    module = mlp(0)
    state = GsState(**OPTIONS, exchange=exchange)
    finish = state._finish

    def finish_or_die() -> None:
        if rank == 1 and state.engine.steps == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        finish()

    state._finish = finish_or_die
    run(module, wrap(module, state), range(1000), rank)
    write_result(out_dir, rank, {"rank": rank, "finished": True})  # not reached: the job is torn down


MODES = {"horovod": Horovod, "tf": Tf, "ddp": Ddp}


def main(out_dir: str, mode: str, exchange: str, *names: str) -> None:
    if mode == "killed":
        if names:
            raise SystemExit("killed is one scenario per launch: OUT_DIR killed EXCHANGE")
        killed(out_dir, exchange)
        return
    if mode not in MODES:
        raise SystemExit(f"unknown mode {mode!r}; modes: {' '.join(MODES)} killed")
    cls = MODES[mode]
    cls.scenarios.selected(names)  # an unknown name ends the job before the ranks meet
    os.makedirs(out_dir, exist_ok=True)  # run alone, the worker may be given a new folder
    job = cls(out_dir, exchange)
    result: dict[str, Any] = {"rank": job.rank}
    result["scenarios"] = cls.scenarios.run(names, job, result)
    write_result(out_dir, job.rank, result)


if __name__ == "__main__":
    main(*sys.argv[1:])
