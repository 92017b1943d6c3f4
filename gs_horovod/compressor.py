"""The GsSketch compressor base, written once for ``horovod.torch`` and ``horovod.tensorflow``
(parameterised by the ``hvd`` module and the framework's :class:`~gs_horovod.array_ops.ArrayOps`):
options, ``__repr__``, the op checks, Horovod's and MPI's collectives and their factory, the
checkpoint API, and the class-as-compressor convention of Horovod."""

from __future__ import annotations

import re
import threading
from dataclasses import asdict, fields
from typing import Any, Callable, Optional

import numpy as np

from .array_ops import Array, ArrayOps
from .checkpoint import DEFAULT_TIMEOUT, CheckpointApi
from .collectives import count
from .gs_sgd import GsConfig, Layout
from .mpi import MergeStats
from .wire import Collective, Traffic


class DefaultInstance:
    """Gives a compressor class ``default()``: one instance with default options, made on
    first use, that the class itself stands for when passed as ``compression``."""

    _default: Any = None

    @classmethod
    def default(cls) -> Any:
        if cls.__dict__.get("_default") is None:
            cls._default = cls()
        return cls._default


class DefaultInstanceMethod:
    """A method that, looked up on the class itself, runs on the class's ``default()``
    instance, so ``compression=GsSketch`` (the class, as Horovod's own compressors are
    passed) works like ``compression=GsSketch()``."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __get__(self, obj: Any, cls: type) -> Any:
        return self.fn.__get__(obj if obj is not None else cls.default(), cls)


def config_from(options: dict[str, Any], extra: tuple[str, ...] = (), owner: str = "GsSketch") -> GsConfig:
    """A validated GsConfig from keyword options; unknown names are a TypeError naming ``owner``
    and listing the allowed ones (``extra``: adapter-level options the caller already took out)."""
    allowed = {f.name for f in fields(GsConfig)}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise TypeError(f"{owner} got unknown option(s) {unknown}; allowed: {sorted(allowed | set(extra))}")
    return GsConfig(**options)


MERGES = ("horovod", "mpi")


def check_merge(merge: str, comm: Any) -> None:
    """The ``merge`` and ``comm`` options of both compressors."""
    if merge not in MERGES:
        raise ValueError(f"merge must be one of {MERGES}, got {merge!r}")
    if comm is not None and merge != "mpi":
        raise ValueError("comm is used by merge='mpi' only")


def check_timeout(timeout: Any) -> float:
    """The ``checkpoint_timeout`` option of every adapter: seconds, a number > 0."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"checkpoint_timeout must be a number of seconds > 0, got {timeout!r}")
    return float(timeout)


def arrive_on_thread(collective: Callable[[], float], timeout: float) -> Optional[float]:
    """Runs ``collective`` (a blocking sum over ranks) on a daemon thread and waits ``timeout``
    seconds: its result, or None if it had not finished (it stays pending). Its error re-raises."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(collective())
        except Exception as error:  # handed to the caller's thread
            outcome.append(error)

    thread = threading.Thread(target=run, name="gs_horovod.arrive", daemon=True)
    thread.start()
    thread.join(timeout)
    if not outcome:
        return None
    if isinstance(outcome[0], Exception):
        raise outcome[0]
    return outcome[0]


class DefaultInstanceAttribute:
    """An instance attribute (set in ``__init__``) that, read on the class itself, is read on
    the class's ``default()`` instance: ``GsSketch.stats`` is the class form's stats."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, cls: type) -> Any:
        if obj is None:
            return getattr(cls.default(), self.name)
        raise AttributeError(self.name)  # not set yet: the instance's own value shadows this


class DefaultInstanceProperty:
    """A read-only property that, read on the class itself, reads the ``default()`` instance."""

    def __init__(self, fget: Callable[[Any], Any]) -> None:
        self.fget = fget
        self.__doc__ = fget.__doc__

    def __get__(self, obj: Any, cls: type) -> Any:
        return self.fget(obj if obj is not None else cls.default())


def op_name(name: str) -> str:
    """A collective's name as Horovod's TF ops accept it (letters, digits, ``_`` and ``.``)."""
    return re.sub(r"[^A-Za-z0-9_.]", "_", name)


class HorovodCollectives:
    """:class:`gs_horovod.collectives.Collectives` over Horovod (``hvd``: horovod.torch or
    horovod.tensorflow; blocking in torch, graph ops in TF) on ``process_set``: ``allreduce``
    with ``op`` (Average or Sum), allgather (any length per rank), alltoall with splits,
    broadcast from rank 0. ``traffic``: where torch calls are counted (the baselines' meter);
    None for GsSketch, whose ``stats`` count its steps (under TF in graph counters)."""

    allreduce_kind = "allreduce"  # Horovod's ring

    def __init__(self, hvd: Any, ops: ArrayOps, op: Any, process_set: Any, traffic: Optional[Traffic] = None) -> None:
        self.hvd, self.ops, self.op, self.process_set, self.traffic = hvd, ops, op, process_set, traffic
        self.rank, self.size, self.averages = process_set.rank(), process_set.size(), op == hvd.Average

    def allreduce(self, x: Array, name: str) -> Array:
        hvd = self.hvd
        count(self.traffic, "allreduce", x)
        if self.ops.dtype_name(x) == "float16" and self.op == hvd.Average:  # sum x/P: a float16 sum of P x
            return hvd.allreduce(x, op=hvd.Sum, prescale_factor=1.0 / self.size,  # could overflow
                                 name=op_name(name), process_set=self.process_set)
        return hvd.allreduce(x, op=self.op, name=op_name(name), process_set=self.process_set)

    def same_on_every_rank(self, value: Any, name: str) -> Any:
        both = self.hvd.allreduce(self.ops.plus_minus(value), op=self.hvd.Min, name=op_name(name),
                                  process_set=self.process_set)
        return self.ops.equal(both[0], -both[1])

    def allreduce_sum(self, x: Array, name: str) -> Array:
        count(self.traffic, "allreduce", x)
        return self.hvd.allreduce(x, op=self.hvd.Sum, name=op_name(name), process_set=self.process_set)

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


TreeAllreduce = Callable[[Array, Any, MergeStats], Array]
"""The framework's call of :func:`gs_horovod.mpi.tree_allreduce`: (x, communicators, stats) → sum."""


NumpyCall = Callable[[Callable[..., Any], list[Array], list[str]], tuple[Array, ...]]
"""The framework's way to run a NumPy function on its arrays: (fn, arrays, the dtype names of
fn's results) → fn's results as the framework's arrays, on the first array's device (torch:
eagerly; TF: ``tf.numpy_function``)."""


class MpiCollectives(HorovodCollectives):
    """Sketch merge, exact round and the sparse exchange's threshold rounds by
    :func:`gs_horovod.mpi.tree_allreduce` over mpi4py (recursive doubling, through ``tree``),
    its alltoall and allgather by MPI's Alltoallv / Allgatherv (through ``numpy_call``); the
    tiny checks stay on Horovod."""

    allreduce_kind = "tree"

    def __init__(self, hvd: Any, ops: ArrayOps, op: Any, process_set: Any, comms: Any, stats: MergeStats,
                 tree: TreeAllreduce, numpy_call: NumpyCall, traffic: Optional[Traffic] = None) -> None:
        super().__init__(hvd, ops, op, process_set, traffic)
        self.comms, self.stats, self.tree, self.numpy_call = comms, stats, tree, numpy_call

    def allreduce_sum(self, x: Array, name: str) -> Array:
        count(self.traffic, "tree", x)
        return self.tree(x, self.comms, self.stats)

    def allgather(self, x: Array, name: str) -> Array:
        from .mpi import allgatherv

        count(self.traffic, "allgather", x)
        return self.numpy_call(lambda buf: (allgatherv(buf, self.comms.comm),), [x], ["float32"])[0]

    def alltoall(self, x: Array, splits: Array, name: str, kind: str = "alltoall") -> tuple[Array, Array]:
        from .mpi import alltoallv

        count(self.traffic, kind, x)
        received, got = self.numpy_call(lambda buf, counts: alltoallv(buf, counts, self.comms.comm), [x, splits],
                                        ["float32", "int32"])
        return received, self.ops.reshape(got, (self.size,))

    def allreduce(self, x: Array, name: str) -> Array:
        count(self.traffic, "tree", x)
        size = self.comms.comm.Get_size()
        average, half = self.op == self.hvd.Average, self.ops.dtype_name(x) == "float16"
        if average and half:
            x = self.ops.cast(self.ops.cast(x, "float32") / size, "float16")
        total = self.tree(x, self.comms, self.stats)
        return total / size if average and not half else total


def allreduce_kind(merge: str) -> str:
    """The :mod:`gs_horovod.wire` kind GsSketch's allreduces run as under ``merge``: Horovod's
    ring ("allreduce") or the MPI tree ("tree")."""
    check_merge(merge, None)
    return (MpiCollectives if merge == "mpi" else HorovodCollectives).allreduce_kind


class GsSketchBase(CheckpointApi, DefaultInstance):
    """What both GsSketch compressors share. A subclass provides ``_hvd`` (its horovod module),
    ``_make_ops()``, ``_tree_allreduce`` (a :data:`TreeAllreduce`), ``_describe(tensor)``,
    ``local_state_dict()`` and ``_load(state)``.

    merge: ``"horovod"`` (default) merges with Horovod's allreduce; ``"mpi"`` runs the sketch
    merge and the exact round as :func:`gs_horovod.mpi.tree_allreduce` over ``comm`` (default:
    MPI's world, which must be Horovod's); it needs Horovod's MPI controller with
    MPI_THREAD_MULTIPLE, and ``merge_stats`` counts its traffic.

    checkpoint_timeout: seconds ``state_dict()`` waits for every rank (default 60) before it
    raises on the ranks that called it (:class:`~gs_horovod.checkpoint.CheckpointApi`).
    """

    _hvd: Any
    config = DefaultInstanceAttribute()
    merge = DefaultInstanceAttribute()
    merge_stats = DefaultInstanceAttribute()

    def __init__(self, merge: str = "horovod", comm: Any = None, checkpoint_timeout: float = DEFAULT_TIMEOUT,
                 **options: Any) -> None:
        check_merge(merge, comm)
        self.checkpoint_timeout = check_timeout(checkpoint_timeout)
        self.config: GsConfig = config_from(options, extra=("merge", "comm", "checkpoint_timeout"))
        self.merge = merge
        self.ops = self._make_ops()
        self.merge_stats = MergeStats()
        self._comm = comm
        self._comms: Any = None  # gs_horovod.mpi.Communicators, made at the first MPI merge

    def __repr__(self) -> str:
        return f"{type(self).__name__}(merge={self.merge!r}, {self.config})"

    def _make_ops(self) -> ArrayOps:
        raise NotImplementedError

    def _tree_allreduce(self, x: Array, comms: Any, stats: MergeStats) -> Array:
        raise NotImplementedError

    def _numpy_call(self, fn: Callable[..., Any], arrays: list[Array], dtypes: list[str]) -> tuple[Array, ...]:
        raise NotImplementedError

    def _options(self) -> dict[str, Any]:
        return {**asdict(self.config), "merge": self.merge}

    def _collectives(self, op: Any, process_set: Any) -> HorovodCollectives:
        """The collectives of one optimizer, after checking its op and process set."""
        hvd = self._hvd
        if op not in (hvd.Average, hvd.Sum):
            raise ValueError("GsSketch supports op=hvd.Average or hvd.Sum, not Adasum or others")
        if self.merge == "horovod":
            return HorovodCollectives(hvd, self.ops, op, process_set)
        if process_set is not None and process_set.process_set_id != 0:
            raise ValueError("GsSketch(merge='mpi') merges over all ranks: use the global process set")
        if self._comms is None:
            from .mpi import Communicators, horovod_world

            self._comms = Communicators(horovod_world(hvd, self._comm).Dup())  # initialises MPI
        return MpiCollectives(hvd, self.ops, op, process_set, self._comms, self.merge_stats, self._tree_allreduce,
                              self._numpy_call)

    @DefaultInstanceMethod
    def collectives_per_step(self, tensors: list[Any], ranks: Optional[int] = None) -> list[Collective]:
        """One step's (kind, payload bytes per rank) collectives (:mod:`gs_horovod.wire`) for the
        gradients of ``tensors`` (parameters or variables) on ``ranks`` ranks (default: Horovod's
        size) once warm-up is over: the sketch merge or the allgather and the exact round for the
        compressed ones, an allreduce of the others as they are."""
        ranks = self._hvd.size() if ranks is None else ranks
        described = [self._describe(t) for t in tensors]  # (name, elements, floating, itemsize)
        layout = Layout.split([(n, d) for n, d, floating, _ in described if floating], self.config, ranks=ranks,
                              allreduce_kind=allreduce_kind(self.merge))
        others = sum(d * itemsize for _, d, floating, itemsize in described if not floating)
        return layout.collectives(self.config) + ([("allreduce", float(others))] if others else [])

    @DefaultInstanceMethod
    def bytes_per_step(self, tensors: list[Any], ranks: Optional[int] = None) -> int:
        """Bytes one rank hands to collectives per step: :meth:`collectives_per_step` summed."""
        return int(sum(n for _, n in self.collectives_per_step(tensors, ranks)))

    def _describe(self, tensor: Any) -> tuple[str, int, bool, int]:
        raise NotImplementedError

    def _exchange(self, out: list[bytes]) -> list[bytes]:
        """Sends ``out[r]`` to rank r (one uint8 ``hvd.alltoall`` with splits; eagerly under TF);
        returns what each rank sent here, in rank order."""
        data = self.ops.from_numpy(np.frombuffer(b"".join(out), dtype=np.uint8).copy())
        splits = self.ops.from_numpy(np.array([len(b) for b in out], np.int32))
        received, splits = self._hvd.alltoall(data, splits=splits, name="gs_horovod.checkpoint")
        buf, sizes = received.numpy().tobytes(), splits.numpy().tolist()
        return [buf[end - n:end] for n, end in zip(sizes, np.cumsum(sizes).tolist())]

    def _arrive(self, value: float, name: str, timeout: float) -> Optional[float]:
        """Horovod's allreduce (Sum) of ``value`` over all ranks, given ``timeout`` seconds."""
        hvd, x = self._hvd, self.ops.from_numpy(np.array([value], np.float32))
        return arrive_on_thread(lambda: float(hvd.allreduce(x, op=hvd.Sum, name=name)[0]), timeout)

    def _rank(self) -> int:
        return self._hvd.rank()

    def _size(self) -> int:
        return self._hvd.size()

    state_dict = DefaultInstanceMethod(CheckpointApi.state_dict)
    load_state_dict = DefaultInstanceMethod(CheckpointApi.load_state_dict)
    load_local_state_dict = DefaultInstanceMethod(CheckpointApi.load_local_state_dict)
