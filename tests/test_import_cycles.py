"""No import circle in ``gs_horovod``: a static walk (``ast``, nothing imported, no process
launched) of every ``import`` statement of every module under ``gs_horovod/``.

Every statement counts, wherever it sits: at module level, under ``if TYPE_CHECKING:``, in a
``try:``, inside a function or a method (an import a reader or a tool sees is an edge, whether
or not it runs at import time). An edge goes to the module named, resolved to the deepest
module that exists (``from .x import y`` is an edge to ``x.y`` when ``y`` is a module, else to
``x``); importing a module is not counted as an edge to its parent packages (that
``gs_horovod.engine.step`` runs ``gs_horovod/engine/__init__.py`` first is how packages work,
not a circle), while an explicit import of a package (``from .. import x``, ``x`` a name of the
package's ``__init__``) is an edge to that package."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gs_horovod"


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, for ``__init__``)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def resolve(name: str, known: dict[str, Path]) -> str | None:
    """The deepest module of ``known`` that ``name`` (dotted) is or lies in; None outside."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in known:
            return ".".join(parts)
        parts.pop()
    return None


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules that ``name`` (at ``path``) imports, by any import statement anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            found = resolve(target, known)
            if found is not None and found != name:
                out.add(found)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def a_circle(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One circle through the first module of ``component`` (a shortest one), for the message."""
    inside, start = set(component), component[0]
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for w in sorted(graph[path[-1]] & inside):
            if w == start:
                return path + [start]
            if w not in seen:
                seen.add(w)
                paths.append(path + [w])
    return component


def test_the_walk_sees_every_kind_of_import(tmp_path):
    # a planted package: a circle through a TYPE_CHECKING import and one through a function body
    pkg = tmp_path / "gs_horovod"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .a import A\n")
    (pkg / "sub" / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..b import B\n")
    (pkg / "b.py").write_text("from .sub.a import A\n\ndef f():\n    from . import c\n")
    (pkg / "c.py").write_text("import gs_horovod.b\n")
    known = modules(pkg)
    graph = {m: imports(m, p, known) for m, p in known.items()}
    assert graph == {"gs_horovod": set(), "gs_horovod.sub": {"gs_horovod.sub.a"}, "gs_horovod.sub.a": {"gs_horovod.b"},
                     "gs_horovod.b": {"gs_horovod.sub.a", "gs_horovod.c"}, "gs_horovod.c": {"gs_horovod.b"}}
    assert cycles(graph) == [["gs_horovod.b", "gs_horovod.c", "gs_horovod.sub.a"]]


def test_no_import_circle_in_the_package():
    known = modules()
    assert "gs_horovod.engine.step" in known and "gs_horovod.engine.exchanges.base" in known
    graph = {m: imports(m, p, known) for m, p in known.items()}
    found = [" -> ".join(a_circle(c, graph)) for c in cycles(graph)]
    assert not found, "import circles:\n" + "\n".join(found)
