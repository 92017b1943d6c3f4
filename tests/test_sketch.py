"""Count-Sketch maths and backend agreement (torch ops, Numba CPU, Numba CUDA simulated)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gs_horovod.kernels.hashing import GOLDEN, MASK32, MIX1, MIX2, fmix32, reference_buckets_signs, row_keys
from gs_horovod.sketch import CountSketch
from gs_horovod.torch import TorchOps

BACKENDS = ["torch", "numba", "cuda"]


def sketch_of(vec: torch.Tensor, rows: int, cols: int, seed: int = 0, backend: str = "torch", offset: int = 0):
    return CountSketch.zeros(rows, cols, seed, TorchOps(backend), vec).accumulate(vec, offset)


def python_hash(g: int, key: int) -> int:
    """The spec of kernels/hashing.py in plain Python integers."""
    return fmix32((((g & MASK32) ^ key) + (g >> 32) * GOLDEN) & MASK32)


def test_fmix32_matches_murmur3_reference_values():
    # MurmurHash3's fmix32 of 0 is 0; values below were computed from its published definition.
    assert fmix32(0) == 0
    x = 1
    x ^= x >> 16
    x = (x * MIX1) & MASK32
    x ^= x >> 13
    x = (x * MIX2) & MASK32
    x ^= x >> 16
    assert fmix32(1) == x == 0x514E28B7


def test_vectorised_hash_matches_the_integer_spec_including_indices_beyond_2_32():
    keys = row_keys(12345, 3)
    offset = 2**32 - 3
    buckets, signs = reference_buckets_signs(keys, 1000, offset, 8)
    for j, key in enumerate(keys.tolist()):
        for i in range(8):
            h = python_hash(offset + i, key)
            assert buckets[j, i] == (h * 1000) >> 32
            assert signs[j, i] == (1.0 if h % 2 == 0 else -1.0)


def test_row_keys_depend_on_seed_and_row():
    assert np.array_equal(row_keys(7, 5), row_keys(7, 5))
    assert len(set(row_keys(7, 5).tolist())) == 5
    assert not np.array_equal(row_keys(7, 5), row_keys(8, 5))
    with pytest.raises(TypeError, match="seed"):
        row_keys(1.5, 3)


def test_buckets_are_uniform_and_rows_independent():
    keys = row_keys(3, 2)
    d, cols = 200_000, 500
    buckets, signs = reference_buckets_signs(keys, cols, 0, d)
    load = np.bincount(buckets[0], minlength=cols)
    chi2 = ((load - d / cols) ** 2 / (d / cols)).sum()
    assert chi2 < cols + 5 * np.sqrt(2 * cols)  # chi-square with cols-1 dof, 5 sigma
    assert abs(signs[0].mean()) < 5 / np.sqrt(d)
    # a pair colliding in row 0 collides in row 1 with probability ~1/cols
    pairs = np.flatnonzero(buckets[0][:-1] == buckets[0][1:])
    both = np.mean(buckets[1][pairs] == buckets[1][pairs + 1]) if len(pairs) else 0.0
    assert both < 5.0 / cols


@pytest.mark.parametrize("backend", BACKENDS)
def test_backends_agree_with_the_numpy_reference(backend):
    g = torch.Generator().manual_seed(0)
    vec = torch.randn(3000, generator=g)
    rows, cols, offset = 5, 97, 2**32 - 1000
    keys = row_keys(11, rows)
    buckets, signs = reference_buckets_signs(keys, cols, offset, len(vec))
    expected = np.zeros((rows, cols), np.float64)
    for j in range(rows):
        np.add.at(expected[j], buckets[j], signs[j] * vec.numpy())
    sk = sketch_of(vec, rows, cols, seed=11, backend=backend, offset=offset)
    np.testing.assert_allclose(sk.table.numpy(), expected, rtol=1e-5, atol=1e-4)
    per_row = signs * expected[np.arange(rows)[:, None], buckets]
    np.testing.assert_allclose(sk.query(len(vec), offset).numpy(), np.median(per_row, axis=0), rtol=1e-5, atol=1e-4)


def test_backends_give_identical_tables_and_estimates():
    vec = torch.randn(5000, generator=torch.Generator().manual_seed(1))
    results = {b: sketch_of(vec, 4, 211, seed=5, backend=b) for b in BACKENDS}
    for b in BACKENDS[1:]:
        torch.testing.assert_close(results[b].table, results["torch"].table, rtol=1e-5, atol=1e-5)
        # even rows: the median is the mean of the two middle rows, the same on every backend
        torch.testing.assert_close(results[b].query(5000), results["torch"].query(5000), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "numba"])
def test_linearity_and_merge_is_the_sketch_of_the_sum(backend):
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(10_000, generator=g), torch.randn(10_000, generator=g)
    sx, sy = sketch_of(x, 5, 301, backend=backend), sketch_of(y, 5, 301, backend=backend)
    torch.testing.assert_close((sx + sy).table, sketch_of(x + y, 5, 301, backend=backend).table, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(sketch_of(3.0 * x, 5, 301, backend=backend).table, 3.0 * sx.table, rtol=1e-5, atol=1e-4)


def test_segments_with_offsets_sketch_one_long_vector():
    x = torch.randn(9000, generator=torch.Generator().manual_seed(3))
    whole = sketch_of(x, 3, 400)
    parts = CountSketch.zeros(3, 400, 0, TorchOps("numba"), x)
    for start in range(0, 9000, 2500):
        parts.accumulate(x[start:start + 2500], offset=start)
    torch.testing.assert_close(parts.table, whole.table, rtol=1e-5, atol=1e-4)


def test_merge_rejects_sketches_with_different_hashes():
    x = torch.ones(10)
    with pytest.raises(ValueError, match="rows, cols, seed"):
        sketch_of(x, 3, 10, seed=1).merge(sketch_of(x, 3, 10, seed=2))


@pytest.mark.parametrize("backend", ["torch", "numba", "cuda"])
def test_planted_k_sparse_vector_is_recovered_exactly(backend):
    # A zero coordinate gets a non-zero median only if 3 of its 5 buckets hold a planted value:
    # about d·10·(k/cols)^3 = 2e-4 expected false hits at d = 20k, k = 50, cols = 100·k.
    d, k = 20_000 if backend != "cuda" else 2_000, 50
    g = torch.Generator().manual_seed(4)
    support = torch.randperm(d, generator=g)[:k]
    x = torch.zeros(d)
    x[support] = (torch.rand(k, generator=g) + 0.5) * torch.sign(torch.randn(k, generator=g))
    idx, est = sketch_of(x, 5, 100 * k, seed=9, backend=backend).heavy_hitters(k, d)
    assert torch.equal(idx, support.sort().values)
    torch.testing.assert_close(est, x[idx], rtol=0, atol=1e-6)


def test_estimate_error_is_within_the_count_sketch_bound():
    # Each row's error on x_i is a sum of ~d/cols colliding terms: N(0, ‖x‖²/cols). The median
    # of 5 rows exceeds 4σ only if 3 rows do: P ≈ 10·(6e-5)^3, negligible over 100k coordinates.
    d, cols = 100_000, 2_000
    x = torch.randn(d, generator=torch.Generator().manual_seed(5))
    err = sketch_of(x, 5, cols, backend="numba").query(d) - x
    sigma = x.norm().item() / cols**0.5
    assert err.abs().max().item() < 4 * sigma
    assert err.pow(2).mean().sqrt().item() < 0.8 * sigma  # the median of 5 shrinks the spread


def test_heavy_hitters_validates_k():
    sk = sketch_of(torch.ones(10), 3, 10)
    for k in (0, 11):
        with pytest.raises(ValueError, match="k must be in"):
            sk.heavy_hitters(k, 10)
