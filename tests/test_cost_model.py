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

from gs_horovod.transports.collective_cost import rounds  # noqa: E402

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


def ring_allreduce_seconds(n: float, P: int, alpha: float, beta: float) -> float:
    """By hand, from gs_horovod/transports/collective_cost.py's definitions: a ring allreduce of n bytes a
    rank is 2(P−1) rounds of n/P bytes, and the cost model charges α + bytes/β a round."""
    return 2 * (P - 1) * (alpha + n / P / beta)


def test_comm_seconds_is_alpha_plus_bytes_over_beta_per_round() -> None:
    """cost_model.comm_seconds against collective_cost.py's rounds written out by hand for each kind, at
    the ping-pong's (α, β) and, for the kinds ``fits`` names, at theirs."""
    a, b, n = 20e-6, 12e6, 3.0e6
    assert cost_model.comm_seconds([("allreduce", n)], 4, a, b) == pytest.approx(6 * (a + n / 4 / b), rel=1e-12)
    assert cost_model.comm_seconds([("allreduce", n)], 4, a, b) == pytest.approx(ring_allreduce_seconds(n, 4, a, b))
    by_hand = {  # P = 5: ⌈log2 5⌉ = 3
        "tree": 3 * (a + n / b), "allgather": 4 * (a + n / b), "alltoall": 4 * (a + n / 5 / b),
        "pairwise": a + n / b, "gather": a + 4 * n / b, "broadcast": 3 * (a + n / b),
    }
    for kind, seconds in by_hand.items():
        assert cost_model.comm_seconds([(kind, n)], 5, a, b) == pytest.approx(seconds, rel=1e-12), kind
    assert cost_model.comm_seconds([("allreduce", n)], 1, a, b) == 0.0  # one rank: nothing on the wire
    # a step's collectives add up; a fitted kind is priced at its own (α, β), the others at the ping-pong's
    fits = {"allgather": (1e-3, 9e6)}
    step = [("allreduce", n), ("allgather", n / 10)]
    assert cost_model.comm_seconds(step, 4, a, b, fits) == pytest.approx(
        ring_allreduce_seconds(n, 4, a, b) + 3 * (1e-3 + n / 10 / 9e6), rel=1e-12)


@pytest.mark.slow
def test_validate_with_the_fit(tmp_path: Path) -> None:
    """Training rows whose allreduce runs at BETA's rate (not the ping-pong's), their step time
    written by hand (0.05 s of compute + the ring allreduce's rounds): --collectives predicts
    them (max_rel_error ≈ 0, holds); the ping-pong alone (12 MB/s) misses them by the error
    computed here by hand."""
    sweep, results, verdict = tmp_path / "sweep.jsonl", tmp_path / "results.jsonl", tmp_path / "verdict.json"
    sweep.write_text("".join(json.dumps(r) + "\n" for r in _sweep_rows()))
    rows = [{"kind": "pingpong", "label": label, "alpha_s": a, "beta_bytes_per_s": b}
            for label, (a, b) in PINGPONG.items()]
    compute, n = 0.05, 7.0e6
    collectives = [["allreduce", n]]
    measured = {}  # (label, P): seconds a step
    for P in (2, 4):
        for label, (a, b) in PINGPONG.items():
            # the shaped link's allreduce gets BETA's rate, with the ping-pong's α a round
            measured[label, P] = compute + ring_allreduce_seconds(n, P, a, BETA["allreduce"] if label == "100mbit"
                                                                   else b)
            rows.append({"kind": "run", "label": label, "repeat": 1, "variant": "none", "ranks": P, "cpu_count": 2,
                         "bytes_per_step": n, "collectives": collectives, "steps_per_s": 1 / measured[label, P]})
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def max_rel_error(*extra: str) -> float:
        out = subprocess.run([sys.executable, str(SCRIPTS / "cost_model.py"), "--validate", str(results), *extra],
                             capture_output=True, text=True, check=True).stdout
        name, value = out.strip().splitlines()[-1].split()
        assert name == "max_rel_error"
        return float(value)

    # the ping-pong alone: compute calibrated on the local rows (their comm at 1.5 GB/s), the
    # shaped rows predicted at 12 MB/s; relative error of steps/s = measured s / predicted s − 1
    a, b = PINGPONG["local"]
    calibrated = {P: measured["local", P] - ring_allreduce_seconds(n, P, a, b) for P in (2, 4)}
    a, b = PINGPONG["100mbit"]
    expected = max(measured["100mbit", P] / (calibrated[P] + ring_allreduce_seconds(n, P, a, b)) - 1 for P in (2, 4))
    assert expected > 0.6  # (a step nearly all allreduce, 12/7 the rate: a large miss)
    assert max_rel_error() == pytest.approx(expected, abs=1e-3)  # printed to 3 decimals
    assert max_rel_error("--collectives", str(sweep), "--validation-out", str(verdict)) == pytest.approx(0, abs=1e-3)
    data = json.loads(verdict.read_text())
    assert data["holds"] and data["rows_counted"] == 2
    assert data["fits"]["100mbit"]["allreduce"]["used"] and not data["fits"]["local"]["allreduce"]["used"]
    assert data["fits"]["100mbit"]["allreduce"]["beta_bytes_per_s"] == pytest.approx(BETA["allreduce"], rel=1e-9)
