"""Workers that come and go, on real ranks.

Horovod elastic (tests/workers/elastic_scenarios.py), torch and TensorFlow: a worker killed with
SIGKILL and a slot added under ``horovodrun --gloo --min-np 1 --max-np 3``. After each reset
every rank's compressor state agrees (the plan, the steps), a survivor's residual is bitwise the
one it committed, a joining rank starts from zeros, the removed rank's committed residual mass
is reported, and the job finishes without waiting past its deadline.

torchrun (tests/workers/restarts.py): ``--max-restarts 1`` with the DDP hook and with FSDP2; a
worker killed part-way restarts the group, which resumes bitwise from its last checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, WORKERS, horovodrun, launcher, rank_env, run_workers, torchrun_command

from gs_horovod.engine.density import WINDOW

pytestmark = pytest.mark.slow  # every test here launches processes

FIRST_DECISION = WINDOW + 2  # steps at the dense level before the rule's first decision (tests/test_density.py)
HELD = WINDOW + 1  # steps a chosen level is held at least: its first (not measured), then a window
DEADLINE = 300  # seconds for the whole job, resets and start-ups included
# How much lower the faulted demo's held-out accuracy may end than the uninterrupted run's: where
# the kill and the add land is timing, and repeats of the faulted run spread over 0.944-0.962
# against 0.958 uninterrupted (docs/elastic_repeats.jsonl, docs/reliability.md "Elastic demo,
# repeated"); CI once saw 0.937. Twice the widest drop seen.
ACCURACY_BAND = 0.04


def elastic_run(out: Path, framework: str, kill_at: int, add_at: int, steps: int,
                remove_at: int = 0, options: str = "") -> list[list[dict]]:
    """Runs the scenario (GsSketch's ``options`` as JSON; default the worker's fixed ratio);
    returns each process's events in order (the killed one's included)."""
    hosts = out / "hosts"
    hosts.write_text("localhost:1\n127.0.0.1:1\n")
    discover = out / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    cmd = [launcher("horovodrun"), "--gloo", "-np", "2", "--min-np", "1", "--max-np", "3",
           "--host-discovery-script", str(discover), "--gloo-timeout-seconds", "120",
           sys.executable, str(WORKERS / "elastic_scenarios.py"), str(out), framework, str(hosts),
           str(kill_at), str(add_at), str(steps), str(remove_at), *([options] if options else [])]
    env = rank_env()
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=DEADLINE)
    assert proc.returncode == 0, f"horovodrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return [[json.loads(line) for line in path.read_text().splitlines()] for path in sorted(out.glob("events.*.jsonl"))]


def of(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["event"] == kind]


@pytest.fixture(scope="module", params=["torch", "tf"])
def kill_then_add(request, tmp_path_factory):
    """Commits at steps 3 and 6; the worker on 127.0.0.1 dies after step 8 (two steps not
    committed); a slot is added after step 14; 24 steps."""
    framework = request.param
    return framework, elastic_run(tmp_path_factory.mktemp(framework), framework, kill_at=8, add_at=14, steps=24)


def split(run: tuple[str, list[list[dict]]]) -> tuple[list[dict], list[dict], list[dict]]:
    """(the survivor's events, the killed worker's, the joiner's) of a ``kill_then_add`` run."""
    _, processes = run
    killed = [p for p in processes if of(p, "killing")]
    joiner = [p for p in processes if not of(p, "killing") and of(p, "synced")[0]["step"] > 0]
    survivor = [p for p in processes if p not in killed and p not in joiner]
    assert (len(survivor), len(killed), len(joiner)) == (1, 1, 1), processes
    return survivor[0], killed[0], joiner[0]


def test_a_survivor_rolls_back_to_its_commit_bitwise(kill_then_add):
    survivor, killed, _ = split(kill_then_add)
    synced = of(survivor, "synced")
    assert [s["ranks"] for s in synced] == [2, 1, 2]
    last_commit = [c for c in of(survivor, "commit") if c["step"] <= 8][-1]
    assert last_commit["step"] == 6
    after_kill = synced[1]
    assert after_kill["step"] == 6  # Horovod's state rolled back the step count ...
    assert after_kill["residual"] == last_commit["residual"]  # ... and GsSketch its residuals, bitwise
    assert after_kill["gs_steps"] == last_commit["gs_steps"] == [6]


def test_the_removed_ranks_committed_mass_is_reported(kill_then_add):
    survivor, killed, _ = split(kill_then_add)
    lost = of(killed, "commit")[-1]
    assert lost["step"] == 6 and lost["mass"] > 0
    assert of(survivor, "synced")[1]["lost_residual"] == pytest.approx(lost["mass"], rel=1e-12)
    assert of(survivor, "done")[0]["lost_residual"] == pytest.approx(lost["mass"], rel=1e-12)


def test_a_joining_rank_starts_from_zeros_at_the_others_steps(kill_then_add):
    framework = kill_then_add[0]
    survivor, _, joiner = split(kill_then_add)
    joined = of(joiner, "synced")[0]
    at_add = of(survivor, "synced")[2]
    assert joined["ranks"] == at_add["ranks"] == 2
    assert joined["step"] == at_add["step"] and joined["gs_steps"] == at_add["gs_steps"]
    if framework == "torch":  # horovod.tensorflow skips the allreduce (and so GsSketch) at one rank
        assert at_add["gs_steps"] == [at_add["step"]]
    assert joined["tensors"] == at_add["tensors"] > 0
    assert joined["mass"] == 0.0 and at_add["mass"] > 0  # zeros for every tensor; the survivor keeps its own
    assert of(survivor, "commit")[-1]["step"] >= at_add["step"]
    survivor_commit = [c for c in of(survivor, "commit") if c["step"] == at_add["step"]][0]
    assert at_add["residual"] == survivor_commit["residual"]  # a host added: nothing rolls back


def test_a_tensorflow_step_traced_before_a_reset_raises_rather_than_run(kill_then_add):
    framework = kill_then_add[0]
    if framework != "tf":
        pytest.skip("TensorFlow traces its step; torch's runs as written")
    survivor, _, _ = split(kill_then_add)
    stale = of(survivor, "stale")
    assert len(stale) == 1 and stale[0]["ranks"] == 2
    assert "this step was traced before a Horovod elastic reset" in stale[0]["error"], stale[0]["error"]


def test_every_rank_plans_alike_after_each_reset(kill_then_add):
    survivor, _, joiner = split(kill_then_add)
    for planned in of(survivor, "planned") + of(joiner, "planned"):
        plans = planned["plans"]
        assert len(plans) == planned["ranks"]
        assert all(p == plans[0] for p in plans), plans
        assert plans[0][-1] == planned["ranks"]  # planned for the new world
    assert [p["ranks"] for p in of(survivor, "planned")] == [2, 1, 2]


def test_the_job_finishes_with_every_rank_alike(kill_then_add):
    survivor, _, joiner = split(kill_then_add)
    done = of(survivor, "done") + of(joiner, "done")
    assert [d["ranks"] for d in done] == [2, 2] and done[0]["step"] == done[1]["step"] >= 24
    assert done[0]["model"] == done[1]["model"]


@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_the_density_rule_starts_again_in_every_world(tmp_path, framework):
    """The defaults (``ratio="auto"``) with a budget no sparse level fits (so the rule's choice
    does not depend on the machine: the sparsest after its first window), a worker killed after
    step 8 and a slot added after step 14: each world of two ranks starts dense and takes the
    sparsest level at its first decision and holds it through its window (later decisions
    weigh the measured seconds, which depend on the machine), alike on every rank, and the job
    finishes alike. 40 steps: the world after the add must last past that window, wherever
    Horovod's discovery lands the add."""
    processes = elastic_run(tmp_path, framework, kill_at=8, add_at=14, steps=40,
                            options='{"budget": 1e-9, "min_size": 64}')
    survivor, killed, joiner = split((framework, processes))
    first = [e["density"] for e in of(survivor, "stepped") if e["step"] <= 8 and e["ranks"] == 2]
    assert first == [1.0] * FIRST_DECISION + [0.001] * (len(first) - FIRST_DECISION) and len(first) > FIRST_DECISION, \
        first
    added = of(joiner, "synced")[0]["step"]
    afters = [[e["density"] for e in of(process, "stepped") if e["step"] > added] for process in (survivor, joiner)]
    assert afters[0] == afters[1], afters  # every rank at the same level at every step
    assert afters[0][:FIRST_DECISION + HELD] == [1.0] * FIRST_DECISION + [0.001] * HELD, afters[0]
    done = of(survivor, "done") + of(joiner, "done")
    assert [d["ranks"] for d in done] == [2, 2] and done[0]["model"] == done[1]["model"]


def test_a_reset_before_any_commit_rolls_back_to_zeros(tmp_path):
    processes = elastic_run(tmp_path, "torch", kill_at=2, add_at=0, steps=6)
    survivor = [p for p in processes if not of(p, "killing")]
    assert len(survivor) == 1
    synced = of(survivor[0], "synced")
    assert [s["ranks"] for s in synced] == [2, 1]
    assert synced[1]["step"] == 0 and synced[1]["gs_steps"] == []  # nothing committed: no state
    assert synced[1]["residual"] == synced[0]["residual"]  # as at the start: empty
    assert of(survivor[0], "done")[0]["step"] == 6


@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_a_graceful_removal_replans_without_a_sync(tmp_path, framework):
    """The discovery script drops a host after step 6: Horovod resets and skips the sync; the
    survivor plans for one rank and finishes."""
    processes = elastic_run(tmp_path, framework, kill_at=0, add_at=0, steps=12, remove_at=6)
    finished = [p for p in processes if of(p, "done")]
    assert len(finished) == 1, processes
    survivor = finished[0]
    assert [s["ranks"] for s in of(survivor, "synced")] == [2, 1]
    assert [p["ranks"] for p in of(survivor, "planned")] == [2, 1]
    assert of(survivor, "planned")[1]["plans"][0][-1] == 1
    assert of(survivor, "done")[0]["step"] >= 12


def test_a_commit_on_some_ranks_only_raises_a_clear_error_and_nothing_hangs(tmp_path):
    ranks = horovodrun("elastic_scenarios.py", 2, "gloo", tmp_path, "commit_alone", timeout=180)
    error = ranks[0]["commit_error"]
    assert error.startswith("RuntimeError: state.commit() of an elastic state holding GsSketch is a collective: "
                            "every rank calls it at the same point, but not every rank called it within "
                            "checkpoint_timeout=3 s. Commit on every rank"), error
    assert ranks[0]["commit_seconds"] < 3.0 + 10
    for r in ranks:
        assert r["next_step_error"].startswith("RuntimeError: "), r
        assert "out of step" in r["next_step_error"]


def restarted(out: Path, kind: str, kill_at: int, *extra: str) -> list[dict]:
    out.mkdir()
    cmd = [*torchrun_command(2), "--max-restarts", "1", sys.executable, str(WORKERS / "restarts.py"), str(out), kind,
           str(kill_at), "12", *extra]
    return run_workers(cmd, 2, out, timeout=DEADLINE)


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_a_torchrun_restart_resumes_bitwise_from_the_last_checkpoint(kind, tmp_path):
    straight = restarted(tmp_path / "straight", kind, 0)
    killed = restarted(tmp_path / "killed", kind, 7)
    control = restarted(tmp_path / "control", kind, 7, "without_gs_state")
    assert [r["attempt"] for r in straight] == [0, 0] and [r["attempt"] for r in killed] == [1, 1]
    assert [r["resumed_from"] for r in killed] == [6, 6]  # the checkpoint of step 6, not step 7
    assert {r["model"] for r in killed} == {r["model"] for r in straight} and len({r["model"] for r in straight}) == 1
    assert {r["model"] for r in control} != {r["model"] for r in straight}  # the residuals matter


def elastic_demo(summary: Path, kill_at: int, add_at: int = 0) -> dict:
    """``bash scripts/examples/elastic_demo.sh --epochs 2 --ratio 0.01`` with KILL_AT / ADD_AT;
    its summary. A fixed ratio: under ratio="auto" a fast link keeps the steps dense, with no
    residual to lose."""
    env = dict(rank_env(), KILL_AT=str(kill_at), ADD_AT=str(add_at), SUMMARY=str(summary))
    cmd = ["bash", str(ROOT / "scripts" / "examples" / "elastic_demo.sh"), "--epochs", "2", "--ratio", "0.01"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=DEADLINE)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "held-out accuracy" in proc.stdout and "elastic_demo: summary" in proc.stdout
    return json.loads(summary.read_text())


def test_the_elastic_demo_with_a_kill_and_an_add_ends_in_the_uninterrupted_runs_band(tmp_path):
    """The MNIST-5k CNN, 2 epochs: a worker killed after step 20 and a slot added after step 40,
    against the same seed uninterrupted. One-sided: the faulted run takes more optimizer steps
    (one rank walks its share of an epoch in twice the steps), and may end higher."""
    faulted = elastic_demo(tmp_path / "faulted.json", kill_at=20, add_at=40)
    straight = elastic_demo(tmp_path / "straight.json", kill_at=0)
    assert faulted["ranks_after_each_reset"] == [1, 2] and faulted["ranks_at_end"] == 2
    assert straight["resets"] == 0 and straight["ranks_at_end"] == 2
    assert faulted["lost_residual"] > 0 and straight["lost_residual"] == 0
    assert faulted["accuracy"] >= straight["accuracy"] - ACCURACY_BAND, (faulted, straight)
