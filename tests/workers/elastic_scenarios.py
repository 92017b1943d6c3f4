"""Runs under ``horovodrun --gloo --min-np 1 --max-np 3 --host-discovery-script``: GsSketch in
Horovod elastic state while a worker is killed and a slot is added (tests/test_elastic.py starts
it and asserts). ``torch``: ``hvd.elastic.TorchState(model, optimizer, gs=compression)``;
``tf``: ``GsKerasState(model, optimizer, compression=gs)`` with a DistributedGradientTape step
in a ``tf.function`` that a reset callback builds again.

    horovodrun --gloo -np 2 --min-np 1 --max-np 3 --host-discovery-script DISCOVER \\
        python tests/workers/elastic_scenarios.py OUT_DIR {torch,tf} HOSTS_FILE KILL_AT ADD_AT STEPS [REMOVE_AT]

Two workers start, on hosts "localhost" and "127.0.0.1" (both this machine; Horovod blacklists
the host of a failed worker). Every ``COMMIT_EVERY`` steps the state is committed. After step
``KILL_AT`` the worker on 127.0.0.1 sends itself SIGKILL (once: a marker file); after step
``ADD_AT`` (0: never) rank 0 rewrites HOSTS_FILE to give localhost a second slot, and training
goes on (slowly) until the new worker has joined; after ``REMOVE_AT`` rank 0 drops 127.0.0.1 from
HOSTS_FILE (a graceful removal: Horovod resets without a sync) and training goes on (slowly)
until the world has shrunk. Every ``train(state)`` takes at least 3 steps. Each process appends what it saw, one JSON
object a line, to ``OUT_DIR/events.<pid>.jsonl``:

- ``commit``: the step, this rank's residual checksum and mass Σ e², gs steps (just before it);
- ``synced``: at the start of each ``train(state)`` (after a sync): ranks, rank, the residual
  checksum and mass, gs steps, the tensors held, the lost residual so far;
- ``stale`` (tf, more than one rank): what the step traced before the reset raised;
- ``planned``: after the first step that follows, every rank's plan as each gathered it;
- ``done``: the model's digest, ranks, steps.

Under plain ``horovodrun -np 2`` (no elastic driver), ``OUT_DIR commit_alone``: rank 0 alone
calls ``state.commit()`` (one JSON result a rank: what the commit and the next step raised).

One scenario per launch: the elastic arguments above, or ``OUT_DIR commit_alone``.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
from rank_result import write_result
from sklearn.datasets import load_digits

COMMIT_EVERY = 3
OPTIONS = dict(ratio=0.05, min_size=64)


def digits() -> tuple[np.ndarray, np.ndarray]:
    x, y = load_digits(return_X_y=True)
    return x.astype(np.float32) / 16.0, y.astype(np.int64)


def batch_of(step: int, rank: int, n: int) -> np.ndarray:
    return np.random.default_rng(1000 * step + rank).integers(0, n, 32)


def sha(arrays: list[np.ndarray]) -> str:
    return hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)).hexdigest()


class TorchJob:
    """The digits MLP under horovod.torch: ``TorchState(model, optimizer, step=0, gs=gs)``."""

    def __init__(self, options: dict[str, Any]) -> None:
        import horovod.torch as hvd
        import torch
        from torch_scenarios import mlp

        from gs_horovod.torch import GsSketch

        hvd.init()
        torch.set_num_threads(1)
        self.hvd, self.torch = hvd, torch
        x, y = digits()
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)
        self.model = mlp(0)
        self.gs = GsSketch(**options)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(self.model.parameters(), lr=0.1),
                                       named_parameters=self.model.named_parameters(), compression=self.gs)
        self.state = hvd.elastic.TorchState(self.model, opt, step=0, gs=self.gs)
        self.run = hvd.elastic.run

    def step(self, step: int) -> None:
        import torch.nn.functional as F

        idx = self.torch.from_numpy(batch_of(step, self.hvd.rank(), len(self.x)))
        self.state.optimizer.zero_grad()
        F.cross_entropy(self.state.model(self.x[idx]), self.y[idx]).backward()
        self.state.optimizer.step()

    def residuals(self) -> tuple[list[np.ndarray], list[int]]:
        tensors = self.gs.local_state_dict()["tensors"]
        steps = sorted({int(t["steps"]) for t in tensors.values()})
        return [tensors[n]["residual"].numpy() for n in sorted(tensors)], steps

    def plan(self) -> list[Any]:
        """The plan of the step just taken, and the ranks its collectives span."""
        (engine, _), = self.gs._states.values()
        return [list(engine.plan.names), engine.plan.exchange, [g.k for g in engine.plan.groups], engine.plan.ranks,
                engine.sgd.comm.size]

    def model_digest(self) -> str:
        return sha([p.detach().numpy() for p in self.model.parameters()])


class TfJob:
    """A Keras MLP under horovod.tensorflow: ``GsKerasState(model, optimizer, compression=gs,
    step=0)``; the step is a ``tf.function`` around a DistributedGradientTape, built again by a
    reset callback."""

    def __init__(self, options: dict[str, Any]) -> None:
        os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
        import horovod.tensorflow as hvd
        import tensorflow as tf

        from gs_horovod.tensorflow import GsKerasState, GsSketch

        hvd.init()
        self.hvd, self.tf = hvd, tf
        self.x, self.y = digits()
        tf.keras.utils.set_random_seed(0)
        self.model = tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu", input_shape=(64,)),
                                          tf.keras.layers.Dense(32, activation="relu"), tf.keras.layers.Dense(10)])
        self.opt = tf.keras.optimizers.SGD(0.1)
        self.opt.apply_gradients([(tf.zeros_like(v), v) for v in self.model.trainable_variables])  # its variables
        self.gs = GsSketch(**options)
        self.traced = self.trace()
        self.state = GsKerasState(self.model, self.opt, compression=self.gs, step=0)
        self.stale: Callable[..., Any] | None = None
        self.state.register_reset_callbacks([self.retrace])
        self.run = hvd.elastic.run

    def trace(self) -> Callable[..., Any]:
        tf, hvd = self.tf, self.hvd

        def step(xb: Any, yb: Any) -> Any:
            with tf.GradientTape() as tape:
                logits = self.model(xb, training=True)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(yb, logits))
            tape = hvd.DistributedGradientTape(tape, compression=self.gs)
            variables = self.model.trainable_variables
            self.opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
            return loss

        return tf.function(step)

    def retrace(self) -> None:
        self.stale, self.traced = self.traced, self.trace()

    def stale_step_error(self, step: int) -> str | None:
        """What the step traced before the last reset raises now (None: it ran)."""
        from idioms import caught

        idx = batch_of(step, self.hvd.rank(), len(self.x))
        return caught(lambda: self.stale(self.x[idx], self.y[idx]))[1]

    def step(self, step: int) -> None:
        idx = batch_of(step, self.hvd.rank(), len(self.x))
        self.traced(self.x[idx], self.y[idx])

    def residuals(self) -> tuple[list[np.ndarray], list[int]]:
        state = self.gs.local_state_dict()
        variables = state["variables"]
        return [np.asarray(variables[p]["residual"]) for p in sorted(variables)], sorted(set(state["steps"].values()))

    def plan(self) -> list[Any]:
        """The collectives a step plans now (TF keeps no plan object) and the ranks."""
        return [self.gs.collectives_per_step(self.model.trainable_variables), self.hvd.size()]

    def model_digest(self) -> str:
        return sha(self.model.get_weights())


def elastic(out_dir: str, framework: str, hosts_file: str, kill_at: int, add_at: int, steps: int,
            remove_at: int = 0, options: str = "") -> None:
    """``options``: GsSketch's as JSON (default :data:`OPTIONS`)."""
    options = json.loads(options) if options else OPTIONS
    job = TorchJob(options) if framework == "torch" else TfJob(options)
    hvd, gs = job.hvd, job.gs
    events = Path(out_dir) / f"events.{os.getpid()}.jsonl"

    def log(kind: str, **fields: Any) -> None:
        with events.open("a") as f:
            f.write(json.dumps({"event": kind, **fields}) + "\n")

    def residual_record() -> dict[str, Any]:
        residuals, gs_steps = job.residuals()
        mass = float(sum(np.square(r, dtype=np.float64).sum() for r in residuals))
        return {"residual": sha(residuals), "mass": mass, "gs_steps": gs_steps, "tensors": len(residuals)}

    job.state.register_reset_callbacks([lambda: log("reset", ranks=hvd.size())])

    @job.run
    def train(state: Any) -> None:
        log("synced", ranks=hvd.size(), rank=hvd.rank(), step=state.step, lost_residual=gs.stats.lost_residual,
            **residual_record())
        if isinstance(job, TfJob) and job.stale is not None and hvd.size() > 1:  # one rank: Horovod skips GsSketch
            log("stale", ranks=hvd.size(), error=job.stale_step_error(state.step))
        first = True
        waiting = (lambda: add_at and hvd.size() < 2) if add_at else (lambda: remove_at and hvd.size() > 1)
        taken = 0
        while state.step < steps or waiting() or taken < 3:  # after a change: until the world has changed,
            if state.step > (add_at or remove_at) and waiting():  # and 3 steps in every world
                time.sleep(0.2)  # Horovod's driver polls the discovery script about once a second
            taken += 1
            job.step(state.step)
            state.step += 1
            log("stepped", step=state.step, ranks=hvd.size(), density=gs.stats.density)
            if first:
                log("planned", ranks=hvd.size(), rank=hvd.rank(), plans=hvd.allgather_object(job.plan()))
                first = False
            if state.step % COMMIT_EVERY == 0:
                log("commit", step=state.step, **residual_record())
                state.commit()  # saves, then may raise HostsUpdatedInterrupt
            if state.step == kill_at and os.environ.get("HOROVOD_HOSTNAME") == "127.0.0.1":
                marker = Path(out_dir) / "killed"
                if not marker.exists():
                    marker.write_text(str(os.getpid()))
                    log("killing", step=state.step)
                    os.kill(os.getpid(), signal.SIGKILL)
            if state.step == add_at and hvd.rank() == 0:
                Path(hosts_file).write_text("localhost:2\n127.0.0.1:1\n")
                log("added", step=state.step)
            if state.step == remove_at and hvd.rank() == 0:
                Path(hosts_file).write_text("localhost:1\n")
                log("removed", step=state.step)

    train(job.state)
    log("done", ranks=hvd.size(), rank=hvd.rank(), step=job.state.step, model=job.model_digest(),
        lost_residual=gs.stats.lost_residual)


def commit_alone(out_dir: str) -> None:
    """Rank 0 alone commits: RuntimeError on rank 0 within checkpoint_timeout, then every
    rank's next step raises."""
    from idioms import caught

    job = TorchJob(OPTIONS)
    job.gs.checkpoint_timeout = 3.0
    job.step(0)
    result: dict[str, Any] = {"rank": job.hvd.rank()}
    if job.hvd.rank() == 0:
        _, result["commit_error"], result["commit_seconds"] = caught(job.state.commit)
    _, result["next_step_error"], _ = caught(lambda: job.step(1))
    write_result(out_dir, job.hvd.rank(), result)


if __name__ == "__main__":
    if sys.argv[2:] == ["commit_alone"]:
        commit_alone(sys.argv[1])
    else:
        elastic(sys.argv[1], sys.argv[2], sys.argv[3], *map(int, sys.argv[4:8]), *sys.argv[8:9])
