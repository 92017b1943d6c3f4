"""The transports, each one module implementing :class:`~.protocol.Collectives`:
:mod:`.horovod` (Horovod, torch and TF), :mod:`.mpi` (``transport="mpi"``: mpi4py beside Horovod),
:mod:`.dist` (torch.distributed) and :mod:`.simulated` (P ranks in one process); the protocol
and what is written once over it in :mod:`.protocol`, the collective cost model (the bytes and
rounds each collective algorithm puts on the wire) in :mod:`.collective_cost`."""
