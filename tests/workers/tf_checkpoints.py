"""Runs under ``horovodrun``: TensorFlow checkpoints saved the Horovod way (rank 0 writes
one file) and the class form of GsSketch, on real ranks; one JSON per rank.

    horovodrun -np 2 -H localhost:2 --gloo python tests/workers/tf_checkpoints.py OUT_DIR [OTHER_CKPT]

OTHER_CKPT: a checkpoint written by a run with another number of ranks (its GsSketch state
must be refused on every rank). Rank 0 writes ``OUT_DIR/checkpoint.pt`` (a pickle).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # as tf_scenarios: Horovod 0.28.1's Keras layer needs tf-keras

import json  # noqa: E402
import pickle  # noqa: E402
import sys  # noqa: E402
from dataclasses import asdict  # noqa: E402

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from tf_scenarios import Mlp, digest, make_step, run  # noqa: E402

from gs_horovod.tensorflow import GsSketch  # noqa: E402

OPTIONS = dict(ratio=0.05, min_size=64, momentum=0.5)
N = 4


def load_gs(gs: GsSketch, ckpt: dict | None) -> str | None:
    """``gs.load_state_dict`` as every rank calls it; the error text, if any."""
    try:
        gs.load_state_dict(ckpt["gs"] if ckpt is not None else None)
    except ValueError as e:
        return str(e)
    return None


def read(path: str) -> dict | None:
    if hvd.rank() != 0:
        return None
    with open(path, "rb") as f:
        return pickle.load(f)


def resume(result: dict, x, y, path: str) -> None:
    """2N steps straight vs N steps, saved by rank 0 only, fresh objects, N more steps."""
    model = Mlp(2)
    run(model, make_step(model, GsSketch(**OPTIONS)), x, y, range(2 * N))
    result["straight"] = digest(model)

    model, gs = Mlp(2), GsSketch(**OPTIONS)
    run(model, make_step(model, gs), x, y, range(N))
    gs_state = gs.state_dict()  # a collective: every rank calls it
    result["state_dict_is_none"] = gs_state is None
    if hvd.rank() == 0:
        with open(path, "wb") as f:
            pickle.dump({"model": [v.numpy() for v in model.variables], "gs": gs_state}, f)
    own = gs.local_state_dict()["variables"]

    # a fresh process would start here: new objects, only rank 0 reads the file
    hvd.allreduce(tf.constant(0.0), name="file_written")  # the file is complete before anyone reads it
    ckpt = read(path)
    model, gs = Mlp(99), GsSketch(**OPTIONS)
    if ckpt is not None:
        for v, value in zip(model.variables, ckpt["model"]):
            v.assign(value)
    hvd.broadcast_variables(model.variables, root_rank=0)
    result["load_error"] = load_gs(gs, ckpt)
    restored = gs.local_state_dict()["variables"]  # not created yet: held until the first step
    result["own_residuals_back"] = sorted(restored) == sorted(own) and all(
        np.array_equal(restored[n]["residual"], own[n]["residual"]) for n in own)
    run(model, make_step(model, gs), x, y, range(N, 2 * N))
    result["resumed"] = digest(model)
    result["resumed_steps"] = sorted(gs.local_state_dict()["steps"].values())

    # the old mistake, for contrast: rank 0's residuals loaded on every rank
    part0 = hvd.broadcast_object(ckpt["gs"]["ranks"][0] if ckpt is not None else None, root_rank=0, name="part0")
    weights = hvd.broadcast_object(ckpt["model"] if ckpt is not None else None, root_rank=0, name="model")
    model, gs = Mlp(99), GsSketch(**OPTIONS)
    for v, value in zip(model.variables, weights):
        v.assign(value)
    gs.load_local_state_dict(part0)
    run(model, make_step(model, gs), x, y, range(N, 2 * N))
    result["rank0_everywhere"] = digest(model)

    result["wrong_options_error"] = load_gs(GsSketch(**{**OPTIONS, "ratio": 0.1, "seed": 3}), ckpt)
    result["local_state_to_collective_error"] = load_gs(
        GsSketch(**OPTIONS), {"gs": gs.local_state_dict()} if hvd.rank() == 0 else None)
    try:
        GsSketch(**OPTIONS).load_local_state_dict(ckpt["gs"] if ckpt is not None else gs.local_state_dict())
        result["local_gathered_error"] = None
    except ValueError as e:
        result["local_gathered_error"] = str(e)


def other_world_size(result: dict, path: str) -> None:
    result["world_size_error"] = load_gs(GsSketch(**OPTIONS), read(path))


def summary(local: dict) -> dict:
    return {**{n: float(np.abs(v["residual"]).sum()) for n, v in local["variables"].items()},
            "steps": sorted(local["steps"].values())}


def class_form(result: dict, x, y) -> None:
    """``compression=GsSketch`` (the class) against an instance with the same (default) options."""
    instance = GsSketch()
    for form, gs in (("class", GsSketch), ("instance", instance)):
        model = Mlp(11)
        run(model, make_step(model, gs), x, y, range(3))
        result[f"{form}_digest"] = digest(model)
        result[f"{form}_bytes_per_step"] = gs.bytes_per_step(model.trainable_variables)
        state = gs.state_dict()
        result[f"{form}_stats"] = asdict(gs.stats)
        result[f"{form}_merge_stats"] = asdict(gs.merge_stats)
        result[f"{form}_gathered_ranks"] = None if state is None else len(state["ranks"])
        local = gs.local_state_dict()
        result[f"{form}_local"] = summary(local)
        gs.reset()
        after = summary(gs.local_state_dict())
        result[f"{form}_after_reset"] = sum(v for k, v in after.items() if k != "steps") + sum(after["steps"])
        gs.load_state_dict(state)
        result[f"{form}_reloaded"] = summary(gs.local_state_dict())
        gs.load_local_state_dict(local)


def main(out_dir: str, other: str | None = None) -> None:
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)[hvd.rank()::hvd.size()]
    y = y.astype(np.int64)[hvd.rank()::hvd.size()]
    result: dict = {"rank": hvd.rank(), "size": hvd.size()}
    resume(result, x, y, os.path.join(out_dir, "checkpoint.pt"))
    if other:
        other_world_size(result, other)
    class_form(result, x, y)
    with open(os.path.join(out_dir, f"rank{hvd.rank()}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
