"""Method variants as the benchmarks name them, and one step's collectives of each from the
gradient shapes alone.

A variant is a word ``METHOD[:NAME=VALUE,...]`` with the baseline's constructor options or
GsSketch's (e.g. ``gtopk:scope=layer``, ``powersgd:rank=1``, ``gs:transport=mpi``), as
``scripts/bench/bench_throughput.sh`` takes it. :func:`planned` gives the (kind, payload bytes)
collectives one step issues, as each method's own code counts them; :mod:`gs_horovod.transports.collective_cost`
turns them into wire bytes and rounds.
"""

from __future__ import annotations

import ast
from typing import Any, Optional

from gs_horovod.engine import GsConfig
from gs_horovod.transports.collective_cost import Collective

from .baselines import Reducer
from .methods import METHODS, Baseline, Gs, method


def _literal(value: str) -> Any:
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


def parse_variant(word: str) -> tuple[str, dict[str, Any]]:
    """``METHOD[:NAME=VALUE,...]`` → (method, options); VALUE a Python literal, else a string."""
    name, _, rest = word.partition(":")
    if name not in METHODS:
        raise ValueError(f"method must be one of {tuple(METHODS)}, got {name!r} in {word!r}")
    options = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"a variant's options are NAME=VALUE, got {item!r} in {word!r}")
        options[key] = _literal(value)
    return name, options


def variant_word(name: str, options: dict[str, Any]) -> str:
    """The canonical word of (method, options), options sorted: inverse of :func:`parse_variant`."""
    return name + (":" + ",".join(f"{k}={v}" for k, v in sorted(options.items())) if options else "")


def variant_label(name: str, options: dict[str, Any]) -> str:
    """A table label: "gTop-k (global)", "gTop-k (per tensor)", "PowerSGD r1", "gs-SGD", ...
    (:meth:`gs_bench.methods.Method.variant_label`)."""
    return method(name).variant_label(options)


def takes_ratio(name: str) -> bool:
    """Whether the method selects k = ratio · D coordinates (gs-SGD, top-k, gTop-k,
    Sketched-SGD); dense, fp16 and PowerSGD take no ratio."""
    return method(name).takes_ratio


def reducer(name: str, options: dict[str, Any], ratio: Optional[float]) -> Reducer:
    """The baseline's :class:`~gs_bench.baselines.Exchange` with these options (``ratio``
    None: its default)."""
    m = method(name)
    if not isinstance(m, Baseline):
        raise ValueError(f"{name!r} is not a baseline reducer")
    return m.reducer(ratio, options)


def gs_config(options: dict[str, Any], ratio: Optional[float]) -> tuple[GsConfig, str]:
    """(GsConfig, transport) of GsSketch with these options."""
    return Gs.config(options, ratio)


def planned(name: str, options: dict[str, Any], shapes: list[tuple[int, ...]], ranks: int,
            ratio: Optional[float] = None) -> list[Collective]:
    """One step's (kind, payload bytes per rank) collectives for gradients of ``shapes``, from the
    sizes alone, as each method's own code counts them (:meth:`Method.planned
    <gs_bench.methods.Method.planned>`). ``ratio`` applies to the methods that take one
    (:func:`takes_ratio`; None: their default)."""
    m = method(name)
    return m.planned(options, shapes, ranks, ratio if m.takes_ratio else None)
