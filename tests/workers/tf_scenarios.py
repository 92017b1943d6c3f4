"""Runs under ``horovodrun``: GsSketch for TensorFlow on real ranks, one JSON file per rank.

    horovodrun -np 2 -H localhost:2 --gloo python tests/workers/tf_scenarios.py OUT_DIR [NAME ...]

NAME: a scenario (``k_equals_d``, ``identical_updates``, ``warmup``, ``resume``, ``nonfinite``,
``bf16``, ``sparse_equals_allgather``, ``compact_wires``, ``keras``, ``check_every``,
``mismatch``; none: all), e.g. the checkpoint's resume alone:

    horovodrun -np 2 -H localhost:2 --gloo python tests/workers/tf_scenarios.py /tmp/out resume
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Horovod 0.28.1's Keras layer needs tf-keras

import hashlib  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

import horovod.tensorflow as hvd  # noqa: E402
import horovod.tensorflow.keras as hvd_keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from rank_result import write_result  # noqa: E402
from scenario import Scenarios  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

from gs_horovod.tensorflow import GsSketch  # noqa: E402

EXCHANGES = ("sketch", "allgather", "sparse")  # named: at 2 ranks "auto" would pick the allgather
SCENARIOS = Scenarios()  # each scenario(result, x, y), in the order they run


class Mlp(tf.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        self.w1 = tf.Variable(rng.standard_normal((64, 64)).astype(np.float32) * 0.1, name="w1")
        self.b1 = tf.Variable(np.zeros(64, np.float32), name="b1")
        self.w2 = tf.Variable(rng.standard_normal((64, 10)).astype(np.float32) * 0.1, name="w2")

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        h = tf.nn.relu(tf.cast(x, self.w1.dtype) @ self.w1 + self.b1)  # w1, b1 may be bfloat16
        return tf.cast(h, tf.float32) @ self.w2


def digest(model: tf.Module) -> str:
    return hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.trainable_variables)).hexdigest()


def batch(x: np.ndarray, y: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
    idx = np.random.default_rng(1000 * step + hvd.rank()).integers(0, len(x), 32)
    return x[idx], y[idx]


def make_step(model: Mlp, compression, graph: bool = True, lr: float = 0.1):
    """An SGD step with DistributedGradientTape; its optional third argument is added to w2's
    gradient (to plant a NaN in one known gradient on one rank)."""
    variables = [model.w1, model.b1, model.w2]

    def step(xb, yb, w2_extra=0.0):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(yb, model(xb)))
            loss += tf.reduce_sum(model.w2 * w2_extra)
        grads = hvd.DistributedGradientTape(tape, compression=compression).gradient(loss, variables)
        for v, g in zip(variables, grads):
            v.assign_sub(lr * g)
        return loss

    return tf.function(step) if graph else step


def digests_after_each(model, step, x, y, steps: int) -> list[str]:
    """Runs ``steps`` steps; the model's digest after each."""
    out = []
    for i in range(steps):
        step(*batch(x, y, i))
        out.append(digest(model))
    return out


def run(model, step, x, y, steps: range) -> None:
    for i in steps:
        step(*batch(x, y, i))


def fitted(x, y, compression) -> tuple[float, float]:
    tf.keras.utils.set_random_seed(3)
    model = tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu", input_shape=(64,)),
                                 tf.keras.layers.Dense(32, activation="relu"), tf.keras.layers.Dense(10)])
    opt = hvd_keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=compression)
    model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(x, y, batch_size=32, epochs=12, verbose=0, shuffle=False,
              callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)])
    loss, acc = model.evaluate(x, y, verbose=0)
    return (float(hvd.allreduce(tf.constant(loss), name="keras_loss")),
            float(hvd.allreduce(tf.constant(acc), name="keras_acc")))


@SCENARIOS
def k_equals_d(result: dict, x: np.ndarray, y: np.ndarray) -> None:
    """k = d with the exact round is dense allreduce."""
    dense, gs = Mlp(0), Mlp(0)
    run(dense, make_step(dense, hvd.Compression.none), x, y, range(5))
    run(gs, make_step(gs, GsSketch(ratio=1.0, rows=1, width=1.0, min_size=1, wire="fp32")), x, y, range(5))
    result["k_equals_d_max_abs_diff"] = max(float(tf.reduce_max(tf.abs(a - b)))
                                            for a, b in zip(dense.trainable_variables, gs.trainable_variables))


@SCENARIOS
def identical_updates(result: dict, x: np.ndarray, y: np.ndarray) -> None:
    """Identical updates on every rank, in tf.function and eagerly, with and without the exact
    round (the sketch; every exchange: the warm-up runs and the sparse-against-allgather runs)."""
    for graph in (True, False):
        for exact in (True, False):
            model = Mlp(1)
            step = make_step(model, GsSketch(ratio=0.05, min_size=64, exact=exact, exchange="sketch"), graph=graph)
            result[f"digests_graph_{graph}_exact_{exact}"] = digests_after_each(model, step, x, y, 6)


@SCENARIOS
def warmup(result: dict, x: np.ndarray, y: np.ndarray) -> None:
    """Warm-up: 2 dense steps (the same weights as Horovod's dense allreduce), then compressed
    # ones (their digests: every rank applies the same update); all ranks alike. The bytes
    counted after the warm-up and after the 2 steps beyond it, and the weights against 4 dense
    steps: a warm-up that never ended would count no exchange's bytes and stay dense."""
    dense = Mlp(5)
    dense_step = make_step(dense, hvd.Compression.none)
    run(dense, dense_step, x, y, range(2))
    dense_after_warmup = [v.numpy().copy() for v in dense.trainable_variables]
    run(dense, dense_step, x, y, range(2, 4))

    def max_abs_diff(weights, model) -> float:
        return max(float(np.abs(w - v.numpy()).max()) for w, v in zip(weights, model.trainable_variables))

    for exchange in EXCHANGES:
        model, gs = Mlp(5), GsSketch(ratio=0.05, min_size=64, warmup_steps=2, exchange=exchange)
        step = make_step(model, gs)
        digests = digests_after_each(model, step, x, y, 2)
        result[f"{exchange}_warmup_dense_max_abs_diff"] = max_abs_diff(dense_after_warmup, model)
        result[f"{exchange}_warmup_stats"] = dict(vars(gs.stats))
        digests += [None] * 2
        for i in (2, 3):
            step(*batch(x, y, i))
            digests[i] = digest(model)
        result[f"{exchange}_warmup_digests"] = digests
        result[f"{exchange}_warmup_steps"] = [int(v.steps.numpy()) for v in gs.steps.values()]
        result[f"{exchange}_after_warmup_stats"] = dict(vars(gs.stats))
        result[f"{exchange}_after_warmup_dense_max_abs_diff"] = max_abs_diff(
            [v.numpy() for v in dense.trainable_variables], model)


@SCENARIOS
def resume(result: dict, x: np.ndarray, y: np.ndarray) -> None:
    """Checkpoint: 2N steps straight vs N, tf.train.Checkpoint, new objects restored, N more."""
    n = 4
    model, gs = Mlp(2), GsSketch(ratio=0.05, min_size=64, momentum=0.5)
    run(model, make_step(model, gs), x, y, range(2 * n))
    result["resume_straight"] = digest(model)
    straight = [v.numpy() for v in model.trainable_variables]
    model, gs = Mlp(2), GsSketch(ratio=0.05, min_size=64, momentum=0.5)
    run(model, make_step(model, gs), x, y, range(n))
    path = tf.train.Checkpoint(model=model, compression=gs).write(os.path.join(tempfile.mkdtemp(), "ckpt"))
    model, gs = Mlp(99), GsSketch(ratio=0.05, min_size=64, momentum=0.5)
    tf.train.Checkpoint(model=model, compression=gs).read(path)  # gs state restored when created
    run(model, make_step(model, gs), x, y, range(n, 2 * n))
    result["resume_restored"] = digest(model)
    result["resume_max_abs_diff"] = max(float(np.abs(a - v.numpy()).max())
                                        for a, v in zip(straight, model.trainable_variables))
    result["resume_steps"] = [int(v.steps.numpy()) for v in gs.steps.values()]
    # the control: the model restored, GsSketch's state (residuals, momentum, steps) not
    model, gs = Mlp(99), GsSketch(ratio=0.05, min_size=64, momentum=0.5)
    tf.train.Checkpoint(model=model).read(path).expect_partial()
    run(model, make_step(model, gs), x, y, range(n, 2 * n))
    result["resume_not_loaded"] = digest(model)
    result["resume_not_loaded_steps"] = [int(v.steps.numpy()) for v in gs.steps.values()]


@SCENARIOS
def nonfinite(result: dict, x: np.ndarray, y: np.ndarray) -> None:
    """NaN planted in w2's gradient on rank 1, the sketch: the same error on every rank naming w2
    (raise), or the step dropped (skip); nothing committed either way."""
    for mode, exchange in (("raise", "sketch"), ("skip", "sketch")):
        model, gs = Mlp(4), GsSketch(ratio=0.05, min_size=64, nonfinite=mode, exchange=exchange)
        step = make_step(model, gs)
        step(*batch(x, y, 0))
        before = [v.residual.numpy().copy() for v in gs.states.values()] + [digest(model)]
        poison = np.zeros((64, 10), np.float32)
        if hvd.rank() == 1:
            poison[3, 7] = np.nan
        try:
            step(*batch(x, y, 1), poison)
            result[f"{exchange}_nan_{mode}_error"] = None
        except tf.errors.InvalidArgumentError as e:
            result[f"{exchange}_nan_{mode}_error"] = e.message
        after = [v.residual.numpy() for v in gs.states.values()] + [digest(model)]
        result[f"{exchange}_nan_{mode}_changed"] = [i for i, (a, b) in enumerate(zip(before, after))
                                                    if not np.array_equal(a, b)]  # residuals by variable, the model
        result[f"{exchange}_nan_{mode}_steps"] = [int(v.steps.numpy()) for v in gs.steps.values()]


@SCENARIOS
def bf16(result: dict, x: np.ndarray, y: np.ndarray) -> None:
    """bfloat16 variables, a large one (sketched) and a small one (sent exactly)."""
    model = Mlp(6)
    for name in ("w1", "b1"):
        setattr(model, name, tf.Variable(tf.cast(getattr(model, name), tf.bfloat16), name=name))
    initial = {v.name: tf.cast(v, tf.float32).numpy() for v in model.trainable_variables}
    step = make_step(model, GsSketch(ratio=0.05, min_size=64))
    for i in range(3):
        step(*batch(x, y, i))
    result["bf16_digest"] = digest(model)
    result["bf16_finite"] = all(bool(np.isfinite(tf.cast(v, tf.float32).numpy()).all())
                                for v in model.trainable_variables)
    result["bf16_moved"] = {v.name: int((tf.cast(v, tf.float32).numpy() != initial[v.name]).sum())
                            for v in model.trainable_variables}  # coordinates that moved, by variable
    result["bf16_dtypes"] = {v.name: v.dtype.name for v in model.trainable_variables}


@SCENARIOS
def sparse_equals_allgather(result: dict, x: np.ndarray, y: np.ndarray) -> None:
    """The sparse exchange (alltoall to the owners, threshold, allgather of the selected pairs)
    applies exactly the allgather's top k: the same model after every step, in a tf.function."""
    for scope in ("global", "layer"):
        # (wire="fp32": the compact wire rounds the owners' sums, which the allgather does not)
        for name, options in (("sparse", {"exchange": "sparse", "wire": "fp32"}),
                              ("gather", {"exchange": "allgather", "apply": "topk", "wire": "fp32"})):
            model, gs = Mlp(9), GsSketch(ratio=0.05, min_size=64, scope=scope, **options)
            result[f"{name}_{scope}_digests"] = digests_after_each(model, make_step(model, gs), x, y, 4)
            result[f"{name}_{scope}_stats"] = vars(gs.stats)


@SCENARIOS
def compact_wires(result: dict, x: np.ndarray, y: np.ndarray) -> None:
    """The compact wires in the graph (their codec through tf.numpy_function), both pair exchanges."""
    for name in ("sparse", "allgather"):
        for wire in ("compact", "compact8"):
            model, gs = Mlp(9), GsSketch(ratio=0.05, min_size=64, exchange=name, wire=wire)
            result[f"{wire}_{name}_digests"] = digests_after_each(model, make_step(model, gs), x, y, 4)
            result[f"{wire}_{name}_stats"] = vars(gs.stats)


@SCENARIOS
def keras(result: dict, x: np.ndarray, y: np.ndarray) -> None:
    """Keras (tf-keras) fit: dense vs GsSketch (k = 5 %)."""
    result["keras_dense"] = fitted(x, y, hvd.Compression.none)
    result["keras_gs"] = fitted(x, y, GsSketch(ratio=0.05, min_size=64))


@SCENARIOS
def shared_name(result: dict, x: np.ndarray, y: np.ndarray) -> None:
    """Two variables of one name: the trace raises on every rank, before any collective."""
    model = Mlp(10)
    model.w1 = tf.Variable(model.w1, name="w")
    model.w2 = tf.Variable(model.w2, name="w")
    try:
        make_step(model, GsSketch(min_size=64))(*batch(x, y, 0))
        result["shared_name_error"] = None
    except ValueError as e:
        result["shared_name_error"] = str(e)


# Last, as a failed step leaves Horovod's collectives of that step unmatched: a selection that
# differs on one rank (check_every), and options that differ across ranks.
@SCENARIOS
def check_every(result: dict, x: np.ndarray, y: np.ndarray) -> None:
    """One rank's sketch nominates every candidate one coordinate off: check_every=1 raises."""
    model, gs = Mlp(7), GsSketch(ratio=0.05, min_size=64, check_every=1, exchange="sketch")
    if hvd.rank() == 1:  # this rank's sketch nominates every candidate one coordinate off
        heavy_hitters = gs.ops.heavy_hitters
        gs.ops.heavy_hitters = lambda table, keys, n, count: ((heavy_hitters(table, keys, n, count)[0] + 1) % n,
                                                              heavy_hitters(table, keys, n, count)[1])
    result["check_every_error"] = _error(lambda: make_step(model, gs)(*batch(x, y, 0)))


@SCENARIOS
def mismatch(result: dict, x: np.ndarray, y: np.ndarray) -> None:
    """Options that differ across ranks (the hash seed): every rank raises."""
    model = Mlp(8)
    result["mismatch_seed_error"] = _error(lambda: make_step(model, GsSketch(seed=hvd.rank(), min_size=64))(
        *batch(x, y, 0)))


def main(out_dir: str, *names: str) -> None:
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)[hvd.rank()::hvd.size()]
    y = y.astype(np.int64)[hvd.rank()::hvd.size()]
    result: dict = {"rank": hvd.rank()}
    result["scenarios"] = SCENARIOS.run(names, result, x, y)
    write_result(out_dir, hvd.rank(), result)


def _error(fn) -> str | None:
    try:
        fn()
    except tf.errors.InvalidArgumentError as e:
        return e.message
    return None


if __name__ == "__main__":
    main(*sys.argv[1:])
