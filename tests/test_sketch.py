"""CountSketch maths on the torch backends (the hash spec and kernel agreement: test_kernels.py)."""

from __future__ import annotations

import pytest
import torch
from count_sketch import CountSketch

from gs_horovod.kernels.torch_ops import TorchOps

BACKENDS = ["torch", "numba", "cuda"]
# the CUDA simulator runs the device functions on NumPy uint64 scalars, which warn on wrap-around
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")


def sketch_of(vec: torch.Tensor, rows: int, cols: int, seed: int = 0, backend: str = "torch", offset: int = 0):
    return CountSketch.zeros(rows, cols, seed, TorchOps(backend), vec).accumulate(vec, offset)


@pytest.mark.parametrize("backend", ["torch", "numba"])
def test_linearity_and_merge_is_the_sketch_of_the_sum(backend):
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(10_000, generator=g), torch.randn(10_000, generator=g)
    sx, sy = sketch_of(x, 5, 301, backend=backend), sketch_of(y, 5, 301, backend=backend)
    torch.testing.assert_close((sx + sy).table, sketch_of(x + y, 5, 301, backend=backend).table, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(sketch_of(3.0 * x, 5, 301, backend=backend).table, 3.0 * sx.table, rtol=1e-5, atol=1e-4)


def test_segments_with_offsets_and_sparse_parts_sketch_one_long_vector():
    x = torch.randn(9000, generator=torch.Generator().manual_seed(3))
    whole = sketch_of(x, 3, 400, backend="numba")
    parts = CountSketch.zeros(3, 400, 0, TorchOps("numba"), x)
    for start in range(0, 9000, 2500):
        parts.accumulate(x[start:start + 2500], offset=start)
    torch.testing.assert_close(parts.table, whole.table, rtol=1e-5, atol=1e-4)
    sparse = CountSketch.zeros(3, 400, 0, TorchOps("numba"), x).accumulate_at(torch.arange(9000), x)
    torch.testing.assert_close(sparse.table, whole.table, rtol=1e-5, atol=1e-4)


def test_merge_rejects_sketches_with_different_hashes():
    x = torch.ones(10)
    with pytest.raises(ValueError, match="rows, cols, seed"):
        sketch_of(x, 3, 10, seed=1).merge(sketch_of(x, 3, 10, seed=2))


@pytest.mark.parametrize("backend", BACKENDS)
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


def test_heavy_hitter_estimates_are_within_the_count_sketch_bound():
    # Each row's error on x_i is a sum of ~d/cols colliding terms: N(0, ‖x‖²/cols). The median
    # of 5 rows exceeds 4σ only if 3 rows do: P ≈ 10·(6e-5)^3, negligible over 100k coordinates.
    d, cols = 100_000, 2_000
    x = torch.randn(d, generator=torch.Generator().manual_seed(5))
    idx, est = sketch_of(x, 5, cols, backend="numba").heavy_hitters(500, d)
    sigma = x.norm().item() / cols**0.5
    assert (est - x[idx]).abs().max().item() < 4 * sigma


def test_heavy_hitters_validates_k():
    sk = sketch_of(torch.ones(10), 3, 10)
    for k in (0, 11):
        with pytest.raises(ValueError, match="k must be in"):
            sk.heavy_hitters(k, 10)
