"""TfOps against TorchOps in one process: the sparse exchange's engine step on simulated ranks
(gs_horovod.transports.simulated accepts TensorFlow arrays), bit for bit, and its selection kernels
(``radix_cut``, ``keep_top``) on hand-made examples."""

from __future__ import annotations

import numpy as np
import pytest
import torch

tf = pytest.importorskip("tensorflow")

from gs_horovod.engine import GsConfig, GsSgd, Plan  # noqa: E402
from gs_horovod.kernels.tf_ops import TfOps  # noqa: E402
from gs_horovod.kernels.torch_ops import TorchOps  # noqa: E402
from gs_horovod.transports.simulated import SimulatedRanks  # noqa: E402

SIZES = {"a.weight": 3000, "b.weight": 1500}  # compressed; "c.bias" (10) is sent exactly
SMALL = 10
STEPS = 2


def gradients(case: str, rank: int, step: int) -> tuple[list[np.ndarray], np.ndarray]:
    """(compressed gradients in name order, the small tensor's) of one rank at one step, as
    tests/workers/exchanges.py makes them: "random" (a few heavy coordinates per rank), "ties"
    (every magnitude 1 or 2), "one_region" (every heavy coordinate in the first 200)."""
    rng = np.random.default_rng(1000 * step + rank)
    out = [(rng.standard_normal(d) * 0.01).astype(np.float32) for d in SIZES.values()]
    small = (rng.standard_normal(SMALL) * 0.01).astype(np.float32)
    if case == "ties":
        out = [(np.where(rng.random(d) < 0.02, 2.0, 1.0) * np.sign(rng.standard_normal(d))).astype(np.float32)
               for d in SIZES.values()]
    elif case == "one_region":
        out[0][:200] += (rng.standard_normal(200) * 10).astype(np.float32)
    else:
        heavy = rng.integers(0, 4500, 20)
        out[0][heavy[heavy < 3000]] += 5.0
        out[1][heavy[heavy >= 3000] - 3000] += 5.0
    return out, small


def run(ops, to, P: int, cfg: GsConfig, case: str) -> list[list[tuple[np.ndarray, np.ndarray, int]]]:
    """STEPS engine steps of P simulated ranks with ``ops``: per rank, per step, (update,
    residual, bytes allgathered) as numpy."""
    plan = Plan.build(list(SIZES), list(SIZES.values()), cfg, ("c.bias",), (SMALL,), ranks=P)
    assert plan.exchange == cfg.exchange
    group = SimulatedRanks(P)
    state = [{"residual": to(np.zeros(plan.total, np.float32)), "steps": 0} for _ in range(P)]
    out: list[list] = [[] for _ in range(P)]
    for t in range(STEPS):
        def rank(r, comm, t=t):
            grads, small = gradients(case, r, t)
            st = state[r]
            res = GsSgd(cfg, ops, comm).step(plan, [to(g) for g in grads], st["residual"], None, st["steps"],
                                             st["steps"] == 0, [to(small)])
            assert bool(res.applied)
            st["residual"], st["steps"] = res.residual, int(res.steps)
            return np.asarray(res.update), np.asarray(res.residual), int(res.gathered)

        for r, got in enumerate(group.run(rank)):
            out[r].append(got)
    return out


def bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, np.float32).view(np.int32)


@pytest.mark.parametrize("case", ["random", "ties", "one_region"])
@pytest.mark.parametrize("P", [3, 4])
@pytest.mark.parametrize("wire,scope", [("fp32", "global"), ("fp32", "layer"), ("compact", "global"),
                                        ("compact", "layer"), ("compact8", "global")])  # compact8: global only
def test_tf_sparse_exchange_equals_torch_bitwise(wire, P, scope, case):
    # ties: magnitudes 1 and 2 only (the threshold's bin is all ties, broken by lower index);
    # one_region: every heavy coordinate in the first 200 of a.weight; compact: TF encodes by
    # the NumPy reference, torch by its own kernels: the same bytes, the same step
    cfg = GsConfig(scope=scope, ratio=0.01, exchange="sparse", wire=wire, backend="torch")
    torch_runs = run(TorchOps("torch"), torch.from_numpy, P, cfg, case)
    tf_runs = run(TfOps(), tf.constant, P, cfg, case)
    k = sum(cfg.k_for(d) for d in SIZES.values()) if scope == "layer" else cfg.k_for(sum(SIZES.values()))
    D = sum(SIZES.values())
    for r in range(P):
        for t in range(STEPS):
            (u_torch, e_torch, g_torch), (u_tf, e_tf, g_tf) = torch_runs[r][t], tf_runs[r][t]
            assert np.array_equal(bits(u_tf), bits(u_torch)), f"update, rank {r}, step {t}"
            assert np.array_equal(bits(e_tf), bits(e_torch)), f"residual, rank {r}, step {t}"
            assert g_tf == g_torch, f"bytes allgathered, rank {r}, step {t}"
            assert np.count_nonzero(u_tf[:D]) == k
            # every rank applies the same update
            assert np.array_equal(bits(u_tf), bits(tf_runs[0][t][0]))


@pytest.mark.parametrize("wire", ["compact", "compact8"])
@pytest.mark.parametrize("apply", ["topk", "all"])
def test_tf_compact_allgather_equals_torch_bitwise(apply, wire):
    cfg = GsConfig(ratio=0.01, exchange="allgather", apply=apply, wire=wire, backend="torch")
    torch_runs, tf_runs = run(TorchOps("torch"), torch.from_numpy, 3, cfg, "random"), run(TfOps(), tf.constant, 3,
                                                                                          cfg, "random")
    for r in range(3):
        for t in range(STEPS):
            assert np.array_equal(bits(tf_runs[r][t][0]), bits(torch_runs[r][t][0])), f"update, rank {r}, step {t}"
            assert np.array_equal(bits(tf_runs[r][t][1]), bits(torch_runs[r][t][1])), f"residual, rank {r}, step {t}"


@pytest.mark.parametrize("case", ["random", "ties", "one_region"])
@pytest.mark.parametrize("scope", ["global", "layer"])
def test_tf_sparse_exchange_equals_tf_allgather_top_k_bitwise(scope, case):
    # with wire="fp32" (the compact wire rounds the owners' sums, which the allgather does not)
    sparse = run(TfOps(), tf.constant, 3, GsConfig(scope=scope, ratio=0.01, exchange="sparse", wire="fp32"), case)
    gather = run(TfOps(), tf.constant, 3, GsConfig(scope=scope, ratio=0.01, exchange="allgather", apply="topk",
                                                   wire="fp32"), case)
    for r in range(3):
        for t in range(STEPS):
            assert np.array_equal(bits(sparse[r][t][0]), bits(gather[r][t][0])), f"update, rank {r}, step {t}"
            assert np.array_equal(bits(sparse[r][t][1]), bits(gather[r][t][1])), f"residual, rank {r}, step {t}"


OPS = [(TorchOps("torch"), lambda x: torch.from_numpy(np.asarray(x))), (TfOps(), tf.constant)]


@pytest.mark.parametrize("ops,to", OPS, ids=["torch", "tf"])
def test_radix_cut_finds_the_bin_of_the_wanted_th_largest(ops, to):
    # two groups of 4 bins; group 0 from the top: 3, 3, 5, 6 (the 4th largest is in bin 1, with 3
    # above it); group 1: 1, 6, 6, 6 (the 2nd largest in bin 2, 1 above); group 1 again wanting
    # all 6 (bin 2: nothing lies below it)
    counts = to(np.array([1, 2, 0, 3, 0, 0, 5, 1], np.int32))
    cut, above = ops.radix_cut(counts, to(np.array([4, 2], np.int32)))
    assert np.asarray(cut).tolist() == [1, 2] and np.asarray(above).tolist() == [3, 1]
    cut, above = ops.radix_cut(counts, to(np.array([6, 6], np.int32)))
    assert np.asarray(cut).tolist() == [0, 2] and np.asarray(above).tolist() == [5, 1]
    cut, above = ops.radix_cut(counts, to(np.array([1, 1], np.int32)))  # the top bin holds it
    assert np.asarray(cut).tolist() == [3, 3] and np.asarray(above).tolist() == [0, 0]


@pytest.mark.parametrize("ops,to", OPS, ids=["torch", "tf"])
def test_keep_top_keeps_those_above_and_the_best_ties(ops, to):
    group = to(np.array([0, 0, 0, 0, 1, 1, 1, 1], np.int64))
    prefix = to(np.array([5, 3, 3, 2, 7, 7, 9, 7], np.int64))
    key = to(np.array([50, 31, 33, 20, 70, 71, 90, 71], np.int64))
    cut = to(np.array([3, 7], np.int64))
    # group 0: 5 > 3, and of the two at 3 the larger key; group 1: 9 > 7, and of the three at 7
    # the two of key 71 (position 5 and 7; 70 loses)
    keep = ops.keep_top(prefix, key, group, cut, to(np.array([1, 2], np.int32)))
    assert np.asarray(keep).tolist() == [0, 2, 5, 6, 7]
    # equal keys: the lower position; no ties wanted: only those above
    keep = ops.keep_top(prefix, key, group, cut, to(np.array([0, 1], np.int32)))
    assert np.asarray(keep).tolist() == [0, 5, 6]
    # nothing at the cut
    keep = ops.keep_top(prefix, key, group, to(np.array([4, 8], np.int64)), to(np.array([1, 1], np.int32)))
    assert np.asarray(keep).tolist() == [0, 6]


def rank_order_union_sum(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The union of P sparse vectors and their sums, added into zeros one vector after another."""
    union = np.unique(np.concatenate([i for i, _ in parts])) if parts else np.zeros(0, np.int64)
    sums = np.zeros(len(union), np.float32)
    for i, v in parts:
        pos = np.searchsorted(union, i)
        sums[pos] = sums[pos] + v
    return union, sums


@pytest.mark.parametrize("ops,to", OPS, ids=["torch", "tf"])
@pytest.mark.parametrize("P", [1, 2, 5])
@pytest.mark.parametrize("universe", [30, 1 << 40], ids=["table", "sort"])
def test_union_sum_adds_in_vector_order_bitwise(ops, to, P, universe):
    """Both of torch's ways on the CPU (a (universe,) table where the pairs are dense in it, a
    sort where not) give the bits of adding each vector in turn onto zeros, NaN and -0.0 included."""
    rng = np.random.default_rng(P)
    parts = []
    for _ in range(P):
        idx = np.sort(rng.choice(30, size=rng.integers(0, 26), replace=False)).astype(np.int64)
        # runs of 3 or more, magnitudes 1e-2 to 1e2: another order of addition gives other bits
        vals = (rng.standard_normal(len(idx)) * 10.0 ** rng.uniform(-2, 2, len(idx))).astype(np.float32)
        parts.append((idx, vals))
    parts[0][1][:2] = [-0.0, np.nan] if len(parts[0][1]) >= 2 else parts[0][1][:2]
    want_union, want_sums = rank_order_union_sum(parts)
    counts = np.array([len(i) for i, _ in parts], np.int32)
    union, sums = ops.union_sum(to(np.concatenate([i for i, _ in parts])), to(np.concatenate([v for _, v in parts])),
                                to(counts), universe)
    assert np.array_equal(np.asarray(union), want_union)
    assert np.array_equal(np.asarray(sums).view(np.uint32), want_sums.view(np.uint32))


@pytest.mark.parametrize("ops,to", OPS, ids=["torch", "tf"])
def test_union_sum_of_nothing(ops, to):
    union, sums = ops.union_sum(to(np.zeros(0, np.int64)), to(np.zeros(0, np.float32)), to(np.zeros(3, np.int32)), 30)
    assert np.asarray(union).size == 0 and np.asarray(sums).size == 0


@pytest.mark.parametrize("ops,to", OPS, ids=["torch", "tf"])
@pytest.mark.parametrize("universe", [40, 1 << 40], ids=["table", "search"])
def test_take_sorted_reads_the_keys_values_and_zero_elsewhere(ops, to, universe):
    keys = np.array([0, 3, 7, 39], np.int64)
    vals = np.array([1.5, -2.0, np.nan, 4.0], np.float32)
    x = np.array([39, 1, 7, 3, 3, 0, 38], np.int64)
    got = np.asarray(ops.take_sorted(to(keys), to(vals), to(x), universe))
    assert np.array_equal(got, np.array([4.0, 0.0, np.nan, -2.0, -2.0, 1.5, 0.0], np.float32), equal_nan=True)
    empty = np.asarray(ops.take_sorted(to(keys[:0]), to(vals[:0]), to(x), universe))
    assert np.array_equal(empty, np.zeros(len(x), np.float32))


@pytest.mark.parametrize("ops,to", OPS, ids=["torch", "tf"])
@pytest.mark.parametrize("bits", [1, 7, 15, 21, 31, 32, 63])
def test_packed_counts_add_as_the_counts_do_up_to_their_bound(ops, to, bits):
    # three ranks' counts of 300 bins (not a multiple of the lanes) whose sums reach 2^bits − 1,
    # the largest a bin may hold: the packed words' sum unpacks to the counts' sum
    rng = np.random.default_rng(bits)
    top = 2**bits - 1
    total = rng.integers(0, top + 1, 300, dtype=np.int64)
    total[:3] = [top, 0, top]
    first = (total * rng.uniform(0, 1, 300)).astype(np.int64)
    second = ((total - first) * rng.uniform(0, 1, 300)).astype(np.int64)
    parts = [first, second, total - first - second]
    words = [np.asarray(ops.pack_counts(to(p), bits)) for p in parts]
    assert words[0].dtype == np.int64 and len(words[0]) == -(-300 // (63 // bits))
    summed = ops.unpack_counts(to(words[0] + words[1] + words[2]), bits, 300)
    assert np.array_equal(np.asarray(summed), total)


@pytest.mark.parametrize("ops,to", OPS, ids=["torch", "tf"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_all_finite_finds_one_nan_or_infinity_anywhere(ops, to, dtype):
    """NaN, +inf and -inf at the first, a middle and the last element are each found; the
    greatest finite values and an empty vector are finite."""
    x = np.linspace(-1, 1, 1001).astype(dtype)
    assert bool(ops.all_finite(to(x)))
    for bad in (np.nan, np.inf, -np.inf):
        for at in (0, 500, 1000):
            y = x.copy()
            y[at] = bad
            assert not bool(ops.all_finite(to(y))), (bad, at)
    big = np.finfo(dtype).max
    assert bool(ops.all_finite(to(np.array([big, -big, big], dtype))))
    assert bool(ops.all_finite(to(np.zeros(0, dtype))))
