"""Counts the bytes of the tensors really handed to collectives on a rank, for the byte checks:
GsSketch's :class:`~gs_horovod.engine.state.CommStats` and the baselines' meters are compared with
these counts, not with their own formulas.

- :class:`HandedOver` wraps ``horovod.torch``'s ``allreduce``, ``allgather``, ``alltoall`` and
  ``broadcast`` (what :class:`gs_horovod.transports.horovod.HorovodCollectives` calls) and the
  ``allreduce_async_`` / ``grouped_allreduce_async_`` of Horovod's ``DistributedOptimizer``; each
  call goes through to Horovod unchanged and its input's bytes are added up under its name.
- :class:`CountingCollectives` wraps one :class:`gs_horovod.transports.protocol.Collectives` (for
  ``transport="mpi"``, whose big collectives go through mpi4py, not Horovod) the same way.

A helper the workers import, not a worker: it is never launched itself.
"""

from __future__ import annotations

from typing import Any

from gs_horovod.engine.exchanges import EXCHANGES

# the engine's collectives by name, and the CommStats field that counts each: what every
# exchange declares, and the step's own
ENGINE = {**{c.name: c.counts for x in EXCHANGES.values() for c in x.collectives},
          "gs_horovod.exact": "exact", "gs_horovod.dense": "dense"}
# the engine's agreement checks (a few int64s, not payload)
CHECKS = ("gs_horovod.options", "gs_horovod.selections", "gs_horovod.nonfinite")


def nbytes(x: Any) -> int:
    return x.numel() * x.element_size()


class Counter:
    """Bytes handed over by collective name (``by_name``) and the number of calls."""

    def __init__(self) -> None:
        self.by_name: dict[str, int] = {}
        self.calls: dict[str, int] = {}

    def add(self, name: str, n: int) -> None:
        self.by_name[name] = self.by_name.get(name, 0) + n
        self.calls[name] = self.calls.get(name, 0) + 1

    def clear(self) -> None:
        self.by_name.clear()
        self.calls.clear()

    def engine(self) -> dict[str, Any]:
        """GsSketch's counted bytes by CommStats field; names it issued that are neither payload
        nor checks (``unknown``: a collective CommStats cannot be counting)."""
        out: dict[str, Any] = {f: 0 for f in set(ENGINE.values())}
        unknown = []
        for name, n in self.by_name.items():
            if name in ENGINE:
                out[ENGINE[name]] += n
            elif name == "gs_horovod.early":
                out["dense"] += n
            elif name not in CHECKS and not name.startswith("optimizer:"):
                unknown.append(name)
        out["unknown"] = sorted(unknown)
        return out

    def total(self, prefix: str = "") -> int:
        return sum(n for name, n in self.by_name.items() if name.startswith(prefix))


class HandedOver(Counter):
    """While entered, counts every tensor handed to horovod.torch's collectives (keyed by the
    name given, ``optimizer:`` + Horovod's name for the DistributedOptimizer's own allreduces).
    ``gs_sketch``: the optimizer's compressor is GsSketch, whose float16 payloads (an early dense
    step: the step flag, then the gradient) count as ``gs_horovod.early``, less the flag."""

    def __init__(self, gs_sketch: bool = False) -> None:
        super().__init__()
        self.gs_sketch = gs_sketch

    def _optimizer_name(self, payload: Any, kw: dict) -> str:
        import torch

        if self.gs_sketch and payload.dtype == torch.float16:
            return "gs_horovod.early"
        return "optimizer:" + str(kw.get("name"))

    def _gradient_bytes(self, payload: Any) -> int:
        import torch

        return nbytes(payload) - (2 if self.gs_sketch and payload.dtype == torch.float16 else 0)

    def __enter__(self) -> HandedOver:
        import horovod.torch as hvd
        import horovod.torch.optimizer as hvd_optimizer

        self._saved = []

        def wrap(module: Any, attr: str, name_of: Any, size_of: Any) -> None:
            inner = getattr(module, attr)

            def counted(*args: Any, **kw: Any) -> Any:
                self.add(name_of(args, kw), size_of(args[0]))
                return inner(*args, **kw)

            self._saved.append((module, attr, inner))
            setattr(module, attr, counted)

        for attr in ("allreduce", "allgather", "alltoall", "broadcast"):
            wrap(hvd, attr, lambda args, kw: kw.get("name") or "unnamed", nbytes)
        wrap(hvd_optimizer, "allreduce_async_", lambda args, kw: self._optimizer_name(args[0], kw),
             self._gradient_bytes)
        wrap(hvd_optimizer, "grouped_allreduce_async_", lambda args, kw: self._optimizer_name(args[0][0], kw),
             lambda tensors: sum(self._gradient_bytes(t) for t in tensors))
        return self

    def __exit__(self, *exc: Any) -> None:
        for module, attr, inner in reversed(self._saved):
            setattr(module, attr, inner)


class CountingCollectives:
    """A :class:`gs_horovod.transports.protocol.Collectives` that counts into ``counter`` the bytes of
    every input handed to ``inner`` (by name) and forwards the call unchanged."""

    def __init__(self, inner: Any, counter: Counter) -> None:
        self.inner, self.counter = inner, counter
        self.rank, self.size, self.averages = inner.rank, inner.size, inner.averages

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    def allreduce(self, x: Any, name: str) -> Any:
        self.counter.add(name, nbytes(x))
        return self.inner.allreduce(x, name)

    def allreduce_sum(self, x: Any, name: str) -> Any:
        self.counter.add(name, nbytes(x))
        return self.inner.allreduce_sum(x, name)

    def allgather(self, x: Any, name: str) -> Any:
        self.counter.add(name, nbytes(x))
        return self.inner.allgather(x, name)

    def alltoall(self, x: Any, splits: Any, name: str, kind: str = "alltoall") -> Any:
        self.counter.add(name, nbytes(x))
        return self.inner.alltoall(x, splits, name, kind)

    def broadcast(self, x: Any, name: str) -> Any:
        self.counter.add(name, nbytes(x))
        return self.inner.broadcast(x, name)

    def same_on_every_rank(self, value: Any, name: str) -> Any:
        self.counter.add(name, 16)  # two int64s (Horovod's Min of ±value)
        return self.inner.same_on_every_rank(value, name)


def count_collectives(compressor: Any, counter: Counter) -> None:
    """Makes ``compressor`` (a torch GsSketch) hand its engine :class:`CountingCollectives`."""
    make = compressor._collectives
    compressor._collectives = lambda op, process_set: CountingCollectives(make(op, process_set), counter)

