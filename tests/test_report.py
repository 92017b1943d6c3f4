"""``scripts/bench/report.py``: the docs' generated blocks match their data files, a changed data
file makes ``--check`` fail until the blocks are rewritten, appended runs that repeat a setting
and seed count once (the latest run) and the report says which it used; and
``bench_convergence.gs_vs_best`` picks and interpolates on hand-made curves."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts" / "bench"))

import bench_convergence as conv  # noqa: E402
import report  # noqa: E402


def test_docs_match_their_data(capsys: pytest.CaptureFixture[str]) -> None:
    """Every generated block in docs/benchmarks.md, docs/design.md and README.md is what its data
    file gives, and every block name has a generator."""
    assert report.main(["--check"]) == 0, capsys.readouterr().out
    text = "".join((ROOT / f).read_text() for f in report.FILES if (ROOT / f).exists())
    assert len(report.MARKER.findall(text)) >= 30


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A copy of the docs and the README to change data in."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    return tmp_path


def test_a_changed_data_file_fails_the_check(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One seed's final accuracy changed in docs/convergence_cnn_sim4.json: ``--check`` exits 1
    and names the blocks made from it (the table and the gs_vs_best lines); a rewrite brings the
    new figure into the doc and the check passes again."""
    data = copy / "docs" / "convergence_cnn_sim4.json"
    runs = json.loads(data.read_text())
    runs["gs @ 0.001"]["0"]["history"][-1]["accuracy"] = 0.25
    data.write_text(json.dumps(runs))
    assert report.main(["--check", "--root", str(copy)]) == 1
    out = capsys.readouterr().out
    assert "block 'cnn_sim4.table' differs" in out and "block 'cnn_sim4.gs_vs_best' differs" in out
    assert "block 'cnn.table'" not in out
    assert report.main(["--root", str(copy)]) == 0
    assert report.main(["--check", "--root", str(copy)]) == 0
    mean = (0.25 + sum(r["history"][-1]["accuracy"] for s, r in runs["gs @ 0.001"].items() if s != "0")) / 3
    assert f"| gs @ 0.001 | 3 | {mean:.4f}" in (copy / "docs" / "design.md").read_text()


def test_a_block_without_a_generator_or_data_is_an_error(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    design = copy / "docs" / "design.md"
    design.write_text(design.read_text() + "\n<!-- report:no.such.block -->x<!-- /report:no.such.block -->\n")
    (copy / "docs" / "projection.json").unlink()
    assert report.main(["--check", "--root", str(copy)]) == 1
    out = capsys.readouterr().out
    assert "block 'no.such.block' has no generator" in out
    assert "block 'projection.table': FileNotFoundError" in out


def tta_row(method: str, seed: int, seconds: float, **fields: object) -> dict:
    """A bench_time_to_accuracy.py row (the CNN, P = 2, 1 Gbit/s) that reached its target at ``seconds``."""
    return {"workload": "cnn", "ranks": 2, "rate": "1gbit", "method": method, "repeat": seed, "seed": seed,
            "metric": "accuracy", "history": [{"seconds": seconds, "accuracy": 0.99}], "bytes_per_step": 100.0,
            **fields}


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_time_to_accuracy_takes_the_latest_run_of_a_setting_and_seed(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Two appended runs of gs seed 0: the later run id is used though its row comes first, and
    stderr names it and the one dropped; a row without run_id is older than any with one (topk
    seed 0), and of two without, the later line is used (topk seed 1). One repeat per seed."""
    old, new = "20250101T000000Z-aaaaaa", "20250301T000000Z-bbbbbb"
    write_jsonl(tmp_path / "time_to_accuracy.jsonl", [
        tta_row("gs", 0, 20.0, run_id=new), tta_row("gs", 0, 10.0, run_id=old), tta_row("gs", 1, 30.0, run_id=old),
        tta_row("topk", 0, 7.0, run_id=old), tta_row("topk", 0, 3.0),
        tta_row("topk", 1, 100.0), tta_row("topk", 1, 9.0)])
    assert report.generator("tta.cnn.2.1gbit.gs")(tmp_path) == "25.0 ± 7.1 s"  # seeds 0 (20 s) and 1 (30 s)
    assert report.generator("tta.cnn.2.1gbit.topk")(tmp_path) == "8.0 ± 1.4 s"  # 7 s and 9 s
    assert "| cnn (accuracy 0.93) | 2 | 1gbit | gs | 100 | 2/2 | 25.0 ± 7.1 |" in report.generator(
        "time_to_accuracy")(tmp_path)
    err = capsys.readouterr().err
    data = tmp_path / "time_to_accuracy.jsonl"
    assert (f"2 runs of cnn P=2 1gbit gs seed 0: using the latest, run {new} ({data}:1); "
            f"dropping run {old} ({data}:2)") in err
    assert f"2 runs of cnn P=2 1gbit topk seed 0: using the latest, run {old} ({data}:4); dropping {data}:5" in err
    assert f"topk seed 1: using the latest, {data}:7 (no run_id); dropping {data}:6 (no run_id)" in err
    assert "gs seed 1" not in err


def test_recovery_figures_take_the_latest_run_of_a_setting_and_seed(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """docs/recovery_sparse.jsonl with gTop-k (global) at P = 16 run twice (bench_recovery.py
    --append): the figure is the later run's, and stderr says so; P = 4's single run is as it was."""
    def gtopk(P: int, mass: float, **fields: object) -> dict:
        return {"task": "digits MLP 1.28M", "P": P, "ratio": 0.001, "steps": 20, "method": "gTop-k (global)",
                "scope": "global", "mass": mass, "mass_steps": [mass], "loss": [2.0], "wire": 1000.0 * P,
                "payload": 500.0, "seconds": 1.0, **fields}

    write_jsonl(tmp_path / "recovery_sparse.jsonl", [
        gtopk(16, 0.5, run_id="20250101T000000Z-aaaaaa", code="abc1234"), gtopk(4, 0.9),
        gtopk(16, 0.75, run_id="20250102T000000Z-bbbbbb", code="def5678")])
    assert report.generator("rs.mass.16.gtopk")(tmp_path) == "0.750"
    assert report.generator("rs.kb.16.gtopk")(tmp_path) == "16.0"
    assert report.generator("rs.mass.4.gtopk")(tmp_path) == "0.900"
    err = capsys.readouterr().err
    assert ("2 runs of digits MLP 1.28M P=16 ratio=0.001 seed 0 gTop-k (global): using the latest, "
            "run 20250102T000000Z-bbbbbb") in err
    assert "dropping run 20250101T000000Z-aaaaaa" in err and "P=4" not in err


def run(wire_per_step: float, values: list[float], metric: str = "accuracy", steps: int = 10) -> dict:
    """One run's record as the training scripts write it: an evaluation every ``steps`` steps,
    ``wire_per_step`` bytes a step, so evaluation i has sent (i + 1)·steps·wire_per_step bytes."""
    return {"history": [{"epoch": i + 1, "steps": steps, "wire_bytes_per_step": wire_per_step, metric: v}
                        for i, v in enumerate(values)]}


def test_gs_vs_best_interpolates_at_gs_budget_and_reports_every_peer() -> None:
    """gs sends 1 and 2 MB (its budget: 2 MB). gTop-k sends 1.5 and 3 MB: interpolated at 2 MB,
    0.4 + (0.5 / 1.5)·0.3 = 0.5 (its last evaluation within, 0.4, would understate it); two
    seeds average. PowerSGD sends 0.5 and 1 MB: stopped short, its last evaluation 0.58 at 1 MB.
    top-k allgather's first evaluation sends 3 MB: reported as starting beyond, not picked,
    though its accuracy is the highest. The pick is PowerSGD (0.58 > 0.5)."""
    runs = {
        "dense @ 1": {"0": run(1e6, [0.99, 0.99])},
        "gs @ 0.001": {"0": run(1e5, [0.5, 0.6])},
        "gtopk @ 0.001": {"0": run(1.5e5, [0.4, 0.7]), "1": run(1.5e5, [0.3, 0.9])},
        "powersgd r1 @ 1": {"0": run(5e4, [0.55, 0.58])},
        "topk @ 0.001": {"0": run(3e5, [0.9, 0.95])},
        "gtopk @ 0.01": {"0": run(1e4, [0.99, 0.99])},  # another k: not a peer
    }
    x, y, peer, peers = conv.gs_vs_best(runs, "accuracy", 0.001)
    assert set(peers) == {"gtopk @ 0.001", "powersgd r1 @ 1", "topk @ 0.001"}
    gtopk = peers["gtopk @ 0.001"]
    assert gtopk.status == "interpolated" and gtopk.mb == pytest.approx(2.0)
    assert gtopk.value == pytest.approx(((0.4 + 0.1) + (0.3 + 0.2)) / 2)
    assert peers["powersgd r1 @ 1"] == conv.AtBudget("stopped short", 0.58, pytest.approx(1.0))
    assert peers["topk @ 0.001"].status == "starts beyond" and peers["topk @ 0.001"].mb == pytest.approx(3.0)
    assert "first evaluation at 3 MB" in peers["topk @ 0.001"].text()
    assert peer == "powersgd r1 @ 1"
    assert x == pytest.approx(0.6 / 0.58) and y == pytest.approx(2.0)


def test_gs_vs_best_perplexity_picks_the_lowest_and_refuses_when_no_peer_reaches_the_budget() -> None:
    runs = {"gs @ 0.01": {"0": run(1e5, [50.0, 40.0], "perplexity")},
            "topk @ 0.01": {"0": run(1e5, [30.0, 20.0], "perplexity")},
            "gtopk @ 0.01": {"0": run(2e5, [35.0, 10.0], "perplexity")}}
    x, y, peer, peers = conv.gs_vs_best(runs, "perplexity", 0.01)
    # topk at 2 MB: 20; gtopk at 2 MB: its first evaluation, 35
    assert peer == "topk @ 0.01" and x == pytest.approx(40.0 / 20.0) and y == pytest.approx(1.0)
    assert peers["gtopk @ 0.01"].value == pytest.approx(35.0)
    far = {"gs @ 0.01": runs["gs @ 0.01"], "gtopk @ 0.01": {"0": run(1e6, [35.0, 10.0], "perplexity")}}
    with pytest.raises(ValueError, match="gtopk @ 0.01 n/a"):
        conv.gs_vs_best(far, "perplexity", 0.01)


def test_equal_bytes_takes_the_gs_run_just_below_the_peers_budget() -> None:
    """PowerSGD sends 1 and 2 MB (its budget 2 MB). gs at 0.004 sends 1.9 MB in all (5 % below),
    gs at 0.005 2.05 MB (2.5 % above, nearer): the run below is taken, so PowerSGD is read at
    gs's 1.9 MB, interpolated (0.6 + 0.9·0.2 = 0.78), not at its last evaluation. With only the
    run above, it is taken (PowerSGD stopped short); with none within 10 %, no figure."""
    peer = {"0": run(1e5, [0.6, 0.8])}
    runs = {"powersgd r1 @ 1": peer, "gs @ 0.004": {"0": run(9.5e4, [0.5, 0.7])},
            "gs @ 0.005": {"0": run(1.025e5, [0.55, 0.9])}}
    ratio, own, last, sent, got = report.matched_gs(runs, "accuracy", "powersgd r1 @ 1")
    assert (ratio, own, last, sent) == (0.004, pytest.approx(2.0), 0.7, pytest.approx(1.9))
    assert got.status == "interpolated" and got.value == pytest.approx(0.78)
    above = {"powersgd r1 @ 1": peer, "gs @ 0.005": runs["gs @ 0.005"]}
    ratio, _, _, _, got = report.matched_gs(above, "accuracy", "powersgd r1 @ 1")
    assert ratio == 0.005 and got.status == "stopped short" and got.value == pytest.approx(0.8)
    far = {"powersgd r1 @ 1": peer, "gs @ 0.01": {"0": run(1.5e5, [0.7, 0.95])}}
    assert not report.matched(*report.matched_gs(far, "accuracy", "powersgd r1 @ 1")[1:4:2])
    # a gs variant is matched among its own runs only: "gs compact8 @ 0.006" (1.96 MB) though
    # the defaults' run at 0.004 lies in the band too
    both = {**runs, "gs compact8 @ 0.006": {"0": run(9.8e4, [0.6, 0.75])}}
    assert report.matched_gs(both, "accuracy", "powersgd r1 @ 1")[0] == 0.004
    ratio, _, last, sent, _ = report.matched_gs(both, "accuracy", "powersgd r1 @ 1", "gs compact8")
    assert (ratio, last, sent) == (0.006, 0.75, pytest.approx(1.96))


def pilot_row(workload: str, ranks: int, rate: str, method: str, seconds: float | None, seed: int = 0,
              bytes_per_step: float = 1000.0) -> dict:
    """A docs/tta_density_pilot.jsonl row whose target (cnn 0.93, lm perplexity 20) is reached at
    ``seconds`` (None: never)."""
    metric, good, bad = ("accuracy", 0.95, 0.5) if workload == "cnn" else ("perplexity", 15.0, 40.0)
    history = [{"seconds": seconds or 50.0, metric: good if seconds else bad, "wire_bytes": 10 * bytes_per_step}]
    return {"workload": workload, "ranks": ranks, "rate": rate, "method": method, "repeat": seed, "seed": seed,
            "metric": metric, "history": history, "bytes_per_step": bytes_per_step, "code": "abc1234",
            "run_id": f"r{seed}"}


def test_the_readme_table_and_plot_follow_the_study_then_the_pilot(copy: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A rerun study (two seeds, a CNN and an LM setting) in docs/tta_defaults.jsonl, one unshaped setting in
    docs/tta_unshaped.jsonl and a pilot holding the study's setting and another: ``--check``
    names the README's table and the plot as stale; a rewrite takes the study's setting from the
    study (not the pilot's row of it) and the other from the pilot, with each file's repeats and
    code version, in order of link speed (unshaped last), the fastest of every method, the new
    ranges in the when-to-use lines (every link but the slowest against FP16), the LM's steps
    over dense's from the study and a new stamp in the PNG; the unshaped file's own verdict reads
    it; the check passes again."""
    study = []
    for seed in (0, 1):
        study += [pilot_row("cnn", 8, "100mbit", "gs", 10.0 + seed, seed, 2e5),
                  pilot_row("cnn", 8, "100mbit", "fp16", 30.0, seed, 1.6e6),
                  pilot_row("cnn", 8, "100mbit", "none", 40.0 + 2 * seed, seed, 3.3e6),
                  pilot_row("cnn", 8, "100mbit", "powersgd:rank=1", None, seed, 2e4),
                  pilot_row("cnn", 8, "100mbit", "topk", 9.0, seed, 3e4)]
    for seed in (0, 1):  # the LM: the defaults at their 2nd evaluation (20 steps), dense at its 1st
        lm_gs = pilot_row("lm", 2, "100mbit", "gs", 20.0, seed)
        lm_gs["history"] = [{"seconds": 10.0, "perplexity": 40.0, "wire_bytes": 1e4},
                            {"seconds": 20.0, "perplexity": 20.0, "wire_bytes": 2e4}]
        study += [lm_gs, pilot_row("lm", 2, "100mbit", "none", 40.0, seed)]
        study[-1]["history"][0]["perplexity"] = 20.0
    pilot = [{**r, "code": "def5678"} for r in (
        pilot_row("cnn", 8, "100mbit", "gs", 99.0, 0, 2e5),
        pilot_row("cnn", 8, "10gbit", "gs", 6.0, 0, 1.6e6),
        pilot_row("cnn", 8, "10gbit", "fp16", 4.0, 0, 1.6e6),
        pilot_row("cnn", 8, "10gbit", "none", 5.0, 0, 3.3e6),
        pilot_row("cnn", 8, "10gbit", "powersgd:rank=1", 3.0, 0, 2e4))]
    unshaped = [{**pilot_row("cnn", 8, "local", method, seconds, seed, 1.6e6), "code": "fed9876"}
                for seed in (0, 1) for method, seconds in (("gs", 3.0), ("fp16", 2.0), ("none", 4.0))]
    write_jsonl(copy / "docs" / "tta_defaults.jsonl", study)
    write_jsonl(copy / "docs" / "tta_unshaped.jsonl", unshaped)
    write_jsonl(copy / "docs" / "tta_density_pilot.jsonl", pilot)
    png = copy / "docs" / "tta_defaults.png"
    before = report.png_stamp(png)
    assert report.main(["--check", "--root", str(copy)]) == 1
    out = capsys.readouterr().out
    assert "README.md: block 'readme.results' differs" in out
    assert "docs/tta_defaults.png: the plot differs from what its data gives" in out
    assert report.main(["--root", str(copy)]) == 0
    assert report.main(["--check", "--root", str(copy)]) == 0
    readme = (copy / "README.md").read_text()
    assert ("| cnn (accuracy 0.93) | 8 | 100 Mbit/s | **10.5 s**, 200 kB | 30.0 s, 1,600 kB | not reached, 20 kB "
            "| 41.0 s, 3,300 kB | topk, 9.0 s |") in readme
    assert ("| cnn (accuracy 0.93) | 8 | 10 Gbit/s | 6.0 s, 1,600 kB | 4.0 s, 1,600 kB | **3.0 s**, 20 kB "
            "| 5.0 s, 3,300 kB | powersgd:rank=1, 3.0 s |") in readme
    unshaped_row = ("| cnn (accuracy 0.93) | 8 | unshaped | 3.0 s, 1,600 kB | **2.0 s**, 1,600 kB | — "
                    "| 4.0 s, 1,600 kB | fp16, 2.0 s |")
    assert readme.index("| 8 | 100 Mbit/s |") < readme.index("| 8 | 10 Gbit/s |") < readme.index(unshaped_row)
    assert ("cnn at P = 8: 2 repeats (seeds 0, 1), code abc1234 (docs/tta_defaults.jsonl); "
            "cnn at P = 8: 2 repeats (seeds 0, 1), code fed9876 (docs/tta_unshaped.jsonl); "
            "cnn at P = 8: 1 repeat (seed 0), code def5678 (docs/tta_density_pilot.jsonl)") in readme
    assert f"{10.5 / 41:.2f}–0.50× dense's seconds to the target on 100 Mbit/s (2 settings)" in readme
    assert "the LM reached perplexity 20 in a mean of 2.00× (2 ranks; seeds 2.00–2.00×) dense's steps" in readme
    assert ("1.50× FP16's seconds to the target on 10 Gbit/s (1 setting) and 1.50× FP16's seconds to the "
            "target on unshaped (1 setting)") in readme
    assert report.generator("tta_unshaped.goal")(copy / "docs").startswith(
        "the defaults were the fastest in 0 of 1 settings and within 1.05× of the fastest in 0")
    assert ("PowerSGD rank 1 reached the target first in 1 of the 1 settings where both reached it "
            "(it missed the target in 1)") in readme
    assert report.png_stamp(png) not in (None, before)


def test_a_missing_or_unstamped_plot_fails_the_check(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The plot deleted: ``--check`` names it missing; a PNG without the data stamp (drawn by hand,
    or by another tool) is named stale; a rewrite restores it."""
    png = copy / "docs" / "tta_defaults.png"
    png.unlink()
    assert report.main(["--check", "--root", str(copy)]) == 1
    assert "docs/tta_defaults.png: missing" in capsys.readouterr().out
    from PIL import Image

    Image.new("RGB", (4, 4)).save(png)
    assert report.main(["--check", "--root", str(copy)]) == 1
    assert "docs/tta_defaults.png: the plot differs from what its data gives" in capsys.readouterr().out
    assert report.main(["--root", str(copy)]) == 0
    assert report.main(["--check", "--root", str(copy)]) == 0


def test_a_figure_refuses_seeds_of_different_wire_formats(tmp_path: Path) -> None:
    """A convergence entry whose seeds ran with different pair formats (one recorded "compact",
    one from before records said) is refused by name; alike, it is read; so is a time-to-accuracy
    method whose repeats differ."""
    def run(wire: str | None) -> dict:
        record = {"history": [{"epoch": 1, "steps": 10, "accuracy": 0.9, "wire_bytes_per_step": 1.0,
                               "bytes_per_step": 1.0}], "seconds": 1.0}
        return record if wire is None else {**record, "wire": wire}

    data = tmp_path / "convergence_cnn_ddp2.json"
    data.write_text(json.dumps({"gs @ auto": {"0": run("compact"), "1": run(None)}}))
    with pytest.raises(ValueError, match=r"'gs @ auto' mixes records of wire formats \['compact', 'unrecorded'\]"):
        report.load(tmp_path, "convergence_cnn_ddp2.json")
    data.write_text(json.dumps({"gs @ auto": {"0": run("fp32"), "1": run("fp32")}}))
    assert set(report.load(tmp_path, "convergence_cnn_ddp2.json")["gs @ auto"]) == {"0", "1"}
    rows = [{**tta_row("gs", seed, 10.0), "wire": wire} for seed, wire in ((0, "compact"), (1, "fp32"))]
    with pytest.raises(ValueError, match=r"gs \(cnn, 2 ranks, 1gbit\) mixes records of wire formats"):
        report.tta.summarise(rows, {"cnn": 0.93})


def test_convergence_runs_gs_at_its_default_density_by_itself(capsys: pytest.CaptureFixture[str]) -> None:
    """``--ratios auto`` keys gs's runs "gs @ auto" and passes no --ratio; methods that select k
    by a ratio are refused beside it, named."""
    args = conv.parse_args(["--launcher", "torchrun", "--ratios", "auto"])
    assert args.ratios == ["auto"] and conv.ratio_text(args.ratios[0]) == "auto" and conv.ratio_text(0.001) == "0.001"
    with pytest.raises(SystemExit):
        conv.parse_args(["--simulated-ranks", "4", "--ratios", "auto", "--methods", "gs", "gtopk"])
    assert "--ratios auto is gs's default density; ['gtopk'] select k" in capsys.readouterr().err


def lm_row(method: str, seed: int, points: list[tuple[float, float]]) -> dict:
    """A time-to-accuracy LM row: (cumulative wire bytes, perplexity) at each evaluation (every 10 steps)."""
    return {"workload": "lm", "ranks": 2, "rate": "100mbit", "method": method, "seed": seed, "metric": "perplexity",
            "history": [{"seconds": 1.0 + i, "perplexity": p, "wire_bytes": b} for i, (b, p) in enumerate(points)]}


def test_equal_bytes_compares_two_runs_at_the_smaller_of_their_totals_interpolated_in_bytes() -> None:
    plain = lm_row("gs", 0, [(100, 40.0), (200, 30.0), (300, 20.0)])
    cheap = lm_row("gs:budget=0.1", 0, [(50, 60.0), (150, 30.0), (250, 24.0)])
    assert report.at_bytes(plain, 150) == pytest.approx(35.0)
    assert report.at_bytes(plain, 100) == 40.0 and report.at_bytes(plain, 99) is None
    assert report.at_bytes(plain, 301) is None
    assert report.equal_bytes_ratio(cheap, plain) == pytest.approx(24.0 / 25.0)  # at 250 bytes
    assert report.equal_bytes_ratio(plain, cheap) == pytest.approx(25.0 / 24.0)
    late = lm_row("fp16", 0, [(400, 30.0), (800, 15.0)])
    assert report.equal_bytes_ratio(late, plain) is None, "dense's first evaluation is past the plain run's bytes"


def test_the_steps_table_and_verdict_pair_each_seed_with_the_plain_and_dense_runs(tmp_path: Path) -> None:
    rows = [lm_row("gs", s, [(100, 30.0), (200, 18.0)]) for s in (0, 1)]
    rows += [lm_row("gs:ramp=32", 0, [(120, 25.0), (240, 19.0)]), lm_row("gs:ramp=32", 1, [(120, 31.0), (240, 22.0)])]
    rows += [lm_row("fp16", s, [(500, 22.0), (1000, 15.0)]) for s in (0, 1)]
    path = tmp_path / "tta.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = report.steps_table(path, "fp16", "gs")
    # gs: perplexity 20 at step 10 + 10·(30-20)/(30-18) = 18.33; fp16 at 10 + 10·2/7 = 12.86
    assert "| lm | 2 | 100mbit | gs | 2 of 2 | 18.33 | 1.43 |" in table, table
    # ramp seed 0 at 200 bytes: 25 + (80/120)·(19-25) = 21 against gs's 18; seed 1: 31 - 6 = 25
    assert "| 1.28 [1.167, 1.389] |" in table, table
    verdict = report.options_verdict(path, "fp16", "gs")
    assert "| gs:ramp=32 | 0 of 2 |" in verdict and "fp16" not in verdict, verdict


def test_the_study_at_the_defaults_counts_fastest_near_and_missed_and_steps_over_dense(tmp_path: Path) -> None:
    """docs/tta_defaults.jsonl's verdict: one setting where the defaults are the fastest, one
    where they are 4 % behind top-k (within 1.05×), one where a repeat missed the target; the
    ratio to FP16 per link; the LM's steps over dense's paired by seed (the defaults at the 2nd
    and the 3rd evaluation, 20 and 30 steps, dense at the 1st in both: 2 and 3, mean 2.50, where
    the ratio of the mean steps would be 2.50 too but a mean over unpaired seeds of 1.5 or 3)."""
    rows = []
    for seed in (0, 1):
        gs = pilot_row("lm", 2, "100mbit", "gs", 10.0, seed)
        gs["history"] = [{"seconds": 4.0 + i, "perplexity": 40.0} for i in range(1 + seed)] + [
            {"seconds": 10.0, "perplexity": 20.0}]  # the target exactly: no interpolation
        rows += [gs, pilot_row("lm", 2, "100mbit", "fp16", 20.0, seed),
                 pilot_row("lm", 2, "100mbit", "none", 40.0, seed),
                 pilot_row("lm", 2, "1gbit", "gs", 10.4, seed), pilot_row("lm", 2, "1gbit", "topk", 10.0, seed),
                 pilot_row("lm", 2, "1gbit", "fp16", 13.0, seed),
                 pilot_row("lm", 4, "1gbit", "gs", None if seed else 5.0, seed),
                 pilot_row("lm", 4, "1gbit", "fp16", 6.0, seed)]
    write_jsonl(tmp_path / "tta_defaults.jsonl", rows)
    assert report.generator("tta_defaults.goal")(tmp_path) == (
        "the defaults were the fastest in 1 of 3 settings and within 1.05× of the fastest in 2 (counting "
        "those where they were the fastest); they missed the target in some repeat in 1; "
        "100 Mbit/s 0.50× FP16's seconds; 1 Gbit/s 0.80× FP16's seconds")
    verdicts = report.generator("tta_defaults.verdicts")(tmp_path).splitlines()
    assert verdicts[2] == "| lm | 2 | 100 Mbit/s | gs: 10.0 ± 0.0 s | 10.0 ± 0.0 s | 1.00 | 0.50 | 2.50 |"
    assert verdicts[3] == "| lm | 2 | 1 Gbit/s | topk: 10.0 ± 0.0 s | 10.4 ± 0.0 s | 1.04 | 0.80 | — |"
    assert verdicts[4].startswith("| lm | 4 | 1 Gbit/s | fp16: 6.0 ± 0.0 s | 5.0 s (1/2 reached it) | — | — |")
    rows.append(pilot_row("lm", 2, "100mbit", "topk", 1.0, 0))  # a method with one repeat of two
    write_jsonl(tmp_path / "tta_defaults.jsonl", rows)
    assert "| lm | 2 | 100 Mbit/s | incomplete: 1–2 repeats a method |" in report.generator("tta_defaults.verdicts")(
        tmp_path)
    assert report.generator("tta_defaults.goal")(tmp_path).startswith("the defaults were the fastest in 0 of 2")
    assert report.generator("tta_defaults.goal")(tmp_path).endswith("1 incomplete setting(s) left out")


def test_stretches_between_evaluations_split_sparse_from_dense_against_fp16(tmp_path: Path) -> None:
    """Two evaluations a run: the defaults' first stretch as dense as FP16's (its bytes) and 10 %
    slower, their second with fewer bytes (a sparse step) and twice FP16's seconds; the file's
    ratios to FP16 (to the target, reached at the second evaluation; the whole run; the dense
    stretches)."""
    def run(method: str, seed: int, seconds: tuple[float, float], sent: tuple[float, float]) -> dict:
        r = pilot_row("lm", 2, "1gbit", method, 1.0, seed)
        r["history"] = [{"seconds": seconds[0], "perplexity": 30.0, "wire_bytes": sent[0]},
                        {"seconds": seconds[1], "perplexity": 20.0, "wire_bytes": sent[1]}]
        return r

    rows = []
    for seed in (0, 1):
        rows += [run("gs", seed, (11.0, 31.0), (100.0, 150.0)), run("fp16", seed, (10.0, 20.0), (100.0, 200.0))]
    write_jsonl(tmp_path / "tta_dense_path.jsonl", rows)
    table = report.segments_table(tmp_path / "tta_dense_path.jsonl").splitlines()
    assert table[2] == "| lm | 2 | 1 Gbit/s | 2 of 4 | 2.00 | 1.10 |"
    to_target, whole, dense = report.over_fp16(tmp_path / "tta_dense_path.jsonl")[("lm", 2, "1gbit")]
    assert (round(to_target, 4), round(whole, 4), round(dense, 4)) == (1.55, 1.55, 1.1)


def test_the_first_stretch_table_sets_the_start_of_a_run_apart_from_the_rest(tmp_path: Path) -> None:
    """Three evaluations a run: the defaults' first stretch sparse (fewer bytes) and 1.5× FP16's
    seconds, the later ones as FP16's; the defaults held dense 1.2× FP16's at first. Each method's
    first, later and to-target ratios over FP16 and where its sparse steps were."""
    def run(method: str, seed: int, seconds: tuple[float, ...], sent: tuple[float, ...]) -> dict:
        r = pilot_row("lm", 4, "1gbit", method, 1.0, seed)
        r["history"] = [{"seconds": t, "perplexity": p, "wire_bytes": b}
                        for t, p, b in zip(seconds, (30.0, 20.0, 15.0), sent)]
        return r

    rows = []
    for seed in (0, 1):
        rows += [run("gs", seed, (15.0, 25.0, 35.0), (50.0, 150.0, 250.0)),
                 run("gs:budget=1000000", seed, (12.0, 22.0, 32.0), (100.0, 200.0, 300.0)),
                 run("fp16", seed, (10.0, 20.0, 30.0), (100.0, 200.0, 300.0))]
    write_jsonl(tmp_path / report.FIRST_STRETCH, rows)
    table = report.tta_first_stretch_table(tmp_path).splitlines()
    assert table[2:] == ["| lm | 4 | 1 Gbit/s | gs | 1.50 | 1.00 | 1.25 | 2 of 2, 0 of 4 |",
                         "| lm | 4 | 1 Gbit/s | gs:budget=1000000 | 1.20 | 1.00 | 1.10 | 0 of 2, 0 of 4 |"]
    assert report.tta_first_stretch_held(tmp_path) == ("held at their dense level the defaults took 1.10× FP16's "
                                                       "seconds to the target, as shipped 1.25× (lm at 4 ranks on "
                                                       "1 Gbit/s)")


def test_the_final_table_gives_each_seeds_last_metric_and_the_bytes_at_both_ends(tmp_path: Path) -> None:
    """Two seeds of two evaluations each: the last accuracy's mean and each seed's, and the mean
    wire MB at the first evaluation and at the end."""
    rows = []
    for seed, last in ((0, 0.5), (1, 0.7)):
        r = pilot_row("cnn", 16, "100mbit modelled", "gs", None, seed)
        r["history"] = [{"seconds": 1.0, "accuracy": 0.3, "wire_bytes": 1e6 * (1 + seed)},
                        {"seconds": 2.0, "accuracy": last, "wire_bytes": 3e6}]
        rows.append(r)
    write_jsonl(tmp_path / "sim.jsonl", rows)
    assert report.final_table(tmp_path / "sim.jsonl").splitlines()[2] == \
        "| cnn | 16 | 100mbit modelled | gs | 0.600 [0.500, 0.700] | 1.5 | 3.0 |"


def test_the_cnns_steps_over_dense_count_epochs_interpolated_between_evaluations() -> None:
    """The CNN evaluates once an epoch, whose steps depend on P: its steps to the target are
    compared in epochs (the same schedule for both runs). The defaults reach 0.93 a quarter of
    the way from epoch 1 (0.90) to epoch 2 (1.02): 1.25 epochs, against dense's 1 (its first
    evaluation already at it); an LM row keeps its 10 steps an evaluation."""
    def cnn(method: str, accuracies: list[float]) -> dict:
        row = pilot_row("cnn", 4, "1gbit", method, 1.0)
        row["history"] = [{"seconds": 5.0 * (i + 1), "accuracy": a, "wire_bytes": 1.0}
                          for i, a in enumerate(accuracies)]
        return row

    gs, dense = cnn("gs", [0.90, 1.02, 0.97]), cnn("none", [0.95, 0.97, 0.98])
    assert report.steps_to_target(gs) is None, "a CNN row has no steps an evaluation of its own"
    assert report.steps_to_target(gs, 1) == pytest.approx(1.25)
    assert report.steps_over_dense({0: gs}, {0: dense}) == {0: pytest.approx(1.25)}
    assert report.steps_over_dense({0: cnn("gs", [0.5, 0.6])}, {0: dense}) == {0: None}
    lm = lm_row("gs", 0, [(100, 30.0), (200, 18.0)])
    assert report.steps_to_target(lm) == pytest.approx(10 + 10 * 10 / 12)


def test_the_engine_rerun_sets_each_pair_beside_the_studys(tmp_path: Path) -> None:
    """docs/tta_engine.jsonl's table: per setting the defaults over the one other method it ran,
    the study's line (its code) first; a setting the study lacks has the rerun's line alone."""
    study = [pilot_row("cnn", 2, "100mbit", "gs", 10.0), pilot_row("cnn", 2, "100mbit", "topk", 8.0),
             pilot_row("cnn", 2, "100mbit", "fp16", 30.0)]
    rerun = [dict(pilot_row("cnn", 2, "100mbit", "gs", 7.5), code="new5678"),
             dict(pilot_row("cnn", 2, "100mbit", "topk", 7.5), code="new5678"),
             dict(pilot_row("lm", 2, "1gbit", "gs", 6.0), code="new5678"),
             dict(pilot_row("lm", 2, "1gbit", "fp16", None), code="new5678")]
    write_jsonl(tmp_path / "tta_defaults.jsonl", study)
    write_jsonl(tmp_path / "tta_engine.jsonl", rerun)
    lines = report.generator("tta_engine.compare")(tmp_path).splitlines()
    assert lines[2:] == [
        "| cnn | 2 | 100 Mbit/s | abc1234 | 10.0 s | topk: 8.0 s | 1.25 |",
        "| cnn | 2 | 100 Mbit/s | new5678 | 7.5 s | topk: 7.5 s | 1.00 |",
        "| lm | 2 | 1 Gbit/s | new5678 | 6.0 s | fp16: not reached (0/1) | — |"]


def test_the_dense_path_table_names_each_settings_own_code(tmp_path: Path) -> None:
    """A study whose settings ran at different codes: each line of the dense-path table names the
    code of its own setting's rows, not every code in the file."""
    def run(workload: str, method: str, seconds: float, code: str) -> dict:
        return dict(pilot_row(workload, 2, "1gbit", method, seconds), code=code)

    study = [run("lm", "gs", 11.0, "aaa1111"), run("lm", "fp16", 10.0, "aaa1111"),
             run("cnn", "gs", 9.0, "bbb2222"), run("cnn", "fp16", 9.0, "bbb2222")]
    write_jsonl(tmp_path / "tta_defaults.jsonl", study)
    rerun = [run("lm", "gs", 10.0, "ccc3333"), run("lm", "fp16", 10.0, "ccc3333")]
    write_jsonl(tmp_path / "tta_dense_path.jsonl", rerun)
    means = [run("cnn", "gs", 8.0, "ddd4444"), run("cnn", "fp16", 8.0, "ddd4444")]
    write_jsonl(tmp_path / "tta_dense_means.jsonl", means)
    lines = report.generator("tta_dense_path.compare")(tmp_path).splitlines()
    assert [line.split(" | ")[3] for line in lines[2:]] == ["aaa1111", "ccc3333", "bbb2222", "ddd4444"], lines
    assert report.codes_of([{"code": "b"}, {"code": "a"}, {}]) == "a, b, unknown"


def test_the_unshaped_verdicts_read_their_own_file_and_name_the_link(tmp_path: Path) -> None:
    """docs/tta_unshaped.jsonl's verdicts: the study's columns for its own rows, the link named
    "unshaped"; the study's file is not read (it does not exist here)."""
    rows = [pilot_row("lm", 2, "local", method, seconds) for method, seconds in
            (("gs", 6.0), ("fp16", 5.0), ("none", 8.0))]
    write_jsonl(tmp_path / "tta_unshaped.jsonl", rows)
    lines = report.generator("tta_unshaped.verdicts")(tmp_path).splitlines()
    assert lines[2].startswith("| lm | 2 | unshaped | fp16: 5.0 s | 6.0 s | 1.20 | 1.20 |"), lines
    assert report.link_bits("local") > report.link_bits("10gbit")
