"""The baseline exchanges: their maths on P ranks simulated in one process (the library's
``SimulatedRanks``, the methods' own code), then on real Horovod ranks (2 and 4, gloo)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import horovodrun
from differ import assert_at_most, assert_equal, assert_ranks_agree

from gs_bench.baselines import GTopK, PowerSGD, SketchedSGD, TopKAllgather
from gs_horovod.codecs import CODECS
from gs_horovod.transports.collective_cost import total_wire_bytes
from gs_horovod.transports.simulated import SimulatedRanks

SHAPES = [(64, 48), (300,), (40, 40), (2000,)]  # (300,) is under min_size=1024: sent exactly
NAMES = [f"t{i}" for i in range(len(SHAPES))]


def grads(P: int, step: int, heavy: float = 0.0, planted: int = 0) -> list[list[torch.Tensor]]:
    """Per rank, a gradient per tensor of SHAPES (float32 N(0, 1), seeded by rank and step);
    tensor t2 scaled by 1 + ``heavy``; ``planted`` coordinates of t0 set to 20 on every rank."""
    out = []
    for r in range(P):
        g = torch.Generator().manual_seed(1000 * step + r)
        ts = [torch.randn(s, generator=g) * (1 + heavy * (i == 2)) for i, s in enumerate(SHAPES)]
        ts[0].view(-1)[torch.arange(planted) * 37] = 20.0
        out.append(ts)
    return out


def run(P: int, make, steps: int = 3, heavy: float = 0.0, planted: int = 0) -> list[dict]:
    """Each rank: its exchange over ``steps`` steps; returns per rank the updates of every
    step, a per step, the final residual, traffic."""

    def rank_fn(rank, comm):
        ex = make()
        updates, accs = [], []
        for step in range(steps):
            gs = grads(P, step, heavy, planted)[rank]
            before = ex.residual.clone() if ex.residual is not None else 0.0
            big = torch.cat([g.reshape(-1) for g in gs if g.numel() >= ex.min_size])
            accs.append(big + before)
            updates.append(ex.reduce(list(zip(NAMES, gs)), comm))
        return {"updates": updates, "accs": accs, "residual": ex.residual, "traffic": comm.traffic, "ex": ex}

    return SimulatedRanks(P).run(rank_fn)


def big_update(ex, update: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([u.reshape(-1) for u, s in zip(update, SHAPES) if math.prod(s) >= ex.min_size])


VARIANTS = {
    "topk": lambda r: TopKAllgather(ratio=r), "topk-layer": lambda r: TopKAllgather(ratio=r, scope="layer"),
    "gtopk": lambda r: GTopK(ratio=r), "gtopk-layer": lambda r: GTopK(ratio=r, scope="layer"),
    "gtopk-compact": lambda r: GTopK(ratio=r, wire="compact"),
    "sketched": lambda r: SketchedSGD(ratio=r), "sketched-layer": lambda r: SketchedSGD(ratio=r, scope="layer"),
    "powersgd-r1": lambda r: PowerSGD(rank=1), "powersgd-r4": lambda r: PowerSGD(rank=4),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_rank_gets_the_same_update_and_the_traffic_planned(variant):
    P = 4
    ranks = run(P, lambda: VARIANTS[variant](0.02))
    for step in range(3):
        for t in range(len(SHAPES)):
            assert all(torch.equal(r["updates"][step][t], ranks[0]["updates"][step][t]) for r in ranks)
    ex = ranks[0]["ex"]
    planned = ex.planned(SHAPES, P)
    for r in ranks:
        assert r["traffic"].last_step == planned
        assert r["traffic"].per_step()[1] == pytest.approx(total_wire_bytes(planned, P))


@pytest.mark.parametrize("variant", [v for v in VARIANTS if not v.startswith("powersgd") and v != "gtopk-compact"])
def test_ratio_one_is_the_dense_mean(variant):
    P = 2
    ranks = run(P, lambda: VARIANTS[variant](1.0), steps=1)
    mean = [sum(g[t] for g in grads(P, 0)) / P for t in range(len(SHAPES))]
    for r in ranks:
        for u, m in zip(r["updates"][0], mean):
            torch.testing.assert_close(u, m, rtol=0, atol=1e-6)


def test_powersgd_sends_matrices_that_would_not_shrink_as_the_dense_mean():
    """rank 64 ≥ min(n, m) of every tensor: the uncompressed path (no power iteration) is exact."""
    P = 2
    ranks = run(P, lambda: PowerSGD(rank=64), steps=1)
    mean = [sum(g[t] for g in grads(P, 0)) / P for t in range(len(SHAPES))]
    assert ranks[0]["ex"].qs == {}  # no matrix was compressed
    for u, m in zip(ranks[0]["updates"][0], mean):
        torch.testing.assert_close(u, m, rtol=0, atol=1e-6)


def spectrum(singular: list[float], n: int = 64, m: int = 48, seed: int = 0) -> torch.Tensor:
    """An n × m matrix U·diag(singular)·Vᵀ with random orthonormal U, V (its SVD by construction)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.linalg.qr(torch.randn(n, n, generator=g)).Q[:, :len(singular)]
    v = torch.linalg.qr(torch.randn(m, m, generator=g)).Q[:, :len(singular)]
    return u @ torch.diag(torch.tensor(singular)) @ v.T


def spread(mean: torch.Tensor, P: int, seed: int = 1) -> list[torch.Tensor]:
    """P full-rank matrices whose mean is ``mean`` (mean + N(0, 1) noise that sums to zero)."""
    g = torch.Generator().manual_seed(seed)
    noise = [torch.randn(mean.shape, generator=g) for _ in range(P)]
    return [mean + x - sum(noise) / P for x in noise]


def powersgd_steps(P: int, approx_rank: int, per_rank: list[torch.Tensor], steps: int) -> list[dict]:
    """PowerSGD(rank=approx_rank) on one matrix "w" for ``steps`` steps, each rank's gradient chosen so that
    its error-fed matrix a = e + g is ``per_rank[r]`` at every step (g = M_r − e): the power
    iteration then runs on the same mean matrix, warm-started. Per rank: updates, the names of
    the collectives issued, the Q kept."""

    def rank_fn(rank, comm):
        ex, updates = PowerSGD(rank=approx_rank), []
        for _ in range(steps):
            e = 0 if ex.residual is None else ex.residual.view_as(per_rank[rank])
            updates.append(ex.reduce([("w", per_rank[rank] - e)], comm)[0])
        return {"updates": updates, "names": list(comm.names), "q": ex.qs.get("w")}

    return SimulatedRanks(P).run(rank_fn)


@pytest.mark.parametrize("rank", [2, 4])
def test_powersgd_at_or_above_the_true_rank_is_exact(rank):
    """The ranks' mean has rank 2 (each rank's matrix has full rank 48): PowerSGD of rank r with
    2 ≤ r < min(n, m) = 48 compresses it (P and Q allreduces, a kept Q of m × r) and its first
    update is the mean itself, as the SVD says a rank-r approximation of it can be."""
    P, mean = 4, spectrum([30.0, 20.0])
    per_rank = spread(mean, P)
    assert torch.linalg.matrix_rank(per_rank[0]) == 48
    ranks = powersgd_steps(P, rank, per_rank, steps=1)
    for r in ranks:
        assert r["names"] == ["powersgd.p", "powersgd.q"] and tuple(r["q"].shape) == (48, rank)
        torch.testing.assert_close(r["updates"][0], mean, rtol=0, atol=1e-4)


def test_powersgd_below_the_true_rank_converges_to_the_svd_truncation():
    """Mean of full rank, singular values 50, 40, 30 then a tail of 45 below 1: rank 3 can at best
    leave the tail, ‖M − M_3‖_F = √(Σ_{i>3} σ_i²) (Eckart–Young). The first step (a random Q)
    leaves more; the warm-started power iteration reaches the SVD's rank-3 truncation M_3."""
    P, singular = 4, [50.0, 40.0, 30.0] + [0.95**i for i in range(45)]
    mean = spectrum(singular)
    ranks = powersgd_steps(P, 3, spread(mean, P), steps=4)
    u, s, vh = torch.linalg.svd(mean)
    best, tail = u[:, :3] @ torch.diag(s[:3]) @ vh[:3], s[3:].norm()
    errors = [float((x - mean).norm() / tail) for x in ranks[0]["updates"]]
    assert all(e >= 1 - 1e-5 for e in errors)  # no rank-3 matrix is closer than the tail
    assert errors[0] > 1.5  # one step from a random Q is not yet the truncation
    for r in ranks:
        assert r["names"] == ["powersgd.p", "powersgd.q"] * 4
        torch.testing.assert_close(r["updates"][-1], best, rtol=0, atol=1e-4)
        assert all(torch.equal(x, y) for x, y in zip(r["updates"], ranks[0]["updates"]))


@pytest.mark.parametrize("variant", ["topk", "topk-layer", "sketched", "powersgd-r1", "powersgd-r4"])
def test_nothing_is_lost_residuals_plus_updates_conserve_the_sum(variant):
    """Σ_ranks e_t + P·Δ_t = Σ_ranks a_t (for the compressed tensors), every step."""
    P = 4
    ranks = run(P, lambda: VARIANTS[variant](0.02), steps=1)
    ex = ranks[0]["ex"]
    total_a = sum(r["accs"][0] for r in ranks)
    total_e = sum(r["residual"] for r in ranks)
    torch.testing.assert_close(total_e + P * big_update(ex, ranks[0]["updates"][0]), total_a, rtol=0, atol=2e-5)


def top_stable(x: torch.Tensor, k: int) -> torch.Tensor:
    """The k largest |x|, ties to the smaller index."""
    return torch.sort(-x.abs(), stable=True).indices[:k]


def dense_gtopk(accs: list[torch.Tensor], k: int, wire=lambda v: v) -> torch.Tensor:
    """gTop-k as first written here: every merge through a dense D-vector and torch.topk; each
    set's values as ``wire`` carries them before every round."""
    P, D = len(accs), accs[0].numel()
    sets = []
    for a in accs:
        i = top_stable(a, k)
        sets.append(torch.zeros(D).index_put_((i,), a[i]))
    mask = 1
    while mask < P:
        merged = []
        sets = [wire(x) for x in sets]
        for r in range(P):
            s = sets[r] + sets[r ^ mask]
            i = top_stable(s, k)
            merged.append(torch.zeros(D).index_put_((i,), s[i]))
        sets, mask = merged, mask << 1
    return sets[0] / P


@pytest.mark.parametrize("P", [2, 4, 8])
def test_gtopk_sparse_merge_equals_the_dense_merge(P):
    ranks = run(P, lambda: GTopK(ratio=0.01), steps=1)
    ex = ranks[0]["ex"]
    k = ex.spans([math.prod(s) for s in SHAPES if math.prod(s) >= ex.min_size])[0].k
    expected = dense_gtopk([r["accs"][0] for r in ranks], k)
    torch.testing.assert_close(big_update(ex, ranks[0]["updates"][0]), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("P", [2, 4, 8])
def test_gtopk_with_compact_pairs_merges_the_values_as_they_travel_and_sends_under_half(P):
    """wire="compact" (a labelled variant): the dense merge of bfloat16-rounded sets, each
    rank's own rounding left in its residual, fewer than half the fp32 pairs' bytes."""
    ranks = run(P, lambda: GTopK(ratio=0.01, wire="compact"), steps=1)
    ex = ranks[0]["ex"]
    k = ex.spans([math.prod(s) for s in SHAPES if math.prod(s) >= ex.min_size])[0].k
    expected = dense_gtopk([r["accs"][0] for r in ranks], k, CODECS["compact"].rounded_torch)
    torch.testing.assert_close(big_update(ex, ranks[0]["updates"][0]), expected, rtol=0, atol=1e-6)
    for r in ranks:
        left = r["accs"][0] != r["residual"]
        assert torch.equal(r["residual"][left], (r["accs"][0] - CODECS["compact"].rounded_torch(r["accs"][0]))[left])
    fp32 = GTopK(ratio=0.01).planned(SHAPES, P)
    compact = ex.planned(SHAPES, P)
    pairs = [(c, f) for c, f in zip(compact, fp32) if c[0] == "pairwise"]
    assert len(pairs) == math.log2(P) and all(c[1] < 0.5 * f[1] for c, f in pairs)
    assert [tuple(c) for c in ranks[0]["traffic"].last_step] == compact


def test_global_scope_selects_across_tensors_layer_scope_per_tensor():
    """Tensor t2 is 100× larger: global top-k takes all k there; layer scope k per tensor."""
    P = 2
    sizes = [math.prod(s) for s in SHAPES if math.prod(s) >= 1024]
    for scope in ("global", "layer"):
        ranks = run(P, lambda scope=scope: TopKAllgather(ratio=0.01, scope=scope), steps=1, heavy=100.0)
        update = ranks[0]["updates"][0]
        nonzero = [int((u != 0).sum()) for u, s in zip(update, SHAPES) if math.prod(s) >= 1024]
        if scope == "global":
            assert nonzero[0] == nonzero[2] == 0 and 0 < nonzero[1] <= P * math.ceil(0.01 * sum(sizes))
        else:
            assert all(0 < n <= P * math.ceil(0.01 * d) for n, d in zip(nonzero, sizes))


def test_sketched_candidates_come_from_the_summed_sketch():
    """With k heavy coordinates planted, Sketched-SGD's summed sketch finds them: it applies
    exactly the top-k of Σ a, with their exact sums."""
    P, D = 4, sum(math.prod(s) for s in SHAPES if math.prod(s) >= 1024)
    k = math.ceil(0.01 * D)
    ranks = run(P, lambda: SketchedSGD(ratio=0.01), steps=1, planted=k)
    ex = ranks[0]["ex"]
    total = sum(r["accs"][0] for r in ranks)
    expected = torch.topk(total.abs(), k).indices.sort().values
    torch.testing.assert_close(big_update(ex, ranks[0]["updates"][0])[expected], total[expected] / P)
    assert torch.equal(big_update(ex, ranks[0]["updates"][0]).nonzero().reshape(-1), expected)


def test_bad_options_and_rank_counts_are_refused_by_name():
    with pytest.raises(ValueError, match="ratio"):
        TopKAllgather(ratio=0.0)
    with pytest.raises(ValueError, match="scope"):
        GTopK(scope="model")
    with pytest.raises(ValueError, match="min_size"):
        SketchedSGD(min_size=0)
    with pytest.raises(ValueError, match="rank"):
        PowerSGD(rank=0)
    with pytest.raises(ValueError, match="power-of-two"):
        run(3, lambda: GTopK(ratio=0.01), steps=1)


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}ranks")
def horovod_ranks(request, tmp_path_factory):
    ranks = horovodrun("baselines.py", request.param, "gloo", tmp_path_factory.mktemp(f"baselines{request.param}"))
    assert_equal(ranks[0]["scenarios"], [*HOROVOD_VARIANTS, "powersgd_against_svd"], "the scenarios run")
    return ranks


HOROVOD_VARIANTS = ["topk", "topk-layer", "gtopk", "gtopk-layer", "sketched", "powersgd-r1", "powersgd-r4"]


@pytest.mark.slow
@pytest.mark.parametrize("variant", HOROVOD_VARIANTS)
def test_horovod_uncompressed_setting_equals_dense_allreduce(horovod_ranks, variant):
    for rank, r in enumerate(horovod_ranks):
        assert_at_most(r[f"{variant}_full_max_abs_diff"], 1e-5, f"rank {rank}: max |ratio 1 - dense|")


@pytest.mark.slow
@pytest.mark.parametrize("variant", HOROVOD_VARIANTS)
def test_horovod_every_rank_applies_the_identical_update(horovod_ranks, variant):
    assert_ranks_agree([r[f"{variant}_digest"] for r in horovod_ranks], f"{variant}: the model after 4 steps")


@pytest.mark.slow
@pytest.mark.parametrize("variant", HOROVOD_VARIANTS)
def test_horovod_counted_collectives_are_the_planned_ones(horovod_ranks, variant):
    for rank, r in enumerate(horovod_ranks):
        assert_equal([tuple(c) for c in r[f"{variant}_collectives"]], [tuple(c) for c in r[f"{variant}_planned"]],
                     f"rank {rank}: the collectives counted vs planned")
        assert r[f"{variant}_wire"] == pytest.approx(r[f"{variant}_planned_wire"])


@pytest.mark.slow
@pytest.mark.parametrize("case", ["exact", "truncation"])
def test_horovod_powersgd_runs_its_power_iteration_against_the_svd(horovod_ranks, case):
    """On real ranks (tests/workers/baselines.py ``powersgd_against_svd``): full-rank matrices per
    rank, compressed (Q of 48 × r, one allreduce of P (64·r floats) and one of Q (48·r) a step);
    at or above the mean's true rank the update is the mean, below it the warm-started power
    iteration reaches the SVD's truncation, never closer than its tail."""
    rank = {"exact": 4, "truncation": 3}[case]
    for r in horovod_ranks:
        got = r[f"powersgd_{case}"]
        assert got["rank_of_mine"] == 48 and got["q_shape"] == [48, rank]
        planned = [("allreduce", 4.0 * 64 * rank), ("allreduce", 4.0 * 48 * rank)]
        assert [tuple(c) for c in got["collectives"]] == planned
        assert got["max_abs_from_truncation"] <= 1e-4
        if case == "exact":
            assert got["max_abs_from_mean"] <= 1e-4
        else:  # the tail is all a rank-3 matrix must leave (Eckart–Young)
            assert got["error_over_tail"] >= 1 - 1e-5
    assert_ranks_agree([r[f"powersgd_{case}"]["digest"] for r in horovod_ranks], f"{case}: the update")
