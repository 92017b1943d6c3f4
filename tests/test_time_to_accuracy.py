"""scripts/bench/bench_time_to_accuracy.py: the time to a target read off hand-made histories
(accuracy and perplexity), and the summary over repeats."""

from __future__ import annotations

import importlib.util

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


def test_summary_counts_the_repeats_that_reached_the_target_and_their_spread():
    rows = [{"workload": "cnn", "ranks": 2, "rate": "1gbit", "method": "gs", "metric": "accuracy",
             "history": [{"seconds": s, "accuracy": a}]} for s, a in ((10.0, 0.95), (14.0, 0.95), (9.0, 0.5))]
    (summary,) = tta.summarise(rows, 0.9)
    assert (summary["repeats"], summary["reached"]) == (3, 2)
    assert summary["mean_seconds"] == 12.0 and summary["std_seconds"] == pytest.approx(2 ** 1.5)


def test_method_flags_go_to_gs_or_to_the_baseline_with_the_ratio_only_where_k_is_chosen():
    assert tta.method_args("gs:exchange=sketch", 0.01)[1] == ["--compression", "gs", "--gs", "exchange=sketch",
                                                             "--ratio", "0.01"]
    assert tta.method_args("powersgd:rank=1", 0.01)[1] == ["--compression", "powersgd", "--opt", "rank=1"]
