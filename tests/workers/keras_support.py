"""Runs under ``horovodrun``: what Horovod 0.28.1 does with Keras 3 and with tf-keras, case
by case; one JSON per rank (docs/tensorflow.md quotes these cases).

    horovodrun -np 2 -H localhost:2 --gloo python tests/workers/keras_support.py OUT_DIR keras3 [NAME ...]
    horovodrun -np 2 -H localhost:2 --gloo python tests/workers/keras_support.py OUT_DIR tf_keras [NAME ...]

NAME: any number of that Keras's cases (none: all of them; the Keras is chosen before TensorFlow
is imported, hence one per launch), e.g. ``horovodrun ... keras_support.py /tmp/out keras3 fit``.
Each case records its error (or None), the steps GsSketch ran, and a digest of the rank's
final weights (``weights``; the ranks' are compared by tests/test_keras_support.py).

keras3 (TF's default Keras): ``tape_values`` (DistributedGradientTape with GsSketch on the
Keras variables' ``.value`` tf.Variables, broadcast the same way), ``fit`` (Horovod's Keras
DistributedOptimizer with GsSketch in model.fit), then the failing ones: ``tape``
(DistributedGradientTape on the Keras variables themselves, no compression) and
``broadcast_callback`` (BroadcastGlobalVariablesCallback in model.fit). tf_keras
(``TF_USE_LEGACY_KERAS=1``): ``evaluate_allreduce`` (fit with GsSketch, metrics averaged with
hvd.allreduce after evaluate), then ``metric_average`` (MetricAverageCallback in fit, dense).
"""

from __future__ import annotations

import os
import sys

GROUP = sys.argv[2]
os.environ["TF_USE_LEGACY_KERAS"] = "1" if GROUP == "tf_keras" else "0"

import hashlib  # noqa: E402

import horovod.tensorflow as hvd  # noqa: E402
import horovod.tensorflow.keras as hvd_keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from rank_result import write_result  # noqa: E402
from scenario import Scenarios  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

from gs_horovod.tensorflow import GsSketch  # noqa: E402


def model_and_data(seed: int = 3):
    keras = tf.keras
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)[hvd.rank()::hvd.size()][:256]
    y = y.astype(np.int64)[hvd.rank()::hvd.size()][:256]
    return model, x, y


def weights(model) -> str:
    """A digest of the model's trainable weights."""
    return hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.trainable_variables)).hexdigest()


def tape_loop(model, x, y, variables: list, compression) -> None:
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = tf.keras.optimizers.SGD(0.1)
    for i in range(4):
        xb, yb = x[32 * i:32 * (i + 1)], y[32 * i:32 * (i + 1)]
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb))
        grads = hvd.DistributedGradientTape(tape, compression=compression).gradient(loss, variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))


def fit_with(model, x, y, compression, callbacks: list) -> None:
    opt = hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=compression)
    model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(x, y, batch_size=32, epochs=2, verbose=0, shuffle=False, callbacks=callbacks)


def case(fn):
    """A case ``fn(gs, result) -> model``, run with a fresh GsSketch: records under
    ``result[name]`` the error, if any, the steps GsSketch ran and the weights' digest."""

    def run(result: dict) -> None:
        gs = GsSketch(ratio=0.05, min_size=64)
        out: dict = {"error": None}
        model = None
        try:
            model = fn(gs, result)
        except Exception as e:  # noqa: BLE001 - the point is to record what Horovod raises
            out["error"] = f"{type(e).__name__}: {e}"
        out["gs_steps"] = gs.stats.steps
        if model is not None:
            out["weights"] = weights(model)
        result[fn.__name__] = out

    run.__name__ = fn.__name__
    return run


KERAS3 = Scenarios()


@KERAS3
@case
def tape_values(gs, result: dict):
    model, x, y = model_and_data(seed=3 + hvd.rank())  # different weights: the broadcast must fix them
    hvd.broadcast_variables([v.value for v in model.variables], root_rank=0)
    tape_loop(model, x, y, [v.value for v in model.trainable_variables], gs)
    return model


@KERAS3
@case
def fit(gs, result: dict):
    model, x, y = model_and_data()  # the same weights on every rank
    fit_with(model, x, y, gs, [])
    return model


@KERAS3
@case
def tape(gs, result: dict):
    model, x, y = model_and_data()
    tape_loop(model, x, y, model.trainable_variables, hvd.Compression.none)
    return model


@KERAS3
@case
def broadcast_callback(gs, result: dict):
    model, x, y = model_and_data()
    fit_with(model, x, y, hvd.Compression.none, [hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)])
    return model


TF_KERAS = Scenarios()


@TF_KERAS
@case
def evaluate_allreduce(gs, result: dict):
    model, x, y = model_and_data()
    fit_with(model, x, y, gs, [hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)])
    _, acc = model.evaluate(x, y, verbose=0)
    result["own_accuracy"] = float(acc)
    result["mean_accuracy"] = float(hvd.allreduce(tf.constant(acc), name="accuracy"))  # the ranks' mean
    return model


@TF_KERAS
@case
def metric_average(gs, result: dict):
    model, x, y = model_and_data()
    fit_with(model, x, y, hvd.Compression.none, [hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0),
                                             hvd_keras.callbacks.MetricAverageCallback()])
    return model


def main(out_dir: str, group: str, *names: str) -> None:
    groups = {"keras3": KERAS3, "tf_keras": TF_KERAS}
    if group not in groups:
        raise SystemExit(f"unknown Keras {group!r}; {' or '.join(groups)}")
    scenarios = groups[group]
    scenarios.selected(names)  # an unknown name ends the job before Horovod starts
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    result: dict = {"rank": hvd.rank(), "keras": f"{tf.keras.__name__} {getattr(tf.keras, '__version__', '')}"}
    result["scenarios"] = scenarios.run(names, result)
    write_result(out_dir, hvd.rank(), result)


if __name__ == "__main__":
    main(*sys.argv[1:])
