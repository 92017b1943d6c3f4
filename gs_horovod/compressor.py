"""What the torch and TensorFlow GsSketch compressors share: option checking and the
class-as-compressor convention of Horovod."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from .gs_sgd import GsConfig


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


def config_from(options: dict[str, Any], extra: tuple[str, ...] = ()) -> GsConfig:
    """A validated GsConfig from keyword options; unknown names are a TypeError listing the
    allowed ones (``extra``: adapter-level options the caller already took out)."""
    allowed = {f.name for f in fields(GsConfig)}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise TypeError(f"GsSketch got unknown option(s) {unknown}; allowed: {sorted(allowed | set(extra))}")
    return GsConfig(**options)


MERGES = ("horovod", "mpi")


def check_merge(merge: str, comm: Any) -> None:
    """The ``merge`` and ``comm`` options of both compressors."""
    if merge not in MERGES:
        raise ValueError(f"merge must be one of {MERGES}, got {merge!r}")
    if comm is not None and merge != "mpi":
        raise ValueError("comm is used by merge='mpi' only")
