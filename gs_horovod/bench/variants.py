"""Method variants as the benchmarks name them, and one step's collectives of each from the
gradient shapes alone.

A variant is a word ``METHOD[:NAME=VALUE,...]`` with the baseline's constructor options or
GsSketch's (e.g. ``gtopk:scope=layer``, ``powersgd:rank=1``, ``gs:merge=mpi``), as
``scripts/bench/bench_throughput.sh`` takes it. :func:`planned` gives the (kind, payload bytes)
collectives one step issues, as each method's own code counts them; :mod:`gs_horovod.wire`
turns them into wire bytes and rounds.
"""

from __future__ import annotations

import ast
import inspect
import math
from typing import Any, Optional

from ..baselines import ALL_METHODS, METHODS, Exchange, PowerSGD
from ..gs_sgd import GsConfig, Layout
from ..wire import Collective

NAMES = {"none": "dense", "fp16": "fp16", "gs": "gs-SGD", "topk": "top-k allgather", "gtopk": "gTop-k",
         "sketched": "Sketched-SGD", "powersgd": "PowerSGD"}
SCOPED = ("topk", "gtopk", "sketched")  # baselines whose label always names the scope



def _literal(value: str) -> Any:
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


def parse_variant(word: str) -> tuple[str, dict[str, Any]]:
    """``METHOD[:NAME=VALUE,...]`` → (method, options); VALUE a Python literal, else a string."""
    method, _, rest = word.partition(":")
    if method not in ALL_METHODS:
        raise ValueError(f"method must be one of {ALL_METHODS}, got {method!r} in {word!r}")
    options = {}
    for item in filter(None, rest.split(",")):
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"a variant's options are NAME=VALUE, got {item!r} in {word!r}")
        options[name] = _literal(value)
    return method, options


def variant_word(method: str, options: dict[str, Any]) -> str:
    """The canonical word of (method, options), options sorted: inverse of :func:`parse_variant`."""
    return method + (":" + ",".join(f"{k}={v}" for k, v in sorted(options.items())) if options else "")


def variant_label(method: str, options: dict[str, Any]) -> str:
    """A table label: "gTop-k (global)", "gTop-k (per tensor)", "PowerSGD r1", "gs-SGD", ..."""
    rest = dict(options)
    label = NAMES[method]
    if method == "powersgd":
        label += f" r{rest.pop('rank', inspect.signature(PowerSGD).parameters['rank'].default)}"
    scope = rest.pop("scope", "global")
    if method in SCOPED or scope != "global":
        label += " (per tensor)" if scope == "layer" else f" ({scope})"
    return label + "".join(f", {k}={v}" for k, v in sorted(rest.items()))


def takes_ratio(method: str) -> bool:
    """Whether the method selects k = ratio · D coordinates (gs-SGD, top-k, gTop-k,
    Sketched-SGD); dense, fp16 and PowerSGD take no ratio."""
    return method == "gs" or (method in METHODS and "ratio" in inspect.signature(METHODS[method]).parameters)


def exchange(method: str, options: dict[str, Any], ratio: Optional[float]) -> Exchange:
    """The baseline's :class:`~gs_horovod.baselines.Exchange` with these options (``ratio``
    None: its default)."""
    return METHODS[method](**({} if ratio is None else {"ratio": ratio}), **options)


def gs_config(options: dict[str, Any], ratio: Optional[float]) -> tuple[GsConfig, str]:
    """(GsConfig, merge) of GsSketch with these options."""
    rest = dict(options)
    merge = rest.pop("merge", "horovod")
    return GsConfig(**({} if ratio is None else {"ratio": ratio}), **rest), merge


def planned(method: str, options: dict[str, Any], shapes: list[tuple[int, ...]], ranks: int,
            ratio: Optional[float] = None) -> list[Collective]:
    """One step's (kind, payload bytes per rank) collectives for gradients of ``shapes``, from the
    sizes alone, as each method's own code counts them: Horovod's dense (f32) or fp16 allreduce;
    gs-SGD's sketch (or allgather) and exact-round allreduces (``Layout.collectives``; tree merge
    under merge=mpi), as :func:`gs_horovod.baselines.distributed_optimizer`'s meter records
    them; a baseline's ``Exchange.planned``. ``ratio`` applies to the methods that take one
    (:func:`takes_ratio`; None: their default)."""
    ratio = ratio if takes_ratio(method) else None
    if method in ("none", "fp16"):
        return [("allreduce", float(sum(map(math.prod, shapes)) * (2 if method == "fp16" else 4)))]
    if method != "gs":
        return exchange(method, options, ratio).planned(shapes, ranks)
    config, merge = gs_config(options, ratio)
    layout = Layout.split([(f"t{i:06d}", math.prod(s)) for i, s in enumerate(shapes)], config, ranks=ranks)
    return layout.collectives(config, merge="tree" if merge == "mpi" else "allreduce")
