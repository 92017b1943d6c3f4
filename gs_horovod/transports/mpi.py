"""The ``transport="mpi"`` transport: :class:`MpiCollectives`, whose allreduces are
:func:`tree_allreduce` (recursive doubling, node-aware) over mpi4py and whose alltoall and
allgather are MPI's Alltoallv / Allgatherv, beside Horovod.

``tree_allreduce(buf, comm)`` sums ``buf`` over every rank of ``comm`` and returns the sum,
bitwise identical on every rank:

1. Node level (``node_aware=True``): ranks sharing a host (``Split_type(COMM_TYPE_SHARED)``,
   or ``ranks_per_host`` to emulate hosts) reduce to their leader, local rank 0.
2. Leaders run recursive doubling: in round i each leader swaps its partial sum with the
   leader whose index differs in bit i (``Sendrecv``) and adds; after ceil(log2 L) rounds all
   L leaders hold the total. Float addition is commutative, so both partners of a round get
   the same bits, and by induction so do all leaders. For L not a power of two, with
   L = 2^m + e, leaders 2i and 2i+1 (i < e) first fold into one (one extra round before) and
   the folded leader receives the result after (one round after).
3. Leaders broadcast the total on their host.

Each rank of the doubling sends n·itemsize bytes per round: ceil(log2 L) rounds (+2 when
L is not a power of two), against 2(L−1)/L·n·itemsize in L−1 latency-bound steps for a ring.
``MergeStats`` counts bytes sent and rounds per rank, for tests and benchmarks.

GPU buffers (torch CUDA tensors) go to MPI directly when Open MPI reports CUDA support
(``MPIX_Query_cuda_support``), else through a host copy; see :func:`cuda_aware_mpi`.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np

from ..array_ops import Array, ArrayOps
from .collective_cost import Traffic
from .horovod import HorovodCollectives, Host
from .protocol import count, half_prescaled

if TYPE_CHECKING:
    from mpi4py import MPI


@dataclass
class MergeStats:
    """Per-rank traffic of ``tree_allreduce`` calls (cumulative): bytes this rank sent and
    point-to-point rounds it took part in, split by level."""

    bytes_sent: int = 0
    doubling_rounds: int = 0
    node_rounds: int = 0
    calls: int = 0


def _mpi() -> Any:
    """mpi4py's MPI module, imported on first use: importing it initialises MPI, which importing
    this module (for :class:`MergeStats`) must not."""
    from mpi4py import MPI

    return MPI


def horovod_world(hvd: Any, comm: Any = None) -> MPI.Comm:
    """``comm`` (or MPI's world), checked to be Horovod's ranks (``hvd``: horovod.torch or
    horovod.tensorflow) under its MPI controller with MPI_THREAD_MULTIPLE, which our collectives
    need beside Horovod's background thread."""
    try:
        threads = hvd.mpi_enabled() and hvd.mpi_threads_supported()
    except ValueError:  # raised under the Gloo controller
        threads = False
    if not threads:
        raise RuntimeError(
            "GsSketch(transport='mpi') needs Horovod's MPI controller with MPI_THREAD_MULTIPLE "
            "(launch with horovodrun --mpi or mpirun, and leave HOROVOD_MPI_THREADS_DISABLE unset); "
            "use transport='horovod' under Gloo"
        )
    comm = _mpi().COMM_WORLD if comm is None else comm
    if comm.Get_size() != hvd.size() or comm.Get_rank() != hvd.rank():
        raise RuntimeError(
            f"GsSketch(transport='mpi'): the MPI communicator (rank {comm.Get_rank()} of {comm.Get_size()}) "
            f"is not Horovod's (rank {hvd.rank()} of {hvd.size()})"
        )
    return comm


class Communicators:
    """The communicators one ``tree_allreduce`` needs, split once from ``comm`` (collective).

    node: ranks of this host; leaders: local rank 0 of every host (None on other ranks).
    ``ranks_per_host`` emulates hosts by consecutive blocks of ranks (tests, benchmarks).
    """

    def __init__(self, comm: MPI.Comm, node_aware: bool = True, ranks_per_host: Optional[int] = None) -> None:
        self.comm = comm
        if not node_aware:
            self.node = comm.Split(comm.Get_rank(), 0)  # one rank per "host"
        elif ranks_per_host is not None:
            if ranks_per_host < 1:
                raise ValueError(f"ranks_per_host must be >= 1, got {ranks_per_host}")
            self.node = comm.Split(comm.Get_rank() // ranks_per_host, comm.Get_rank())
        else:
            self.node = comm.Split_type(_mpi().COMM_TYPE_SHARED, key=comm.Get_rank())
        is_leader = self.node.Get_rank() == 0
        self.leaders = comm.Split(0 if is_leader else _mpi().UNDEFINED, comm.Get_rank())
        if self.leaders == _mpi().COMM_NULL:
            self.leaders = None


def tree_allreduce(buf: Any, comms: Communicators, stats: Optional[MergeStats] = None) -> Any:
    """Returns the elementwise sum of ``buf`` over all ranks, as a new array of its kind.

    buf: (n,) float16/float32/float64, contiguous, the same shape and dtype on every rank: a
    NumPy array, or a torch CUDA tensor when MPI is CUDA-aware (see :func:`tree_allreduce_tensor`).
    MPI has no float16 type: float16 buffers travel as raw bytes and are added here.
    """
    if len(buf.shape) != 1:
        raise ValueError(f"tree_allreduce takes a 1-D array, got shape {tuple(buf.shape)}")
    stats = stats if stats is not None else MergeStats()
    stats.calls += 1
    acc = _copy(buf)
    node = comms.node
    if node.Get_size() > 1:
        if node.Get_rank() != 0:
            stats.bytes_sent += acc.nbytes
            if _is_half(acc):
                node.Send(_raw(acc), dest=0, tag=_TAG)
            else:
                node.Reduce(acc, None, op=_mpi().SUM, root=0)
        elif _is_half(acc):  # the leader adds the others' halves in rank order
            recv = _empty_like(acc)
            for source in range(1, node.Get_size()):
                node.Recv(_raw(recv), source=source, tag=_TAG)
                acc = _sync(acc + recv)
        else:
            recv = _empty_like(acc)
            node.Reduce(acc, recv, op=_mpi().SUM, root=0)
            acc = recv
        stats.node_rounds += 1
    if comms.leaders is not None:
        acc = _recursive_doubling(acc, comms.leaders, stats)
    if node.Get_size() > 1:
        node.Bcast(_raw(acc), root=0)
        stats.node_rounds += 1
        if node.Get_rank() == 0:
            stats.bytes_sent += acc.nbytes * (node.Get_size() - 1)
    return acc


def _recursive_doubling(acc: np.ndarray, comm: MPI.Comm, stats: MergeStats) -> np.ndarray:
    size, rank = comm.Get_size(), comm.Get_rank()
    if size == 1:
        return acc
    pof2 = 1 << (size.bit_length() - 1)
    extra = size - pof2
    recv = _empty_like(acc)
    # fold: of each pair (2i, 2i+1) with i < extra, the even rank hands its data to the odd one
    if rank < 2 * extra:
        if rank % 2 == 0:
            comm.Send(_raw(acc), dest=rank + 1, tag=_TAG)
            stats.bytes_sent += acc.nbytes
            stats.doubling_rounds += 1
            comm.Recv(_raw(acc), source=rank + 1, tag=_TAG)
            stats.doubling_rounds += 1
            return acc
        comm.Recv(_raw(recv), source=rank - 1, tag=_TAG)
        acc = _sync(acc + recv)
        stats.doubling_rounds += 1
        vrank = rank // 2
    else:
        vrank = rank - extra
    mask = 1
    while mask < pof2:
        vpartner = vrank ^ mask
        partner = vpartner * 2 + 1 if vpartner < extra else vpartner + extra
        comm.Sendrecv(_raw(acc), dest=partner, sendtag=_TAG, recvbuf=_raw(recv), source=partner, recvtag=_TAG)
        acc = _sync(acc + recv)
        stats.bytes_sent += acc.nbytes
        stats.doubling_rounds += 1
        mask <<= 1
    if rank < 2 * extra:  # unfold: return the total to the even partner
        comm.Send(_raw(acc), dest=rank - 1, tag=_TAG)
        stats.bytes_sent += acc.nbytes
        stats.doubling_rounds += 1
    return acc


def alltoallv(buf: np.ndarray, splits: np.ndarray, comm: MPI.Comm) -> tuple[np.ndarray, np.ndarray]:
    """MPI's Alltoallv of the 1-D ``buf``: ``splits[r]`` elements (in order) to rank r; returns
    (what every rank sent here, in rank order; the counts received (P,) int32). The counts go
    first, by one Alltoall."""
    splits = np.ascontiguousarray(splits, dtype=np.int32)
    got = np.empty_like(splits)
    comm.Alltoall(splits, got)
    out = np.empty(int(got.sum()), dtype=buf.dtype)
    comm.Alltoallv([np.ascontiguousarray(buf), (splits, _displacements(splits))], [out, (got, _displacements(got))])
    return out, got


def allgatherv(buf: np.ndarray, comm: MPI.Comm) -> np.ndarray:
    """MPI's Allgatherv of the 1-D ``buf`` (any length per rank): every rank's, in rank order."""
    sizes = np.array(comm.allgather(int(buf.shape[0])), dtype=np.int64)
    out = np.empty(int(sizes.sum()), dtype=buf.dtype)
    comm.Allgatherv(np.ascontiguousarray(buf), [out, (sizes, _displacements(sizes))])
    return out


def _displacements(counts: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(counts.dtype)


@lru_cache(maxsize=1)
def cuda_aware_mpi() -> bool:
    """Whether MPI can read and write GPU memory: ``GS_HOROVOD_CUDA_AWARE_MPI`` (0/1) if set,
    else Open MPI's ``MPIX_Query_cuda_support()`` when the library exports it, else False."""
    forced = os.environ.get("GS_HOROVOD_CUDA_AWARE_MPI")
    if forced is not None:
        return forced == "1"
    query = getattr(ctypes.CDLL(_mpi().__file__), "MPIX_Query_cuda_support", None)  # mpi4py's libmpi
    if query is None:
        return False
    query.restype = ctypes.c_int
    return bool(query())


def tree_allreduce_tensor(tensor: Any, comms: Communicators, stats: Optional[MergeStats] = None) -> Any:
    """``tree_allreduce`` of a 1-D float torch tensor (CPU or CUDA), returning a new tensor on
    the same device. CUDA tensors go to MPI as they are when it is CUDA-aware, else through a
    host copy (one device-to-host and one host-to-device transfer per call)."""
    import torch

    if tensor.is_cuda and cuda_aware_mpi():
        return tree_allreduce(_sync(tensor.detach().contiguous()), comms, stats)
    result = tree_allreduce(tensor.detach().cpu().contiguous().numpy(), comms, stats)
    return torch.from_numpy(result).to(tensor.device)


_TAG = 0x6753  # "gS"


def _is_half(x: Any) -> bool:
    return str(x.dtype) in ("float16", "torch.float16")


def _raw(x: Any) -> Any:
    """x as raw bytes for point-to-point transfers when MPI has no type for it (float16)."""
    if not _is_half(x):
        return x
    if isinstance(x, np.ndarray):
        return x.view(np.uint8)
    import torch

    return x.view(torch.uint8)


def _copy(x: Any) -> Any:
    return x.copy() if isinstance(x, np.ndarray) else _sync(x.clone())


def _empty_like(x: Any) -> Any:
    return np.empty_like(x) if isinstance(x, np.ndarray) else x.new_empty(x.shape)


def _sync(x: Any) -> Any:
    """MPI reads device memory outside torch's streams: wait for the kernels that wrote ``x``."""
    if not isinstance(x, np.ndarray) and x.is_cuda:
        import torch

        torch.cuda.current_stream(x.device).synchronize()
    return x


TreeAllreduce = Callable[[Array, Any, MergeStats], Array]
"""The framework's call of :func:`tree_allreduce`: (x, communicators, stats) → sum."""


NumpyCall = Callable[[Callable[..., Any], list[Array], list[str]], tuple[Array, ...]]
"""The framework's way to run a NumPy function on its arrays: (fn, arrays, the dtype names of
fn's results) → fn's results as the framework's arrays, on the first array's device (torch:
eagerly; TF: ``tf.numpy_function``)."""


class MpiCollectives(HorovodCollectives):
    """Sketch merge, exact round and the sparse exchange's threshold rounds by
    :func:`tree_allreduce` over mpi4py (recursive doubling, through ``tree``), its alltoall and
    allgather by MPI's Alltoallv / Allgatherv (through ``numpy_call``); the tiny checks stay on
    Horovod. Made on all of Horovod's ranks only (the global process set), over ``comm``
    (default: MPI's world), which must be Horovod's (:func:`horovod_world`)."""

    name = "mpi"
    allreduce_kind = "tree"
    takes_comm = True
    dense_rides_horovod = False

    @classmethod
    def connect(cls, host: Host, op: Any, process_set: Any) -> MpiCollectives:
        """The collectives over ``host``'s communicators, split from ``comm`` at the first call
        (collective; kept in ``host._connection``); a ValueError for a process set other than
        the global one, a RuntimeError from :func:`horovod_world`."""
        if process_set is not None and process_set.process_set_id != 0:
            raise ValueError("GsSketch(transport='mpi') runs over all ranks: use the global process set")
        if host._connection is None:
            host._connection = Communicators(horovod_world(host._hvd, host._comm).Dup())  # initialises MPI
        return cls(host._hvd, host.ops, op, process_set, host._connection, host.merge_stats, host._tree_allreduce,
                   host._numpy_call)

    def __init__(self, hvd: Any, ops: ArrayOps, op: Any, process_set: Any, comms: Communicators, stats: MergeStats,
                 tree: TreeAllreduce, numpy_call: NumpyCall, traffic: Optional[Traffic] = None) -> None:
        super().__init__(hvd, ops, op, process_set, traffic)
        self.comms, self.stats, self.tree, self.numpy_call = comms, stats, tree, numpy_call

    def allreduce_sum(self, x: Array, name: str) -> Array:
        count(self.traffic, "tree", x)
        return self.tree(x, self.comms, self.stats)

    def allgather(self, x: Array, name: str) -> Array:
        count(self.traffic, "allgather", x)
        return self.numpy_call(lambda buf: (allgatherv(buf, self.comms.comm),), [x], [self.ops.dtype_name(x)])[0]

    def alltoall(self, x: Array, splits: Array, name: str, kind: str = "alltoall") -> tuple[Array, Array]:
        count(self.traffic, kind, x)
        received, got = self.numpy_call(lambda buf, counts: alltoallv(buf, counts, self.comms.comm), [x, splits],
                                        [self.ops.dtype_name(x), "int32"])
        return received, self.ops.reshape(got, (self.size,))

    def allreduce(self, x: Array, name: str) -> Array:
        count(self.traffic, "tree", x)
        half = self.ops.dtype_name(x) == "float16"
        if self.averages and half:
            x = half_prescaled(self.ops, x, self.size)
        total = self.tree(x, self.comms, self.stats)
        return total / self.size if self.averages and not half else total
