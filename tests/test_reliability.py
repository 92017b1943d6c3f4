"""Failure behaviour on real Horovod ranks, for each exchange (named in the test id): NaN/Inf,
diverging selections, odd shapes; and a rank that dies."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
from conftest import ROOT, WORKERS, horovodrun
from differ import assert_equal, assert_ranks_agree

from gs_horovod.engine.density import DENSE

pytestmark = pytest.mark.slow  # every test here launches processes

EXCHANGES = ("sketch", "allgather", "sparse")


def pytest_generate_tests(metafunc):
    if "exchange" in metafunc.fixturenames:
        metafunc.parametrize("exchange", EXCHANGES)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return horovodrun("torch_reliability.py", 2, "gloo", tmp_path_factory.mktemp("reliability"), timeout=300)


@pytest.fixture
def ranks(job, exchange):
    return [r[exchange] for r in job]


def test_nan_on_one_rank_raises_on_every_rank_and_keeps_residuals(job):
    # the sketch alone (every exchange: tests/test_gs_sgd.py on simulated ranks)
    ranks, exchange = [r["sketch"] for r in job], "sketch"
    for r in ranks:
        assert r["nan_raise_error"].startswith(f"GsSketch: the gradient of 'n.{exchange}.raise.2.weight' is NaN or "
                                               "infinite on at least one rank at step 1; residuals are left as before "
                                               "the step")
        # (the parameters cannot move: Horovod's optimizer raised before the wrapped SGD ran)
        assert r["nan_raise_residual_change"] == 0, f"residuals moved by up to {r['nan_raise_residual_change']}"
        assert_equal(r["nan_raise_steps"][1], r["nan_raise_steps"][0], "steps by tensor after the NaN step")


def test_inf_with_skip_drops_the_update_on_every_rank_and_trains_on(job):
    ranks = [r["sketch"] for r in job]
    for r in ranks:
        assert r["nan_skip_error"] is None
        assert r["nan_skip_skipped"] == 1  # the whole step (one global selection) was dropped
        assert r["nan_skip_residual_change"] == 0, f"residuals moved by up to {r['nan_skip_residual_change']}"
        assert_equal(r["nan_skip_steps"][1], r["nan_skip_steps"][0], "steps by tensor after the skipped step")
        # SGD stepped with a zero update
        assert r["nan_skip_params_change"] == 0, f"the parameters moved by up to {r['nan_skip_params_change']}"
        assert r["nan_skip_then_nonfinite"] == 0, f"{r['nan_skip_then_nonfinite']} parameters not finite"
        assert r["nan_skip_then_change"] > 0, "the next, finite step did not move the parameters"
    assert_ranks_agree([r["nan_skip_then_digest"] for r in ranks], "the model after the next, finite step")


def test_inf_with_skip_at_the_default_density_drops_the_dense_step_on_every_rank(job):
    ranks = [r["sketch"] for r in job]
    for r in ranks:
        assert r["dense_skip_levels"] == [DENSE] * 4, r["dense_skip_levels"]
        assert r["dense_skip_skipped"] == 1
        changes = r["dense_skip_changes"]
        assert changes[2] == 0, f"the skipped step moved the parameters by up to {changes[2]}"
        assert min(changes[:2] + changes[3:]) > 0, f"a finite step did not move the parameters: {changes}"
        assert r["dense_skip_nonfinite"] == 0
        dtypes = r["dense_skip_dtypes"]
        assert dtypes["bias16"] == "torch.float16" and dtypes["fc.weight"] == "torch.float32", dtypes
    assert_ranks_agree([r["dense_skip_digest"] for r in ranks], "the model after the dense steps")


def test_selection_checksum_passes_when_equal(ranks, exchange):
    for r in ranks:
        assert r["check_every_clean_error"] is None


def test_selection_checksum_fails_everywhere_when_not(ranks, exchange):
    # rank 1's selection planted one coordinate off at every step (tests/workers/torch_reliability.py)
    for r in ranks:
        assert r["check_every_error"] == ("step 0: GsSketch: ranks selected different coordinates at "
                                          "step 0 (checked because check_every is set); their models are "
                                          "diverging")


def test_zero_d_empty_and_fp16_parameters_train(ranks, exchange):
    for r in ranks:
        # the empty parameter is below min_size=1 and passes through; the others are compressed
        assert r["odd_steps"] == {"o.scale": 3, "o.fc.weight": 3, "o.fc.bias": 3, "o.bias16": 3}
        assert r["odd_dtypes"]["bias16"] == "torch.float16(10,)" and r["odd_dtypes"]["scale"] == "torch.float32()"
        assert r["odd_dtypes"]["empty"] == "torch.float32(0, 3)"
        # they trained: every non-empty parameter moved from its initial value, nothing became
        # NaN/Inf; k = ⌈0.5 · 661⌉ = 331 coordinates a step are applied, at most 21 of them
        # outside fc.weight
        moved = r["odd_moved"]
        assert moved["empty"] == 0 and r["odd_nonfinite"] == 0, (moved, r["odd_nonfinite"])
        assert all(moved[n] > 0 for n in ("scale", "fc.weight", "fc.bias", "bias16")), moved
        assert moved["fc.weight"] >= 331 - 21, moved
    assert_ranks_agree([r["odd_digest"] for r in ranks], "the model after 3 steps")


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_a_killed_rank_ends_the_job_promptly_without_orphans(controller):
    launcher = shutil.which("horovodrun", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    cmd = [launcher, "-np", "2", "-H", "localhost:2", f"--{controller}"]
    if controller == "mpi":
        cmd += ["--mpi-args=--oversubscribe --bind-to none"]
    cmd += [sys.executable, str(WORKERS / "rank_death.py")]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(WORKERS)))
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert proc.stdout.count("reached step 5") == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    # start-up plus teardown, with room for a loaded machine
    assert elapsed < 60, f"the job took {elapsed:.0f} s to end"
    time.sleep(1)
    left = subprocess.run(["pgrep", "-f", "rank_death.py"], capture_output=True, text=True).stdout.split()
    assert left == [], f"orphan processes: {left}"
