"""scripts/bench/bench_time_to_accuracy.py: the time to a target read off hand-made histories
(accuracy and perplexity), the summary over repeats (failed runs counted, never dropped), the
declared targets and their overrides, and the report's blocks made from such rows."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
from conftest import ROOT

spec = importlib.util.spec_from_file_location("tta", ROOT / "scripts/bench/bench_time_to_accuracy.py")
tta = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tta)

ACCURACY = [{"seconds": 10.0, "accuracy": 0.80}, {"seconds": 20.0, "accuracy": 0.90},
            {"seconds": 30.0, "accuracy": 0.96}]


def test_time_to_an_accuracy_is_interpolated_between_the_evaluations_around_it():
    assert tta.time_to_target(ACCURACY, "accuracy", 0.93) == pytest.approx(25.0)  # 0.90 → 0.96 over 20 → 30 s
    assert tta.time_to_target(ACCURACY, "accuracy", 0.90) == 20.0  # reached exactly at an evaluation
    assert tta.time_to_target(ACCURACY, "accuracy", 0.75) == 10.0  # the first evaluation already had it
    assert tta.time_to_target(ACCURACY, "accuracy", 0.97) is None  # never reached


def test_time_to_a_perplexity_counts_lower_as_better():
    history = [{"seconds": 5.0, "perplexity": 40.0}, {"seconds": 15.0, "perplexity": 20.0}]
    assert tta.time_to_target(history, "perplexity", 30.0) == pytest.approx(10.0)
    assert tta.time_to_target(history, "perplexity", 10.0) is None


def row(seconds: float, accuracy: float, **fields) -> dict:
    return {"workload": "cnn", "ranks": 2, "rate": "1gbit", "method": "gs", "metric": "accuracy",
            "history": [{"seconds": seconds, "accuracy": accuracy}], "bytes_per_step": 100.0, **fields}


def test_summary_counts_the_repeats_that_reached_the_target_and_their_spread():
    rows = [row(10.0, 0.95), row(14.0, 0.95), row(9.0, 0.5)]
    (summary,) = tta.summarise(rows, {"cnn": 0.9})
    assert (summary["repeats"], summary["reached"], summary["failed"]) == (3, 2, 0)
    assert summary["mean_seconds"] == 12.0 and summary["std_seconds"] == pytest.approx(2 ** 1.5)


def test_a_failed_run_is_counted_as_failed_and_not_as_slow():
    failed = {k: v for k, v in row(0.0, 0.0).items() if k not in ("history", "bytes_per_step")}
    rows = [row(10.0, 0.95), dict(failed, failed={"returncode": 1, "stderr": "boom"})]
    (summary,) = tta.summarise(rows, {"cnn": 0.9})
    assert (summary["repeats"], summary["reached"], summary["failed"]) == (2, 1, 1)
    assert "| 1/2, 1 failed | 10.0 |" in tta.table([summary])


def test_targets_are_the_declared_ones_unless_overridden():
    assert tta.targets_of([]) == {name: spec[3] for name, spec in tta.WORKLOADS.items()}
    assert tta.targets_of(["cnn=0.9"])["cnn"] == 0.9
    with pytest.raises(SystemExit, match="WORKLOAD=VALUE"):
        tta.targets_of(["resnet=0.9"])


def test_report_blocks_read_the_seconds_and_the_fastest_method_off_the_runs(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts" / "bench"))
    import report

    target = tta.WORKLOADS["cnn"][3]
    rows = [row(10.0, target + 0.01), row(12.0, target + 0.01), row(5.0, target + 0.01, method="fp16"),
            row(6.0, target - 0.1, method="fp16"), row(30.0, target + 0.01, method="gs:exchange=sketch")]
    (tmp_path / "time_to_accuracy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert report.generator("tta.cnn.2.1gbit.gs")(tmp_path) == "11.0 ± 1.4 s"
    assert report.generator("tta.cnn.2.1gbit.fp16")(tmp_path) == "5.0 s (1/2 reached it)"
    assert report.generator("tta.cnn.2.1gbit.gs-exchange-sketch")(tmp_path) == "30.0 s"
    # fp16 was faster once but missed the target in its other repeat: the fastest of those that always reached it
    assert report.generator("tta_fastest.cnn.2.1gbit")(tmp_path) == "gs (11.0 ± 1.4 s)"
    verdict = report.generator("time_to_accuracy.verdicts")(tmp_path).splitlines()[-1]
    assert verdict == "| cnn | 2 | 1gbit | gs: 11.0 ± 1.4 s | 11.0 ± 1.4 s | 1.00 | 30.0 s |"
    assert report.generator("time_to_accuracy.defaults")(tmp_path) == (
        "the defaults were the fastest in 1 of 1 settings, within 1.2× of the fastest in 1, "
        "and missed the target in some repeat in 0")


def test_method_flags_go_to_gs_or_to_the_baseline_with_the_ratio_only_where_k_is_chosen():
    assert tta.method_args("gs:exchange=sketch", 0.01)[1] == ["--compression", "gs", "--gs", "exchange=sketch",
                                                             "--ratio", "0.01"]
    assert tta.method_args("powersgd:rank=1", 0.01)[1] == ["--compression", "powersgd", "--opt", "rank=1"]
    assert tta.method_args("gs", 0.01)[1] == ["--compression", "gs"], "the defaults got a ratio"
    assert tta.method_args("gs:ratio=0.01", 0.02)[1] == ["--compression", "gs", "--gs", "ratio=0.01"]
    assert tta.method_args("topk", 0.02)[1] == ["--compression", "topk", "--ratio", "0.02"]
    assert tta.method_args("gs:ramp=24", 0.01)[1] == ["--compression", "gs", "--gs", "ramp=24"], \
        "a variant of the defaults' measured density got a ratio"
    assert tta.method_args("gs:critical=0.5,budget=0.2", 0.01)[1][-1] == "budget=0.2"


def test_a_warmup_run_is_kept_on_record_but_never_counted(tmp_path, capsys):
    """A warm-up row shares its setting, seed and run id with the counted run, and comes last:
    the latest-run rule would pick it; read_rows drops it first, so no repeat is reported."""
    target = tta.WORKLOADS["cnn"][3]
    counted = row(10.0, target + 0.01, seed=0, repeat=0, run_id="r1")
    rows = [counted, {**row(99.0, target + 0.01, seed=0, repeat=0, run_id="r1"), "warmup": True}]
    path = tmp_path / "tta.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert tta.read_rows(path) == [counted]
    assert capsys.readouterr().err == ""
    assert tta.summarise(tta.read_rows(path), tta.targets_of([]))[0]["mean_seconds"] == 10.0
