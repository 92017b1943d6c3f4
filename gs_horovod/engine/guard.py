"""The cross-rank guard of a step, written once for every adapter: what every rank must agree
on, and what each check says when it fails.

- the options digest (:meth:`GsConfig.digest`, with an adapter's own extras such as FSDP2's
  mesh) and :func:`options_differ`, the ValueError text when ranks hold different ones;
- the NaN/Inf rule (``nonfinite="raise"``: :func:`nonfinite_parts`, the FloatingPointError
  text naming the tensors; ``"skip"``: :meth:`EngineState.skip` when the adapter found it
  before the exchange, the step's own ``applied`` flag otherwise);
- the step flags (:meth:`~gs_horovod.checkpoint.CheckpointApi.step_flag` summed over ranks
  into :meth:`~gs_horovod.checkpoint.CheckpointApi.agree`) and the count of every step, run or
  skipped, in :class:`~gs_horovod.engine.state.CommStats`.

:class:`~gs_horovod.engine.step.GsSgd` runs the checks over its collectives (Horovod, DDP:
the group the step reduces over); FSDP2 runs them over every rank of the job, since its
replicate groups step apart (:mod:`gs_horovod.fsdp`).
"""

from __future__ import annotations

from typing import Any

from ..kernels.hashing import HASH_VERSION
from .config import GsConfig


def options_differ(config: GsConfig, mesh: Any = None) -> str:
    """The ValueError text when the options digest (with ``mesh`` (R, S), FSDP2's, when given)
    differs across ranks."""
    if mesh is None:
        return ("GsSketch options differ across ranks (seed, sizes or modes must be equal on every rank); "
                f"this rank has {config} with hash version {HASH_VERSION}")
    return ("GsSketch options differ across ranks (seed, sizes or modes must be equal on every rank, and the mesh): "
            f"this rank has {config} with hash version {HASH_VERSION} on a {mesh[0]} × {mesh[1]} mesh")


def nonfinite_parts(names: Any, steps: Any, overflow: bool = False, owner: str = "GsSketch") -> list[Any]:
    """The FloatingPointError text of a NaN/Inf step as parts (strings, or the framework's
    tensors ``names`` and ``steps`` under TF): ``names`` the tensors NaN/Inf on some rank,
    ``steps`` the steps done, ``overflow`` whether the step sent float16 (ratio="auto"'s
    DENSE level), ``owner`` the class that takes ``nonfinite='skip'``."""
    skip = f"{owner}(nonfinite='skip') skips such steps instead."
    if overflow:
        return ["GsSketch: the gradient of ", names, " is NaN or infinite on at least one rank at step ", steps,
                " (or, at the dense float16 level of ratio='auto', overflowed float16: a value above 65504; give a "
                "fixed ratio to send pairs); residuals are left as before the step. ", skip]
    return ["GsSketch: the gradient of ", names, " is NaN or infinite on at least one rank at step ", steps,
            "; residuals are left as before the step. ", skip]
