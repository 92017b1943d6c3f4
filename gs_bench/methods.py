"""Every method the examples and benchmarks compare, in one registry (:data:`METHODS`): for each
name its Horovod optimizer (torch, under horovodrun), DDP communication hook, exchange on
simulated ranks, Horovod TensorFlow compression, the collectives one step issues planned from the
gradient shapes, and the :class:`Meter` of the bytes each rank sends. A method is added here,
once; :mod:`.cli`, :mod:`.variants` and the scripts look it up.

- ``gs``: GsSketch (:mod:`gs_horovod.torch`, :mod:`gs_horovod.ddp`, :mod:`gs_horovod.tensorflow`);
  options: :class:`~gs_horovod.engine.GsConfig`'s and ``transport`` (``merge``, its former name,
  read as it in the variants recorded before the rename).
- ``none`` / ``fp16``: Horovod's ``Compression.none`` / ``fp16`` (DDP: no hook / torch's
  ``fp16_compress_hook``): one allreduce of every gradient at 4 / 2 bytes an element.
- ``topk``, ``gtopk``, ``sketched``, ``powersgd``: the baselines of :mod:`gs_bench.baselines`
  (options: their constructors'); under DDP ``powersgd`` is torch's ``powerSGD_hook``.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Optional

from gs_horovod.checkpoint import RENAMED
from gs_horovod.engine import CommStats, GsConfig, Plan, collectives_of
from gs_horovod.transports import DEFAULT_TRANSPORT
from gs_horovod.transports.collective_cost import Collective, Traffic, total_wire_bytes

from .baselines import GTopK, PowerSGD, Reducer, ReducerOptimizer, SketchedSGD, TopKAllgather
from .powersgd_hook import register_powersgd_hook

Shapes = list[tuple[int, ...]]


class Meter:
    """Bytes one rank sends per step, mean so far: ``per_step()`` → (payload handed to
    collectives, wire bytes through the busiest rank); ``collectives()`` → one step's (kind,
    payload bytes) list, for the cost model."""

    def __init__(self, ranks: int, collectives: Callable[[], list[Collective]],
                 per_step: Optional[Callable[[], tuple[float, float]]] = None) -> None:
        self.ranks, self._collectives, self._per_step = ranks, collectives, per_step

    def collectives(self) -> list[Collective]:
        return self._collectives()

    def per_step(self) -> tuple[float, float]:
        if self._per_step is not None:
            return self._per_step()
        step = self.collectives()
        return sum(n for _, n in step), total_wire_bytes(step, self.ranks)

    @classmethod
    def of_traffic(cls, traffic: Traffic) -> Meter:
        """The meter of collectives counted as a transport issued them: means over every step so far."""
        return cls(traffic.ranks, lambda: traffic.last_step, traffic.per_step)

    @classmethod
    def of_gs(cls, stats: Callable[[], CommStats], ranks: int, allreduce_kind: str = "allreduce") -> Meter:
        """gs-SGD's meter from its :class:`CommStats` as ``stats()`` reads them now: per step
        (means so far) its collectives as :func:`gs_horovod.engine.collectives_of` lays them out,
        the allreduces as ``allreduce_kind``."""
        return cls(ranks, lambda: collectives_of(stats().per_step(), allreduce_kind))


class Method:
    """One method: ``name`` (``--compression``), ``label`` (tables), whether it selects
    k = ratio · D coordinates (``takes_ratio``), where its options come from on the command line
    (``option_flag``: "--gs", "--opt" or None), and where it runs (``under_ddp``,
    ``under_tensorflow``, ``simulated_too``); ``scoped``: its tables always name its scope.
    ``ratio`` None everywhere: the method's default."""

    name: str
    label: str
    takes_ratio = True
    scoped = False
    option_flag: Optional[str] = "--opt"
    under_ddp = False
    under_tensorflow = False
    simulated_too = True

    def variant_label(self, options: dict[str, Any]) -> str:
        """A table label of the method with ``options``: "gTop-k (global)", "gTop-k (per
        tensor)", "gs-SGD", "gs-SGD, exchange=sketch", ..."""
        rest = dict(options)
        scope = rest.pop("scope", "global")
        label = self.label
        if self.scoped or scope != "global":
            label += " (per tensor)" if scope == "layer" else f" ({scope})"
        return label + "".join(f", {k}={v}" for k, v in sorted(rest.items()))

    def wire(self, options: dict[str, Any]) -> str:
        """The format its messages travel in with ``options``: "fp32" (float32 values, int32
        indices) unless a ``wire`` option names another."""
        return options.get("wire", "fp32")

    def check(self, ratio: Optional[float], options: dict[str, Any]) -> None:
        """ValueError for a ratio the method does not take, or options it refuses."""
        if ratio is not None and not self.takes_ratio:
            raise ValueError(f"{self.label} takes no ratio, got ratio={ratio}")
        if options and self.option_flag is None:
            raise ValueError(f"{self.label} takes no options, got {options}")

    def horovod(self, optimizer: Any, named: list[tuple[str, Any]], ratio: Optional[float],
                options: dict[str, Any]) -> tuple[Any, Meter]:
        """(optimizer to step, its meter) under horovodrun, for torch ``named`` parameters."""
        raise NotImplementedError

    def planned(self, options: dict[str, Any], shapes: Shapes, ranks: int,
                ratio: Optional[float] = None) -> list[Collective]:
        """One step's (kind, payload bytes per rank) collectives for gradients of ``shapes``
        (f32) on ``ranks`` ranks, from the sizes alone, as the method's own code issues them."""
        raise NotImplementedError

    def simulated(self, comm: Any, ratio: Optional[float], options: dict[str, Any]) -> Any:
        """The reducer (``reduce(named, comm)`` → updates) of one simulated rank on ``comm``
        (a :class:`~gs_horovod.transports.simulated.SimulatedComm`), for :class:`ReducerOptimizer`."""
        raise ValueError(f"{self.label} does not run on simulated ranks")

    def ddp(self, ddp_model: Any, module: Any, ratio: Optional[float], options: dict[str, Any]) -> Meter:
        """Registers the method's DDP communication hook on ``ddp_model`` (wrapping ``module``)."""
        raise ValueError(f"{self.label} has no DDP communication hook")

    def tensorflow(self, ratio: Optional[float], options: dict[str, Any]) -> Any:
        """The ``compression`` for ``horovod.tensorflow``'s DistributedGradientTape / optimizer."""
        raise ValueError(f"{self.label} does not run under horovod.tensorflow")


def _ratio(ratio: Optional[float]) -> dict[str, float]:
    return {} if ratio is None else {"ratio": ratio}


def _shapes(named: list[tuple[str, Any]]) -> Shapes:
    return [tuple(p.shape) for _, p in sorted(named, key=lambda t: t[0])]


def _current_names(options: dict[str, Any]) -> dict[str, Any]:
    """GsSketch's ``options`` with former names (``gs:merge=mpi``, as variants were recorded before
    the rename) under the current ones, so the harness reads old records without a warning."""
    return {RENAMED.get(k, k): v for k, v in options.items()}


class Gs(Method):
    """GsSketch; ``transport="mpi"`` runs its allreduces as the MPI tree."""

    name, label, option_flag = "gs", "gs-SGD", "--gs"
    under_ddp = under_tensorflow = True

    @staticmethod
    def config(options: dict[str, Any], ratio: Optional[float]) -> tuple[GsConfig, str]:
        """(GsConfig, transport) of GsSketch with these options."""
        rest = _current_names(options)
        transport = rest.pop("transport", DEFAULT_TRANSPORT)
        return GsConfig(**_ratio(ratio), **rest), transport

    def wire(self, options: dict[str, Any]) -> str:
        """GsSketch's pair format (its dense steps under ``ratio="auto"`` go in float16)."""
        return self.config(options, None)[0].wire

    def horovod(self, optimizer: Any, named: list[tuple[str, Any]], ratio: Optional[float],
                options: dict[str, Any]) -> tuple[Any, Meter]:
        import horovod.torch as hvd

        from gs_horovod.compressor import allreduce_kind
        from gs_horovod.torch import GsSketch

        gs = GsSketch(**_ratio(ratio), **_current_names(options))
        opt = hvd.DistributedOptimizer(optimizer, named_parameters=named, compression=gs)
        return opt, Meter.of_gs(lambda: gs.stats, hvd.size(), allreduce_kind(gs.transport))

    def planned(self, options: dict[str, Any], shapes: Shapes, ranks: int,
                ratio: Optional[float] = None) -> list[Collective]:
        from gs_horovod.compressor import allreduce_kind

        config, transport = self.config(options, ratio)
        plan = Plan.split([(f"t{i:06d}", math.prod(s)) for i, s in enumerate(shapes)], config, ranks=ranks,
                          allreduce_kind=allreduce_kind(transport))
        return plan.collectives(config)

    def simulated(self, comm: Any, ratio: Optional[float], options: dict[str, Any]) -> Any:
        from .engine_reducer import EngineReducer

        if "transport" in _current_names(options):
            raise ValueError("simulated ranks exchange in process: GsSketch's transport option does not apply")
        return EngineReducer(comm, **_ratio(ratio), **options)

    def ddp(self, ddp_model: Any, module: Any, ratio: Optional[float], options: dict[str, Any]) -> Meter:
        import torch.distributed as dist

        from gs_horovod.ddp import GsState, gs_hook

        state = GsState(model=module, **_ratio(ratio), **options)
        ddp_model.register_comm_hook(state, gs_hook)
        return Meter.of_gs(lambda: state.stats, dist.get_world_size())

    def tensorflow(self, ratio: Optional[float], options: dict[str, Any]) -> Any:
        from gs_horovod.tensorflow import GsSketch

        return GsSketch(**_ratio(ratio), **_current_names(options))


class Dense(Method):
    """Every gradient in one allreduce at ``itemsize`` bytes an element (Horovod's
    ``Compression.none`` at 4, ``fp16`` at 2)."""

    takes_ratio, option_flag = False, None
    under_ddp = under_tensorflow = True

    def __init__(self, name: str, label: str, itemsize: int) -> None:
        self.name, self.label, self.itemsize = name, label, itemsize
        self.simulated_too = itemsize == 4  # fp16 is Horovod's

    def wire(self, options: dict[str, Any]) -> str:
        return "fp16" if self.itemsize == 2 else "fp32"

    def _compression(self, hvd: Any) -> Any:
        return hvd.Compression.fp16 if self.itemsize == 2 else hvd.Compression.none

    def horovod(self, optimizer: Any, named: list[tuple[str, Any]], ratio: Optional[float],
                options: dict[str, Any]) -> tuple[Any, Meter]:
        import horovod.torch as hvd

        opt = hvd.DistributedOptimizer(optimizer, named_parameters=named, compression=self._compression(hvd))
        step = self.planned({}, _shapes(named), hvd.size())
        return opt, Meter(hvd.size(), lambda: step)

    def planned(self, options: dict[str, Any], shapes: Shapes, ranks: int,
                ratio: Optional[float] = None) -> list[Collective]:
        return [("allreduce", float(sum(map(math.prod, shapes)) * self.itemsize))]

    def simulated(self, comm: Any, ratio: Optional[float], options: dict[str, Any]) -> Any:
        from .engine_reducer import MeanReducer

        if not self.simulated_too:
            return super().simulated(comm, ratio, options)
        return MeanReducer()

    def ddp(self, ddp_model: Any, module: Any, ratio: Optional[float], options: dict[str, Any]) -> Meter:
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        if self.itemsize == 2:
            ddp_model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        step = self.planned({}, _shapes(list(module.named_parameters())), dist.get_world_size())
        return Meter(dist.get_world_size(), lambda: step)

    def tensorflow(self, ratio: Optional[float], options: dict[str, Any]) -> Any:
        import horovod.tensorflow as hvd

        return self._compression(hvd)


class Baseline(Method):
    """A baseline :class:`~gs_bench.baselines.Exchange` of class ``reducer_class``: every
    gradient of a step exchanged at ``optimizer.step()`` (:class:`ReducerOptimizer`), its
    collectives counted as the transport issues them."""

    def __init__(self, name: str, label: str, reducer_class: type[Reducer]) -> None:
        self.name, self.label, self.reducer_class = name, label, reducer_class
        parameters = inspect.signature(reducer_class).parameters
        self.takes_ratio, self.scoped = "ratio" in parameters, "scope" in parameters

    def reducer(self, ratio: Optional[float], options: dict[str, Any]) -> Reducer:
        """The reducer with these options."""
        self.check(ratio, options)
        return self.reducer_class(**_ratio(ratio), **options)

    def horovod(self, optimizer: Any, named: list[tuple[str, Any]], ratio: Optional[float],
                options: dict[str, Any]) -> tuple[Any, Meter]:
        import horovod.torch as hvd

        from gs_horovod.kernels.torch_ops import TorchOps
        from gs_horovod.transports.horovod import HorovodCollectives

        comm = HorovodCollectives(hvd, TorchOps(), hvd.Sum, hvd.global_process_set, Traffic(hvd.size()))
        return ReducerOptimizer(optimizer, named, self.reducer(ratio, options), comm), Meter.of_traffic(comm.traffic)

    def planned(self, options: dict[str, Any], shapes: Shapes, ranks: int,
                ratio: Optional[float] = None) -> list[Collective]:
        return self.reducer(ratio, options).planned(shapes, ranks)

    def simulated(self, comm: Any, ratio: Optional[float], options: dict[str, Any]) -> Any:
        return self.reducer(ratio, options)


class PowerSgd(Baseline):
    """PowerSGD: this project's :class:`~gs_bench.baselines.PowerSGD` under Horovod and on
    simulated ranks; under DDP torch's own ``powerSGD_hook`` (:mod:`.powersgd_hook`; ``rank`` stands
    for ``matrix_approximation_rank``)."""

    under_ddp = True

    def variant_label(self, options: dict[str, Any]) -> str:
        """"PowerSGD r1", "PowerSGD r4, min_size=64", ... (the rank always named)."""
        rest = dict(options)
        rank = rest.pop("rank", inspect.signature(self.reducer_class).parameters["rank"].default)
        return f"{self.label} r{rank}" + "".join(f", {k}={v}" for k, v in sorted(rest.items()))

    def ddp(self, ddp_model: Any, module: Any, ratio: Optional[float], options: dict[str, Any]) -> Meter:
        return Meter.of_traffic(register_powersgd_hook(ddp_model, **options))


METHODS: dict[str, Method] = {m.name: m for m in (
    Gs(), Dense("none", "dense", 4), Dense("fp16", "fp16", 2),
    Baseline("topk", "top-k allgather", TopKAllgather), Baseline("gtopk", "gTop-k", GTopK),
    Baseline("sketched", "Sketched-SGD", SketchedSGD), PowerSgd("powersgd", "PowerSGD", PowerSGD))}
"""Every method by ``--compression`` name, in the order tables list them."""


def method(name: str) -> Method:
    """The method called ``name`` (ValueError naming the known ones)."""
    if name not in METHODS:
        raise ValueError(f"method must be one of {tuple(METHODS)}, got {name!r}")
    return METHODS[name]


def distributed_optimizer(name: str, optimizer: Any, named_parameters: Any, ratio: Optional[float] = None,
                          **options: Any) -> tuple[Any, Meter]:
    """(optimizer, :class:`Meter`) of method ``name`` under horovodrun (torch): GsSketch in
    Horovod's DistributedOptimizer, Horovod's none / fp16, or a baseline's ReducerOptimizer.
    ``ratio`` None: the method's default."""
    m = method(name)
    m.check(ratio, options)
    return m.horovod(optimizer, list(named_parameters), ratio, options)


DDP_METHODS = tuple(name for name, m in METHODS.items() if m.under_ddp)


def register_hook(name: str, ddp_model: Any, module: Any, ratio: Optional[float] = None,
                  **options: Any) -> Meter:
    """Registers method ``name``'s communication hook on ``ddp_model`` (which wraps ``module``)
    and returns the meter of its bytes. ``ratio``: gs only (None: GsSketch's default)."""
    m = method(name)
    if not m.under_ddp:
        raise ValueError(f"method must be one of {DDP_METHODS} under DDP, got {name!r}")
    m.check(ratio, options)
    return m.ddp(ddp_model, module, ratio, options)
