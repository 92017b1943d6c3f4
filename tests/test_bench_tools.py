"""Smoke runs of the throughput tools: scripts/bench/bench_throughput.py under a real horovodrun
(no network namespaces), scripts/bench/cost_model.py's --validate on the measured runs in docs/
and --project, scripts/bench/bench_wire.py counted, against what the collectives receive, and
measured. And the data-writing scripts of scripts/bench/ refuse an existing --out unless
--append is given, and stamp what they append with their run's run_id."""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts" / "bench"
sys.path.insert(0, str(SCRIPTS))
import bench_time_to_accuracy as tta  # noqa: E402
import bench_wire  # noqa: E402
import cost_model  # noqa: E402

from gs_bench import runs, variants  # noqa: E402
from gs_horovod.transports.collective_cost import KINDS  # noqa: E402

RUN_KEYS = {"kind", "label", "repeat", "method", "options", "variant", "ratio", "ranks", "cpu_count", "batch",
            "seq", "hidden", "params", "warmup", "steps", "seconds", "steps_per_s", "bytes_per_step",
            "wire_bytes_per_step", "wire", "collectives", "run_id", "code"}
RUN_ID = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{6}")


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    return env


def _run(*args: str, ranks: int = 0, timeout: float = 240) -> str:
    """Runs a script of scripts/ (under horovodrun on ``ranks`` local ranks when > 0); returns
    its stdout and asserts exit 0."""
    cmd = [sys.executable, *args]
    if ranks:
        launcher = shutil.which("horovodrun", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
        assert launcher, "horovodrun is not installed (run scripts/setup_env.sh)"
        cmd = [launcher, "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo", *cmd]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)
    output = f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{output}"
    return proc.stdout


def _lm_shapes(hidden: int) -> list[tuple[int, ...]]:
    from gs_bench.workloads import LstmLM

    return [tuple(p.shape) for _, p in LstmLM(hidden=hidden).named_parameters()]


def test_variant_words_round_trip_and_label() -> None:
    for word in cost_model.HEADLINE:
        assert variants.variant_word(*variants.parse_variant(word)) == word
    assert variants.parse_variant("sketched:width=4,rows=3") == ("sketched", {"width": 4, "rows": 3})
    assert variants.variant_word("sketched", {"width": 4, "rows": 3}) == "sketched:rows=3,width=4"
    labels = [variants.variant_label(*variants.parse_variant(w)) for w in cost_model.HEADLINE]
    assert labels == ["gs-SGD", "gs-SGD, exchange=sketch", "gTop-k (global)", "gTop-k (per tensor)",
                      "top-k allgather (global)", "Sketched-SGD (global)", "PowerSGD r1", "PowerSGD r4", "dense",
                      "fp16"]
    with pytest.raises(ValueError, match="method"):
        variants.parse_variant("dgc:scope=layer")
    with pytest.raises(ValueError, match="NAME=VALUE"):
        variants.parse_variant("gtopk:layer")


@pytest.mark.slow
def test_bench_throughput_smoke(tmp_path: Path) -> None:
    """One launch, two phases: a JSON row each, the variant and its options recorded, and the
    collectives the meter saw equal the ones planned from the model's shapes; with --append (as
    bench_throughput.sh launches it) after the rows already there, with the run id it is given."""
    out = tmp_path / "runs.jsonl"
    out.write_text('{"kind": "pingpong", "label": "earlier"}\n')
    _run(str(SCRIPTS / "bench_throughput.py"), "--hidden", "32", "--steps", "2", "--warmup", "1",
         "--compression", "gtopk", "--opt", "scope=layer", "--ratio", "0.01", "--labels", "local", "fake",
         "--repeat", "2", "--out", str(out), "--append", "--run-id", "study-1", ranks=2)
    first, *rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert first == {"kind": "pingpong", "label": "earlier"}
    assert [r["label"] for r in rows] == ["local", "fake"]
    assert all(r["run_id"] == "study-1" and r["code"] == runs.code_version() for r in rows)
    planned = variants.planned("gtopk", {"scope": "layer"}, _lm_shapes(32), 2, 0.01)
    for r in rows:
        assert set(r) == RUN_KEYS
        assert (r["kind"], r["method"], r["options"], r["variant"]) == ("run", "gtopk", {"scope": "layer"},
                                                                         "gtopk:scope=layer")
        assert (r["ranks"], r["repeat"], r["steps"], r["ratio"], r["wire"]) == (2, 2, 2, 0.01, "fp32")
        assert r["steps_per_s"] > 0 and r["seconds"] > 0
        assert all(kind in KINDS for kind, _ in r["collectives"])
        assert [tuple(c) for c in r["collectives"]] == planned
        assert r["bytes_per_step"] == pytest.approx(sum(n for _, n in planned))
        assert r["bytes_per_step"] < 4 * r["params"] / 10  # compressed


def _table(out: str, title: str) -> list[dict[str, str]]:
    """The rows, as {column: cell}, of the markdown table under the first line of ``out`` that
    starts with ``title``."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    header = next(i for i in range(start, len(lines)) if lines[i].startswith("| "))
    columns = [c.strip() for c in lines[header].strip("|").split("|")]
    rows = []
    for line in lines[header + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(columns, (c.strip() for c in line.strip("|").split("|")))))
    return rows


def _predictions(path: Path) -> tuple[str, dict[tuple[str, int, str], dict[str, str]]]:
    """cost_model.py --validate's output on ``path`` and its out-of-sample predictions by (link, P, label)."""
    out = _run(str(SCRIPTS / "cost_model.py"), "--validate", str(path))
    rows = _table(out, "Prediction (out-of-sample)")
    return out, {(r["link"], int(r["P"]), r["variant"]): r for r in rows}


@pytest.mark.slow
def test_cost_model_validates_on_measured_rows_it_never_fitted(tmp_path: Path) -> None:
    """On the measured runs in docs/throughput_fair.jsonl (P = 2 and 4, 10 variants, unshaped and
    two shaped links, 3 repeats): each shaped prediction is measured against the file's own median, its error is
    |predicted − measured| / measured, the last line is the worst counted one; and the shaped
    runs are held out: scaling their steps/s leaves every prediction unchanged, while scaling
    the unshaped runs (the compute calibration) moves them."""
    data = [json.loads(line) for line in (ROOT / "docs" / "throughput_fair.jsonl").read_text().splitlines() if line]
    runs = [r for r in data if r["kind"] == "run"]

    def write(name: str, scale: Any) -> Path:
        path = tmp_path / name
        path.write_text("".join(json.dumps({**r, "steps_per_s": r["steps_per_s"] * scale(r)} if r["kind"] == "run"
                                           else r) + "\n" for r in data))
        return path

    out, base = _predictions(write("as_measured.jsonl", lambda r: 1.0))
    label = {r["variant"]: variants.variant_label(*variants.parse_variant(r["variant"])) for r in runs}
    shaped = {(r["label"], r["ranks"], label[r["variant"]]) for r in runs if r["label"] != "local"}
    assert set(base) == shaped and len(shaped) == 40
    counted = []
    for (link, P, name), row in base.items():
        median = statistics.median(r["steps_per_s"] for r in runs
                                   if (r["label"], r["ranks"], label[r["variant"]]) == (link, P, name))
        measured, predicted = float(row["measured steps/s"].split()[0]), float(row["predicted"])
        assert measured == pytest.approx(median, abs=5e-4)
        assert float(row["rel. error"]) == pytest.approx(abs(predicted - median) / median, abs=2e-3)
        if "not counted" not in row["comm share"]:
            counted.append(row["rel. error"])
    assert counted and out.strip().splitlines()[-1] == f"max_rel_error {max(counted, key=float)}"

    _, held_out = _predictions(write("shaped_scaled.jsonl", lambda r: 1.0 if r["label"] == "local" else
                                     1.5 if r["ranks"] == 2 else 0.6))
    for key, row in base.items():
        assert held_out[key]["predicted"] == row["predicted"], key
        assert float(held_out[key]["measured steps/s"].split()[0]) != pytest.approx(float(
            row["measured steps/s"].split()[0]), rel=0.05)
    _, calibration = _predictions(write("local_scaled.jsonl", lambda r: 0.5 if r["label"] == "local" else 1.0))
    assert all(calibration[key]["predicted"] != row["predicted"] for key, row in base.items())


@pytest.mark.slow
def test_cost_model_project(tmp_path: Path) -> None:
    table = tmp_path / "projection.json"
    out = _run(str(SCRIPTS / "cost_model.py"), "--project", "--variants", "gs gtopk:scope=layer powersgd:rank=1 none",
               "--out", str(table))
    assert "÷ gTop-k (per tensor)" in out and "÷ PowerSGD r1" in out and "ResNet-50 (25.6M), 25,557,032" in out
    data = json.loads(table.read_text())
    assert data["ranks"] == [2 ** i for i in range(3, 11)]
    for by_rate in data["table"].values():
        for by_variant in by_rate.values():
            assert set(by_variant) == {"gs", "gtopk:scope=layer", "powersgd:rank=1", "none"}
            assert all(len(s) == 8 and all(x > 0 for x in s) for s in by_variant.values())


@pytest.mark.parametrize("ranks", [2, 4])
def test_bench_wire_counts_what_the_collectives_receive(ranks: int) -> None:
    """bench_wire's counted bytes (each method's plan from the shape alone) against one step of
    every variant that runs on simulated ranks, its bytes counted by the transport from the
    tensors each collective is handed (SimulatedComm's Traffic; the alltoalls' wire bytes from
    what each rank really sent and received): the same collectives, payload and wire bytes."""
    import torch

    from gs_bench.baselines import ReducerOptimizer
    from gs_bench.methods import METHODS
    from gs_horovod.transports.simulated import SimulatedRanks

    shape, ratio = (20, 5000), 0.001
    counted = bench_wire.counted(shape, ratio, ranks)
    runnable = [v for v in bench_wire.VARIANTS if METHODS[variants.parse_variant(v)[0]].simulated_too
                and "transport" not in variants.parse_variant(v)[1]]
    assert len(runnable) == len(bench_wire.VARIANTS) - 2  # fp16 is Horovod's, transport=mpi needs MPI
    for v in runnable:
        method, options = variants.parse_variant(v)

        def rank_fn(rank: int, comm: Any, method: str = method, options: dict = options) -> tuple:
            param = torch.nn.Parameter(torch.zeros(shape))
            exchange = METHODS[method].simulated(comm, ratio if variants.takes_ratio(method) else None, options)
            opt = ReducerOptimizer(torch.optim.SGD([param], lr=0.0), [("w", param)], exchange, comm)
            param.grad = torch.randn(shape, generator=torch.Generator().manual_seed(rank))
            opt.step()
            return comm.traffic.last_step, comm.traffic.per_step()

        for step, (payload, wire) in SimulatedRanks(ranks).run(rank_fn):
            assert step == variants.planned(method, options, [shape], ranks, ratio), v
            assert (payload, wire) == pytest.approx(counted[v]), v


@pytest.mark.slow
def test_bench_wire_counted_and_measured(tmp_path: Path) -> None:
    """bench_wire --table, and --measure on 2 Horovod ranks against the counted table (the
    baselines' meters count at the transport; gs-SGD's and dense's meters follow the plan,
    whose bytes the test above checks against what the collectives receive)."""
    counted = tmp_path / "counted.json"
    out = _run(str(SCRIPTS / "bench_wire.py"), "--table", "--d", "100000", "--out", str(counted))
    assert "| 1024 |" in out and "PowerSGD r4" in out
    table = json.loads(counted.read_text())
    assert table["2"]["none"] == [400_000, 800_000]  # payload, wire: a ring allreduce of 4d at P = 2
    measured = tmp_path / "P2.json"
    _run(str(SCRIPTS / "bench_wire.py"), "--measure", "--d", "100000", "--out", str(measured), ranks=2)
    data = json.loads(measured.read_text())
    assert data["ranks"] == 2 and set(data["measured_rank0"]) == set(data["counted"])
    for variant, (payload, wire) in data["measured_rank0"].items():
        assert (payload, wire) == pytest.approx(data["counted"][variant]), variant


# ---------------------------------------------------------------------------------------------
# no silent appends: an existing --out is refused unless --append; appended records carry run_id

REFUSERS = {
    "bench_time_to_accuracy.py": ["run", "--workloads", "cnn", "--ranks", "2", "--rates", "1gbit", "--methods", "gs",
                                  "--repeats", "1"],
    "bench_recovery.py": ["--run", "c", "--ranks", "4", "--ratios", "0.01", "--steps", "1", "--grid", "none",
                          "--baselines", "gtopk-global", "--planted-d", "4096", "--threads", "1"],
    "bench_throughput.py": ["--hidden", "32", "--steps", "1", "--warmup", "0"],
    "pingpong.py": ["--label", "local", "--repeats", "1"],
    "collective_sweep.py": ["--label", "local", "--kinds", "allreduce", "--sizes", "4096", "--repeats", "1"],
}
"""Each data-writing script of scripts/bench/ that appends to --out, with cheap arguments."""


@pytest.mark.slow
@pytest.mark.parametrize("script", [*REFUSERS, "bench_throughput.sh", "collective_sweep.sh"])
def test_an_existing_out_is_refused_without_append(tmp_path: Path, script: str) -> None:
    """Run as a user runs it on an --out that exists: a non-zero exit whose message names the
    file and says to pass --append or choose another path, and the file as it was. (The .sh
    wrappers are told they already run inside shaped.sh, with too few ranks: should the check
    not stop them, they fail differently and touch no network.)"""
    out = tmp_path / "results.jsonl"
    before = '{"kind": "earlier"}\n'
    out.write_text(before)
    if script.endswith(".sh"):
        args = [str(out), "100mbit", "gs", "2", "1"] if script == "bench_throughput.sh" else [str(out), "100mbit", "2"]
        cmd = ["bash", str(SCRIPTS / script), *args]
        env = dict(_env(), SHAPED_RANKS="1")
    else:
        cmd, env = [sys.executable, str(SCRIPTS / script), *REFUSERS[script], "--out", str(out)], _env()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert f"{out} exists: pass --append" in proc.stderr and "choose another" in proc.stderr, proc.stderr[-2000:]
    assert out.read_text() == before


@pytest.mark.slow
def test_bench_recovery_append_stamps_each_invocations_records(tmp_path: Path) -> None:
    """``bench_recovery.py --run ... --append`` twice on an existing file: the earlier line is
    kept as it was, each invocation's records follow with their own run_id (UTC time and random
    hex) and the commit; without --append the same command changes nothing."""
    out = tmp_path / "R.jsonl"
    out.write_text('{"task": "earlier"}\n')
    cmd = [str(SCRIPTS / "bench_recovery.py"), "--run", "c", "--ranks", "4", "--ratios", "0.01", "--steps", "1",
           "--grid", "none", "--baselines", "gtopk-global,gtopk", "--planted-d", "4096", "--threads", "1",
           "--out", str(out), "--append"]
    _run(*cmd)
    _run(*cmd)
    first, *records = [json.loads(line) for line in out.read_text().splitlines()]
    assert first == {"task": "earlier"}
    assert [r["method"] for r in records] == ["gTop-k (global)", "gTop-k"] * 2
    ids = [r["run_id"] for r in records]
    assert all(RUN_ID.fullmatch(i) for i in ids), ids
    assert ids[0] == ids[1] and ids[2] == ids[3] and ids[0] != ids[2]
    assert all(r["code"] == runs.code_version() for r in records)


@pytest.mark.slow
def test_time_to_accuracy_run_refuses_or_appends_with_a_run_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """``bench_time_to_accuracy.py run`` (its trainings replaced by a stand-in): an existing
    --out without --append stops it before any training; with --append every row of the study
    goes after the rows already there, with one run_id and the commit."""
    trained: list[tuple] = []

    def one_run(workload: str, ranks: int, rate: str, variant: str, repeat: int, args: Any) -> dict:
        trained.append((workload, ranks, rate, variant, repeat))
        return {"workload": workload, "ranks": ranks, "rate": rate, "method": variant, "repeat": repeat,
                "seed": repeat, "metric": "accuracy", "history": [{"seconds": 1.0, "accuracy": 0.95}],
                "bytes_per_step": 10}

    monkeypatch.setattr(tta, "one_run", one_run)
    out = tmp_path / "tta.jsonl"
    earlier = '{"workload": "cnn", "note": "an earlier study"}\n'
    out.write_text(earlier)
    argv = ["run", "--out", str(out), "--workloads", "cnn", "--ranks", "2", "--rates", "1gbit",
            "--methods", "gs", "topk", "--repeats", "2"]
    with pytest.raises(SystemExit, match=re.escape(f"{out} exists: pass --append")):
        tta.main(argv)
    assert trained == [] and out.read_text() == earlier
    tta.main([*argv, "--append"])
    lines = out.read_text().splitlines()
    assert lines[0] + "\n" == earlier
    rows = [json.loads(line) for line in lines[1:]]
    assert [(r["method"], r["seed"]) for r in rows] == [("gs", 0), ("topk", 0), ("topk", 1), ("gs", 1)]
    assert len({r["run_id"] for r in rows}) == 1 and RUN_ID.fullmatch(rows[0]["run_id"])
    assert all(r["code"] == runs.code_version() for r in rows)


def test_time_to_accuracy_warmup_trains_each_setting_once_more_uncounted(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``run --warmup`` (trainings replaced by a stand-in): one extra training of the first method
    (seed 0) before each setting's first run, written with ``warmup``, and none in later repeats;
    ``read_rows`` returns the counted rows only, without calling them repeats of one another."""
    def one_run(workload: str, ranks: int, rate: str, variant: str, repeat: int, args: Any) -> dict:
        return {"workload": workload, "ranks": ranks, "rate": rate, "method": variant, "repeat": repeat,
                "seed": repeat, "metric": "accuracy", "history": [{"seconds": 1.0, "accuracy": 0.95}],
                "bytes_per_step": 10}

    monkeypatch.setattr(tta, "one_run", one_run)
    out = tmp_path / "tta.jsonl"
    tta.main(["run", "--out", str(out), "--workloads", "cnn", "--ranks", "2", "4", "--rates", "1gbit",
              "--methods", "gs", "topk", "--repeats", "2", "--warmup"])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["ranks"], r["method"], r["seed"], r.get("warmup", False)) for r in rows] == [
        (2, "gs", 0, True), (2, "gs", 0, False), (2, "topk", 0, False),
        (4, "gs", 0, True), (4, "gs", 0, False), (4, "topk", 0, False),
        (2, "topk", 1, False), (2, "gs", 1, False), (4, "topk", 1, False), (4, "gs", 1, False)]
    assert not any(r.get("warmup") for r in tta.read_rows(out)) and len(tta.read_rows(out)) == 8
