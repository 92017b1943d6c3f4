"""Checkpoints saved the Horovod way (every rank calls ``state_dict()``, rank 0 writes one
file; after a restart rank 0 reads it and every rank calls ``load_state_dict``, rank 0 with
the state, the others None; rank 0 alone: tests/test_idioms.py) and one file
per rank (``local_state_dict``), at 2 and 3 ranks, torch and TensorFlow (one worker,
``tests/workers/checkpoints.py``, the same scenarios for both); and the class form
``compression=GsSketch`` offering the instance's API. The Horovod-way resume runs for each
exchange (named in the test id). A 3-rank job also tries the 2-rank file, and (torch) a
2-rank job the 3-rank file: the world-size error on rank 0, at once."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import horovodrun
from differ import assert_equal, assert_ranks_agree

pytestmark = pytest.mark.slow  # every test here launches processes

SIZES = (2, 3)
EXCHANGES = ("sketch", "allgather", "sparse")
OWN = ("resume", "mistakes", "resume_local", "resume_mid_warmup", "class_form")  # all but other_world_size


def pytest_generate_tests(metafunc):
    if "exchange" in metafunc.fixturenames:
        metafunc.parametrize("exchange", EXCHANGES)


def run_both_sizes(framework: str, tmp_path_factory, timeout: float) -> dict:
    two, three = tmp_path_factory.mktemp(f"{framework}2"), tmp_path_factory.mktemp(f"{framework}3")
    runs = {2: horovodrun("checkpoints.py", 2, "gloo", two, framework, timeout=timeout)}
    runs[3] = horovodrun("checkpoints.py", 3, "gloo", three, framework, "--other", str(two / "checkpoint_sketch.pt"),
                         timeout=timeout)
    if framework == "torch":  # the 3-rank file into 2 ranks (a short job: that scenario alone)
        runs["fewer"] = horovodrun("checkpoints.py", 2, "gloo", tmp_path_factory.mktemp(f"{framework}fewer"),
                                   framework, "--other", str(three / "checkpoint_sketch.pt"), "other_world_size",
                                   timeout=timeout)
    assert_equal(runs[2][0]["scenarios"], list(OWN), "scenarios run at 2 ranks")
    assert_equal(runs[3][0]["scenarios"], [*OWN[:4], "other_world_size", OWN[4]], "scenarios run at 3 ranks")
    return runs


@pytest.fixture(scope="module")
def torch_runs(tmp_path_factory):
    return run_both_sizes("torch", tmp_path_factory, 240)


@pytest.fixture(scope="module")
def tf_runs(tmp_path_factory):
    return run_both_sizes("tf", tmp_path_factory, 420)


@pytest.fixture(params=["torch", "tf"])
def runs(request):
    return request.getfixturevalue(f"{request.param}_runs")


@pytest.mark.parametrize("size", SIZES)
def test_rank0_file_resume_is_bitwise_the_uninterrupted_run(runs, exchange, size):
    for rank, r in enumerate(r[exchange] for r in runs[size]):
        assert r["load_error"] is None
        # each rank's residuals are the straight run's: its own, not rank 0's
        assert_equal(r["residuals_resumed"], r["residuals_straight"],
                     f"rank {rank}: residuals (digest, sum |r|) resumed vs straight")
        # Gloo reduces in a fixed order, so the resumed run is bit for bit the straight one
        assert_equal(r["resumed"], r["straight"], f"rank {rank}: the resumed model's digest vs the straight run's")
    assert_ranks_agree([r[exchange]["straight"] for r in runs[size]], "the straight run's model")
    # the exchanges differ: each resume checks its own exchange's state
    assert len({r[e]["straight"] for e in EXCHANGES for r in runs[size][:1]}) == len(EXCHANGES)


@pytest.mark.parametrize("size", SIZES)
def test_one_file_per_rank_resume_is_bitwise_the_uninterrupted_run(runs, size):
    for rank, r in enumerate(runs[size]):
        assert_equal(r["local_resumed"], r["sketch"]["straight"], f"rank {rank}: resumed from its own file vs straight")
        assert r["local_wrong_options_error"] == "GsSketch state was saved with different options: seed=0 saved, 1 now"


@pytest.mark.parametrize("size", SIZES)
def test_reset_forgets_state_and_training_goes_on(runs, size):
    for r in runs[size]:
        assert r["reset_total"] == 0
        assert r["reset_then_steps"] == [1]  # new residuals, one step old


@pytest.mark.parametrize("size", SIZES)
def test_resume_in_the_middle_of_the_warmup_is_bitwise_the_uninterrupted_run(runs, size):
    for r in runs[size]:
        assert r["warmup_resumed"] == r["warmup_straight"] != r["warmup_not_loaded"]


@pytest.mark.parametrize("size", SIZES)
def test_rank0_residuals_on_every_rank_would_resume_wrong(runs, size):
    # what saving rank 0's compressor state alone gives: the check above can tell the difference
    for r in runs[size]:
        assert r["rank0_everywhere"] != r["sketch"]["straight"]


@pytest.mark.parametrize("size", SIZES)
def test_state_dict_is_gathered_on_rank_0_only(runs, exchange, size):
    assert_equal([r[exchange]["state_dict_is_none"] for r in runs[size]], [False] + [True] * (size - 1),
                 "state_dict() is None, by rank")
    assert runs[size][0]["class_gathered_ranks"] == runs[size][0]["instance_gathered_ranks"] == size


@pytest.mark.parametrize("size", SIZES)
def test_wrong_options_fail_on_rank0_at_load_naming_them(runs, size):
    assert runs[size][0]["wrong_options_error"] == ("GsSketch state was saved with different options: "
                                                    "ratio=0.05 saved, 0.1 now; seed=0 saved, 3 now")
    assert [r["wrong_options_error"] for r in runs[size][1:]] == [None] * (size - 1)  # they passed None


def test_wrong_world_size_fails_on_rank0_at_load(runs):
    for r in runs[3][:1]:
        assert r["world_size_error"].startswith("GsSketch state was saved by 2 ranks, this job has 3: "
                                                "residuals are per rank")


def test_a_state_of_more_ranks_fails_on_rank0_at_load(torch_runs):
    for r in torch_runs["fewer"][:1]:
        assert r["world_size_error"].startswith("GsSketch state was saved by 3 ranks, this job has 2: "
                                                "residuals are per rank")


@pytest.mark.parametrize("size", SIZES)
def test_local_and_gathered_states_are_not_mixed_up(runs, size):
    assert "this is one rank's state (local_state_dict())" in runs[size][0]["local_state_to_collective_error"]
    assert "this is the gathered state of all ranks" in runs[size][0]["local_gathered_error"]


@pytest.mark.parametrize("size", SIZES)
def test_class_form_offers_the_instance_api(runs, size, request):
    framework = request.node.callspec.params["runs"]
    for r in runs[size]:
        if framework == "torch":  # dense float16 steps: Horovod's fusion orders their sums by timing from P = 3 on
            params, instance = np.array(r["class_params"]), np.array(r["instance_params"])
            assert np.abs(params - instance).max() <= 1e-3 * np.abs(params).max(), np.abs(params - instance).max()
        else:
            assert r["class_digest"] == r["instance_digest"]
        assert r["class_stats"] == r["instance_stats"] and r["class_stats"]["steps"] == 3
        # the shipped defaults (ratio="auto") start with dense float16 steps
        assert r["class_stats"]["density"] == 1.0 and r["class_stats"]["dense_bytes"] > 0
        assert r["class_local"] == r["instance_local"] and len(r["class_local"]) >= 2
        assert r["class_after_reset"] == r["instance_after_reset"] == 0
        assert r["class_reloaded"] == r["class_local"] and r["instance_reloaded"] == r["instance_local"]
        assert r["class_merge_stats"] == r["instance_merge_stats"]


@pytest.mark.parametrize("size", SIZES)
def test_stats_and_bytes_per_step_count_the_bytes_handed_to_horovod(torch_runs, size):
    # torch: the tensors handed to Horovod's collectives, counted (TF's run inside its graph)
    for r in torch_runs[size]:
        counted, stats = r["class_counted"], r["class_stats"]
        assert counted["unknown"] == []
        for field in ("sketch", "gather", "alltoall", "select", "exact", "dense"):
            assert counted[field] == stats[f"{field}_bytes"], field
        total = sum(v for k, v in counted.items() if k != "unknown")
        assert total > 0 and total == 3 * r["class_bytes_per_step"]
