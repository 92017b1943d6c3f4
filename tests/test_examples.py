"""The examples a user copies (scripts/examples): read, not run (tests/test_scripts.py and
tests/test_elastic.py run the harness's entry points and the elastic demo). Each imports nothing
from the benchmark harness (gs_bench) and shows the call of its adapter as a user writes it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import ROOT

EXAMPLES = ROOT / "scripts" / "examples"


def call_name(node: ast.AST) -> str:
    """"hvd.DistributedOptimizer" for ``hvd.DistributedOptimizer(...)``, "GsSketch" for ``GsSketch(...)``."""
    func = node.func if isinstance(node, ast.Call) else node
    if isinstance(func, ast.Attribute):
        return f"{call_name(func.value)}.{func.attr}"
    return func.id if isinstance(func, ast.Name) else ""


def calls(path: Path) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]


def imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            modules.add("." * node.level + (node.module or ""))
    return modules


def test_no_example_imports_the_harness() -> None:
    files = sorted(p for p in EXAMPLES.iterdir() if p.is_file())
    assert {p.name for p in files} >= {"data.py", "train_torch.py", "train_lm.py", "train_fsdp.py", "train_tf.py",
                                       "train_elastic.py", "elastic_demo.sh"}
    for path in files:
        if path.suffix == ".py":
            harness = {m for m in imported_modules(path) if m.split(".")[0] in ("gs_bench", "") or m == "."}
            assert not harness, f"{path.name} imports {sorted(harness)}"
        assert "gs_bench" not in path.read_text(), f"{path.name} names gs_bench"
    assert not any(m.startswith("gs_horovod") for m in imported_modules(EXAMPLES / "data.py"))


def keyword_call(call: ast.Call, keyword: str) -> str:
    """The name of the call given as ``keyword=`` to ``call`` ("" if none)."""
    value = next((k.value for k in call.keywords if k.arg == keyword), None)
    return call_name(value) if isinstance(value, ast.Call) else ""


def the_call(path: Path, name: str) -> ast.Call:
    found = [c for c in calls(path) if call_name(c) == name]
    assert found, f"{path.name} never calls {name}(...)"
    return found[0]


@pytest.mark.parametrize("example", ["train_torch.py", "train_lm.py"])
def test_horovod_examples_give_gssketch_to_the_distributed_optimizer(example: str) -> None:
    """``hvd.DistributedOptimizer(..., compression=GsSketch(...))``, GsSketch from gs_horovod.torch."""
    path = EXAMPLES / example
    assert keyword_call(the_call(path, "hvd.DistributedOptimizer"), "compression") == "GsSketch"
    assert "gs_horovod.torch" in imported_modules(path)


def test_the_torch_example_registers_gs_hook_on_ddp() -> None:
    """``ddp_model.register_comm_hook(GsState(...), gs_hook)``."""
    path = EXAMPLES / "train_torch.py"
    (hook,) = [c for c in calls(path) if call_name(c).endswith(".register_comm_hook")]
    assert [call_name(a) for a in hook.args] == ["GsState", "gs_hook"]
    assert isinstance(hook.args[0], ast.Call) and isinstance(hook.args[1], ast.Name)
    assert "gs_horovod.ddp" in imported_modules(path)


def test_the_fsdp_example_registers_its_hooks() -> None:
    """``state = GsFsdpState(replicate_group, model=...)``; ``register_fsdp_hooks(model, state)``."""
    path = EXAMPLES / "train_fsdp.py"
    assert any(k.arg == "model" for k in the_call(path, "GsFsdpState").keywords)
    assert [call_name(a) for a in the_call(path, "register_fsdp_hooks").args] == ["model", "state"]
    assert "gs_horovod.fsdp" in imported_modules(path)


def test_the_tensorflow_example_gives_gssketch_to_the_tape() -> None:
    """``hvd.DistributedGradientTape(tape, compression=compression)``, ``compression = GsSketch(...)``
    from gs_horovod.tensorflow."""
    path = EXAMPLES / "train_tf.py"
    tape = the_call(path, "hvd.DistributedGradientTape")
    assert any(k.arg == "compression" for k in tape.keywords)
    the_call(path, "GsSketch")
    assert "gs_horovod.tensorflow" in imported_modules(path)


def test_the_elastic_example_commits_gssketch_with_the_model() -> None:
    """GsSketch in ``hvd.DistributedOptimizer(..., compression=...)`` and in ``TorchState``'s ``gs=``."""
    path = EXAMPLES / "train_elastic.py"
    assert any(k.arg == "compression" for k in the_call(path, "hvd.DistributedOptimizer").keywords)
    the_call(path, "GsSketch")
    the_call(path, "hvd.elastic.TorchState")
    assert "gs_horovod.torch" in imported_modules(path) and '{"gs": compression}' in path.read_text()
