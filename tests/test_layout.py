"""The package's layout rules that a reader relies on: each framework adapter (the module a
user imports for Horovod torch, Horovod TensorFlow, DDP or FSDP2) only translates, at most 250
lines; what does not fit lives in a module of its own (``torch_params``, ``tf_step``, ...)."""

from __future__ import annotations

from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gs_horovod"
ADAPTERS = ("torch.py", "tensorflow.py", "ddp.py", "fsdp.py")
MAX_LINES = 250


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_each_adapter_is_at_most_250_lines(adapter: str) -> None:
    lines = len((PACKAGE / adapter).read_text().splitlines())
    assert lines <= MAX_LINES, f"gs_horovod/{adapter} is {lines} lines (at most {MAX_LINES})"
