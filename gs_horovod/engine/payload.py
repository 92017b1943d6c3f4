"""What one rank hands to collectives in one step (:class:`Payload`), and the one place a
payload becomes the step's collectives (:func:`collectives_of`), both derived from what the
exchanges declare (:attr:`Exchange.collectives <gs_horovod.engine.exchanges.base.Exchange>`):
no exchange is named here."""

from __future__ import annotations

from collections import namedtuple

from .exchanges import EXCHANGES

STEP_FIELDS = ("exact", "dense")
"""The step's own byte kinds: the exact round, and the small tensors (or a whole dense step),
one allreduce together after the exchange's collectives."""


def _fields() -> dict[str, tuple[str, int]]:
    """Every byte kind of the registry, in the order of first declaration, with the collective
    kind that carries it and how many collectives of one exchange share it (equal shares);
    raises where two exchanges declare one byte kind differently."""
    out: dict[str, tuple[str, int]] = {}
    for exchange in EXCHANGES.values():
        for field in exchange.byte_kinds:
            carriers = [c for c in exchange.collectives if c.counts == field]
            shape = (carriers[0].kind, len(carriers))
            if any(c.kind != shape[0] for c in carriers) or out.setdefault(field, shape) != shape:
                raise ValueError(f"exchange {exchange.name!r} declares byte kind {field!r} as {len(carriers)} "
                                 f"{carriers[0].kind}(s); another exchange as {out[field][1]} {out[field][0]}(s)")
    if set(out) & set(STEP_FIELDS):
        raise ValueError(f"byte kinds {STEP_FIELDS} are the step's own, not an exchange's")
    return out


def _issue_order() -> list[str]:
    """Every exchange's byte kinds merged into one order that keeps each exchange's issue order
    (a kind first seen later goes before the first of its exchange's later kinds already placed)."""
    order: list[str] = []
    for exchange in EXCHANGES.values():
        kinds = exchange.byte_kinds
        for i, kind in enumerate(kinds):
            if kind in order:
                continue
            later = [order.index(k) for k in kinds[i + 1:] if k in order]
            order.insert(min(later, default=len(order)), kind)
    return order


FIELDS = _fields()
ISSUE_ORDER = _issue_order()

Payload = namedtuple("Payload", [*FIELDS, *STEP_FIELDS], defaults=(0,) * (len(FIELDS) + len(STEP_FIELDS)))
Payload.__doc__ = """Bytes one rank hands to collectives in one step, by byte kind (each 0 unless
given): one field per byte kind the exchanges declare (``sketch``: the sketch merge; ``gather``:
the allgather exchange's pairs, or the sparse exchange's selected pairs, this rank's share;
``alltoall``: the sparse exchange's alltoall; ``select``: its two threshold histograms together),
then the step's ``exact`` round and the small tensors (``dense``, or a whole dense step)."""


def collectives_of(payload: Payload, allreduce_kind: str = "allreduce") -> list[tuple[str, float]]:
    """A step's (kind, payload bytes) collectives (:mod:`gs_horovod.transports.collective_cost`) in
    issue order, the empty ones left out: each byte kind of the exchanges in :data:`ISSUE_ORDER`,
    as as many collectives of its declared kind as carry it (equal shares; "allreduce" as
    ``allreduce_kind``: "allreduce", or "tree" under transport="mpi"), then the exact round with
    the small tensors as one ``allreduce_kind``."""
    step = []
    for field in ISSUE_ORDER:
        kind, parts = FIELDS[field]
        step += [(allreduce_kind if kind == "allreduce" else kind, getattr(payload, field) / parts)] * parts
    step.append((allreduce_kind, payload.exact + payload.dense))
    return [(kind, float(n)) for kind, n in step if n]
