"""How many threads the engine's CPU kernels use: the node's cores shared among its ranks.

Numba's CPU kernels (:mod:`gs_horovod.kernels.numba_cpu`) would otherwise start one thread per
core in every rank, so P ranks on one node run P threads per core, and torch's own intra-op pool
(one thread per core by default) adds as many again; ``horovodrun`` sets no thread count
(torchrun sets ``OMP_NUM_THREADS=1``). The rule, :func:`kernel_threads`:

- ``NUMBA_NUM_THREADS`` set: Numba's count is the user's; the engine leaves it.
- ``OMP_NUM_THREADS`` set, or ``torch.set_num_threads`` called (torch's count differs from the
  one it had when this module was imported): the kernels follow torch's count.
- otherwise: at most the cores this process may run on divided by the ranks on its node
  (:func:`local_size`), and never more than torch's own count.

torch's intra-op threads run the user's model too, so the engine changes them only around
its own step (:func:`engine_share`): at most the rank's share of the node, restored after.
Horovod users who want the model to fit the node as well add, after ``hvd.init()``,
``torch.set_num_threads(threads_per_rank(hvd.local_size()))``. The decision's inputs (cores,
ranks on the node, environment) are read once, at the first kernel call (:func:`numba_threads`).
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Iterator, Mapping, Optional

# launchers' counts of the ranks on this node, in the order they are trusted
LOCAL_SIZE_VARIABLES = ("LOCAL_WORLD_SIZE",  # torchrun
                        "HOROVOD_LOCAL_SIZE",  # horovodrun --gloo
                        "OMPI_COMM_WORLD_LOCAL_SIZE",  # Open MPI's mpirun (and horovodrun --mpi)
                        "MPI_LOCALNRANKS")  # MPICH's hydra
USER_COUNTS = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS")


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


_TORCH_AT_IMPORT = _torch_threads() if "torch" in sys.modules else None
_FACTS: Optional[dict] = None


def cores() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def local_size(env: Mapping[str, str] = os.environ) -> Optional[int]:
    """The number of ranks on this node: Horovod's ``local_size()`` where ``horovod.torch`` or
    ``horovod.tensorflow`` is imported and initialised, else the first of
    :data:`LOCAL_SIZE_VARIABLES` that is set to a positive integer; None when none says."""
    for name in ("horovod.torch", "horovod.tensorflow"):
        hvd = sys.modules.get(name)
        try:
            if hvd is not None and hvd.is_initialized():
                return int(hvd.local_size())
        except (AttributeError, ValueError, RuntimeError):
            pass
    for name in LOCAL_SIZE_VARIABLES:
        try:
            n = int(env.get(name, ""))
        except ValueError:
            continue
        if n > 0:
            return n
    return None


def threads_per_rank(ranks_on_node: Optional[int] = None, cpus: Optional[int] = None) -> int:
    """The node's share for one rank: ``cpus`` (default :func:`cores`) // ``ranks_on_node``
    (default :func:`local_size`, 1 if unknown), at least 1."""
    ranks = ranks_on_node if ranks_on_node is not None else local_size() or 1
    return max(1, (cpus if cpus is not None else cores()) // max(1, ranks))


def kernel_threads(*, cpus: int, ranks_on_node: Optional[int], env: Mapping[str, str], torch_threads: int,
                   torch_set: bool, numba_max: int) -> tuple[int, str]:
    """The rule: (threads for the engine's Numba kernels, why).

    ``cpus``: cores this process may use; ``ranks_on_node``: ranks on the node (None: unknown,
    taken as 1); ``env``: the environment; ``torch_threads``: torch's intra-op count now;
    ``torch_set``: whether the program set it (``torch.set_num_threads``); ``numba_max``:
    the most Numba can run (its ``NUMBA_NUM_THREADS``, which that variable sets)."""
    if env.get("NUMBA_NUM_THREADS"):
        return max(1, numba_max), "NUMBA_NUM_THREADS"
    if env.get("OMP_NUM_THREADS") or torch_set:
        why = "OMP_NUM_THREADS" if env.get("OMP_NUM_THREADS") else "torch.set_num_threads"
        return max(1, min(torch_threads, numba_max)), f"torch's count ({why})"
    share = threads_per_rank(ranks_on_node or 1, cpus)
    return max(1, min(share, torch_threads, numba_max)), f"{cpus} cores / {ranks_on_node or 1} rank(s) on the node"


def numba_threads() -> int:
    """The count :func:`kernel_threads` gives for this process, set on Numba for the calling
    thread (Numba's count is per thread); the node's facts are read at the first call."""
    import numba

    torch_now = _torch_threads()
    n, _ = kernel_threads(**_facts(), torch_threads=torch_now,
                          torch_set=_TORCH_AT_IMPORT is not None and torch_now != _TORCH_AT_IMPORT,
                          numba_max=numba.config.NUMBA_NUM_THREADS)
    if numba.get_num_threads() != n:
        numba.set_num_threads(n)
    return n


def _facts() -> dict:
    global _FACTS
    if _FACTS is None:
        _FACTS = {"cpus": cores(), "ranks_on_node": local_size(),
                  "env": {k: os.environ.get(k, "") for k in USER_COUNTS}}
    return _FACTS


@contextmanager
def engine_share() -> Iterator[int]:
    """Runs the body with torch's intra-op threads at most this rank's share of the node
    (:func:`threads_per_rank` of the node's facts), whatever torch's count; restores the count
    after. Yields the count in force."""
    import torch

    facts = _facts()
    before = torch.get_num_threads()
    share = min(before, threads_per_rank(facts["ranks_on_node"] or 1, facts["cpus"]))
    if share == before:
        yield before
        return
    torch.set_num_threads(share)
    try:
        yield share
    finally:
        torch.set_num_threads(before)


def reset() -> None:
    """Forget the node's facts (tests)."""
    global _FACTS
    _FACTS = None
