"""Data-parallel training of an MLP on scikit-learn's handwritten digits with Horovod and
TensorFlow (tf-keras model, ``hvd.DistributedGradientTape`` in a ``tf.function``).

    horovodrun -np 2 -H localhost:2 --gloo python scripts/bench/train_tf.py --compression gs

Same data, model, flags and output as ``scripts/bench/train_torch.py``.

The benchmark harness's entry point (it imports gs_bench); the example to copy:
``scripts/examples/train_tf.py``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf-keras: see docs/tensorflow.md

import argparse  # noqa: E402
import math  # noqa: E402

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from gs_bench.cli import Report, demo_arguments, method_options  # noqa: E402
from gs_bench.methods import METHODS, Meter  # noqa: E402
from gs_bench.workloads import digits_shard  # noqa: E402
from gs_horovod.compressor import allreduce_kind  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = demo_arguments(__doc__, [n for n, m in METHODS.items() if m.under_tensorflow]).parse_args(argv)
    if args.epochs is None:
        args.epochs = 30
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    hvd.init()
    tf.keras.utils.set_random_seed(args.seed)
    tf.config.threading.set_intra_op_parallelism_threads(1)

    x_train, y_train, x_test, y_test = digits_shard(hvd.rank(), hvd.size())

    model = tf.keras.Sequential([
        tf.keras.layers.Dense(args.hidden, activation="relu", input_shape=(64,)),
        tf.keras.layers.Dense(args.hidden // 2, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    optimizer = tf.keras.optimizers.SGD(args.lr, momentum=args.momentum)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    hvd.broadcast_variables(model.variables, root_rank=0)
    method, (ratio, options) = METHODS[args.compression], method_options(args)
    method.check(ratio, options)
    compression = method.tensorflow(ratio, options)
    if hasattr(compression, "stats"):  # GsSketch: what it sent, counted (ratio="auto" moves with the step)
        meter = Meter.of_gs(lambda: compression.stats, hvd.size(), allreduce_kind(compression.transport))
    else:
        shapes = [tuple(v.shape) for v in sorted(model.trainable_variables, key=lambda v: v.name)]
        planned = method.planned(options, shapes, hvd.size(), ratio)
        meter = Meter(hvd.size(), lambda: planned)
    dense_bytes = sum(v.shape.num_elements() * 4 for v in model.trainable_variables)

    @tf.function
    def train_step(xb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    steps_per_epoch = int(hvd.allreduce(tf.constant(math.ceil(len(x_train) / args.batch_size)),
                                        op=hvd.Min, name="steps"))
    rng = np.random.default_rng(args.seed + hvd.rank())
    report = Report(args, hvd.rank(), hvd.size(), dense_bytes, meter.per_step, steps_per_epoch, args.epochs)
    for epoch in report.periods():
        order = rng.permutation(len(x_train))
        total = 0.0
        for step in range(steps_per_epoch):
            batch = order[step * args.batch_size:(step + 1) * args.batch_size]
            total += float(train_step(x_train[batch], y_train[batch]))
            report.step()
        train_loss = float(hvd.allreduce(tf.constant(total / steps_per_epoch), name="loss"))
        accuracy = float(np.mean(np.argmax(model(x_test), axis=1) == y_test))
        report.record(epoch, train_loss, accuracy)
    return report.finish()


if __name__ == "__main__":
    main()
