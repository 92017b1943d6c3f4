"""Runs under ``horovodrun --mpi``: the TensorFlow GsSketch with ``transport="mpi"`` (tree merge over
mpi4py inside the graph) for each exchange (results under ``result[exchange]``), one JSON file
per rank.

    horovodrun -np 2 -H localhost:2 --mpi python tests/workers/tf_mpi.py OUT_DIR

One scenario per launch: ``OUT_DIR`` (the same step, once per exchange).
"""

from __future__ import annotations

import sys

import horovod.tensorflow as hvd
import tensorflow as tf
from rank_result import write_result
from sklearn.datasets import load_digits
from tf_scenarios import EXCHANGES, Mlp, digests_after_each, make_step, run

from gs_horovod.tensorflow import GsSketch


def main(out_dir: str) -> None:
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    x, y = load_digits(return_X_y=True)
    x, y = (x / 16.0).astype("float32")[hvd.rank()::hvd.size()], y.astype("int64")[hvd.rank()::hvd.size()]
    result: dict = {"rank": hvd.rank()}
    dense, gs = Mlp(0), Mlp(0)
    run(dense, make_step(dense, hvd.Compression.none), x, y, range(3))
    compression = GsSketch(transport="mpi", ratio=1.0, rows=1, width=1.0, min_size=1, sketch_dtype="float32",
                           wire="fp32")
    run(gs, make_step(gs, compression), x, y, range(3))
    result["k_equals_d_max_abs_diff"] = max(float(tf.reduce_max(tf.abs(a - b)))
                                            for a, b in zip(dense.trainable_variables, gs.trainable_variables))
    for exchange in EXCHANGES:
        model, compression = Mlp(1), GsSketch(transport="mpi", ratio=0.05, min_size=64, exchange=exchange)
        step = make_step(model, compression)
        result[exchange] = {"digests": digests_after_each(model, step, x, y, 4),
                            "merge_calls": compression.merge_stats.calls}
    write_result(out_dir, hvd.rank(), result)


if __name__ == "__main__":
    main(sys.argv[1])
