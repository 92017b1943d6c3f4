"""Runs under ``horovodrun --gloo --min-np 1 --max-np 3 --host-discovery-script``: GsSketch in
Horovod elastic state (``TorchState(model, optimizer, gs=compression)``) while a worker is
killed and a slot is added (tests/test_elastic.py starts it and asserts).

    horovodrun --gloo -np 2 --min-np 1 --max-np 3 --host-discovery-script DISCOVER \\
        python tests/workers/elastic_scenarios.py OUT_DIR HOSTS_FILE KILL_AT ADD_AT STEPS

Two workers start, on hosts "localhost" and "127.0.0.1" (both this machine; Horovod blacklists
the host of a failed worker). Every ``COMMIT_EVERY`` steps the state is committed. After step
``KILL_AT`` the worker on 127.0.0.1 sends itself SIGKILL (once: a marker file); after step
``ADD_AT`` (0: never) rank 0 rewrites HOSTS_FILE to give localhost a second slot, and training
goes on (slowly) until the new worker has joined. Each process
appends what it saw, one JSON object a line, to ``OUT_DIR/events.<pid>.jsonl``:

- ``commit``: the step, this rank's residual checksum and mass Σ e², gs steps;
- ``synced``: at the start of each ``train(state)`` (after a sync): ranks, rank, the residual
  checksum and mass, gs steps, the tensors held, the lost residual so far;
- ``planned``: after the first step that follows, every rank's plan as rank 0 gathered it;
- ``done``: the model's digest, ranks, steps.

Under plain ``horovodrun -np 2`` (no elastic driver), ``OUT_DIR commit_alone``: rank 0 alone
calls ``state.commit()`` (one JSON result a rank: what the commit and the next step raised).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from idioms import caught
from rank_result import write_result
from sklearn.datasets import load_digits
from torch_scenarios import digest, mlp

from gs_horovod.torch import GsSketch

COMMIT_EVERY = 3
OPTIONS = dict(ratio=0.05, min_size=64)


def residual_digest(gs: GsSketch) -> tuple[str, float, list[int]]:
    """(sha256 of this rank's residuals in name order, Σ e², the steps of each tensor)."""
    tensors = gs.local_state_dict()["tensors"]
    names = sorted(tensors)
    data = b"".join(tensors[n]["residual"].numpy().tobytes() for n in names)
    mass = float(sum(float(tensors[n]["residual"].double().square().sum()) for n in names))
    return hashlib.sha256(data).hexdigest(), mass, sorted({int(tensors[n]["steps"]) for n in names})


def main(out_dir: str, hosts_file: str, kill_at: int, add_at: int, steps: int) -> None:
    hvd.init()
    torch.set_num_threads(1)
    events = Path(out_dir) / f"events.{os.getpid()}.jsonl"

    def log(kind: str, **fields: Any) -> None:
        with events.open("a") as f:
            f.write(json.dumps({"event": kind, **fields}) + "\n")

    x, y = load_digits(return_X_y=True)
    x, y = torch.from_numpy(x.astype("float32") / 16.0), torch.from_numpy(y)
    model = mlp(0)
    gs = GsSketch(**OPTIONS)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), compression=gs)
    state = hvd.elastic.TorchState(model, opt, step=0, gs=gs)
    state.register_reset_callbacks([lambda: log("reset", ranks=hvd.size())])

    @hvd.elastic.run
    def train(state: Any) -> None:
        checksum, mass, gs_steps = residual_digest(gs)
        log("synced", ranks=hvd.size(), rank=hvd.rank(), step=state.step, residual=checksum, mass=mass,
            gs_steps=gs_steps, tensors=len(gs.local_state_dict()["tensors"]), lost_residual=gs.stats.lost_residual)
        first = True
        while state.step < steps or (add_at and hvd.size() < 2):  # after the add: until the joiner is in
            if add_at and state.step > add_at and hvd.size() < 2:
                time.sleep(0.2)  # Horovod's driver polls the discovery script about once a second
            g = torch.Generator().manual_seed(1000 * state.step + hvd.rank())
            idx = torch.randint(0, len(x), (32,), generator=g)
            state.optimizer.zero_grad()
            F.cross_entropy(state.model(x[idx]), y[idx]).backward()
            state.optimizer.step()
            state.step += 1
            if first:
                (engine, _), = gs._states.values()
                plan = engine.plan
                plans = hvd.allgather_object([plan.names, plan.exchange, [g.k for g in plan.groups], plan.ranks,
                                              engine.engine.comm.size])
                log("planned", ranks=hvd.size(), rank=hvd.rank(), plans=plans)
                first = False
            if state.step % COMMIT_EVERY == 0:
                checksum, mass, gs_steps = residual_digest(gs)
                log("commit", step=state.step, residual=checksum, mass=mass, gs_steps=gs_steps)
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

    train(state)
    log("done", ranks=hvd.size(), rank=hvd.rank(), step=state.step, model=digest(model),
        lost_residual=gs.stats.lost_residual)


def commit_alone(out_dir: str) -> None:
    """Rank 0 alone commits: RuntimeError on rank 0 within checkpoint_timeout, then every
    rank's next step raises."""
    hvd.init()
    torch.set_num_threads(1)
    x, y = load_digits(return_X_y=True)
    x, y = torch.from_numpy(x.astype("float32") / 16.0), torch.from_numpy(y)
    model = mlp(0)
    gs = GsSketch(checkpoint_timeout=3.0, **OPTIONS)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), compression=gs)
    state = hvd.elastic.TorchState(model, opt, gs=gs)

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(x[:32]), y[:32]).backward()
        opt.step()

    step()
    result: dict[str, Any] = {"rank": hvd.rank()}
    if hvd.rank() == 0:
        _, result["commit_error"], result["commit_seconds"] = caught(state.commit)
    _, result["next_step_error"], _ = caught(step)
    write_result(out_dir, hvd.rank(), result)


if __name__ == "__main__":
    if sys.argv[2:] == ["commit_alone"]:
        commit_alone(sys.argv[1])
    else:
        main(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6]))
