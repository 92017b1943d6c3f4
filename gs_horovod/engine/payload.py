"""What one rank hands to collectives in one step (:class:`Payload`), and the one place a
payload becomes the step's collectives (:func:`collectives_of`)."""

from __future__ import annotations

from typing import NamedTuple


class Payload(NamedTuple):
    """Bytes one rank hands to collectives in one step, by collective: the sketch merge (the
    sketch exchange only), the allgather (the allgather exchange's pairs, or the sparse
    exchange's selected pairs: this rank's share), the sparse exchange's alltoall and its two
    threshold histograms (``select``, both rounds together), the exact round and the small
    tensors (``dense``)."""

    sketch: int = 0
    gather: int = 0
    alltoall: int = 0
    select: int = 0
    exact: int = 0
    dense: int = 0


def collectives_of(payload: Payload, allreduce_kind: str = "allreduce") -> list[tuple[str, float]]:
    """A step's (kind, payload bytes) collectives (:mod:`gs_horovod.transports.collective_cost`) in issue
    order, the empty ones left out: the sketch merge, the threshold rounds and the exact round
    (with the small tensors) as ``allreduce_kind`` ("allreduce", or "tree" under transport="mpi"), the
    allgather as "allgather", the alltoall as "alltoall"."""
    ar = allreduce_kind
    step = [(ar, payload.sketch), ("alltoall", payload.alltoall), (ar, payload.select / 2),
            (ar, payload.select / 2), ("allgather", payload.gather), (ar, payload.exact + payload.dense)]
    return [(kind, float(n)) for kind, n in step if n]
