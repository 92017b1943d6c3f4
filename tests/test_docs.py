"""``scripts/check_docs.py``: the hand-written docs agree with the repository (every documented
command parses as its script parses it and overwrites no record it does not name, every script
run directly keeps its run bit, every test named exists, every error message quoted in
docs/reliability.md is one the code can produce), and the check names what it finds when a doc
drifts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

import check_docs  # noqa: E402


@pytest.mark.slow
def test_the_docs_pass_the_check() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_docs.py")], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("check_docs: 0 problem(s)")


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A repository to plant drift in: scripts/ copied (run bits kept), the package, the harness
    and tests/ linked, docs/ with one record."""
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("gs_horovod", "gs_bench", "tests"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "convergence_cnn_sim16.json", tmp_path / "docs")
    return tmp_path


def plant(root: Path, text: str) -> list[str]:
    (root / "docs" / "planted.md").write_text(text)
    return check_docs.check(root, ["docs/planted.md"])


def test_a_copy_of_a_doc_with_drift_planted_fails_naming_it(copy: Path) -> None:
    """docs/reliability.md as it is passes; a copy with a stale command and a renamed test
    planted fails, naming exactly those two lines."""
    original = (ROOT / "docs" / "reliability.md").read_text()
    (copy / "docs" / "reliability.md").write_text(original)
    assert check_docs.check(copy, ["docs/reliability.md"]) == []
    planted = original.replace(
        "soak.py --steps 5000 --out docs/soak.json", "soak.py --steps 5000 --every-step --out docs/soak.json").replace(
        "`tests/test_checkpoints.py::test_wrong_world_size_fails_on_rank0_at_load`",
        "`tests/test_checkpoints.py::test_wrong_world_size_fails_at_load`")
    assert planted != original
    (copy / "docs" / "reliability.md").write_text(planted)
    problems = check_docs.check(copy, ["docs/reliability.md"])
    lines = {n for n, text in enumerate(planted.splitlines(), 1) if "--every-step" in text or "fails_at_load`" in text}
    assert len(problems) == 2 and {int(p.split(":")[1]) for p in problems} == lines, problems
    assert any("unrecognized arguments: --every-step" in p for p in problems)
    assert any("tests/test_checkpoints.py::test_wrong_world_size_fails_at_load, which tests/test_checkpoints.py "
               "does not define" in p for p in problems)


def test_a_stale_command_is_named(copy: Path) -> None:
    """An unknown method, an unknown flag and an unknown choice each fail the script's own parser;
    the documented commands around them pass."""
    problems = plant(copy, "\n".join([
        "# Planted", "", "```bash",
        ".venv/bin/python scripts/bench/bench_convergence.py --model mlp --methods dense powersgd --out-dir /tmp/x",
        ".venv/bin/python scripts/bench/bench_convergence.py --model mlp --methods \"powersgd r1\" --out-dir /tmp/x",
        "python scripts/bench/bench_time_to_accuracy.py run --out /tmp/t.jsonl --no-such-flag",
        "```", "", "Inline: `python scripts/bench/bench_convergence.py --model resnet --out-dir /tmp/x`.", ""]))
    assert len(problems) == 3, problems
    assert "docs/planted.md:4:" in problems[0] and "unknown methods ['powersgd']" in problems[0]
    assert "docs/planted.md:6:" in problems[1] and "unrecognized arguments: --no-such-flag" in problems[1]
    assert "docs/planted.md:9:" in problems[2] and "invalid choice: 'resnet'" in problems[2]


def test_a_command_that_overwrites_a_record_is_named_unless_it_says_so(copy: Path) -> None:
    """``--out-dir docs`` writes docs/convergence_cnn_sim16.json, an existing record: named as a
    problem, unless the command's comment says it regenerates it; a brace pattern is expanded."""
    problems = plant(copy, "\n".join([
        "```bash",
        "python scripts/bench/bench_convergence.py --simulated-ranks {4,16} --quick --out-dir docs",
        "python scripts/bench/bench_convergence.py --simulated-ranks 16 --methods gs --out-dir docs  "
        "# regenerates docs/convergence_cnn_sim16.{json,png}",
        "```", ""]))
    assert len(problems) == 1, problems
    assert problems[0].startswith("docs/planted.md:2:") and "--simulated-ranks 16 --quick" in problems[0]
    assert "writes over the record docs/convergence_cnn_sim16.json" in problems[0]


def test_a_missing_test_name_is_named(copy: Path) -> None:
    problems = plant(copy, "\n".join([
        "| case | test |", "|---|---|",
        "| exists | `tests/test_gs_sgd.py::test_invalid_options_are_named`, "
        "`test_k_larger_than_a_group_is_an_error_naming_it` |",
        "| renamed | `test_k_larger_than_a_tensor_is_an_error_naming_it` |",
        "| wrong file | `tests/test_ddp.py::test_invalid_options_are_named` |",
        "| no file | `tests/test_nothing.py` |", ""]))
    assert problems == [
        "docs/planted.md:4: names the test test_k_larger_than_a_tensor_is_an_error_naming_it, which no file in "
        "tests/ defines",
        "docs/planted.md:5: names the test tests/test_ddp.py::test_invalid_options_are_named, which tests/test_ddp.py "
        "does not define",
        "docs/planted.md:6: names tests/test_nothing.py, which is not in tests/"]


def test_a_script_run_directly_without_its_run_bit_is_named(copy: Path) -> None:
    doc = "```bash\nsudo scripts/bench/shaped.sh 1gbit 4 -- horovodrun --mpi -np 4 python train.py\n```\n"
    assert plant(copy, doc) == []
    (copy / "scripts" / "bench" / "shaped.sh").chmod(0o644)
    assert plant(copy, doc) == ["docs/planted.md:2: scripts/bench/shaped.sh is run directly but is not executable "
                                "(chmod +x)"]
    # run through bash, the same script needs no run bit
    assert plant(copy, doc.replace("sudo scripts", "sudo bash scripts")) == []


def test_an_error_message_the_code_cannot_raise_is_named(copy: Path) -> None:
    (copy / "docs" / "reliability.md").write_text("\n".join([
        "| case | behaviour |", "|---|---|",
        "| k too large | `ValueError: k=5000 exceeds the 4096 elements of 'fc.weight' (scope='layer'); raise min_size "
        "above k or use ratio` |",
        "| the old wording | `ValueError: k=5000 exceeds the 4096 elements of tensor 'fc.weight'; raise min_size "
        "above k or use ratio` |",
        "| a prefix | `ValueError: GsSketch options differ across ranks …` |",
        "| a type it never raises | `ZeroDivisionError: GsSketch options differ across ranks …` |", ""]))
    problems = check_docs.check(copy, ["docs/reliability.md"])
    assert len(problems) == 2, problems
    assert problems[0].startswith("docs/reliability.md:4: quotes the message `ValueError: k=5000 exceeds the 4096 "
                                  "elements of tensor")
    assert problems[1] == "docs/reliability.md:6: quotes ZeroDivisionError, which gs_horovod/ never raises"


def test_shell_words_are_read_as_the_shell_reads_them() -> None:
    assert check_docs.expand_braces("a{1,2}b{x,y}") == ["a1bx", "a1by", "a2bx", "a2by"]
    assert check_docs.unroll_for("for P in 2 4; do python s.py --ranks $P --out o; done") == \
        "python s.py --ranks 2 --out o"
    assert check_docs.simple_commands("RATIO=1 bash x.sh a 2>&1 | python c.py > log; echo") == [
        ["bash", "x.sh", "a"], ["python", "c.py"], ["echo"]]
    assert check_docs.strip_comment("python s.py --m 'a # b'  # note") == ("python s.py --m 'a # b'  ", "note")


def test_a_hand_written_figure_in_the_readme_is_named_and_a_generated_one_passes(copy: Path) -> None:
    """A number with a unit planted in README.md's prose is named; the same number between report
    markers, in code, as a goal's bound or as a link's rate is not."""
    (copy / "README.md").write_text("\n".join([
        "# Planted", "",
        "The defaults took 0.42× dense's seconds and sent 618 kB a step.",
        "The defaults took <!-- report:readme.when.slow -->0.42× dense's seconds<!-- /report:readme.when.slow -->.",
        "Run `bash scripts/run_demo.sh --ratio 0.01` (a 5 % sample) on 100 Mbit/s, within 5 % of dense.",
        "```bash", "python train.py  # 40 s here", "```",
        "![plot](docs/x_2.5x.png) with 28 bits a pair.", ""]))
    problems = check_docs.check(copy, ["README.md"])
    assert problems == [
        "README.md:3: the figure '0.42×' is hand-written: generate it between report markers "
        "(scripts/bench/report.py) or drop it",
        "README.md:3: the figure '618 kB' is hand-written: generate it between report markers "
        "(scripts/bench/report.py) or drop it",
        "README.md:5: the figure '5 %' is hand-written: generate it between report markers "
        "(scripts/bench/report.py) or drop it",
        "README.md:9: the figure '28 bits' is hand-written: generate it between report markers "
        "(scripts/bench/report.py) or drop it"], problems


def test_only_the_headline_tables_of_benchmarks_md_are_checked_for_figures() -> None:
    """In docs/benchmarks.md a figure in a table row before the first section is named; one in the
    prose before it or anywhere after the first section is not."""
    text = "\n".join(["# Benchmarks", "", "Measured on a 24 GiB VM.", "",
                      "| claim | measured |", "|---|---|", "| fast | 1.5× dense |",
                      "| goal ≤ 0.4× bytes | <!-- report:a.b -->0.38×<!-- /report:a.b --> |", "",
                      "## Kernels", "", "| x | 2.0× |", ""])
    assert check_docs.hand_written_figures(text, "headline") == [(7, "1.5×")]
    assert check_docs.hand_written_figures(text, "all") == [(3, "24 GiB"), (7, "1.5×"), (12, "2.0×")]


def test_the_readme_is_one_screen_with_the_calls_the_results_and_the_plot() -> None:
    """README.md is at most 250 lines; its first 60 hold the two commands, the Horovod, DDP and
    FSDP2 calls, the generated results table, the plot and at most five when-to-use bullets."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250
    first = "\n".join(lines[:60])
    for needle in ("bash scripts/run_demo.sh", "bash scripts/run_tests.sh", "hvd.DistributedOptimizer(",
                   "compression=GsSketch", "register_comm_hook(GsState(", "register_fsdp_hooks(",
                   "<!-- report:readme.results -->", "<!-- /report:readme.results -->",
                   "](docs/tta_defaults.png)"):
        assert needle in first, needle
    when = first[first.index("**When to use it, when not**"):]
    assert 1 <= len([line for line in when.splitlines() if line.startswith("- ")]) <= 5
    assert not lines[60].startswith(("- ", "  ")), "the when-to-use bullets run past line 60"
