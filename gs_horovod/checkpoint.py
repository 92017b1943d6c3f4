"""The checkpoint protocol of every adapter (GsSketch for torch and TF, the DDP GsState): one
rank's state (``local_state_dict``), and the state of all ranks gathered on rank 0
(``state_dict``, a collective that raises rather than hangs when called on some ranks only)
and handed back from it (``load_state_dict``, called on rank 0 alone or on every rank: rank 0
keeps the state, and the next step's flags start a scatter every rank joins). Its transport
is written once here over the adapter's :class:`CheckpointCollectives`."""

from __future__ import annotations

import pickle
from typing import Any, Callable, Optional, Protocol

import numpy as np

from .array_ops import Array
from .transports.protocol import Collectives

GATHERED = "gs_horovod.GsSketch.gathered.v1"

BytesAlltoall = Callable[[list[bytes]], list[bytes]]
"""An alltoall of bytes over all ranks: sends ``out[r]`` to rank r, returns what each rank
sent to this one (in rank order)."""


def check_timeout(timeout: Any) -> float:
    """The ``checkpoint_timeout`` option of every adapter: seconds, a number > 0."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"checkpoint_timeout must be a number of seconds > 0, got {timeout!r}")
    return float(timeout)


def exchange_bytes(comm: Collectives, out: list[bytes]) -> list[bytes]:
    """:data:`BytesAlltoall` over ``comm``: one uint8 alltoall with splits (eagerly)."""
    data = comm.from_host(np.frombuffer(b"".join(out), dtype=np.uint8).copy())
    splits = comm.from_host(np.array([len(b) for b in out], np.int32))
    received, sizes = comm.alltoall(data, splits, "gs_horovod.checkpoint")
    buf, counts = comm.to_host(received).tobytes(), comm.to_host(sizes).tolist()
    return [buf[end - n:end] for n, end in zip(counts, np.cumsum(counts).tolist())]


class CheckpointCollectives(Collectives, Protocol):
    """The collectives a checkpoint runs on (Horovod's, torch.distributed's): :class:`Collectives`
    and a sum with a deadline."""

    def allreduce_sum_within(self, x: Array, name: str, timeout: float) -> Optional[Array]:
        """``allreduce_sum(x, name)``, or None when not every rank joined within ``timeout``
        seconds; it then stays pending, and nothing of this rank waits on it at exit
        (:mod:`gs_horovod.transports.deadline`)."""


def arrive(comm: CheckpointCollectives, value: float, name: str, timeout: float) -> Optional[float]:
    """The sum over ``comm``'s ranks of ``value``, or None when not every rank joined within
    ``timeout`` seconds."""
    total = comm.allreduce_sum_within(comm.from_host(np.array([value], np.float32)), name, timeout)
    return None if total is None else float(comm.to_host(total)[0])


def options_difference(saved: dict[str, Any], current: dict[str, Any]) -> str:
    """``"ratio=0.05 saved, 0.1 now; ..."`` for each option that differs ("" if none)."""
    keys = sorted(set(saved) | set(current))
    return "; ".join(f"{k}={saved.get(k, '<absent>')!r} saved, {current.get(k, '<absent>')!r} now"
                     for k in keys if saved.get(k, "<absent>") != current.get(k, "<absent>"))


def _world_size_error(saved: int, size: int) -> str:
    return (f"GsSketch state was saved by {saved} ranks, this job has {size}: residuals are per rank, "
            f"so resume with {saved} ranks, or leave the GsSketch state out to start residuals from zero")


STATE_NEUTRAL = ("wire",)
"""Options a saved state's residuals do not depend on (the pair format changes what travels,
not what a residual means): a checkpoint written before one existed loads under any value."""


ADDED = {"ramp": 0, "critical": 0.0}
"""Options added after states were first saved, with the value a state saved without them ran
under (off): such a state loads where they are still off, and is refused, naming them, where not."""


RENAMED = {"merge": "transport"}
"""Options under their former names (old: new): the adapters still take the old name (with a
DeprecationWarning), and a state saved before the rename carries it, read as the new one."""


def saved_options(state: dict[str, Any]) -> dict[str, Any]:
    """The options ``state`` was saved with, each under its current name (:data:`RENAMED`)."""
    return {RENAMED.get(k, k): v for k, v in state["options"].items()}


def check_local_state(state: Any, options: dict[str, Any], size: int) -> str:
    """Why ``state`` (one rank's, from ``local_state_dict``) cannot be loaded here, or ""."""
    if isinstance(state, dict) and state.get("format") == GATHERED:
        return ("GsSketch: this is the gathered state of all ranks (state_dict()); load it with "
                "load_state_dict() called on every rank")
    if not isinstance(state, dict) or not isinstance(state.get("options"), dict):
        return f"GsSketch: not a GsSketch state (got {type(state).__name__})"
    saved = saved_options(state)
    older = {k: options[k] for k in STATE_NEUTRAL if k in options and k not in saved}
    added = {k: v for k, v in ADDED.items() if k in options and k not in saved}
    diff = options_difference({**added, **older, **saved}, options)
    if diff:
        return f"GsSketch state was saved with different options: {diff}"
    if state.get("world_size", size) != size:
        return _world_size_error(state["world_size"], size)
    return ""


def _check_gathered(state: Any, size: int) -> str:
    if not isinstance(state, dict) or state.get("format") != GATHERED:
        if isinstance(state, dict) and "options" in state:
            return ("GsSketch.load_state_dict: this is one rank's state (local_state_dict()); load it with "
                    "load_local_state_dict() on that rank, or save with state_dict() called on every rank")
        return f"GsSketch.load_state_dict: not a GsSketch state (got {type(state).__name__})"
    if state.get("world_size") != size or len(state.get("ranks", ())) != state.get("world_size"):
        return _world_size_error(state.get("world_size"), size)
    return ""


def gather_state(local: dict[str, Any], exchange: BytesAlltoall, rank: int, size: int) -> Optional[dict[str, Any]]:
    """Collective: every rank's ``local`` state, gathered on rank 0 (None on the others)."""
    received = exchange([pickle.dumps(local) if dest == 0 else b"" for dest in range(size)])
    if rank != 0:
        return None
    return {"format": GATHERED, "world_size": size, "options": local["options"],
            "ranks": [pickle.loads(part) for part in received]}


def scatter_state(state: Any, exchange: BytesAlltoall, rank: int, size: int,
                  options: dict[str, Any]) -> Optional[dict[str, Any]]:
    """Collective: rank 0's gathered ``state`` split back into each rank's own part (None on
    every rank when rank 0 passes None: nothing to restore), checked on every rank against its
    options and the world size. A problem anywhere raises the same ValueError on every rank
    (no rank is left waiting in a collective)."""
    if rank == 0:
        error = "" if state is None else _check_gathered(state, size)
        if error:
            parts = [("error", error)] * size
        else:
            parts = [("none", None)] * size if state is None else [("ok", part) for part in state["ranks"]]
        out = [pickle.dumps(part) for part in parts]
    else:
        out = [b""] * size
    kind, part = pickle.loads(exchange(out)[0])
    if kind == "none":
        return None
    error = part if kind == "error" else check_local_state(part, options, size)
    errors = [pickle.loads(e) for e in exchange([pickle.dumps(error)] * size)]
    failed = [r for r, e in enumerate(errors) if e]
    if failed:
        first = errors[failed[0]]
        where = "" if len(failed) == size and len(set(errors)) == 1 else f" (on rank(s) {failed} of {size})"
        raise ValueError(first + where)
    return part


RESTORE = 1.0
"""What rank 0 adds to a step's flags while it holds a state to restore (:meth:`CheckpointApi.load_state_dict`)."""
ABORT = 65536.0
"""What a rank adds to a step's flags once it is out of step (a checkpoint call of its timed
out), and what every rank adds to the arrival check of ``state_dict()``: a step's flags of ABORT
or more raise on every rank, an arrival check that sums to less than P·ABORT met a step."""
DEFAULT_TIMEOUT = 60.0
"""Seconds ``state_dict()`` waits for every rank (Horovod warns of a stalled collective at 60 s)."""


class CheckpointApi:
    """``state_dict`` / ``load_state_dict`` / ``load_local_state_dict``, written once for every
    adapter. A subclass provides ``local_state_dict()``, ``_load(state)`` (takes one rank's
    state), ``_options()`` (what must match on load) and ``_checkpoint_comm()`` (the
    :class:`CheckpointCollectives` over every rank of the job, which
    carries the state, ``_exchange``, and the arrival checks, ``_arrive``); each of its steps
    sums :meth:`step_flag` over ranks before it computes and calls :meth:`agree` (a restore
    rides on that), and ``_flag_changed()`` tells it when the flag did.

    ``checkpoint_timeout``: seconds ``state_dict()`` (a collective) waits for every rank before
    it raises on the ranks that called it. ``save_idiom``: the save line its errors show.
    """

    checkpoint_timeout: float = DEFAULT_TIMEOUT
    save_idiom = "gs_state = compression.state_dict()"
    _to_restore: Optional[dict[str, Any]] = None  # rank 0: what load_state_dict took, for the next step
    _out_of_step = ""  # why this rank's collectives no longer match the others' ("" while they do)
    _arrivals = 0  # state_dict() calls on this rank: names each arrival check

    def local_state_dict(self) -> dict[str, Any]:
        """Not collective: this rank's own state, ``{"options", "world_size", "rank", ...}``
        (the adapter's)."""
        raise NotImplementedError

    def _load(self, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def _options(self) -> dict[str, Any]:
        raise NotImplementedError

    def _checkpoint_comm(self) -> CheckpointCollectives:
        raise NotImplementedError

    def _rank(self) -> int:
        return self._checkpoint_comm().rank

    def _size(self) -> int:
        return self._checkpoint_comm().size

    def _exchange(self, out: list[bytes]) -> list[bytes]:
        return exchange_bytes(self._checkpoint_comm(), out)

    def _arrive(self, value: float, name: str, timeout: float) -> Optional[float]:
        return arrive(self._checkpoint_comm(), value, name, timeout)

    def _all_arrive(self, call: Optional[str] = None, advice: Optional[str] = None) -> None:
        """Raises RuntimeError on this rank unless every rank made ``call`` (default: this
        adapter's ``state_dict()``) at the same point within ``checkpoint_timeout``; after that
        this rank is out of step with the others, and its next gs-SGD step raises on every rank
        (:meth:`agree`). ``advice``: what the error tells the user to write instead."""
        if self._out_of_step:
            raise RuntimeError(self._out_of_step)
        owner = type(self).__name__
        call = call or f"{owner}.state_dict()"
        self._arrivals += 1
        size, timeout = self._size(), self.checkpoint_timeout
        total = self._arrive(ABORT, f"gs_horovod.arrival.{self._arrivals}", timeout)
        if total is not None and total == size * ABORT:
            return
        seen = (f"not every rank called it within checkpoint_timeout={timeout:g} s" if total is None
                else "the other ranks were in a gs-SGD step")
        advice = advice or (
            f"Save as\n    {self.save_idiom}   # on every rank; rank 0 gets every rank's state, the others None\n"
            "    if rank == 0:\n        save it with the model\n"
            "and load with load_state_dict() on rank 0 alone (or on every rank, the others passing None).")
        self._out_of_step = (
            f"{call} is a collective: every rank calls it at the same point, but {seen}. {advice} "
            "If every rank calls it and one was only late, raise checkpoint_timeout. This rank is now out of "
            "step with the others: the next gs-SGD step raises on every rank.")
        self._flag_changed()
        raise RuntimeError(self._out_of_step)

    def _commit_arrival(self) -> None:
        """:meth:`_all_arrive` for Horovod elastic's ``state.commit()`` (:mod:`gs_horovod.elastic`)."""
        self._all_arrive(f"state.commit() of an elastic state holding {type(self).__name__}",
                         "Commit on every rank, as hvd.elastic.run's examples do (state.commit() in the "
                         "training loop of every rank).")

    def state_dict(self) -> Optional[dict[str, Any]]:
        """Collective (call it on every rank, at the same point; eagerly under TF): the state of
        ALL ranks, gathered on rank 0, which saves it as the framework's examples save the model;
        None on the other ranks. ``{"format", "world_size", "options", "ranks": [local_state_dict()
        of rank 0, 1, ...]}``. Called on some ranks only (``if rank == 0: save(gs.state_dict())``),
        it raises RuntimeError on them within ``checkpoint_timeout`` seconds (at once where the
        others' next step meets it), showing the idiom, and the next step raises on every rank."""
        self._all_arrive()
        return gather_state(self.local_state_dict(), self._exchange, self._rank(), self._size())

    def load_state_dict(self, state: Optional[dict[str, Any]]) -> None:
        """Not collective: call it on rank 0 alone, as Horovod's examples load a checkpoint, or
        on every rank (what the other ranks pass is not read). Rank 0 passes what
        :meth:`state_dict` returned (None: nothing to restore), checks it now (ValueError naming
        what differs: world size, options) and keeps it; at the next gs-SGD step every rank gets
        its own residuals back from rank 0 before the step computes: a flag in the step's first
        agreement, then one scatter. The run then continues bitwise as the one that saved it."""
        if self._rank() == 0:
            size = self._size()  # rank 0's own part checked as every rank's is at the restore
            error = "" if state is None else (_check_gathered(state, size)
                                              or check_local_state(state["ranks"][0], self._options(), size))
            if error:
                raise ValueError(error)
            self._to_restore = state
            self._flag_changed()

    def _forget_checkpoint_calls(self) -> None:
        """For ``reset()`` (a new set of ranks): no state to restore, in step, calls counted anew."""
        self._to_restore, self._out_of_step, self._arrivals = None, "", 0
        self._flag_changed()

    def _flag_changed(self) -> None:
        """Called when :meth:`step_flag` may have changed (TF keeps it in a variable)."""

    def step_flag(self) -> float:
        """What this rank adds to a step's flags (summed over ranks into :meth:`agree`)."""
        if self._out_of_step:
            return ABORT
        return RESTORE if self._to_restore is not None else 0.0

    def agree(self, flags: float) -> None:
        """At the start of a step, with the sum over ranks of :meth:`step_flag` (the same on every
        rank): raises on every rank if one is out of step; restores rank 0's loaded state on every
        rank if it holds one (a collective every rank joins alike)."""
        if flags >= ABORT / 2:
            raise RuntimeError(self._out_of_step or (
                f"{type(self).__name__}: another rank called state_dict() alone and is out of step with this one "
                "(state_dict() is a collective: call it on every rank at the same point)"))
        if flags >= RESTORE / 2:
            state, self._to_restore = self._to_restore, None
            self._flag_changed()
            part = scatter_state(state, self._exchange, self._rank(), self._size(), self._options())
            if part is not None:
                self._load(part)

    def load_local_state_dict(self, state: dict[str, Any]) -> None:
        """Not collective: restores what ``local_state_dict`` saved on this rank. The options and
        the world size must be the ones it was saved with (ValueError naming what differs)."""
        error = check_local_state(state, self._options(), self._size())
        if error:
            raise ValueError(error)
        self._load(state)
