"""The transports: each one module implementing :class:`~.protocol.Collectives`. Those the
Horovod compressors' ``transport=`` option chooses are registered below by name, each a
:class:`~.horovod.HorovodCollectives` (sub)class that says how it is made (``connect``), which
cost-model kind its allreduces are (``allreduce_kind``), whether it takes ``comm=``
(``takes_comm``) and whether an early dense step may ride Horovod's own allreduce
(``dense_rides_horovod``). The options, their checks, the cost plan and the adapters read this
registry; a new transport is one new module and one entry below.

- :mod:`.horovod`: Horovod's collectives, torch and TF (``transport="horovod"``, the default);
- :mod:`.mpi`: the allreduces as a tree over mpi4py beside Horovod (``transport="mpi"``);
- :mod:`.dist`: torch.distributed (the DDP and FSDP adapters); :mod:`.simulated`: P ranks in
  one process;
- :mod:`.protocol`: the protocol and what is written once over it; :mod:`.collective_cost`: the
  bytes and rounds each collective algorithm puts on the wire; :mod:`.deadline`: waiting for a
  collective until a deadline.
"""

from __future__ import annotations

from .horovod import HorovodCollectives
from .mpi import MpiCollectives

TRANSPORTS: dict[str, type[HorovodCollectives]] = {t.name: t for t in (
    HorovodCollectives,
    MpiCollectives,
)}
"""Every transport ``transport=`` takes, by name; the first is the default."""

DEFAULT_TRANSPORT = next(iter(TRANSPORTS))


def check_transport(transport: str, comm: object = None) -> type[HorovodCollectives]:
    """The registered transport named ``transport``, after checking the ``comm`` option against
    it; a ValueError naming the registry's transports for an unknown name, or naming those
    that take ``comm`` when it does not."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {tuple(TRANSPORTS)}, got {transport!r}")
    chosen = TRANSPORTS[transport]
    if comm is not None and not chosen.takes_comm:
        takers = " or ".join(f"transport={n!r}" for n, t in TRANSPORTS.items() if t.takes_comm)
        raise ValueError(f"comm is used by {takers} only")
    return chosen


__all__ = ["DEFAULT_TRANSPORT", "TRANSPORTS", "check_transport"]
