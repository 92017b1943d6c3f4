"""Runs under ``horovodrun`` (torch) or ``torchrun`` (DDP): the checkpoint idioms users already
write, one JSON file per rank (tests/test_idioms.py asserts).

    horovodrun -np P -H localhost:P --gloo python tests/workers/idioms.py OUT_DIR {horovod,tf} EXCHANGE
    torchrun --standalone --nproc_per_node P tests/workers/idioms.py OUT_DIR ddp EXCHANGE
    torchrun --standalone --nproc_per_node P tests/workers/idioms.py OUT_DIR killed EXCHANGE

- save the Horovod way (every rank calls ``state_dict()``, rank 0 writes the file) at step 3 of
  6; a fresh job-like set of objects where **rank 0 alone** loads the file (model, optimizer,
  GsSketch / GsState) as Horovod's examples do, then 3 steps: bitwise the uninterrupted run;
- the same, every rank loading the file; and a rank-0-only load mid-run (a roll-back);
- a state of other options (rank 0 alone): ValueError at once, nothing waits;
- **rank 0 alone** calls ``state_dict()`` (``if rank == 0: save(gs.state_dict())``): a
  RuntimeError on rank 0 within ``checkpoint_timeout``, and the next step raises on every rank;
- ``killed``: rank 1 SIGKILLs itself inside a step; the others must exit (torchrun non-zero).
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


def horovod(out_dir: str, exchange: str) -> None:
    import horovod.torch as hvd
    from torch_scenarios import digest, digits_shard, distributed, mlp, train

    from gs_horovod.torch import GsSketch

    hvd.init()
    torch.set_num_threads(1)
    rank, path = hvd.rank(), os.path.join(out_dir, "checkpoint.pt")
    x, y = digits_shard()
    options = dict(OPTIONS, exchange=exchange)
    result: dict[str, Any] = {"rank": rank}

    def job(**extra: Any) -> tuple[Any, Any, Any]:
        model = mlp(0)
        gs = GsSketch(**options, **extra)
        return model, distributed(model, "idiom.", gs), gs

    model, opt, gs = job()
    train(model, opt, x, y, steps=3)
    gs_state = gs.state_dict()  # every rank
    if rank == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "gs": gs_state}, path)
    train(model, opt, x, y, steps=3)
    result["straight"] = digest(model)

    def resume(model: Any, opt: Any, gs: Any, every_rank: bool, load_gs: bool = True) -> str:
        ckpt = torch.load(path, weights_only=False) if rank == 0 or every_rank else None
        if ckpt is not None and (rank == 0 or every_rank):
            model.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["opt"])
            if load_gs:
                gs.load_state_dict(ckpt["gs"])
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        train(model, opt, x, y, steps=3)
        return digest(model)

    result["rank0_load"] = resume(*job(), every_rank=False)
    result["every_rank_load"] = resume(*job(), every_rank=True)
    result["not_loaded"] = resume(*job(), every_rank=True, load_gs=False)  # the control: GsSketch's state not loaded
    result["rank0_rollback"] = resume(model, opt, gs, every_rank=False)  # the same objects, mid-run

    other = job(seed=1)[2]
    if rank == 0:
        saved = torch.load(path, weights_only=False)["gs"]
        _, result["wrong_options_error"], _ = caught(lambda: other.load_state_dict(saved))

    model, opt, gs = job(checkpoint_timeout=TIMEOUT)
    train(model, opt, x, y, steps=2)
    if rank == 0:
        _, result["alone_save_error"], result["alone_save_seconds"] = caught(gs.state_dict)
    _, result["next_step_error"], _ = caught(lambda: train(model, opt, x, y, steps=1))
    result["waiting_threads"] = waiting_threads()
    write_result(out_dir, rank, result)


def tf(out_dir: str, exchange: str) -> None:
    """The same under ``horovod.tensorflow`` (DistributedGradientTape, checkpoints.TfTrainer)."""
    from checkpoints import TfTrainer

    hvd, GsSketch = TfTrainer.start()
    rank, options = hvd.rank(), dict(OPTIONS, exchange=exchange)
    result: dict[str, Any] = {"rank": rank}
    gs = GsSketch(**options)
    trainer = TfTrainer(0, gs)
    trainer.train(range(3))
    gs_state = gs.state_dict()  # every rank
    weights = trainer.weights() if rank == 0 else None
    trainer.train(range(3, 6))
    result["straight"] = trainer.digest()

    def resume(every_rank: bool, load_gs: bool = True) -> str:
        fresh = GsSketch(**options)
        resumed = TfTrainer(1, fresh, weights, from_rank0=True)
        if load_gs and (rank == 0 or every_rank):
            fresh.load_state_dict(gs_state)  # None on the other ranks
        resumed.train(range(3, 6))
        return resumed.digest()

    result["rank0_load"], result["every_rank_load"] = resume(False), resume(True)
    result["not_loaded"] = resume(True, load_gs=False)  # the control: the weights, not GsSketch's state

    gs = GsSketch(checkpoint_timeout=TIMEOUT, **options)
    trainer = TfTrainer(0, gs)
    trainer.train(range(2))
    if rank == 0:
        _, result["alone_save_error"], result["alone_save_seconds"] = caught(gs.state_dict)
    _, result["next_step_error"], _ = caught(lambda: trainer.train(range(2, 3)))
    write_result(out_dir, rank, result)


def ddp(out_dir: str, exchange: str) -> None:
    import torch.distributed as dist
    from ddp_scenarios import ddp as wrap
    from ddp_scenarios import digest, mlp, run

    from gs_horovod.ddp import GsState

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, path = dist.get_rank(), os.path.join(out_dir, "checkpoint.pt")
    options = dict(OPTIONS, exchange=exchange)
    result: dict[str, Any] = {"rank": rank}

    module = mlp(0)
    state = GsState(**options)  # PowerSGDState's idiom: no model, the default group
    model = wrap(module, state)
    run(module, model, range(3), rank)
    gs_state = state.state_dict()  # every rank
    if rank == 0:
        torch.save({"model": module.state_dict(), "gs": gs_state}, path)
    run(module, model, range(3, 6), rank)
    result["straight"] = digest(module)
    result["keys"] = sorted(state.local_state_dict()["tensors"])

    def resume(every_rank: bool, named: bool = False, load_gs: bool = True) -> tuple[str | None, str | None]:
        fresh = mlp(1)  # other weights: only the checkpoint (through DDP's broadcast) can make them equal
        ckpt = torch.load(path, weights_only=False) if rank == 0 or every_rank else None
        restored = GsState(model=fresh, **options) if named else GsState(**options)
        error = None
        if ckpt is not None:
            fresh.load_state_dict(ckpt["model"])  # before DDP: its constructor broadcasts rank 0's weights
            if load_gs:
                _, error, _ = caught(lambda: restored.load_state_dict(ckpt["gs"]))
        if named:
            return None, error
        run(fresh, wrap(fresh, restored), range(3, 6), rank)
        return digest(fresh), error

    result["rank0_load"], _ = resume(every_rank=False)
    result["every_rank_load"], _ = resume(every_rank=True)
    result["not_loaded"], _ = resume(every_rank=True, load_gs=False)  # the control: GsState's state not loaded
    _, result["named_into_order_error"] = resume(every_rank=False, named=True)

    module = mlp(0)
    state = GsState(checkpoint_timeout=TIMEOUT, **options)
    model = wrap(module, state)
    run(module, model, range(2), rank)
    if rank == 0:
        _, result["alone_save_error"], result["alone_save_seconds"] = caught(state.state_dict)
    _, result["next_step_error"], _ = caught(lambda: run(module, model, range(2, 3), rank))
    result["waiting_threads"] = waiting_threads()
    write_result(out_dir, rank, result)


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


if __name__ == "__main__":
    out, mode, exchange = sys.argv[1:4]
    {"horovod": horovod, "tf": tf, "ddp": ddp, "killed": killed}[mode](out, exchange)
