"""Sketch kernels (hash v2): every backend against the NumPy reference, bit for bit.

Backends: Numba CPU, torch ops, TensorFlow ops, Numba CUDA under the simulator (small sizes:
the simulator runs each GPU thread as a Python thread). Speed is not asserted here.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gs_horovod.kernels import numba_cpu, numba_cuda, torch_ops
from gs_horovod.kernels.hashing import (
    GAMMA,
    HASH_VERSION,
    M1,
    M2,
    M3,
    MASK32,
    MASK64,
    hash_keys,
    reference_buckets_signs,
    reference_hashes,
)

tf = pytest.importorskip("tensorflow")
# the CUDA simulator runs the device functions on NumPy uint64 scalars, which warn on wrap-around
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
from gs_horovod.kernels import tf_ops  # noqa: E402

BACKENDS = ["numba", "torch", "tf", "cuda"]
NAN_KEY = 0x7F800001


def python_hash(g: int, key: int, rows: int, cols: int) -> list[tuple[int, int]]:
    """The spec of kernels/hashing.py in plain Python integers: (bucket, sign) per row."""
    z = (g ^ key) & MASK64
    z = ((z ^ (z >> 30)) * M1) & MASK64
    z = ((z ^ (z >> 27)) * M2) & MASK64
    z ^= z >> 31
    h1, h2 = z & MASK32, (z >> 32) | 1
    w = ((z ^ (z >> 29)) * M3) & MASK64
    out = []
    for j in range(rows):
        u = (h1 + j * h2) & MASK32
        out.append(((u * cols) >> 32, -1 if (w >> (63 - j)) & 1 else 1))
    return out


def reference_table(table: np.ndarray, idx: np.ndarray, vals: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Sequential float32 additions onto ``table`` in idx order (np.add.at is unbuffered, in order)."""
    rows, cols = table.shape
    buckets, signs = reference_hashes(keys, cols, idx, rows)
    out = table.copy()
    for j in range(rows):
        np.add.at(out[j], buckets[j], signs[j] * vals)
    return out


def reference_estimates(table: np.ndarray, keys: np.ndarray, offset: int, length: int) -> np.ndarray:
    rows, cols = table.shape
    buckets, signs = reference_buckets_signs(keys, cols, offset, length, rows)
    est = np.sort(signs * table[np.arange(rows)[:, None], buckets], axis=0)
    if rows % 2:
        return est[rows // 2]
    return ((est[rows // 2 - 1] + est[rows // 2]) * np.float32(0.5)).astype(np.float32)


def reference_top(key: np.ndarray, count: int) -> np.ndarray:
    """Indices ascending of the ``count`` largest keys, ties to the smaller index."""
    return np.sort(np.lexsort((np.arange(len(key)), -key))[:count])


def abs_key(x: np.ndarray) -> np.ndarray:
    k = (x.view(np.uint32) & 0x7FFFFFFF).astype(np.int64)
    k[np.isnan(x)] = NAN_KEY
    return k


def run_accumulate(backend: str, table: np.ndarray, vec: np.ndarray, keys: np.ndarray, offset: int) -> np.ndarray:
    if backend == "tf":
        return tf_ops.accumulate(tf.constant(table), tf.constant(vec), keys, offset).numpy()
    t = torch.from_numpy(table.copy())
    torch_ops.accumulate(backend, t, torch.from_numpy(vec), keys, offset)
    return t.numpy()


def run_accumulate_at(backend: str, table: np.ndarray, idx: np.ndarray, vals: np.ndarray,
                      keys: np.ndarray) -> np.ndarray:
    if backend == "tf":
        return tf_ops.accumulate_at(tf.constant(table), tf.constant(idx), tf.constant(vals), keys).numpy()
    t = torch.from_numpy(table.copy())
    torch_ops.accumulate_at(backend, t, torch.from_numpy(idx), torch.from_numpy(vals), keys)
    return t.numpy()


def run_heavy_hitters(backend: str, table: np.ndarray, keys: np.ndarray, length: int, count: int,
                      offset: int) -> tuple[np.ndarray, np.ndarray]:
    if backend == "tf":
        idx, est = tf_ops.heavy_hitters(tf.constant(table), keys, length, count, offset)
    else:
        idx, est = torch_ops.heavy_hitters(backend, torch.from_numpy(table), keys, length, count, offset)
    return idx.numpy(), est.numpy()


def run_top_abs(backend: str, x: np.ndarray, count: int) -> np.ndarray:
    if backend == "tf":
        return tf_ops.top_abs(tf.constant(x), count).numpy()
    return torch_ops.top_abs(backend, torch.from_numpy(x), count).numpy()


def heavy_tailed(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_t(1.5, n) * np.exp(rng.standard_normal(n))).astype(np.float32)


# --- the hash ---------------------------------------------------------------------------------

def test_reference_matches_the_integer_spec_including_large_indices():
    keys = hash_keys(12345)
    key = int(keys[0]) & MASK64
    idx = np.array([0, 1, 2**32 - 1, 2**32, 2**32 + 1, 2**40 + 7, 2**62 - 1], dtype=np.int64)
    for cols in (1, 7, 1000, 2**31 - 1):
        buckets, signs = reference_hashes(keys, cols, idx, 5)
        for i, g in enumerate(idx.tolist()):
            assert [(int(buckets[j, i]), int(signs[j, i])) for j in range(5)] == python_hash(g, key, 5, cols)


def test_hash_keys_version_and_seed():
    assert HASH_VERSION == 2
    assert hash_keys(7).dtype == np.int64 and hash_keys(7).shape == (1,)
    assert np.array_equal(hash_keys(7), hash_keys(7))
    assert not np.array_equal(hash_keys(7), hash_keys(8))
    z = (7 + GAMMA) & MASK64
    z = ((z ^ (z >> 30)) * M1) & MASK64
    z = ((z ^ (z >> 27)) * M2) & MASK64
    assert int(hash_keys(7)[0]) & MASK64 == z ^ (z >> 31)
    assert hash_keys(2**64 + 7)[0] == hash_keys(7)[0]
    with pytest.raises(TypeError, match="seed"):
        hash_keys(1.5)


@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_framework_hashes_are_bitwise_the_reference(framework):
    keys = hash_keys(99)
    rng = np.random.default_rng(0)
    idx = np.concatenate([np.arange(2**32 - 500, 2**32 + 500), rng.integers(0, 2**62, 2000), [2**62 - 1]])
    idx = idx.astype(np.int64)
    for rows, cols in ((5, 1009), (64, 2**31 - 1)):
        buckets, signs = reference_hashes(keys, cols, idx, rows)
        if framework == "torch":
            b, neg = torch_ops.hashes(torch.from_numpy(idx), keys, rows, cols)
        else:
            b, neg = tf_ops.hashes(tf.constant(idx), keys, rows, cols)
        assert np.array_equal(b.numpy(), buckets)
        assert np.array_equal(np.where(neg.numpy(), -1.0, 1.0), signs)


def test_buckets_uniform_signs_balanced_and_independent():
    keys = hash_keys(3)
    n, cols, rows = 200_000, 257, 5
    buckets, signs = reference_buckets_signs(keys, cols, 2**35, n, rows)
    bound = lambda dof: dof + 6 * np.sqrt(2 * dof)  # noqa: E731  chi-square, 6 sigma
    for j in range(rows):
        load = np.bincount(buckets[j], minlength=cols)
        assert ((load - n / cols) ** 2 / (n / cols)).sum() < bound(cols - 1)
        assert abs(signs[j].mean()) < 6 / np.sqrt(n)
        # sign independent of bucket: per-bucket sign sums are N(0, load)
        per_bucket = np.bincount(buckets[j], weights=signs[j], minlength=cols)
        assert (per_bucket**2 / load).sum() < bound(cols)
    for a in range(rows):  # every product of distinct rows' signs is balanced
        for b in range(a + 1, rows):
            assert abs((signs[a] * signs[b]).mean()) < 6 / np.sqrt(n)
            # buckets of different rows are independent (joint chi-square on 16 x 16 cells)
            joint = np.bincount((buckets[a] * 16 // cols) * 16 + buckets[b] * 16 // cols, minlength=256)
            assert ((joint - n / 256) ** 2 / (n / 256)).sum() < bound(255)
    for r in range(3, rows + 1):
        assert abs(np.prod(signs[:r], axis=0).mean()) < 6 / np.sqrt(n)
    # a pair colliding in row 0 collides in row 1 with probability ~1/cols, with independent signs
    pairs = np.flatnonzero(buckets[0][:-1] == buckets[0][1:])
    assert np.mean(buckets[1][pairs] == buckets[1][pairs + 1]) < 3.0 / cols
    assert abs(np.mean(signs[0][pairs] * signs[0][pairs + 1])) < 6 / np.sqrt(len(pairs))


# --- accumulate -------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rows", [1, 3, 4])
def test_tables_equal_the_sequential_reference(backend, rows):
    n = 300 if backend == "cuda" else 5000
    cols, offset = 61, 2**32 - n // 2
    keys = hash_keys(11)
    rng = np.random.default_rng(rows)
    start = rng.standard_normal((rows, cols)).astype(np.float32)
    vec = heavy_tailed(n, 1)
    idx = np.concatenate([rng.integers(0, 2**62, n // 2), [2**62 - 1, 5, 5, 2**33]]).astype(np.int64)
    vals = heavy_tailed(len(idx), 2)
    expected = reference_table(start, np.arange(offset, offset + n, dtype=np.int64), vec, keys)
    dense = run_accumulate(backend, start, vec, keys, offset)
    expected_at = reference_table(expected, idx, vals, keys)
    sparse = run_accumulate_at(backend, dense, idx, vals, keys)
    if backend == "cuda":  # float atomics: order of additions within a cell varies
        np.testing.assert_allclose(dense, expected, rtol=1e-5, atol=1e-3)
        np.testing.assert_allclose(sparse, expected_at, rtol=1e-5, atol=1e-3)
    else:
        assert np.array_equal(dense, expected)
        assert np.array_equal(sparse, expected_at)


def test_numba_tables_do_not_depend_on_the_thread_count():
    import numba

    keys, vec = hash_keys(1), heavy_tailed(100_000, 3)  # 3 rows x 100k: the parallel kernel
    tables = []
    for threads in (1, numba.config.NUMBA_NUM_THREADS):
        numba.set_num_threads(threads)
        table = np.zeros((3, 101), np.float32)
        numba_cpu.accumulate(table, vec, keys, 0)
        tables.append(table)
    assert np.array_equal(tables[0], tables[1])


# --- heavy_hitters ----------------------------------------------------------------------------

def planted_table(rows: int, cols: int, length: int, keys: np.ndarray, offset: int, seed: int) -> np.ndarray:
    """The merged sketch of 4 ranks' pre-filtered heavy-tailed vectors sharing a heavy part."""
    rng = np.random.default_rng(seed)
    shared = np.zeros(length, np.float32)
    support = rng.choice(length, length // 50, replace=False)
    shared[support] = heavy_tailed(len(support), seed) * 20
    table = np.zeros((rows, cols), np.float32)
    for rank in range(4):
        a = shared + heavy_tailed(length, seed * 10 + rank)
        top = reference_top(abs_key(a), length // 20)
        table = reference_table(table, top + offset, a[top], keys)
    return table


def check_heavy_hitters(backend: str, table: np.ndarray, keys: np.ndarray, length: int, count: int, offset: int):
    est = reference_estimates(table, keys, offset, length)
    want = reference_top(abs_key(est), count)
    idx, got = run_heavy_hitters(backend, table, keys, length, count, offset)
    assert idx.dtype == np.int64 and got.dtype == np.float32
    assert np.array_equal(idx, want)
    assert np.array_equal(got, est[want])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rows", [1, 3, 4, 5])
def test_heavy_hitters_are_exactly_the_reference_set(backend, rows):
    length = 600 if backend == "cuda" else 30_000
    keys, offset = hash_keys(rows), 2**32 - 100
    cols = max(8, length // 100)
    table = planted_table(rows, cols, length, keys, offset, seed=rows)
    counts = (1, 7, length // 100, length // 10, length) if backend != "cuda" else (1, 9, 120)
    for count in counts:
        check_heavy_hitters(backend, table, keys, length, count, offset)


@pytest.mark.parametrize("backend", ["numba", "cuda"])
def test_heavy_hitters_lower_the_threshold_when_too_few_survive(backend, monkeypatch):
    # large cells in row 0 only: the first threshold (a large cell) needs 2 of 3 rows above it,
    # which no coordinate has, so the scan is repeated with lower thresholds
    length, keys, rows = (800 if backend == "cuda" else 20_000), hash_keys(5), 3
    table = np.random.default_rng(0).standard_normal((rows, 400)).astype(np.float32) * 0.01
    table[0] = 10.0
    module, name = (numba_cpu, "_scan") if backend == "numba" else (numba_cuda, "scan")
    scans = []
    original = getattr(module, name)

    def counting(*args, **kwargs):
        scans.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    check_heavy_hitters(backend, table, keys, length, 40, 0)
    assert len(scans) >= 2


@pytest.mark.parametrize("backend", ["numba", "cuda"])
def test_heavy_hitters_raise_the_threshold_when_too_many_survive(backend, monkeypatch):
    # a zero first threshold admits every coordinate: more survivors than the buffer of
    # cap = count + max(count // 2, 1024) holds, so the scan must raise its threshold (Numba CPU:
    # each worker compacts its buffer to the count best and goes on above the count-th; CUDA:
    # a rescan above the count-th it buffered) and still return the reference set
    length, keys, rows = (1500 if backend == "cuda" else 50_000), hash_keys(6), 3
    table = planted_table(rows, 40, length, keys, 0, seed=9)
    module = numba_cpu if backend == "numba" else torch_ops
    zero_thresholds = []
    scans: list[dict] = []  # per scan: its (lowest) threshold, what it kept, its buffer's size

    def zero_threshold(cells, *args):
        zero_thresholds.append(cells)
        return cells  # the last cell of the sample: threshold 0, every coordinate survives

    monkeypatch.setattr(module, "first_threshold_rank", zero_threshold)
    if backend == "numba":
        original_scan = numba_cpu._scan

        def scan(table, key, offset, length, count, thr, workers, cap):
            bidx, best, counts = original_scan(table, key, offset, length, count, thr, workers, cap)
            scans.append({"threshold": float(thr), "kept": int(counts.sum()), "fullest": int(counts.max()),
                          "share": length // workers, "cap": cap})
            return bidx, best, counts

        monkeypatch.setattr(numba_cpu, "_scan", scan)
    else:
        original_cuda_scan = numba_cuda.scan

        def scan(table, keys, offset, length, lo, hi, out_idx, out_est, counter):
            original_cuda_scan(table, keys, offset, length, lo, hi, out_idx, out_est, counter)
            found = counter.copy_to_host() if hasattr(counter, "copy_to_host") else counter  # simulator: NumPy
            scans.append({"threshold": float(lo), "found": int(found[0]), "cap": out_idx.shape[0]})

        monkeypatch.setattr(numba_cuda, "scan", scan)
    for count in (1, 30, 200):
        zero_thresholds.clear()
        scans.clear()
        check_heavy_hitters(backend, table, keys, length, count, 0)
        assert zero_thresholds, "the zero first threshold was not used"
        cap = count + max(count // 2, 1024)
        first = scans[0] if scans else {}
        assert first.get("threshold") == 0.0 and first["cap"] == cap, f"count {count}: {scans}"
        if backend == "numba":
            # every coordinate reaches T = 0 and each worker's share is more than its buffer
            # holds, yet no buffer went past cap: the workers raised their thresholds and
            # dropped the survivors below them, in the one scan
            assert first["share"] > cap, f"count {count}: a worker's share fits its buffer: {scans}"
            assert first["fullest"] <= cap and first["kept"] < length, f"count {count}: {scans}"
            assert len(scans) == 1, f"count {count}: {scans}"
        else:
            # the scan at T = 0 found every coordinate, more than its buffer holds; every later
            # scan ran above a raised threshold
            assert first["found"] == length > cap, f"count {count}: {scans}"
            assert len(scans) >= 2 and all(s["threshold"] > 0.0 for s in scans[1:]), f"count {count}: {scans}"


def test_heavy_hitters_ties_and_a_zero_table():
    keys = hash_keys(0)
    for backend in ("numba", "torch"):
        check_heavy_hitters(backend, np.zeros((3, 16), np.float32), keys, 5000, 17, 0)
        check_heavy_hitters(backend, np.ones((4, 16), np.float32), keys, 5000, 17, 3)


def test_heavy_hitters_inside_tf_function():
    keys, length = hash_keys(2), 4000
    table = planted_table(3, 64, length, keys, 0, seed=2)
    fn = tf.function(lambda t: tf_ops.heavy_hitters(t, keys, length, 50))
    idx, est = fn(tf.constant(table))
    assert idx.shape == (50,)
    assert np.array_equal(idx.numpy(), run_heavy_hitters("numba", table, keys, length, 50, 0)[0])


@pytest.mark.parametrize("backend", ["numba", "torch", "tf"])
def test_count_out_of_range_is_an_error(backend):
    with pytest.raises(ValueError, match="count"):
        run_heavy_hitters(backend, np.zeros((3, 8), np.float32), hash_keys(0), 10, 11, 0)
    if backend != "tf":
        with pytest.raises(ValueError, match="count"):
            run_top_abs(backend, np.zeros(10, np.float32), 0)


# --- top_abs ----------------------------------------------------------------------------------

def top_abs_cases() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    mixed = rng.standard_normal(20_000).astype(np.float32)
    mixed[[3, 50, 51]] = [np.nan, -np.inf, np.inf]
    mixed[100:300] = 2.5  # ties
    mixed[300:400] = -2.5
    mixed[400] = -np.nan
    mixed[500:600] = 0.0
    mixed[600:610] = -0.0
    # >2^16 values with one top digit: forces the lower digits of the radix select
    narrow = (1.0 + rng.integers(0, 2**12, 70_000) * 2.0**-23).astype(np.float32)
    # 300k: the parallel histogram and collect passes (smaller inputs run serially)
    return [mixed, narrow, np.full(5000, -3.0, np.float32), heavy_tailed(300_000, 8)]


def test_top_abs_from_a_sampled_threshold_equals_the_reference_or_falls_back():
    """From 2^18 elements numba's top_abs first picks a threshold from a strided sample and
    scans once: on a heavy-tailed vector (NaN and Inf in it) that path answers, exactly; on a
    vector whose sampled positions are all small (the sample sets the threshold too low: too
    many pass) it gives up and the radix select answers, exactly; where they are all large
    (the threshold too high) the answer is exact whichever path gives it."""
    from gs_horovod.kernels import numba_cpu

    n = 1 << 21
    heavy = heavy_tailed(n, 3)
    heavy[[10, 20_000, 1_500_000]] = [np.nan, np.inf, -np.inf]
    stride = max(1, n // numba_cpu._SAMPLE) | 1
    low, high = np.full(n, 5.0, np.float32), np.full(n, 1e-3, np.float32)
    low[::stride], high[::stride] = 1e-3, 5.0
    for x, answers in ((heavy, True), (low, False), (high, None)):
        for count in (1, 1000, n // 64):
            want = reference_top(abs_key(x), count)
            sampled = numba_cpu._top_by_sample(x.view(np.uint32), count)
            assert answers is None or (sampled is not None) == answers, (count, answers)
            if sampled is not None:
                assert np.array_equal(sampled, want), count
            assert np.array_equal(numba_cpu.top_abs(x, count), want), count


@pytest.mark.parametrize("backend", BACKENDS)
def test_top_abs_equals_the_reference(backend):
    for x in top_abs_cases():
        n = len(x)
        for count in (1, 2, 3, 5, 150, 350, n // 3, n - 1, n):
            assert np.array_equal(run_top_abs(backend, x, count), reference_top(abs_key(x), count)), (n, count)
