"""Horovod as a transport: :class:`HorovodCollectives` over ``horovod.torch`` or
``horovod.tensorflow`` (blocking calls in torch, graph ops in TF)."""

from __future__ import annotations

import re
from typing import Any, Optional, Protocol

import numpy as np

from ..array_ops import Array, ArrayOps
from .collective_cost import Traffic
from .deadline import poll_until, wait_on_thread
from .protocol import count, half_prescaled


def op_name(name: str) -> str:
    """A collective's name as Horovod's TF ops accept it (letters, digits, ``_`` and ``.``)."""
    return re.sub(r"[^A-Za-z0-9_.]", "_", name)


class Host(Protocol):
    """What a transport's :meth:`HorovodCollectives.connect` reads of the compressor that chose
    it (:class:`gs_horovod.compressor.GsSketchBase`)."""

    _hvd: Any  # horovod.torch or horovod.tensorflow
    ops: ArrayOps
    _comm: Any  # the comm= option (None: not given)
    _connection: Any  # what the transport made at its first connect, kept until reset (None before)
    merge_stats: Any  # the tree allreduces' counters (gs_horovod.transports.mpi.MergeStats)

    def _tree_allreduce(self, x: Array, comms: Any, stats: Any) -> Array: ...

    def _numpy_call(self, fn: Any, arrays: list[Array], dtypes: list[str]) -> tuple[Array, ...]: ...


class HorovodCollectives:
    """:class:`~gs_horovod.transports.protocol.Collectives` over Horovod (``hvd``: horovod.torch
    or horovod.tensorflow) on ``process_set``: ``allreduce`` with ``op`` (Average or Sum),
    allgather (any length per rank), alltoall with splits, broadcast from rank 0. ``traffic``:
    where torch calls are counted (the baselines' meter); None for GsSketch, whose ``stats``
    count its steps (under TF in graph counters).

    As a transport ``transport=`` chooses (:data:`gs_horovod.transports.TRANSPORTS`), a subclass
    sets ``name``, ``allreduce_kind`` (a :mod:`~gs_horovod.transports.collective_cost` kind),
    ``takes_comm`` (whether the ``comm`` option applies), ``dense_rides_horovod`` (whether an
    early dense step's float16 gradients may ride the allreduce Horovod itself runs on
    ``compress()``'s payload, i.e. whether this transport's allreduce is Horovod's) and, if
    its constructor differs, :meth:`connect`."""

    name = "horovod"
    allreduce_kind = "allreduce"  # Horovod's ring
    takes_comm = False
    dense_rides_horovod = True

    @classmethod
    def connect(cls, host: Host, op: Any, process_set: Any) -> HorovodCollectives:
        """This transport's collectives for one optimizer of ``host`` (its op, Average or Sum,
        and its process set, checked by the caller); raises where the transport cannot run them."""
        return cls(host._hvd, host.ops, op, process_set)

    def __init__(self, hvd: Any, ops: ArrayOps, op: Any, process_set: Any, traffic: Optional[Traffic] = None) -> None:
        self.hvd, self.ops, self.op, self.process_set, self.traffic = hvd, ops, op, process_set, traffic
        self.averages = op == hvd.Average

    @property
    def rank(self) -> int:
        """This rank in the process set now (read each time: a Horovod elastic reset renumbers)."""
        return self.process_set.rank()

    @property
    def size(self) -> int:
        """The process set's ranks now (read each time: a Horovod elastic reset changes them)."""
        return self.process_set.size()

    def allreduce(self, x: Array, name: str) -> Array:
        hvd = self.hvd
        count(self.traffic, "allreduce", x)
        if self.averages and self.ops.dtype_name(x) == "float16":
            x, op = half_prescaled(self.ops, x, self.size), hvd.Sum
        else:
            op = self.op
        return hvd.allreduce(x, op=op, name=op_name(name), process_set=self.process_set)

    def same_on_every_rank(self, value: Any, name: str) -> Any:
        both = self.hvd.allreduce(self.ops.plus_minus(value), op=self.hvd.Min, name=op_name(name),
                                  process_set=self.process_set)
        return self.ops.equal(both[0], -both[1])

    def allreduce_sum(self, x: Array, name: str) -> Array:
        count(self.traffic, "allreduce", x)
        return self.hvd.allreduce(x, op=self.hvd.Sum, name=op_name(name), process_set=self.process_set)

    def allreduce_sum_within(self, x: Array, name: str, timeout: float) -> Optional[Array]:
        """:meth:`allreduce_sum`, or None when not every rank joined within ``timeout`` seconds
        (it stays pending): horovod.torch's handle is polled on this thread; horovod.tensorflow
        has no handles, so a thread waits, ended by Horovod's shutdown at exit
        (:mod:`~gs_horovod.transports.deadline`)."""
        hvd = self.hvd
        if not hasattr(hvd, "poll"):  # horovod.tensorflow
            return wait_on_thread(lambda: self.allreduce_sum(x, name), timeout, end=hvd.shutdown)
        count(self.traffic, "allreduce", x)
        handle = hvd.allreduce_async(x, op=hvd.Sum, name=op_name(name), process_set=self.process_set)
        return poll_until(lambda: hvd.poll(handle), lambda: hvd.synchronize(handle), timeout)

    def allgather(self, x: Array, name: str) -> Array:
        count(self.traffic, "allgather", x)
        return self.hvd.allgather(x, name=op_name(name), process_set=self.process_set)

    def alltoall(self, x: Array, splits: Array, name: str, kind: str = "alltoall") -> tuple[Array, Array]:
        count(self.traffic, kind, x)
        received, got = self.hvd.alltoall(x, splits=self.ops.host_int32(splits), name=op_name(name),
                                          process_set=self.process_set)
        return received, self.ops.reshape(got, (self.size,))

    def broadcast(self, x: Array, name: str) -> Array:
        count(self.traffic, "broadcast", x)
        return self.hvd.broadcast(x, root_rank=0, name=op_name(name), process_set=self.process_set)

    def from_host(self, x: np.ndarray) -> Array:
        return self.ops.from_numpy(x)

    def to_host(self, x: Array) -> np.ndarray:
        return np.asarray(x.numpy())
