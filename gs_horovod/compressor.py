"""The GsSketch compressor base, written once for ``horovod.torch`` and ``horovod.tensorflow``
(parameterised by the ``hvd`` module and the framework's :class:`~gs_horovod.array_ops.ArrayOps`):
options, ``__repr__``, the op checks, the choice of transport (``transport``), the checkpoint
API, and the class-as-compressor convention of Horovod."""

from __future__ import annotations

import warnings
from dataclasses import asdict
from typing import Any, Callable, Optional

from .array_ops import Array, ArrayOps
from .checkpoint import DEFAULT_TIMEOUT, RENAMED, CheckpointApi, check_timeout
from .engine.config import GsConfig
from .engine.density import DENSE
from .engine.plan import Plan
from .transports import DEFAULT_TRANSPORT, TRANSPORTS, check_transport
from .transports.collective_cost import Collective
from .transports.horovod import HorovodCollectives
from .transports.mpi import MergeStats


class DefaultInstance:
    """Gives a compressor class ``default()``: one instance with default options, made on
    first use, that the class itself stands for when passed as ``compression``."""

    _default: Any = None

    @classmethod
    def default(cls) -> Any:
        """The class's instance with default options (made on the first call, then the same)."""
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


def renamed_option(options: dict[str, Any], new: str, value: Any, owner: str, stacklevel: int) -> Any:
    """``value`` of option ``new``, or the value given under its former name (:data:`RENAMED`;
    taken out of ``options``, with a DeprecationWarning naming ``new``, ``stacklevel`` as
    :func:`warnings.warn` counts it from here); a ValueError if both are given. None: neither was."""
    old = next(o for o, n in RENAMED.items() if n == new)
    if old not in options:
        return value
    if value is not None:
        raise ValueError(f"{owner}: give {new}= only ({old}= is its former name)")
    warnings.warn(f"{owner}({old}=...) is deprecated: use {new}=...", DeprecationWarning, stacklevel=stacklevel)
    return options.pop(old)


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


def allreduce_kind(transport: str) -> str:
    """The :mod:`gs_horovod.transports.collective_cost` kind GsSketch's allreduces run as under
    ``transport`` (a name of :data:`~gs_horovod.transports.TRANSPORTS`; else a ValueError)."""
    return check_transport(transport).allreduce_kind


class GsSketchBase(CheckpointApi, DefaultInstance):
    """What both GsSketch compressors share. A subclass provides ``_hvd`` (its horovod module),
    ``_make_ops()``, ``_tree_allreduce`` (a :data:`TreeAllreduce`), ``_describe(tensor)``,
    ``local_state_dict()`` and ``_load(state)``.

    transport: the collectives every exchange runs on, a name of
    :data:`~gs_horovod.transports.TRANSPORTS`: ``"horovod"`` (default) Horovod's; ``"mpi"``
    runs the allreduces (the sketch merge, the exact round, the sparse exchange's histograms)
    as :func:`gs_horovod.transports.mpi.tree_allreduce` and the alltoall and allgather as
    MPI's over ``comm`` (default: MPI's world, which must be Horovod's); it needs Horovod's MPI
    controller with MPI_THREAD_MULTIPLE, and ``merge_stats`` counts the tree allreduces' traffic.
    ``merge`` is its former name: still taken, with a DeprecationWarning (both: ValueError).

    checkpoint_timeout: seconds ``state_dict()`` waits for every rank (default 60) before it
    raises on the ranks that called it (:class:`~gs_horovod.checkpoint.CheckpointApi`).
    """

    _hvd: Any
    config = DefaultInstanceAttribute()
    transport = DefaultInstanceAttribute()
    merge_stats = DefaultInstanceAttribute()

    def __init__(self, transport: Optional[str] = None, comm: Any = None,
                 checkpoint_timeout: float = DEFAULT_TIMEOUT, **options: Any) -> None:
        transport = renamed_option(options, "transport", transport, type(self).__name__, stacklevel=4)
        transport = DEFAULT_TRANSPORT if transport is None else transport
        check_transport(transport, comm)
        self.checkpoint_timeout = check_timeout(checkpoint_timeout)
        self.config = GsConfig.from_options(options, extra=("transport", "comm", "checkpoint_timeout"))
        self.transport = transport
        self.ops = self._make_ops()
        self.merge_stats = MergeStats()
        self._comm = comm
        self._connection: Any = None  # what the transport made at its first connect (MPI: its communicators)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(transport={self.transport!r}, {self.config})"

    @DefaultInstanceProperty
    def merge(self) -> str:
        """Deprecated: the former name of :attr:`transport`."""
        warnings.warn(f"{type(self).__name__}.merge is deprecated: use .transport", DeprecationWarning,
                      stacklevel=3)
        return self.transport

    def _make_ops(self) -> ArrayOps:
        raise NotImplementedError

    def _tree_allreduce(self, x: Array, comms: Any, stats: MergeStats) -> Array:
        raise NotImplementedError

    def _numpy_call(self, fn: Callable[..., Any], arrays: list[Array], dtypes: list[str]) -> tuple[Array, ...]:
        raise NotImplementedError

    def _options(self) -> dict[str, Any]:
        return {**asdict(self.config), "transport": self.transport}

    @property
    def dense_rides_horovod(self) -> bool:
        """Whether an early dense step may hand its float16 gradient to Horovod's own allreduce
        (the transport's :attr:`~gs_horovod.transports.horovod.HorovodCollectives.dense_rides_horovod`)."""
        return TRANSPORTS[self.transport].dense_rides_horovod

    def _collectives(self, op: Any, process_set: Any) -> HorovodCollectives:
        """The collectives of one optimizer on the chosen transport, after checking its op (the
        transport checks the process set)."""
        hvd = self._hvd
        if op not in (hvd.Average, hvd.Sum):
            raise ValueError("GsSketch supports op=hvd.Average or hvd.Sum, not Adasum or others")
        return TRANSPORTS[self.transport].connect(self, op, process_set)

    @DefaultInstanceMethod
    def collectives_per_step(self, tensors: list[Any], ranks: Optional[int] = None) -> list[Collective]:
        """One step's (kind, payload bytes per rank) collectives (:mod:`gs_horovod.transports.collective_cost`) for the
        gradients of ``tensors`` (parameters or variables) on ``ranks`` ranks (default: Horovod's
        size) once warm-up is over: the sketch merge or the allgather and the exact round for the
        compressed ones, an allreduce of the others as they are. Under ``ratio="auto"``: at the
        level of the last step (:meth:`_planned_level`)."""
        ranks = self._hvd.size() if ranks is None else ranks
        described = [self._describe(t) for t in tensors]  # (name, elements, floating, itemsize)
        plan = Plan.split([(n, d) for n, d, floating, _ in described if floating], self.config, ranks=ranks,
                          allreduce_kind=allreduce_kind(self.transport), level=self._planned_level())
        others = sum(d * itemsize for _, d, floating, itemsize in described if not floating)
        return plan.collectives(self.config) + ([("allreduce", float(others))] if others else [])

    @DefaultInstanceMethod
    def bytes_per_step(self, tensors: list[Any], ranks: Optional[int] = None) -> int:
        """Bytes one rank hands to collectives per step: :meth:`collectives_per_step` summed."""
        return int(sum(n for _, n in self.collectives_per_step(tensors, ranks)))

    def _describe(self, tensor: Any) -> tuple[str, int, bool, int]:
        raise NotImplementedError

    def _planned_level(self) -> Optional[float]:
        """The density level :meth:`collectives_per_step` plans at: under ``ratio="auto"`` the
        last step's (``stats.density``; dense before any), else None (a fixed ratio or k)."""
        return (self.stats.density or DENSE) if self.config.adaptive else None

    def _checkpoint_comm(self) -> HorovodCollectives:
        """Horovod's collectives over every rank (sums), for the checkpoint protocol."""
        hvd = self._hvd
        return HorovodCollectives(hvd, self.ops, hvd.Sum, hvd.global_process_set)

    state_dict = DefaultInstanceMethod(CheckpointApi.state_dict)
    load_state_dict = DefaultInstanceMethod(CheckpointApi.load_state_dict)
    load_local_state_dict = DefaultInstanceMethod(CheckpointApi.load_local_state_dict)
