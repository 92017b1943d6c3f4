"""The checkpoint protocol of both compressors: one rank's state, and the state of all ranks
gathered on rank 0 (``state_dict``) and scattered back from it (``load_state_dict``)."""

from __future__ import annotations

import pickle
from typing import Any, Callable, Optional

GATHERED = "gs_horovod.GsSketch.gathered.v1"

Exchange = Callable[[list[bytes]], list[bytes]]
"""An alltoall of bytes over all Horovod ranks: sends ``out[r]`` to rank r, returns what
each rank sent to this one (in rank order)."""


def options_difference(saved: dict[str, Any], current: dict[str, Any]) -> str:
    """``"ratio=0.05 saved, 0.1 now; ..."`` for each option that differs ("" if none)."""
    keys = sorted(set(saved) | set(current))
    return "; ".join(f"{k}={saved.get(k, '<absent>')!r} saved, {current.get(k, '<absent>')!r} now"
                     for k in keys if saved.get(k, "<absent>") != current.get(k, "<absent>"))


def _world_size_error(saved: int, size: int) -> str:
    return (f"GsSketch state was saved by {saved} ranks, this job has {size}: residuals are per rank, "
            f"so resume with {saved} ranks, or leave the GsSketch state out to start residuals from zero")


def check_local_state(state: Any, options: dict[str, Any], size: int) -> str:
    """Why ``state`` (one rank's, from ``local_state_dict``) cannot be loaded here, or ""."""
    if isinstance(state, dict) and state.get("format") == GATHERED:
        return ("GsSketch: this is the gathered state of all ranks (state_dict()); load it with "
                "load_state_dict() called on every rank")
    if not isinstance(state, dict) or not isinstance(state.get("options"), dict):
        return f"GsSketch: not a GsSketch state (got {type(state).__name__})"
    diff = options_difference(state["options"], options)
    if diff:
        return f"GsSketch state was saved with different options: {diff}"
    if state.get("world_size", size) != size:
        return _world_size_error(state["world_size"], size)
    return ""


def _check_gathered(state: Any, size: int) -> str:
    if state is None:
        return ("GsSketch.load_state_dict: rank 0 passed None; it must pass what state_dict() returned on "
                "rank 0 (the other ranks pass None)")
    if not isinstance(state, dict) or state.get("format") != GATHERED:
        if isinstance(state, dict) and "options" in state:
            return ("GsSketch.load_state_dict: this is one rank's state (local_state_dict()); load it with "
                    "load_local_state_dict() on that rank, or save with state_dict() called on every rank")
        return f"GsSketch.load_state_dict: not a GsSketch state (got {type(state).__name__})"
    if state.get("world_size") != size or len(state.get("ranks", ())) != state.get("world_size"):
        return _world_size_error(state.get("world_size"), size)
    return ""


def gather_state(local: dict[str, Any], exchange: Exchange, rank: int, size: int) -> Optional[dict[str, Any]]:
    """Collective: every rank's ``local`` state, gathered on rank 0 (None on the others)."""
    received = exchange([pickle.dumps(local) if dest == 0 else b"" for dest in range(size)])
    if rank != 0:
        return None
    return {"format": GATHERED, "world_size": size, "options": local["options"],
            "ranks": [pickle.loads(part) for part in received]}


def scatter_state(state: Any, exchange: Exchange, rank: int, size: int, options: dict[str, Any]) -> dict[str, Any]:
    """Collective: rank 0's gathered ``state`` split back into each rank's own part, checked on
    every rank against its options and the world size. A problem anywhere raises the same
    ValueError on every rank (no rank is left waiting in a collective)."""
    if rank == 0:
        error = _check_gathered(state, size)
        parts = [("error", error)] * size if error else [("ok", part) for part in state["ranks"]]
        out = [pickle.dumps(part) for part in parts]
    else:
        out = [b""] * size
    kind, part = pickle.loads(exchange(out)[0])
    error = part if kind == "error" else check_local_state(part, options, size)
    errors = [pickle.loads(e) for e in exchange([pickle.dumps(error)] * size)]
    failed = [r for r, e in enumerate(errors) if e]
    if failed:
        first = errors[failed[0]]
        where = "" if len(failed) == size and len(set(errors)) == 1 else f" (on rank(s) {failed} of {size})"
        raise ValueError(first + where)
    return part


class CheckpointApi:
    """``state_dict`` / ``load_state_dict`` / ``load_local_state_dict``, written once for every
    adapter. A subclass provides ``local_state_dict()``, ``_load(state)`` (takes one rank's
    state), ``_options()`` (what must match on load), ``_rank()``, ``_size()`` and
    ``_exchange`` (an :data:`Exchange` over its ranks)."""

    def local_state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def _load(self, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def _options(self) -> dict[str, Any]:
        raise NotImplementedError

    def _rank(self) -> int:
        raise NotImplementedError

    def _size(self) -> int:
        raise NotImplementedError

    def _exchange(self, out: list[bytes]) -> list[bytes]:
        raise NotImplementedError

    def state_dict(self) -> Optional[dict[str, Any]]:
        """Collective (call it on every rank, at the same point; eagerly under TF): the state of
        ALL ranks, gathered on rank 0, which saves it as the framework's examples save the model;
        None on the other ranks. ``{"format", "world_size", "options", "ranks": [local_state_dict()
        of rank 0, 1, ...]}``."""
        return gather_state(self.local_state_dict(), self._exchange, self._rank(), self._size())

    def load_state_dict(self, state: Optional[dict[str, Any]]) -> None:
        """Collective (every rank): rank 0 passes what :meth:`state_dict` returned (loaded from
        its file), the other ranks None (what they pass is not read); each rank gets its own
        residuals back, now or when its state is first created. A state of another world size
        or other options raises ValueError on every rank."""
        self._load(scatter_state(state, self._exchange, self._rank(), self._size(), self._options()))

    def load_local_state_dict(self, state: dict[str, Any]) -> None:
        """Not collective: restores what ``local_state_dict`` saved on this rank. The options and
        the world size must be the ones it was saved with (ValueError naming what differs)."""
        error = check_local_state(state, self._options(), self._size())
        if error:
            raise ValueError(error)
        self._load(state)
