"""Every ``horovod.tensorflow`` internal the TensorFlow adapter reads, in one place (Horovod
0.28.1). Horovod calls ``compress(grad)`` without the variable; GsSketch finds the step it is
called from, and the variables, by the Python frames of Horovod's functions.

- :func:`calling_step`: the ``allreduce_grads(grads, vars)`` up the stack whose ``grads``
  hold the gradient, and the ``op`` and ``process_set`` of the ``allreduce`` below it;
  RuntimeError when there is none (``compress`` called from ``hvd.allreduce`` or elsewhere).
- :func:`variable_path`: the name GsSketch keys a variable's state by (``var.path`` in
  Keras 3, else ``var.name``): a str, the same on every rank.
- :func:`forget_traced_steps`: drops the ``allreduce_grads`` functions Horovod cached for a
  compressor, so that the next step is traced again (after an elastic reset).
- :data:`STEP_SCOPE`: the name scope that makes Horovod's elastic loop read a failed
  collective of the step as a lost peer.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import horovod.tensorflow as hvd
import tensorflow as tf

STEP_SCOPE = "HorovodAllreduce_gs_horovod"
"""The name scope of the engine's step: Horovod's TF ``hvd.elastic.run`` tells a lost peer (reset
and go on) from other errors by "HorovodAllreduce", "HorovodAllgather" or "HorovodBroadcast" in
the failing node's name (and drops any other UnknownError); the engine names its collectives
itself, so this scope puts the word in every one of them."""


def variable_path(var: Any) -> str:
    """The key of ``var``'s state: ``var.path`` where it has one (Keras 3), else ``var.name``."""
    return getattr(var, "path", None) or var.name


def calling_step(grad: tf.Tensor) -> tuple[list, list, Any, Any]:
    """(grads, vars, op, process_set) of the Horovod ``allreduce_grads(grads, vars)`` up the
    stack whose ``grads`` hold ``grad``; ``allreduce(tensor, ..., op, process_set)`` below it
    has the reduction op and process set. Called from ``compress`` (two frames up)."""
    frame = sys._getframe(2)
    op: Optional[Any] = None
    process_set: Optional[Any] = None
    for _ in range(60):  # autograph puts its own frames between Horovod's functions
        if frame is None:
            break
        local = frame.f_locals
        name = frame.f_code.co_name.removeprefix("tf__")  # autograph-converted copies
        if op is None and name == "allreduce" and "op" in local:
            op, process_set = local["op"], local.get("process_set")
        if name == "allreduce_grads" and "grads" in local and local.get("vars") is not None:
            if any(g is grad for g in local["grads"]):
                return local["grads"], local["vars"], op, process_set
        frame = frame.f_back
    raise RuntimeError(
        "GsSketch compresses gradients inside Horovod's DistributedGradientTape or DistributedOptimizer; "
        "called from elsewhere (e.g. hvd.allreduce) it cannot tell which variable a tensor belongs to "
        "and so cannot keep its error-feedback residual"
    )


def forget_traced_steps(compression: Any) -> None:
    """Drops Horovod's cached ``allreduce_grads`` functions built with ``compression`` (an
    instance; those built with its class too): ``hvd._make_cached_allreduce_grads_fn`` keeps one
    per argument tuple, traced once, so the next DistributedGradientTape traces its step for the
    current world."""
    cached = hvd._make_cached_allreduce_grads_fn
    for cell in cached.__closure__ or ():
        cache = cell.cell_contents
        if isinstance(cache, dict):
            for key in [key for key in cache if any(arg is compression or arg is type(compression) for arg in key[0])]:
                del cache[key]
