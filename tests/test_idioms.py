"""The checkpoint idioms users already write (Horovod's examples; PowerSGDState's constructor),
on real ranks: horovodrun (torch) and torchrun (DDP) at 2 and 3 ranks, one job each
(tests/workers/idioms.py). Rank 0 alone loading a checkpoint resumes bitwise; rank 0 alone
saving raises within ``checkpoint_timeout`` on rank 0 and at the next step on every rank; a
rank killed mid-step under torchrun takes the job down with an error."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT, WORKERS, horovodrun, rank_env, torchrun, torchrun_command
from differ import assert_equal, assert_ranks_agree

from gs_horovod.checkpoint import DEFAULT_TIMEOUT

TIMEOUT = 5.0  # tests/workers/idioms.py's checkpoint_timeout for the rank-0-only save
JOBS = [("horovod", 2, "sparse"), ("horovod", 3, "sketch"), ("tf", 2, "sparse"), ("ddp", 2, "sketch"),
        ("ddp", 3, "sparse")]
SCENARIOS = {"horovod": ["resume", "rollback", "wrong_options", "alone_save"], "tf": ["resume", "alone_save"],
             "ddp": ["resume", "wrong_options", "alone_save"]}  # tests/workers/idioms.py's, all run


@pytest.fixture(scope="module", params=JOBS, ids=[f"{launcher}-{size}-{exchange}" for launcher, size, exchange in JOBS])
def job(request, tmp_path_factory):
    launcher, size, exchange = request.param
    out = tmp_path_factory.mktemp(f"{launcher}{size}")
    if launcher in ("horovod", "tf"):
        ranks = horovodrun("idioms.py", size, "gloo", out, launcher, exchange, timeout=420)
    else:
        ranks = torchrun("idioms.py", size, out, "ddp", exchange, timeout=300)
    assert_equal(ranks[0]["scenarios"], SCENARIOS[launcher], f"{launcher}: the scenarios run")
    return launcher, ranks


@pytest.mark.slow
def test_rank0_alone_loads_and_the_run_resumes_bitwise(job):
    _, ranks = job
    assert_ranks_agree([r["straight"] for r in ranks], "the uninterrupted run's model")
    for rank, r in enumerate(ranks):
        assert_equal(r["rank0_load"], r["straight"], f"rank {rank}: rank 0 alone loaded, vs uninterrupted")
        assert_equal(r["every_rank_load"], r["straight"], f"rank {rank}: every rank loaded, vs uninterrupted")
        # the control: the same weights (and optimizer) loaded without the compressor's state
        # (residuals, steps) train elsewhere, so the comparisons above can fail
        assert r["not_loaded"] != r["straight"], f"rank {rank}: the control trained to the same model"
    assert_ranks_agree([r["not_loaded"] for r in ranks], "the control's model")


@pytest.mark.slow
def test_rank0_alone_rolls_back_mid_run_bitwise(job):
    launcher, ranks = job
    if launcher != "horovod":
        pytest.skip("the TF and DDP jobs resume into fresh objects only")
    for rank, r in enumerate(ranks):
        assert_equal(r["rank0_rollback"], r["straight"], f"rank {rank}: rolled back by rank 0 alone, vs uninterrupted")


@pytest.mark.slow
def test_a_state_of_other_options_or_keys_raises_at_once_on_rank0(job):
    launcher, ranks = job
    if launcher == "tf":
        pytest.skip("the options check is the same code as torch's (CheckpointApi.load_state_dict)")
    if launcher == "horovod":
        assert ranks[0]["wrong_options_error"] == (
            "ValueError: GsSketch state was saved with different options: seed=0 saved, 1 now")
    else:
        assert ranks[0]["named_into_order_error"] == (
            "ValueError: GsSketch state was saved with different options: keys='order' saved, 'names' now")
        assert ranks[0]["keys"][:3] == ["#00000", "#00001", "#00002"]  # no model: keyed by order


@pytest.mark.slow
def test_rank0_alone_saving_raises_within_the_timeout_then_every_rank_raises(job):
    launcher, ranks = job
    owner = "GsState" if launcher == "ddp" else "GsSketch"
    error = ranks[0]["alone_save_error"]
    assert error.startswith(f"RuntimeError: {owner}.state_dict() is a collective: every rank calls it at the "
                            "same point, but ")
    assert "state_dict()   # on every rank" in error
    assert ranks[0]["alone_save_seconds"] < TIMEOUT + 30  # bounded: the timeout, or at once when a step met it
    # TensorFlow reports an error raised inside the traced step as an UnknownError quoting it
    assert f"{owner}.state_dict() is a collective: every rank calls it" in ranks[0]["next_step_error"]
    if launcher != "tf":  # polled, not waited on: nothing is left waiting that could abort the rank at exit
        assert ranks[0]["waiting_threads"] == []
    for r in ranks[1:]:
        assert "alone_save_error" not in r
        assert (f"{owner}: another rank called state_dict() alone and is out of step with this one "
                "(state_dict() is a collective: call it on every rank at the same point)") in r["next_step_error"]


def test_default_checkpoint_timeout_is_documented():
    assert DEFAULT_TIMEOUT == 60.0
    guide = (ROOT / "docs" / "user-guide.md").read_text()
    assert "checkpoint_timeout" in guide and "60 s" in guide


@pytest.mark.slow
def test_a_rank_killed_mid_step_under_torchrun_ends_the_job_with_an_error(tmp_path):
    """torchrun's agent checks its workers every 0.1 s (--monitor-interval) and stops the others
    (SIGTERM) once one dies; without the agent, gloo raises "Connection closed by peer" in
    their next collective (a peer that hangs instead: the process group's timeout, 30 min)."""
    cmd = [*torchrun_command(3), sys.executable, str(WORKERS / "idioms.py"), str(tmp_path), "killed", "sparse"]
    env = rank_env()
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0
    assert "Signal 9 (SIGKILL) received by PID" in proc.stderr or "exitcode  : -9" in proc.stderr, proc.stderr[-3000:]
    assert not list(tmp_path.glob("rank*.json"))  # no rank trained on as if nothing happened
