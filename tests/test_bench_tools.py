"""Smoke runs of the throughput tools: scripts/bench/bench_throughput.py under a real horovodrun
(no network namespaces), scripts/bench/cost_model.py's --validate on a generated results file
and --project, scripts/bench/bench_wire.py counted and measured."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts" / "bench"
sys.path.insert(0, str(SCRIPTS))
import cost_model  # noqa: E402

from gs_horovod.bench import variants  # noqa: E402
from gs_horovod.wire import KINDS  # noqa: E402

RUN_KEYS = {"kind", "label", "repeat", "method", "options", "variant", "ratio", "ranks", "cpu_count", "batch",
            "seq", "hidden", "params", "warmup", "steps", "seconds", "steps_per_s", "bytes_per_step",
            "wire_bytes_per_step", "collectives"}


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
    from gs_horovod.bench.workloads import LstmLM

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


def test_bench_throughput_smoke(tmp_path: Path) -> None:
    """One launch, two phases: a JSON row each, the variant and its options recorded, and the
    collectives the meter saw equal the ones planned from the model's shapes."""
    out = tmp_path / "runs.jsonl"
    _run(str(SCRIPTS / "bench_throughput.py"), "--hidden", "32", "--steps", "2", "--warmup", "1",
         "--compression", "gtopk", "--opt", "scope=layer", "--ratio", "0.01", "--labels", "local", "fake",
         "--repeat", "2", "--out", str(out), ranks=2)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["label"] for r in rows] == ["local", "fake"]
    planned = variants.planned("gtopk", {"scope": "layer"}, _lm_shapes(32), 2, 0.01)
    for r in rows:
        assert set(r) == RUN_KEYS
        assert (r["kind"], r["method"], r["options"], r["variant"]) == ("run", "gtopk", {"scope": "layer"},
                                                                         "gtopk:scope=layer")
        assert (r["ranks"], r["repeat"], r["steps"], r["ratio"]) == (2, 2, 2, 0.01)
        assert r["steps_per_s"] > 0 and r["seconds"] > 0
        assert all(kind in KINDS for kind, _ in r["collectives"])
        assert [tuple(c) for c in r["collectives"]] == planned
        assert r["bytes_per_step"] == pytest.approx(sum(n for _, n in planned))
        assert r["bytes_per_step"] < 4 * r["params"] / 10  # compressed


def _synthetic_results(path: Path) -> int:
    """A results file as bench_throughput.sh writes it, from known compute and the cost model
    itself, so every prediction is exact except one planted 10 % error (dense, 100mbit, P = 2);
    returns how many shaped rows have modelled communication ≥ 20 % of the step."""
    links = {"local": (20e-6, 1.5e9), "100mbit": (25e-6, 12e6), "1gbit": (20e-6, 118e6)}
    compute = {"gs": 0.12, "none": 0.04, "sketched": 0.13}
    shapes = _lm_shapes(512)
    rows, counted = [], 0
    for rep in (1, 2, 3):
        rows += [{"kind": "pingpong", "label": label, "alpha_s": a * (1 + 0.01 * (rep - 2)), "beta_bytes_per_s": b}
                 for label, (a, b) in links.items()]
        for P in (2, 4):
            for variant, c in compute.items():
                c *= P // 2  # ranks per core
                collectives = variants.planned(variant, {}, shapes, P, 0.001)
                for label, (a, b) in links.items():
                    comm = cost_model.comm_seconds(collectives, P, a, b)
                    counted += rep == 1 and label != "local" and comm / (c + comm) >= cost_model.SHARE
                    slow = 1.1 if (variant, label, P) == ("none", "100mbit", 2) else 1.0
                    rows.append({"kind": "run", "label": label, "repeat": rep, "method": variant, "options": {},
                                 "variant": variant, "ranks": P, "cpu_count": 2, "bytes_per_step": 1.0,
                                 "collectives": [list(x) for x in collectives],
                                 "steps_per_s": (1 + 0.02 * (rep - 2)) / (slow * (c + comm))})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return counted


def test_cost_model_validate(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    counted = _synthetic_results(results)
    out = _run(str(SCRIPTS / "cost_model.py"), "--validate", str(results))
    lines = out.strip().splitlines()
    name, value = lines[-1].split()
    assert name == "max_rel_error" and float(value) == pytest.approx(0.1, abs=1e-3)
    assert lines[-2].startswith(f"max_rel_error over {counted} of 12 shaped predictions")
    assert 0 < counted < 12
    assert "| gs-SGD ÷ it, 100mbit | gs-SGD ÷ it, 1gbit |" in out
    dense = 1 / (0.04 + cost_model.comm_seconds(variants.planned("none", {}, _lm_shapes(512), 2), 2, 20e-6, 1.5e9))
    assert f"| dense | 1 | {dense:.3f} ({0.98 * dense:.3f}–{1.02 * dense:.3f}) |" in out  # median, min–max of 3
    cross = next(line for line in lines if line.startswith("cross-P max_rel_error"))
    assert float(cross.split()[2]) == pytest.approx(0.0, abs=1e-3)  # compute scales by ranks per core exactly


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


def test_bench_wire_counted_and_measured(tmp_path: Path) -> None:
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
