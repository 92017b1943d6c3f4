"""Options under their former names (``merge=`` → ``transport=``): still taken with a
DeprecationWarning naming the new name, refused when given with it, and read as the new name
from checkpoints saved before the rename. In this process, without Horovod's ranks."""

from __future__ import annotations

import importlib
import warnings

import pytest

from gs_horovod.checkpoint import check_local_state

ADAPTERS = ["gs_horovod.torch", "gs_horovod.tensorflow"]


def gs_sketch(module: str) -> type:
    if module == "gs_horovod.tensorflow":
        pytest.importorskip("tensorflow")
    return importlib.import_module(module).GsSketch


@pytest.mark.parametrize("module", ADAPTERS)
def test_merge_still_works_with_a_deprecation_warning_naming_transport(module):
    GsSketch = gs_sketch(module)
    with pytest.warns(DeprecationWarning, match=r"GsSketch\(merge=\.\.\.\) is deprecated: use transport=") as caught:
        gs = GsSketch(merge="mpi", ratio=0.05)
    assert caught[0].filename == __file__  # the warning points at the caller's line
    assert gs.transport == "mpi" and gs._options()["transport"] == "mpi" and "merge" not in gs._options()
    assert repr(gs).startswith("GsSketch(transport='mpi', ")
    with pytest.warns(DeprecationWarning, match=r"GsSketch\.merge is deprecated: use \.transport"):
        assert gs.merge == "mpi"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new name warns about nothing
        assert GsSketch(transport="mpi").transport == "mpi" and GsSketch().transport == "horovod"
        assert GsSketch("mpi").transport == "mpi"  # still the first positional argument


@pytest.mark.parametrize("module", ADAPTERS)
def test_giving_both_names_is_a_value_error(module):
    GsSketch = gs_sketch(module)
    for transport in ("horovod", "mpi"):
        with pytest.raises(ValueError, match=r"give transport= only \(merge= is its former name\)"):
            GsSketch(transport=transport, merge="mpi")
    with pytest.raises(ValueError, match="transport must be one of"):
        GsSketch(transport="nccl")
    with pytest.raises(ValueError, match="transport must be one of"), pytest.warns(DeprecationWarning):
        GsSketch(merge="nccl")


@pytest.mark.parametrize("module", ADAPTERS)
def test_a_checkpoint_saved_with_merge_loads(module):
    """A local state whose options say ``merge`` (as every state saved before the rename does)
    passes the options check of a GsSketch built with ``transport``; another value is named."""
    GsSketch = gs_sketch(module)
    for transport in ("horovod", "mpi"):
        options = GsSketch(transport=transport, ratio=0.05)._options()
        old = {k: v for k, v in options.items() if k != "transport"} | {"merge": transport}
        assert check_local_state({"options": old, "world_size": 1}, options, 1) == ""
    options = GsSketch(ratio=0.05)._options()
    old = {k: v for k, v in options.items() if k != "transport"} | {"merge": "mpi"}
    assert "transport='mpi' saved, 'horovod' now" in check_local_state({"options": old, "world_size": 1}, options, 1)


def test_bench_variants_recorded_with_merge_read_as_transport():
    """The harness reads variants recorded before the rename (``gs:merge=mpi``) without a warning."""
    from gs_bench.variants import gs_config, parse_variant

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for variant in ("gs:merge=mpi", "gs:transport=mpi"):
            assert gs_config(parse_variant(variant)[1], 0.01)[1] == "mpi"
        assert gs_config({}, 0.01)[1] == "horovod"
