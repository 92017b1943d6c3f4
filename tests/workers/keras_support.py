"""Runs under ``horovodrun``: what Horovod 0.28.1 does with Keras 3 and with tf-keras, case
by case; one JSON per rank (docs/tensorflow.md quotes these cases).

    horovodrun -np 2 -H localhost:2 --gloo python tests/workers/keras_support.py OUT_DIR keras3
    horovodrun -np 2 -H localhost:2 --gloo python tests/workers/keras_support.py OUT_DIR tf_keras

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


def weights_agree(model, name: str) -> bool:
    digest = hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.trainable_variables)).digest()
    return len(set(hvd.allgather_object(digest, name=name))) == 1


def tape_loop(model, x, y, variables: list, compression) -> None:
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = tf.keras.optimizers.SGD(0.1)
    for i in range(4):
        xb, yb = x[32 * i:32 * (i + 1)], y[32 * i:32 * (i + 1)]
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb))
        grads = hvd.DistributedGradientTape(tape, compression=compression).gradient(loss, variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))


def fit(model, x, y, compression, callbacks: list) -> None:
    opt = hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=compression)
    model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(x, y, batch_size=32, epochs=2, verbose=0, shuffle=False, callbacks=callbacks)


def case(name: str, fn) -> tuple[dict, object]:
    """Runs ``fn(gs) -> model`` with a fresh GsSketch; records the error, if any, whether every
    rank ends with the same weights, and the steps GsSketch ran."""
    gs = GsSketch(ratio=0.05, min_size=64)
    result: dict = {"error": None}
    model = None
    try:
        model = fn(gs)
    except Exception as e:  # noqa: BLE001 - the point is to record what Horovod raises
        result["error"] = f"{type(e).__name__}: {e}"
    result["gs_steps"] = gs.stats.steps
    return result, model


def keras3() -> dict:
    out = {}

    def tape_values(gs):
        model, x, y = model_and_data(seed=3 + hvd.rank())  # different weights: the broadcast must fix them
        hvd.broadcast_variables([v.value for v in model.variables], root_rank=0)
        tape_loop(model, x, y, [v.value for v in model.trainable_variables], gs)
        return model

    def fit_plain(gs):
        model, x, y = model_and_data()  # the same weights on every rank
        fit(model, x, y, gs, [])
        return model

    def tape(gs):
        model, x, y = model_and_data()
        tape_loop(model, x, y, model.trainable_variables, hvd.Compression.none)
        return model

    def broadcast_callback(gs):
        model, x, y = model_and_data()
        fit(model, x, y, hvd.Compression.none, [hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)])
        return model

    for name, fn in (("tape_values", tape_values), ("fit", fit_plain), ("tape", tape),
                     ("broadcast_callback", broadcast_callback)):
        out[name], model = case(name, fn)
        if model is not None:
            out[name]["weights_agree"] = weights_agree(model, name)
    return out


def tf_keras() -> dict:
    out = {}

    def evaluate_allreduce(gs):
        model, x, y = model_and_data()
        fit(model, x, y, gs, [hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)])
        _, acc = model.evaluate(x, y, verbose=0)
        out["own_accuracy"] = float(acc)
        out["mean_accuracy"] = float(hvd.allreduce(tf.constant(acc), name="accuracy"))  # the ranks' mean
        return model

    def metric_average(gs):
        model, x, y = model_and_data()
        fit(model, x, y, hvd.Compression.none, [hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0),
                                                 hvd_keras.callbacks.MetricAverageCallback()])
        return model

    for name, fn in (("evaluate_allreduce", evaluate_allreduce), ("metric_average", metric_average)):
        out[name], model = case(name, fn)
        if model is not None:
            out[name]["weights_agree"] = weights_agree(model, name)
    return out


def main(out_dir: str, group: str) -> None:
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    keras = f"{tf.keras.__name__} {getattr(tf.keras, '__version__', '')}"
    result = {"rank": hvd.rank(), "keras": keras, **(keras3() if group == "keras3" else tf_keras())}
    write_result(out_dir, hvd.rank(), result)


if __name__ == "__main__":
    main(sys.argv[1], GROUP)
