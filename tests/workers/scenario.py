"""Named scenarios: a worker registers each of its scenarios in a :class:`Scenarios` and runs
the ones its command line names (a scenario's name or a group's; none: every scenario), so that
one scenario runs alone, e.g.

    horovodrun -np 2 -H localhost:2 --gloo python tests/workers/torch_reliability.py /tmp/out nonfinite

An unknown name ends the worker listing the names it knows. Selected scenarios run in the order
they were registered, whatever the order of the names (some must run last: they leave a step
unfinished), and the names run are recorded in the result (``result["scenarios"]``) so that the
pytest side can tell a scenario not run from one that failed.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable, Sequence

ALL = "all"


class Scenarios:
    """A worker's scenarios by name (registration order) and its named groups of them."""

    def __init__(self, **groups: Sequence[str]) -> None:
        self.registered: dict[str, Callable[..., Any]] = {}
        self.groups = {name: tuple(members) for name, members in groups.items()}

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Registers ``fn`` under its name."""
        assert fn.__name__ not in self.registered and fn.__name__ not in self.groups, fn.__name__
        self.registered[fn.__name__] = fn
        return fn

    def known(self) -> str:
        groups = ", ".join(f"{g} ({' '.join(m)})" for g, m in self.groups.items())
        return f"scenarios: {' '.join(self.registered)}; groups: {ALL} (every scenario){', ' if groups else ''}{groups}"

    def selected(self, names: Iterable[str]) -> list[str]:
        """The scenarios ``names`` (scenarios or groups; none: all) stand for, in registration order."""
        chosen: set[str] = set()
        for name in list(names) or [ALL]:
            if name == ALL:
                chosen.update(self.registered)
            elif name in self.groups:
                chosen.update(self.groups[name])
            elif name in self.registered:
                chosen.add(name)
            else:
                raise SystemExit(f"unknown scenario {name!r}; {self.known()}")
        unknown = chosen - set(self.registered)
        assert not unknown, f"groups name scenarios never registered: {sorted(unknown)}"
        return [name for name in self.registered if name in chosen]

    def run(self, names: Iterable[str], *args: Any, **kw: Any) -> list[str]:
        """Runs the scenarios ``names`` stand for, each with ``args`` and ``kw``; returns their names."""
        ran = self.selected(names)
        for name in ran:
            self.registered[name](*args, **kw)
        return ran


def each(values: Sequence[str]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A scenario ``fn(out, value, *args)`` run for each of ``values`` (exchanges, meshes), its
    results under ``result[value]``: ``fn(result, *args)`` runs them all."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(result: dict, *args: Any, **kw: Any) -> None:
            for value in values:
                fn(result.setdefault(value, {}), value, *args, **kw)

        return run

    return wrap
