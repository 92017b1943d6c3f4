"""Smoke tests of the benchmark and tool scripts: each documented command, in its cheapest mode,
run as a user runs it (``python scripts/<folder>/<name>.py ...`` from the repository root, under
horovodrun or mpirun where it needs ranks) must exit 0 and produce what it promises, so that a
documented command cannot break unnoticed.

Adding a script is one test function: :func:`run_script` runs it and returns its stdout, and the
test checks that output or the files the script wrote. Not here: bench_wire.py, bench_throughput.py
and cost_model.py (tests/test_bench_tools.py runs them); bench_throughput.sh (root and network namespaces);
train_tf.py, whose TensorFlow start-up on two ranks does not fit this file's budget
(tests/workers/tf_scenarios.py runs the same DistributedGradientTape with GsSketch). The whole
file is meant to stay around 90 s on two idle cores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

import pytest
from conftest import ROOT, horovodrun_command, mpirun_command, rank_env, torchrun_command

pytestmark = pytest.mark.slow  # every test here launches processes

SCRIPTS = ROOT / "scripts"


def run_script(script: str, *args: str, launcher: Sequence[str] = (), stdin: Optional[str] = None,
               timeout: float = 300) -> str:
    """Runs ``python scripts/<script> *args`` (``script`` relative to scripts/, e.g.
    "bench/soak.py") with this venv's python from the repository root, after ``launcher`` if
    given (:func:`conftest.horovodrun_command`, :func:`conftest.mpirun_command`), and returns its
    stdout as written (carriage returns kept); fails with the tail of both streams unless it
    exits 0. The repository root leads PYTHONPATH, so the scripts import this checkout's
    gs_horovod wherever the venv's editable install points (scripts import only the library)."""
    cmd = [*launcher, sys.executable, str(SCRIPTS / script), *args]
    env = rank_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, input=None if stdin is None else stdin.encode(),
                          capture_output=True, timeout=timeout)
    stdout, stderr = (stream.decode(errors="replace") for stream in (proc.stdout, proc.stderr))
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{stdout[-4000:]}\n{stderr[-4000:]}"
    return stdout


RANK0_PREFIX = re.compile(r"^\[(?:\d+,)?0\]<stdout>:")  # horovodrun --gloo: [0]; --mpi (mpirun --tag-output): [1,0]


def rank0_lines(stdout: str) -> list[str]:
    """Rank 0's stdout lines of a horovodrun job, without the rank prefix horovodrun adds."""
    return [RANK0_PREFIX.sub("", line) for line in stdout.splitlines() if RANK0_PREFIX.match(line)]


def test_console_filters_horovodrun_output() -> None:
    """``horovodrun ... 2>&1 | python scripts/console.py``: TensorFlow's start-up notices go (its
    errors and warnings stay), rank 0 loses its prefix, other ranks keep theirs, a progress-bar
    redraw passes on as it ends."""
    noise = ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
             "[1]<stderr>:I0000 00:00:1796303339.636060   21127 cudart_stub.cc:31] Could not find cuda drivers\n"
             "I0000 00:00:1796303339.631607   21127 port.cc:153] oneDNN custom operations are on.\n")
    kept = ("E0000 00:00:1796303339.6 21127 cuda_dnn.cc:8579] Unable to register cuDNN factory\n"
            "W0000 00:00:1796303339.6 21127 port.cc:153] something odd\n")
    shown = ("[0]<stdout>:epoch   1/1  loss 0.5\n[0]<stderr>:training: 50%\r"
             "[1]<stderr>:Traceback (most recent call last):\n[0]<stdout>:no newline at the end")
    out = run_script("console.py", stdin=noise + kept + shown)
    assert out == kept + ("epoch   1/1  loss 0.5\ntraining: 50%\r[1]<stderr>:Traceback (most recent call last):\n"
                          "no newline at the end")


def test_bench_merge_quick(tmp_path: Path) -> None:
    """``horovodrun -np 2 --mpi ... bench_merge.py --quick --out``: the four merges timed on the two
    smallest buffers; on 2 ranks the flat tree is one exchange of the whole buffer."""
    out = tmp_path / "merge.json"
    stdout = run_script("bench/bench_merge.py", "--quick", "--out", str(out), launcher=horovodrun_command(2, "mpi"))
    result = json.loads(out.read_text())
    assert (result["ranks"], result["reps"]) == (2, 3)
    assert [r["bytes"] for r in result["rows"]] == [10_000, 100_000]
    for row in result["rows"]:
        assert all(row[key] > 0 for key in ("tree_flat_ms", "tree_node_aware_ms", "horovod_ms", "mpi_allreduce_ms"))
        assert row["tree_flat_rounds_rank0"] == 1
        assert row["tree_flat_bytes_sent_rank0"] == row["bytes"]
    assert sum(line.startswith("| 10,000 |") or line.startswith("| 100,000 |") for line in rank0_lines(stdout)) == 2


def test_pingpong(tmp_path: Path) -> None:
    """``mpirun -np 2 ... pingpong.py --label L --out F``: α and β fitted, one JSON line appended."""
    out = tmp_path / "pingpong.jsonl"
    stdout = run_script("bench/pingpong.py", "--label", "smoke", "--repeats", "1", "--out", str(out),
                        launcher=mpirun_command(2))
    row = json.loads(out.read_text())
    assert json.loads(stdout.strip().splitlines()[-1]) == row
    assert row["kind"] == "pingpong" and row["label"] == "smoke"
    assert len(row["one_way_s"]) == len(row["sizes"]) and all(t > 0 for t in row["one_way_s"])
    assert row["alpha_s"] > 0 and math.isfinite(row["beta_bytes_per_s"])


def test_soak(tmp_path: Path) -> None:
    """``horovodrun -np 2 ... soak.py --steps N --out F``: RSS sampled on both ranks, GsSketch's
    per-tensor states stay the number of compressed parameters."""
    out = tmp_path / "soak.json"
    stdout = run_script("bench/soak.py", "--steps", "20", "--every", "10", "--settle", "10", "--out", str(out),
                        launcher=horovodrun_command(2, "gloo"))
    result = json.loads(out.read_text())
    assert result["steps"] == 20 and [s["step"] for s in result["samples"]] == [10, 20]
    assert all(len(s["rss_mib"]) == 2 and min(s["rss_mib"]) > 0 for s in result["samples"])
    assert len({s["states"] for s in result["samples"]}) == 1 and result["samples"][0]["states"] > 0
    assert len(result["growth"]) == 2
    assert rank0_lines(stdout)[-1].startswith("growth after step 10: rank 0 ")


def test_bench_step(tmp_path: Path) -> None:
    """``horovodrun -np 2 ... bench_step.py --out F`` (1 timed step, 2 repeats, both thread
    settings; a smoke test, not a timing): dense, gs and the one-float compressor timed on the
    three models per repeat and thread setting, the counts in force recorded, the table on rank 0
    and in ``report.py``'s block."""
    out = tmp_path / "step.json"
    stdout = run_script("bench/bench_step.py", "--steps", "1", "--warmup", "1", "--repeats", "2", "--out", str(out),
                        launcher=horovodrun_command(2, "gloo"))
    result = json.loads(out.read_text())
    assert (result["format"], result["ranks"], result["steps"], result["repeats"]) == (2, 2, 1, 2)
    assert set(result["rows"]) == {"one 5M tensor", "MNIST CNN", "LSTM LM h512"}
    assert result["rows"]["one 5M tensor"]["params"] == 5_000_000
    assert set(result["threads"]) == {"default", "one"}
    assert result["threads"]["one"]["torch"] == result["threads"]["one"]["numba"] == 1
    assert result["threads"]["default"]["local_size"] == 2
    assert result["threads"]["default"]["numba"] <= max(1, result["threads"]["default"]["cores"] // 2)
    for row in result["rows"].values():
        assert all(len(ts) == 2 and min(ts) > 0 for by in row["times"].values() for ts in by.values())
    lines = rank0_lines(stdout)
    assert sum(line.startswith("| one 5M tensor | 1 | 5,000,000 |") for line in lines) == 2
    sys.path.insert(0, str(SCRIPTS / "bench"))
    import report

    (tmp_path / "bench_step.json").write_text(out.read_text())
    assert "threads 'one' (torch 1, Numba 1)" in report.step_table(tmp_path)


def test_bench_sketch_quick(tmp_path: Path) -> None:
    """``bench_sketch.py --log2-size N --ratio R --quick --out --plot`` on 2^14 elements: the table,
    the JSON row of every phase and, last, ``gs_vs_topk <ratio>``."""
    out, png = tmp_path / "sketch.json", tmp_path / "sketch.png"
    stdout = run_script("bench/bench_sketch.py", "--log2-size", "14", "--ratio", "0.01", "--ranks", "2", "--quick",
                        "--out", str(out), "--plot", str(png))
    (row,) = json.loads(out.read_text())
    assert (row["d"], row["k"], row["ranks"]) == (2 ** 14, 164, 2)
    for phase in ("sum_s", "topk_s", "top_abs_s", "accumulate_at_s", "heavy_hitters_s", "final_topk_s", "step_s",
                  "reference_s"):
        assert row[phase] > 0, phase
    last = stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"gs_vs_topk \d+\.\d{3}", last), last
    assert "| 2^14 | 164 (D/100) |" in stdout
    assert png.stat().st_size > 0


def test_bench_recovery_quick_and_report(tmp_path: Path) -> None:
    """``bench_recovery.py --quick`` (3 steps instead of 20, P = 4) runs the library's engine
    under every exchange and every baseline, prints the tables and ends with GsSketch's
    defaults (then the defaults with ``wire="compact8"``) against gTop-k over all weights, the
    ratios of its own records; ``--report`` of
    the records prints the tables, writes the Markdown table and draws both plots."""
    records = tmp_path / "recovery.jsonl"
    stdout = run_script("bench/bench_recovery.py", "--quick", "--ranks", "4", "--steps", "3", "--out", str(records))
    *_, line, last = stdout.strip().splitlines()
    match = re.fullmatch(r"defaults_vs_gtopk P=4 delivered_mass_ratio (\d+\.\d{3}) wire_bytes_ratio (\d+\.\d{3})", line)
    assert match, line
    match8 = re.fullmatch(r"compact8_vs_gtopk P=4 delivered_mass_ratio (\d+\.\d{3}) wire_bytes_ratio (\d+\.\d{3})",
                          last)
    assert match8, last
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    by_method = {r["method"]: r for r in rows if r["method"] != "gs global"}
    gs = {(r["exchange"], r["apply"], r["wire_format"]): r for r in rows if r["method"] == "gs global"}
    assert set(by_method) == {"dense", "exact top-k", "top-k allgather", "top-k allgather (global)", "gTop-k",
                              "gTop-k (global)", "gTop-k (global, compact pairs)", "Sketched-SGD", "PowerSGD"}
    assert by_method["gTop-k (global, compact pairs)"]["wire_format"] == "compact"
    assert by_method["gTop-k (global, compact pairs)"]["wire"] < 0.6 * by_method["gTop-k (global)"]["wire"]
    pairs = {(e, a, w) for e, a in (("sparse", None), ("allgather", "topk"), ("allgather", None))
             for w in ("fp32", "compact")}
    assert set(gs) == {("auto", None, "compact"), ("auto", None, "compact8"), ("sketch", None, "compact")} | pairs
    assert all(r["P"] == 4 and r["steps"] == 3 and len(r["loss"]) == 3 for r in rows)
    gtopk, defaults = by_method["gTop-k (global)"], gs["auto", None, "compact"]
    assert float(match[1]) == pytest.approx(defaults["mass"] / gtopk["mass"], abs=1e-3)
    assert float(match[2]) == pytest.approx(defaults["wire"] / gtopk["wire"], abs=1e-3)
    compact8 = gs["auto", None, "compact8"]
    assert float(match8[1]) == pytest.approx(compact8["mass"] / gtopk["mass"], abs=1e-3)
    assert float(match8[2]) == pytest.approx(compact8["wire"] / gtopk["wire"], abs=1e-3)
    # E4M3 values: the same coordinates, a byte less a value than bfloat16's
    assert compact8["mass"] == pytest.approx(defaults["mass"], rel=2e-2) and compact8["wire"] < defaults["wire"]
    # at P = 4 the defaults are the allgather applying its union (at most twice the sparse
    # exchange's bytes); the sparse exchange applies what the allgather's top k does, for less
    assert defaults["exchange_used"] == "allgather"
    union = gs["allgather", None, "compact"]
    assert (defaults["mass"], defaults["wire"]) == (union["mass"], union["wire"])
    for w in ("fp32", "compact"):
        assert gs["sparse", None, w]["wire"] < gs["allgather", "topk", w]["wire"] <= 2 * gs["sparse", None, w]["wire"]
    assert gs["sparse", None, "fp32"]["mass"] == pytest.approx(gs["allgather", "topk", "fp32"]["mass"])
    # the compact wire: about half the pairs' bytes, the same mass but for bfloat16 rounding
    for e, a in (("sparse", None), ("allgather", "topk"), ("allgather", None)):
        assert gs[e, a, "compact"]["mass"] == pytest.approx(gs[e, a, "fp32"]["mass"], rel=1e-2)
        assert gs[e, a, "compact"]["wire"] < 0.7 * gs[e, a, "fp32"]["wire"]
    assert by_method["dense"]["wire"] == 4 * 3 / 4 * by_method["dense"]["payload"]  # one ring allreduce
    assert abs(by_method["exact top-k"]["mass"] - 1) < 1e-6 and by_method["exact top-k"]["wire"] is None
    assert all(0 < r["mass"] < math.inf and (r["wire"] is None or r["wire"] > 0) for r in rows)
    # exact top k of exact sums of the ranks' own top k: at most the top k's mass
    assert all(r["mass"] <= 1 + 1e-6 for r in gs.values() if r["apply"] == "topk" or r["exchange_used"] != "allgather")

    plot, loss_plot, markdown = tmp_path / "recovery.png", tmp_path / "loss.png", tmp_path / "recovery.md"
    report = run_script("bench/bench_recovery.py", "--report", str(records), "--plot", str(plot), "--loss-plot",
                        str(loss_plot), "--markdown", str(markdown))
    assert "### digits MLP 1.28M, ratio 0.001, P = 4" in report
    assert plot.stat().st_size > 0 and loss_plot.stat().st_size > 0
    table = markdown.read_text()
    assert "| 4 | gs defaults (auto → allgather) | " in table and "| 4 | gs sparse | " in table
    assert "| 4 | gTop-k (global) | " in table


def test_bench_recovery_rule(tmp_path: Path) -> None:
    """``bench_recovery.py --run d --grid rule --seeds 0 1`` (the CNN, 2 steps, P = 2): the two
    exchanges "auto" chooses between, once per seed, each record saying what "auto" picks; the
    seeds start differently; ``--rule`` tabulates the union against the sparse exchange."""
    records = tmp_path / "rule.jsonl"
    run_script("bench/bench_recovery.py", "--run", "d", "--ranks", "2", "--ratios", "0.001", "--steps", "2",
               "--grid", "rule", "--baselines", "none", "--seeds", "0", "1", "--threads", "1", "--out", str(records))
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    assert [(r.get("seed", 0), r["exchange"]) for r in rows] == [(0, "sparse"), (0, "allgather"), (1, "sparse"),
                                                                 (1, "allgather")]
    assert all(r["task"] == "MNIST-5k CNN" and r["auto_picks"] == "allgather" for r in rows)
    assert rows[0]["loss"] != rows[2]["loss"]  # other weights and micro-batches
    table = run_script("bench/bench_recovery.py", "--rule", str(records))
    union, sparse = rows[1], rows[0]
    assert "| MNIST-5k CNN | 0.001 | 2 | 2 | " in table and "| allgather |" in table
    assert f"{union['wire'] / sparse['wire']:.2f}" in table


@pytest.mark.parametrize("launcher, compression", [("run_demo.sh", "gs"), ("run_demo.sh --launcher torchrun", "gs"),
                                                   ("torchrun", "powersgd"),
                                                   ("horovodrun --mpi --transport mpi", "gs")])
def test_train_torch_mlp(tmp_path: Path, launcher: str, compression: str) -> None:
    """``bash scripts/run_demo.sh --model mlp --epochs 1 --json F`` (the demo: horovodrun, GsSketch;
    and ``--launcher torchrun``: DDP with gs_hook), ``torchrun ... train_torch.py`` with torch's
    PowerSGD hook, and ``horovodrun --mpi ... train_torch.py --transport mpi``: one epoch, fewer bytes
    per step than dense."""
    out = tmp_path / "history.json"
    args = ["--model", "mlp", "--epochs", "1", "--json", str(out), "--compression", compression]
    if launcher.startswith("run_demo.sh"):
        env = dict(rank_env(), PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        cmd = ["bash", str(SCRIPTS / "run_demo.sh"), *launcher.split()[1:], *args]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        lines = proc.stdout.splitlines()  # scripts/console.py strips rank 0's prefix
    elif launcher.startswith("horovodrun"):
        lines = rank0_lines(run_script("bench/train_torch.py", *args, "--transport", "mpi",
                                       launcher=horovodrun_command(2, "mpi")))
    else:
        lines = run_script("bench/train_torch.py", *args, launcher=torchrun_command(2)).splitlines()
    result = json.loads(out.read_text())
    (epoch,) = result["history"]
    assert result["ranks"] == 2 and 0 <= epoch["accuracy"] <= 1 and math.isfinite(epoch["loss"])
    assert 0 < epoch["bytes_per_step"] < result["dense_bytes_per_step"]
    assert any(line.startswith(f"summary (2 ranks, --compression {compression})") for line in lines)


@pytest.mark.parametrize("launcher", ["horovodrun", "torchrun"])
def test_the_torch_example_trains(launcher: str) -> None:
    """``scripts/examples/train_torch.py --epochs 1`` (the example to copy: GsSketch in Horovod's
    DistributedOptimizer, or gs_hook on DDP under torchrun): an epoch line with a held-out
    accuracy well above chance. The harness's train_torch.py is the one the tests above run."""
    command = horovodrun_command(2, "gloo") if launcher == "horovodrun" else torchrun_command(2)
    out = run_script("examples/train_torch.py", "--epochs", "1", "--ratio", "0.01", launcher=command)
    lines = rank0_lines(out) if launcher == "horovodrun" else out.splitlines()
    (line,) = [line for line in lines if line.startswith("epoch 1 ")]
    assert float(line.split("held-out accuracy ")[1]) > 0.5, line


def test_train_tf_one_epoch(tmp_path: Path) -> None:
    """``horovodrun -np 2 ... train_tf.py --epochs 1 --json F`` (DistributedGradientTape with
    GsSketch in a tf.function): one epoch on the digits, a held-out accuracy, fewer bytes per step
    than dense, the summary line."""
    out = tmp_path / "history.json"
    lines = rank0_lines(run_script("bench/train_tf.py", "--epochs", "1", "--json", str(out), "--compression", "gs",
                                   launcher=horovodrun_command(2, "gloo"), timeout=420))
    result = json.loads(out.read_text())
    (epoch,) = result["history"]
    assert result["ranks"] == 2 and 0.1 < epoch["accuracy"] <= 1 and math.isfinite(epoch["loss"])
    assert 0 < epoch["bytes_per_step"] < result["dense_bytes_per_step"]
    assert any(line.startswith("summary (2 ranks, --compression gs)") for line in lines)


@pytest.mark.parametrize("compression", ["gs", "none"])
def test_train_fsdp_one_epoch(tmp_path: Path, compression: str) -> None:
    """``torchrun --nproc_per_node 4 train_fsdp.py --epochs 1 --json F`` (2 replicas × 2 shards;
    GsFsdpState, or plain HSDP): a held-out accuracy; gs hands the replicate group fewer bytes than
    the shard's, plain HSDP's all-reduce exactly the shard's (its layers shard evenly)."""
    out = tmp_path / "history.json"
    lines = run_script("bench/train_fsdp.py", "--epochs", "1", "--hidden", "32", "--json", str(out),
                       "--compression", compression, launcher=torchrun_command(4)).splitlines()
    result = json.loads(out.read_text())
    (epoch,) = result["history"]
    assert result["ranks"] == 4 and 0 <= epoch["accuracy"] <= 1 and math.isfinite(epoch["loss"])
    if compression == "gs":
        assert 0 < epoch["bytes_per_step"] < result["dense_bytes_per_step"]
        assert any(line.startswith("  engine payload      ") for line in lines)
    else:
        assert epoch["bytes_per_step"] == result["dense_bytes_per_step"]
    assert any(line.startswith(f"summary (4 ranks, --compression {compression})") for line in lines)
    assert "  mesh                2 replicas × 2 shards; dense = this rank's shard, " in lines[-2] + lines[-1]


@pytest.mark.parametrize("launcher", ["horovodrun", "torchrun"])
def test_train_lm_tiny(tmp_path: Path, launcher: str) -> None:
    """``horovodrun -np 2 ... train_lm.py --steps N --json F`` on a tiny LSTM (and the same under
    torchrun: DDP with gs_hook): a held-out perplexity per interval and gs's bytes under dense."""
    out = tmp_path / "history.json"
    run_script("bench/train_lm.py", "--steps", "2", "--eval-every", "1", "--hidden", "64", "--embed", "16",
               "--batch-size", "2", "--seq", "16", "--eval-windows", "2", "--eval-seq", "32", "--json", str(out),
               launcher=horovodrun_command(2, "gloo") if launcher == "horovodrun" else torchrun_command(2))
    result = json.loads(out.read_text())
    assert [h["epoch"] for h in result["history"]] == [1, 2]
    assert all(1 < h["perplexity"] < 1000 for h in result["history"])
    assert 0 < result["history"][-1]["bytes_per_step"] < result["dense_bytes_per_step"]


def test_bench_convergence_quick(tmp_path: Path) -> None:
    """``bench_convergence.py --quick``: gs-SGD with 8-byte pairs and Sketched-SGD at its wire
    bytes, 2 ranks; the equal-wire comparison holds (Sketched-SGD sent no more wire bytes than
    gs-SGD). (At the compact defaults no Sketched-SGD size fits: its exact round alone costs more.)"""
    out = run_script("bench/bench_convergence.py", "--quick", "--out-dir", str(tmp_path), timeout=600)
    runs = json.loads((tmp_path / "convergence_mlp.json").read_text())
    assert set(runs) == {"gs fp32 @ 0.01", "sketched = gs fp32 @ 0.01"}
    wire = {k: v["0"]["history"][-1]["wire_bytes_per_step"] for k, v in runs.items()}
    assert 0 < wire["sketched = gs fp32 @ 0.01"] <= wire["gs fp32 @ 0.01"]
    assert "at equal wire bytes" in out and (tmp_path / "convergence_mlp.png").stat().st_size > 0


@pytest.mark.parametrize(("compression", "ranks", "options"), [("gs", 2, []), ("topk", 2, []),
                                                             ("gs", 3, ["--gs", "exchange=sparse"])],
                         ids=["gs-allgather-2", "topk-2", "gs-sparse-3"])
def test_simulated_ranks_train_what_horovodrun_trains(tmp_path: Path, compression: str, ranks: int,
                                                      options: list[str]) -> None:
    """``train_torch.py --simulated-ranks P`` (P ranks in one process) against the same run
    under ``horovodrun -np P`` (GsSketch's defaults at 2: the allgather; the sparse exchange at
    3): the same held-out accuracy, loss and payload bytes per step; the same wire bytes where
    they do not depend on where coordinates fall (the simulated alltoall counts the busiest
    rank's real bytes, Horovod's meter an even split, so those may differ)."""
    args = ["--model", "mlp", "--epochs", "2", "--compression", compression, "--ratio", "0.01", *options]
    run_script("bench/train_torch.py", *args, "--json", str(tmp_path / "real.json"),
               launcher=horovodrun_command(ranks, "gloo"))
    run_script("bench/train_torch.py", *args, "--simulated-ranks", str(ranks), "--json", str(tmp_path / "sim.json"))
    real, sim = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("real", "sim"))
    assert sim["ranks"] == real["ranks"] == ranks
    for r, s in zip(real["history"], sim["history"], strict=True):
        assert s["accuracy"] == pytest.approx(r["accuracy"], abs=0.01)
        assert s["loss"] == pytest.approx(r["loss"], rel=1e-3)
        # the same plan on both transports (gs: both from CommStats; that CommStats and the
        # baselines' meters count the tensors handed to Horovod: tests/test_horovod_torch.py)
        assert s["bytes_per_step"] == pytest.approx(r["bytes_per_step"])
        if ranks == 2:
            assert s["wire_bytes_per_step"] == pytest.approx(r["wire_bytes_per_step"])
        else:
            # Horovod's meter: rank 0's own allgather share, an even alltoall; simulated: the mean
            # share, the busiest rank's real alltoall bytes
            assert 0.5 * r["wire_bytes_per_step"] <= s["wire_bytes_per_step"] <= 2 * r["wire_bytes_per_step"]


def test_a_modelled_link_gives_simulated_ranks_the_density_a_slow_link_gets(tmp_path: Path) -> None:
    """``--simulated-link``: without it the collectives take no time and ``ratio="auto"`` stays
    dense (float16, 2 bytes a coordinate); on a modelled 1 Mbit/s link it goes sparse after its
    first window, so fewer bytes a step. A rate that is not one is an argument error."""
    from gs_bench.cli import link_of

    args = ["--model", "mlp", "--epochs", "2", "--compression", "gs", "--simulated-ranks", "2"]
    run_script("bench/train_torch.py", *args, "--json", str(tmp_path / "free.json"))
    run_script("bench/train_torch.py", *args, "--simulated-link", "1mbit", "--json", str(tmp_path / "slow.json"))
    free, slow = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("free", "slow"))
    assert free["history"][-1]["bytes_per_step"] == pytest.approx(free["dense_bytes_per_step"] / 2, rel=0.01)
    assert slow["history"][-1]["bytes_per_step"] < 0.5 * free["history"][-1]["bytes_per_step"]
    assert link_of("2.5gbit") == (5e-5, 2.5e9 / 8)
    with pytest.raises(argparse.ArgumentTypeError, match="a link rate like 100mbit or 1gbit, got 'fast'"):
        link_of("fast")


def test_bench_convergence_simulated(tmp_path: Path) -> None:
    """``bench_convergence.py --simulated-ranks 4`` on the digits MLP: every method runs in one
    process and the run ends with the documented ``gs_vs_best P=4 metric_ratio <x>
    wire_bytes_ratio <y>`` (its pick and interpolation are checked on hand-made curves in
    tests/test_report.py)."""
    out = run_script("bench/bench_convergence.py", "--simulated-ranks", "4", "--model", "mlp", "--epochs", "2",
                     "--methods", "dense", "gs", "gtopk", "powersgd r1", "--ratios", "0.01", "--seeds", "0",
                     "--out-dir", str(tmp_path), timeout=600)
    runs = json.loads((tmp_path / "convergence_mlp_sim4.json").read_text())
    assert set(runs) == {"dense @ 1", "gs @ 0.01", "gtopk @ 0.01", "powersgd r1 @ 1"}
    assert all(run["0"]["ranks"] == 4 for run in runs.values())
    name, ranks, metric, x, wire, y = out.strip().splitlines()[-1].split()
    assert (name, ranks, metric, wire) == ("gs_vs_best", "P=4", "metric_ratio", "wire_bytes_ratio")
    assert float(x) > 0 and float(y) > 0


def test_bench_compute_codec(tmp_path: Path) -> None:
    """``bench_compute.py --codec`` (D scaled down): the defaults' codec and selection seconds
    per step at each P, the exchange ``auto`` ran, and the printed ratio of the two."""
    out = run_script("bench/bench_compute.py", "--codec", "--ranks", "2", "64", "--ratios", "0.001",
                     "--steps", "1", "--scale", "64", "--out", str(tmp_path / "codec.json"))
    rows = json.loads((tmp_path / "codec.json").read_text())
    assert [(r["ranks"], r["exchange"]) for r in rows] == [(2, "allgather"), (64, "sparse")]
    assert all(r["codec_s"] > 0 and r["selection_s"] > 0 for r in rows)
    lines = [line.split() for line in out.strip().splitlines() if line.startswith("codec_vs_selection")]
    for line, r in zip(lines, rows):
        assert line[1] == f"P={r['ranks']}"
        assert float(line[3]) == pytest.approx(r["codec_s"] / r["selection_s"], abs=5e-4)


def test_bench_compute_quick(tmp_path: Path) -> None:
    """``bench_compute.py --quick`` (D scaled down): every method timed, and the last lines are
    the documented ratios of the rows' medians."""
    out = run_script("bench/bench_compute.py", "--quick", "--scale", "256", "--out", str(tmp_path / "c.json"))
    rows = json.loads((tmp_path / "c.json").read_text())
    assert len(rows) == 11 and all(r["median_s"] > 0 and r["ranks"] == 4 for r in rows)
    median = {r["method"]: r["median_s"] for r in rows}
    lines = [line.split() for line in out.strip().splitlines()[-3:]]
    assert [line[0] for line in lines] == ["defaults_vs_topk_allgather", "gtopk_vs_topk_allgather", "compact_vs_fp32"]
    for (_, ratio), method in zip(lines[:2], ("gs-SGD (defaults)", "gTop-k")):
        assert float(ratio) == pytest.approx(median[method] / median["top-k allgather"], abs=5e-4)
    _, _, defaults, _, sparse = lines[2]
    assert float(defaults) == pytest.approx(median["gs-SGD (defaults)"] / median["gs-SGD (wire=fp32)"], abs=5e-4)
    assert float(sparse) == pytest.approx(median["gs-SGD (exchange=sparse)"]
                                          / median["gs-SGD (exchange=sparse, wire=fp32)"], abs=5e-4)
