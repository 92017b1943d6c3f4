"""Data-parallel training of an MLP on scikit-learn's handwritten digits with Horovod and
TensorFlow: GsSketch as the ``compression`` of ``hvd.DistributedGradientTape`` in a ``tf.function``.

    horovodrun -np 2 -H localhost:2 --gloo python scripts/examples/train_tf.py

``--ratio R`` fixes the fraction of coordinates sent a step (default: GsSketch's ``ratio="auto"``).
The model is tf-keras's (``TF_USE_LEGACY_KERAS=1``: see docs/tensorflow.md). The benchmark
harness's version, with the byte counts: scripts/bench/train_tf.py.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import argparse  # noqa: E402

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from data import digits  # noqa: E402

from gs_horovod.tensorflow import GsSketch  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ratio", type=float, help="k / d (default: GsSketch's ratio='auto')")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    return p.parse_args(argv)


def main() -> None:
    args = parse_args()
    hvd.init()
    tf.keras.utils.set_random_seed(0)
    x_train, y_train, x_test, y_test = digits(hvd.rank(), hvd.size())

    model = tf.keras.Sequential([
        tf.keras.layers.Dense(256, activation="relu", input_shape=(64,)),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    optimizer = tf.keras.optimizers.SGD(0.05, momentum=0.9)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    hvd.broadcast_variables(model.variables, root_rank=0)
    compression = GsSketch(**({} if args.ratio is None else {"ratio": args.ratio}))

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    # every rank takes the same number of steps (the smallest shard's)
    steps = int(hvd.allreduce(tf.constant(len(x_train) // args.batch_size), op=hvd.Min, name="steps"))
    rng = np.random.default_rng(hvd.rank())
    for epoch in range(args.epochs):
        order = rng.permutation(len(x_train))
        for step in range(steps):
            batch = order[step * args.batch_size:(step + 1) * args.batch_size]
            loss = train_step(x_train[batch], y_train[batch])
        accuracy = float(np.mean(np.argmax(model(x_test), axis=1) == y_test))
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}  loss {float(loss):.4f}  held-out accuracy {accuracy:.4f}", flush=True)


if __name__ == "__main__":
    main()
