"""Assertions for the ranks' results that say what differed: which rank, both values, the first
index where two sequences part."""

from __future__ import annotations

from typing import Any, Sequence


def first_difference(a: Sequence[Any], b: Sequence[Any]) -> str:
    """Where ``a`` and ``b`` first differ: the index and both values, or the lengths."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"first differ at [{i}]: {x!r} != {y!r}"
    return f"lengths {len(a)} != {len(b)}" if len(a) != len(b) else "equal"


def assert_ranks_agree(values: Sequence[Any], what: str) -> None:
    """Every rank's value equals rank 0's; otherwise names the first rank that differs and both values."""
    for rank, value in enumerate(values[1:], 1):
        if value != values[0]:
            where = first_difference(values[0], value) if isinstance(value, (list, tuple)) else ""
            raise AssertionError(f"{what}: rank {rank} differs from rank 0 {where}\n  rank 0: {values[0]!r}\n"
                                 f"  rank {rank}: {value!r}")


def assert_equal(got: Any, want: Any, what: str) -> None:
    """``got == want``; otherwise both, and for sequences the first index where they differ."""
    if got != want:
        sequences = isinstance(got, (list, tuple)) and isinstance(want, (list, tuple))
        where = first_difference(got, want) if sequences else ""
        raise AssertionError(f"{what} {where}\n  got:  {got!r}\n  want: {want!r}")


def assert_at_most(value: float, bound: float, what: str, **context: Any) -> None:
    """``value <= bound``; otherwise both, with ``context`` (norms, steps) alongside."""
    if not value <= bound:
        extra = "".join(f", {k} {v!r}" for k, v in context.items())
        raise AssertionError(f"{what}: {value!r} > {bound!r}{extra}")
