"""scripts/bench/cost_model.py's fit of β per collective algorithm (collective_sweep.sh's rows)
and its use in --validate: a sweep made from known per-kind bandwidths is fitted back, and
training rows slowed to those bandwidths are predicted by the fit but not by the ping-pong."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts" / "bench"
sys.path.insert(0, str(SCRIPTS))

import cost_model  # noqa: E402

from gs_horovod.transports.wire import rounds  # noqa: E402

PINGPONG = {"local": (20e-6, 1.5e9), "100mbit": (20e-6, 12e6)}
BETA = {"allreduce": 7e6, "allgather": 9e6, "gather": 12e6}  # 100mbit: what each kind gets of the link
OVERHEAD = {2: 0.004, 4: 0.009}  # Horovod's per-call time, by rank count


def _sweep_rows() -> list[dict]:
    rows = []
    for label in ("local", "100mbit"):
        for P in (2, 4):
            for kind, beta in BETA.items():
                beta = beta if label == "100mbit" else PINGPONG["local"][1]
                for n in (4 << 10, 512 << 10, 2 << 20, 8 << 20):
                    seconds = OVERHEAD[P] + sum(x / beta for x in rounds(kind, n, P))
                    rows.append({"kind": "collective", "collective": kind, "label": label, "ranks": P, "bytes": n,
                                 "seconds": seconds})
    return rows


def test_fit_recovers_each_kinds_beta(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep.jsonl"
    sweep.write_text("".join(json.dumps(r) + "\n" for r in _sweep_rows()))
    fits = cost_model.fit_collectives(sweep)
    for kind, beta in BETA.items():
        alpha, fitted, worst = fits["100mbit"][kind]
        assert fitted == pytest.approx(beta, rel=1e-9)
        assert worst == pytest.approx(0.0, abs=1e-9)
        smallest = [(OVERHEAD[P] + sum(x / beta for x in rounds(kind, 4 << 10, P))) / len(rounds(kind, 4 << 10, P))
                    for P in (2, 4)]
        assert alpha == pytest.approx(sum(smallest) / 2)  # the median of two: their mean


def test_validate_with_the_fit(tmp_path: Path) -> None:
    """Training rows whose allreduce runs at BETA's rate (not the ping-pong's): --collectives
    predicts them (max_rel_error ≈ 0, holds), the ping-pong alone misses by 12/7 − 1 of comm."""
    sweep, results, verdict = tmp_path / "sweep.jsonl", tmp_path / "results.jsonl", tmp_path / "verdict.json"
    sweep.write_text("".join(json.dumps(r) + "\n" for r in _sweep_rows()))
    rows = [{"kind": "pingpong", "label": label, "alpha_s": a, "beta_bytes_per_s": b}
            for label, (a, b) in PINGPONG.items()]
    collectives = [["allreduce", 7.0e6]]
    for P in (2, 4):
        for label, (a, b) in PINGPONG.items():
            fits = {"allreduce": (a, BETA["allreduce"])} if label == "100mbit" else None
            step = 0.05 + cost_model.comm_seconds([tuple(c) for c in collectives], P, a, b, fits)
            rows.append({"kind": "run", "label": label, "repeat": 1, "variant": "none", "ranks": P, "cpu_count": 2,
                         "bytes_per_step": 7.0e6, "collectives": collectives, "steps_per_s": 1 / step})
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def max_rel_error(*extra: str) -> float:
        out = subprocess.run([sys.executable, str(SCRIPTS / "cost_model.py"), "--validate", str(results), *extra],
                             capture_output=True, text=True, check=True).stdout
        name, value = out.strip().splitlines()[-1].split()
        assert name == "max_rel_error"
        return float(value)

    assert max_rel_error() > 0.3  # the ping-pong's 12 MB/s against 7 MB/s on a step that is nearly all allreduce
    assert max_rel_error("--collectives", str(sweep), "--validation-out", str(verdict)) == pytest.approx(0, abs=1e-3)
    data = json.loads(verdict.read_text())
    assert data["holds"] and data["rows_counted"] == 2
    assert data["fits"]["100mbit"]["allreduce"]["used"] and not data["fits"]["local"]["allreduce"]["used"]
