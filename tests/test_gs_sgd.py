"""The gs-SGD engine on simulated ranks (gs_horovod.transports.simulated: threads taking turns) and its options."""

from __future__ import annotations

import math
import threading
from dataclasses import replace

import numpy as np
import pytest
import torch

from gs_horovod.engine import GsConfig, GsSgd, Payload, Plan
from gs_horovod.engine.exchanges import EXCHANGES
from gs_horovod.kernels.hashing import hash_keys, reference_buckets_signs
from gs_horovod.kernels.torch_ops import TorchOps
from gs_horovod.torch import GsSketch
from gs_horovod.transports.collective_cost import total_wire_bytes
from gs_horovod.transports.simulated import SimulatedRanks

NAMES = ["a.weight", "b.weight"]


class Rank:
    """One rank's engine state across steps, kept as :class:`gs_horovod.engine.state.EngineState` keeps it
    (flat residual and momentum buffers); ``residuals`` / ``momenta``: per-tensor views."""

    def __init__(self, config: GsConfig, sizes: list[int], ranks: int) -> None:
        self.config, self.sizes = config, sizes
        self.plan = Plan.build(NAMES[:len(sizes)], sizes, config, ranks=ranks)
        self.residual = torch.zeros(sum(sizes))
        self.momentum = torch.zeros(sum(sizes)) if config.momentum else None
        self.steps = 0

    @property
    def residuals(self) -> list[torch.Tensor]:
        return list(torch.split(self.residual, self.sizes))

    @property
    def momenta(self) -> list[torch.Tensor]:
        return [] if self.momentum is None else list(torch.split(self.momentum, self.sizes))

    def step(self, comm, grads: list[torch.Tensor]):
        sgd = GsSgd(self.config, TorchOps(self.config.backend), comm)
        result = sgd.step(self.plan, grads, self.residual, self.momentum, self.steps, self.steps == 0)
        # kept whether applied or not, as TF's variables keep it: a skipped step must hand back the prior state
        self.residual, self.momentum, self.steps = result.residual, result.momentum, result.steps
        return list(torch.split(result.update, self.plan.all_sizes))


def run(config: GsConfig, grads: list[list[list[torch.Tensor]]], ranks: list[Rank] | None = None):
    """grads[step][rank][tensor]; returns (ranks, updates[step] of rank 0), asserting every
    rank got bitwise the same update."""
    sizes = [int(g.numel()) for g in grads[0][0]]
    ranks = ranks or [Rank(config, sizes, len(grads[0])) for _ in grads[0]]
    updates = []
    for step_grads in grads:
        results = SimulatedRanks(len(ranks)).run(lambda r, comm, g=step_grads: ranks[r].step(comm, g[r]))
        for res in results[1:]:
            assert all(torch.equal(u, v) for u, v in zip(res, results[0]))
        updates.append(results[0])
    return ranks, updates


def errors_of_every_rank(ranks: list[Rank], grads: list[list[torch.Tensor]], error: type) -> list:
    """One step of every rank (grads[rank][tensor]), each rank catching its own ``error``: what
    each rank raised (None where it did not), so a test sees every rank, not the first to fail."""
    def step(r, comm):
        try:
            ranks[r].step(comm, grads[r])
        except error as e:
            return e
        return None

    return SimulatedRanks(len(ranks)).run(step)


def heavy_tailed(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * torch.rand(*shape, generator=gen).pow(4) * 10


@pytest.mark.parametrize("exchange", ["sketch", "allgather"])
@pytest.mark.parametrize("scope", ["global", "layer"])
@pytest.mark.parametrize("prefilter", [0, 1, 2])
def test_exact_round_conserves_every_gradient(scope, prefilter, exchange):
    # Σ_steps Σ_ranks g = P · Σ_steps Δ + Σ_ranks e: every gradient applied or still held
    cfg = GsConfig(scope=scope, ratio=0.02, prefilter=prefilter, exchange=exchange, exact=True, backend="torch")
    gen = torch.Generator().manual_seed(0)
    P, sizes = 3, [3000, 1500]
    grads = [[[heavy_tailed(gen, d) for d in sizes] for _ in range(P)] for _ in range(4)]
    ranks, updates = run(cfg, grads)
    for t in range(len(sizes)):
        fed = sum(g[r][t].double() for g in grads for r in range(P))
        applied = sum(u[t].double() for u in updates)
        held = sum(rank.residuals[t].double() for rank in ranks)
        torch.testing.assert_close(P * applied + held, fed, rtol=1e-6, atol=1e-4)
    k = cfg.k_for(4500) if scope == "global" else cfg.k_for(3000) + cfg.k_for(1500)
    assert all(int(sum((x != 0).sum() for x in u)) == k for u in updates)


@pytest.mark.parametrize("exact", [True, False])
def test_tensors_below_min_size_are_averaged_exactly_in_the_same_step(exact):
    cfg = GsConfig(ratio=0.01, exact=exact, exchange="sketch", backend="torch")
    gen = torch.Generator().manual_seed(8)
    grads = [[torch.randn(4000, generator=gen)] for _ in range(2)]
    small = [[torch.randn(10, generator=gen), torch.randn(0)] for _ in range(2)]
    plan = Plan.build(["w"], [4000], cfg, ("b", "empty"), (10, 0), ranks=2)

    def rank(r, comm):
        sgd = GsSgd(cfg, TorchOps("torch"), comm)
        update = sgd.step(plan, grads[r], torch.zeros(4000), None, 0, True, small[r]).update
        return list(torch.split(update, plan.all_sizes))

    updates = SimulatedRanks(2).run(rank)
    assert [tuple(u.shape) for u in updates[0]] == [(4000,), (10,), (0,)]
    torch.testing.assert_close(updates[0][1], (small[0][0] + small[1][0]) / 2)
    assert int((updates[0][0] != 0).sum()) == 40


@pytest.mark.parametrize("exchange", ["sketch", "allgather"])
def test_without_the_exact_round_a_rank_drops_only_what_it_fed(exchange):
    cfg = GsConfig(ratio=0.01, candidates=1, exact=False, prefilter=1, exchange=exchange, wire="fp32", backend="torch")
    gen = torch.Generator().manual_seed(1)
    grads = [[[heavy_tailed(gen, 4000)] for _ in range(2)]]
    ranks, updates = run(cfg, grads)
    sel = updates[0][0] != 0
    for r, rank in enumerate(ranks):
        a = grads[0][r][0]
        fed = torch.zeros(4000, dtype=torch.bool)
        fed[torch.topk(a.abs(), 40).indices] = True
        torch.testing.assert_close(rank.residuals[0], torch.where(sel & fed, torch.zeros(4000), a))


def test_ratio_one_with_the_exact_round_is_the_dense_mean():
    cfg = GsConfig(ratio=1.0, rows=1, width=1.0, candidates=1, wire="fp32", backend="torch")
    gen = torch.Generator().manual_seed(2)
    grads = [[[torch.randn(2048, generator=gen), torch.randn(1024, generator=gen)] for _ in range(2)]]
    ranks, updates = run(cfg, grads)
    for t in range(2):
        torch.testing.assert_close(updates[0][t], (grads[0][0][t] + grads[0][1][t]) / 2, rtol=0, atol=1e-6)
    assert all(float(r.abs().max()) == 0 for rank in ranks for r in rank.residuals)


def test_a_planted_global_top_k_lands_entirely_in_the_tensor_that_holds_it():
    # tensor b holds the 25 largest coordinates of the whole vector: global scope sends only b
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(20_000, generator=gen) * 0.01, torch.randn(5_000, generator=gen) * 0.01
    planted = torch.randperm(5_000, generator=gen)[:25]
    b[planted] = 5.0 + torch.rand(25, generator=gen)
    cfg = GsConfig(k=25, rows=5, width=40.0, exchange="sketch", backend="torch")
    _, updates = run(cfg, [[[a, b], [a, b]]])
    assert int((updates[0][0] != 0).sum()) == 0
    assert torch.equal(torch.nonzero(updates[0][1]).flatten(), planted.sort().values)
    # layer scope spends k on each tensor instead
    _, layer = run(GsConfig(scope="layer", k=25, backend="torch"), [[[a, b], [a, b]]])
    assert int((layer[0][0] != 0).sum()) == 25


def test_candidates_let_the_exact_values_pick_the_final_k():
    # with m = 4 the sketch only has to rank the true top-k within 4k candidates (measured: 64 → 100 of 100)
    gen = torch.Generator().manual_seed(4)
    x = heavy_tailed(gen, 50_000)
    k = 100
    truth = set(torch.topk(x.abs(), k).indices.tolist())
    hits = {}
    for m in (1, 4):
        cfg = GsConfig(k=k, rows=5, width=8.0, candidates=m, prefilter=1, exchange="sketch", backend="torch")
        _, updates = run(cfg, [[[x], [x]]])
        hits[m] = len(truth & set(torch.nonzero(updates[0][0]).flatten().tolist()))
    assert hits[4] > hits[1] and hits[4] >= 0.9 * k


def test_global_sketch_equals_the_numpy_reference_bit_for_bit():
    # prefilter 0: the sketch of the two tensors concatenated, summed in coordinate order
    gen = torch.Generator().manual_seed(5)
    grads = [torch.randn(3000, generator=gen), torch.randn(1700, generator=gen)]
    cfg = GsConfig(ratio=0.01, prefilter=0, sketch_dtype="float32", exchange="sketch", backend="numba")
    plan = Plan.build(NAMES, [3000, 1700], cfg, ranks=1)

    class Capture:
        size, averages = 1, True

        def allreduce(self, x, name):
            self.payload = self.payload if hasattr(self, "payload") else x.clone()
            return x

        def same_on_every_rank(self, value, name):
            return True

    comm = Capture()
    GsSgd(cfg, TorchOps("numba"), comm).step(plan, grads, torch.zeros(4700), None, 0, False)
    x = torch.cat(grads).numpy()
    cols = cfg.cols_for(4700)
    buckets, signs = reference_buckets_signs(hash_keys(0), cols, 0, 4700, cfg.rows)
    expected = np.zeros((cfg.rows, cols), np.float32)
    for j in range(cfg.rows):
        for i in range(4700):  # the same order of additions as the kernel
            expected[j, buckets[j, i]] += signs[j, i] * x[i]
    assert np.array_equal(comm.payload.numpy().reshape(cfg.rows, cols), expected)


@pytest.mark.parametrize("exchange", ["sketch", "allgather", "sparse"])
@pytest.mark.parametrize("nonfinite", ["raise", "skip"])
@pytest.mark.parametrize("exact", [True, False])
def test_a_non_finite_step_commits_nothing_on_any_rank(nonfinite, exact, exchange):
    cfg = GsConfig(ratio=0.02, momentum=0.5, candidates=2 if exact else 1, prefilter=2, exact=exact,
                   nonfinite=nonfinite, exchange=exchange, backend="torch")
    gen = torch.Generator().manual_seed(6)
    clean = [[[torch.randn(3000, generator=gen), torch.randn(2000, generator=gen)] for _ in range(2)]]
    ranks, _ = run(cfg, clean)
    before = [[r.clone() for r in rank.residuals + rank.momenta] for rank in ranks]
    bad = [[torch.randn(3000, generator=gen), torch.randn(2000, generator=gen)] for _ in range(2)]
    bad[1][1][17] = float("nan")  # rank 1, tensor b.weight
    if nonfinite == "raise":
        for error in errors_of_every_rank(ranks, bad, FloatingPointError):
            assert "gradient of 'b.weight' is NaN or infinite on at least one rank at step 1; residuals are left " \
                   "as before the step" in str(error)
    else:
        _, updates = run(cfg, [bad], ranks)
        assert all(float(u.abs().max()) == 0 for u in updates[0])
    for rank, old in zip(ranks, before):
        assert rank.steps == 1
        assert all(torch.equal(x, y) for x, y in zip(rank.residuals + rank.momenta, old))


@pytest.mark.parametrize("exchange", ["sketch", "allgather", "sparse"])
def test_after_a_skipped_step_training_goes_on_alike(exchange):
    """nonfinite="skip": an Inf on rank 1 drops the whole step on every rank; the next, finite
    step applies k coordinates, the same on every rank (:func:`run` compares them)."""
    cfg = GsConfig(ratio=0.02, nonfinite="skip", apply="topk", exchange=exchange, backend="torch")
    gen = torch.Generator().manual_seed(15)
    grads = [[[heavy_tailed(gen, 3000), heavy_tailed(gen, 2000)] for _ in range(2)] for _ in range(2)]
    grads[0][1][0][5] = float("inf")
    ranks, updates = run(cfg, grads)
    assert [int(sum((u != 0).sum() for u in step)) for step in updates] == [0, cfg.k_for(5000)]
    assert [rank.steps for rank in ranks] == [1, 1]  # the skipped step hands back the prior count


def test_options_that_differ_across_ranks_fail_on_every_rank():
    sizes = [3000]
    ranks = [Rank(GsConfig(seed=0, backend="torch"), sizes, 2), Rank(GsConfig(seed=1, backend="torch"), sizes, 2)]
    grads = [torch.randn(3000)], [torch.randn(3000)]
    for error in errors_of_every_rank(ranks, grads, ValueError):
        assert "GsSketch options differ across ranks" in str(error)


@pytest.mark.parametrize("exchange", ["sketch", "allgather", "sparse"])
def test_a_selection_that_differs_on_one_rank_fails_on_every_rank(exchange, monkeypatch):
    """check_every=1: ranks that select alike pass the check; rank 1 selecting every coordinate
    one off (its sketch's heavy hitters, or the candidates its pair exchange returns after the
    exchange's collectives, so the ranks stay in step until the check) makes every rank raise."""
    cfg = GsConfig(ratio=0.02, check_every=1, exchange=exchange, backend="torch")
    gen = torch.Generator().manual_seed(14)
    grads = [[[heavy_tailed(gen, 3000)] for _ in range(2)] for _ in range(3)]
    ranks, _ = run(cfg, grads[:2])  # alike: checked at steps 0 and 1 without an error
    skewed = threading.local()  # .on in rank 1's thread
    if exchange == "sketch":
        heavy_hitters = TorchOps.heavy_hitters

        def off_by_one(self, table, keys, length, count):
            idx, est = heavy_hitters(self, table, keys, length, count)
            return ((idx + 1) % length, est) if getattr(skewed, "on", False) else (idx, est)

        monkeypatch.setattr(TorchOps, "heavy_hitters", off_by_one)
    else:
        pairs = type(EXCHANGES[exchange])
        nominate = pairs.nominate

        def off_by_one(self, *args):
            nominated = nominate(self, *args)
            if not getattr(skewed, "on", False):
                return nominated
            return nominated._replace(groups=[c._replace(idx=(c.idx + 1) % 3000) for c in nominated.groups])

        monkeypatch.setattr(pairs, "nominate", off_by_one)

    def step(r, comm):
        skewed.on = r == 1
        try:
            ranks[r].step(comm, grads[2][r])
        except RuntimeError as e:
            return str(e)
        return None

    assert SimulatedRanks(2).run(step) == ["GsSketch: ranks selected different coordinates at step 2 (checked because "
                                           "check_every is set); their models are diverging"] * 2


@pytest.mark.parametrize("exchange", ["sketch", "allgather", "sparse"])
def test_warmup_sends_dense_then_compresses(exchange):
    cfg = GsConfig(ratio=0.01, warmup_steps=2, exchange=exchange, apply="topk", backend="torch")
    gen = torch.Generator().manual_seed(7)
    grads = [[[torch.randn(5000, generator=gen)] for _ in range(2)] for _ in range(3)]
    ranks, updates = run(cfg, grads)
    for t in range(2):
        torch.testing.assert_close(updates[t][0], (grads[t][0][0] + grads[t][1][0]) / 2)
    assert int((updates[2][0] != 0).sum()) == 50 and ranks[0].steps == 3


def test_momentum_correction_masks_sent_coordinates():
    cfg = GsConfig(k=1, width=2000.0, momentum=0.5, candidates=1, backend="torch")
    g = torch.zeros(10_000)
    g[7], g[8] = 100.0, 1.0
    ranks, updates = run(cfg, [[[g]]])
    assert updates[0][0][7] == 100.0
    rank = ranks[0]
    assert rank.momenta[0][7] == 0 and rank.residuals[0][7] == 0
    assert rank.momenta[0][8] == 1.0 and rank.residuals[0][8] == 1.0
    _, updates = run(cfg, [[[g]]], ranks)  # u = 0.5·u + g, a = e + u: coordinate 7 again (100 > 2.5)
    assert updates[0][0][7] == 100.0 and rank.residuals[0][8] == 2.5 and rank.momenta[0][8] == 1.5


def test_auto_takes_the_allgather_while_it_costs_at_most_twice_the_sparse_exchange():
    # wire="fp32", D = 100,000, k = 1,000: the allgather's ring puts 2(P−1)·8k bytes through a rank;
    # the sparse exchange (P−1)/P · (2·8k alltoall + 4·H histograms + 2·8k allgather), H = two
    # rounds of 256 counts of b = bits(min(P·k, D)) bits, ⌊63/b⌋ to an 8-byte word: 1,024 bytes
    # for P < 17 (b ≤ 14: 4 a word), 1,376 from P = 100 (b = 17: 3 a word). So
    # 16,000 ≤ 2 · 36,096 / P: the allgather up to P = 4, the sparse exchange from 5 on
    fp32 = GsConfig(ratio=0.01, wire="fp32")
    plans = {P: Plan.build(["w"], [100_000], fp32, ranks=P) for P in (1, 2, 4, 5, 16, 1024)}
    assert {P: x.exchange for P, x in plans.items()} == {1: "allgather", 2: "allgather", 4: "allgather",
                                                          5: "sparse", 16: "sparse", 1024: "sparse"}
    assert (plans[4].exact, plans[4].apply, plans[5].exact, plans[5].apply) == (False, "all", False, "topk")
    wire = {P: total_wire_bytes(plans[P].collectives(GsConfig(ratio=0.01, wire="fp32")), P) for P in (5, 1024)}
    assert wire[5] == pytest.approx(36_096 * 4 / 5, rel=2e-2)
    assert wire[1024] == pytest.approx(37_504 * 1023 / 1024, rel=2e-2)
    # a tiny k: the histograms cost more than the pairs save, so the allgather runs longer
    # (k = 10: 2·8·10·(P−1) ≤ 2 · (4(P−1)/P · H + ...) holds to P = 34)
    tiny = GsConfig(k=10, wire="fp32")
    assert [Plan.build(["w"], [100_000], tiny, ranks=P).exchange for P in (34, 35)] == ["allgather", "sparse"]
    assert Plan.build(["w"], [100_000], GsConfig(exchange="sketch"), ranks=2).exchange == "sketch"
    assert Plan.build(["w"], [100_000], GsConfig(exchange="allgather"), ranks=64).exchange == "allgather"
    assert Plan.build(["w"], [100_000], GsConfig(exchange="sparse"), ranks=2).exchange == "sparse"


def test_auto_with_the_compact_wire_prices_the_encoded_bytes():
    # the defaults (wire="compact"), D = 100,000, k = 1,000: one message of k pairs (≈ 28 bits a
    # pair) against the sparse exchange's P framed messages of k/P pairs: the same rule, on the
    # bytes as encoded; it keeps the allgather to P = 5 here (fp32: to 4)
    def wire(P: int, exchange: str) -> float:
        cfg = GsConfig(ratio=0.01, exchange=exchange)
        return total_wire_bytes(Plan.build(["w"], [100_000], cfg, ranks=P).collectives(cfg), P)

    chosen = {P: Plan.build(["w"], [100_000], GsConfig(ratio=0.01), ranks=P).exchange for P in range(2, 65)}
    assert all(chosen[P] == ("allgather" if wire(P, "allgather") <= 2 * wire(P, "sparse") else "sparse")
               for P in chosen)
    assert max(P for P, e in chosen.items() if e == "allgather") == 5


@pytest.mark.parametrize("P", [5, 6, 7])
def test_auto_prices_the_allreduces_as_the_transport_runs_them(P):
    """transport="mpi" runs allreduces as a recursive-doubling tree (2⌈log2 P⌉·n through a rank),
    Horovod as a ring (4(P−1)/P·n): "auto" prices the sparse exchange's histograms and the small
    tensors on the transport's own. D = 1,280,000 + a 1,000-element tensor sent exactly, k = 1,280."""
    k, small = 1280, 4 * 1000
    ring, tree = 4 * (P - 1) / P, 2 * math.ceil(math.log2(P))
    gather = 2 * (P - 1) * 8 * k  # the allgather's ring

    def sparse(allreduce: float) -> float:
        # alltoall, two histograms (256 counts below 2^14, 4 to an 8-byte word: 512 bytes each),
        # each owner's share allgathered
        return 2 * (P - 1) / P * 8 * k + 2 * allreduce * 512 + 2 * (P - 1) * math.ceil(8 * k / P)

    expected = {kind: "allgather" if gather + per * small <= 2 * (sparse(per) + per * small) else "sparse"
                for kind, per in (("allreduce", ring), ("tree", tree))}
    assert expected == {5: {"allreduce": "allgather", "tree": "allgather"},
                        6: {"allreduce": "sparse", "tree": "allgather"},
                        7: {"allreduce": "sparse", "tree": "sparse"}}[P]
    cfg = GsConfig(ratio=0.001, wire="fp32")
    for kind in ("allreduce", "tree"):
        plan = Plan.split([("w", 1_280_000), ("b", 1000)], cfg, ranks=P, allreduce_kind=kind)
        assert plan.exchange == expected[kind]
        assert {c for c, _ in plan.collectives(cfg)} - {"allgather", "alltoall"} == {kind}
    tensors = [torch.zeros(1_280_000), torch.zeros(1000)]
    for transport, kind in (("horovod", "allreduce"), ("mpi", "tree")):
        step = GsSketch(transport=transport, ratio=0.001, wire="fp32").collectives_per_step(tensors, ranks=P)
        assert {c for c, _ in step} == {kind, "allgather"} | ({"alltoall"} if expected[kind] == "sparse" else set())
    with pytest.raises(ValueError, match="allreduce_kind"):
        Plan.split([("w", 1_280_000)], cfg, ranks=P, allreduce_kind="ring")

def test_the_allgather_nominates_the_largest_partial_sums_of_the_union():
    # without the exact round: Δ = (Σ over the ranks that fed i of a_r,i) / P on the k largest
    P, d, k = 3, 2000, 20
    gen = torch.Generator().manual_seed(11)
    grads = [[heavy_tailed(gen, d)] for _ in range(P)]
    cfg = GsConfig(k=k, prefilter=2, exact=False, apply="topk", exchange="allgather", wire="fp32", backend="torch")
    _, updates = run(cfg, [grads])
    partial = torch.zeros(d, dtype=torch.float64)
    for (g,) in grads:
        fed = torch.topk(g.abs(), 2 * k).indices
        partial[fed] += g[fed].double()
    best = torch.topk(partial.abs(), k).indices
    expected = torch.zeros(d, dtype=torch.float64)
    expected[best] = partial[best] / P
    torch.testing.assert_close(updates[0][0].double(), expected, rtol=1e-6, atol=1e-6)


def test_the_allgather_applying_its_whole_union_is_top_k_allgather():
    # exact=False, apply="all": every rank's top-k pairs, summed over the union, all applied;
    # each rank drops its whole top-k set: the top-k allgather baseline (global scope)
    from gs_bench.baselines import TopKAllgather

    P, sizes = 3, [3000, 1500]
    gen = torch.Generator().manual_seed(13)
    grads = [[[heavy_tailed(gen, d) for d in sizes] for _ in range(P)] for _ in range(3)]
    cfg = GsConfig(ratio=0.01, exact=False, apply="all", exchange="allgather", wire="fp32", backend="torch")
    ranks, updates = run(cfg, grads)
    baselines = [TopKAllgather(ratio=0.01, backend="torch") for _ in range(P)]
    group = SimulatedRanks(P)
    for step, step_grads in enumerate(grads):
        named = [[(n, g) for n, g in zip(NAMES, step_grads[r])] for r in range(P)]
        expected = group.run(lambda r, comm, named=named: baselines[r].reduce(named[r], comm))[0]
        for got, want in zip(updates[step], expected):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
            assert torch.equal(got != 0, want != 0)
    for rank, base in zip(ranks, baselines):
        torch.testing.assert_close(rank.residual, base.residual, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("exchange", ["sketch", "allgather"])
def test_apply_all_applies_every_exact_value_fetched(exchange):
    cfg = GsConfig(k=30, candidates=2, prefilter=2, apply="all", exchange=exchange, backend="torch")
    gen = torch.Generator().manual_seed(12)
    grads = [[[heavy_tailed(gen, 3000)] for _ in range(3)] for _ in range(3)]
    ranks, updates = run(cfg, grads)
    assert all(int((u[0] != 0).sum()) == 60 for u in updates)
    fed = sum(g[r][0].double() for g in grads for r in range(3))
    held = sum(rank.residuals[0].double() for rank in ranks)
    torch.testing.assert_close(3 * sum(u[0].double() for u in updates) + held, fed, rtol=1e-6, atol=1e-4)


def test_k_larger_than_a_group_is_an_error_naming_it():
    with pytest.raises(ValueError, match="k=5000 exceeds the 4096 elements of 'fc.weight'"):
        Plan.build(["fc.weight"], [4096], GsConfig(k=5000, scope="layer"), ranks=4)


def test_sizes_and_bytes_follow_the_options():
    cfg = GsConfig(ratio=0.01, rows=3, width=2.0, candidates=2, sketch_dtype="float16", exchange="sketch",
                   wire="fp32")
    plan = Plan.build(NAMES, [60_000, 40_000], cfg, ("c.bias",), (10,), ranks=2)
    (grp,) = plan.groups
    assert (grp.k, grp.cols, grp.fed, grp.nominated) == (1000, 2000, 1000, 2000)
    assert plan.payload_bytes(cfg) == Payload(sketch=3 * 2000 * 2, exact=2000 * 4, dense=10 * 4)
    assert plan.collectives(cfg) == [("allreduce", 12_000.0), ("allreduce", 8040.0)]
    # the allgather sends (int32, f32) per pre-filtered coordinate and nominates at most L·k
    # (candidates above the pre-filter are an error there)
    one = replace(cfg, candidates=1, exact=True)
    gathered = Plan.build(NAMES, [60_000, 40_000], replace(one, exchange="allgather"), ("c.bias",), (10,), ranks=2)
    assert gathered.groups[0].nominated == 1000
    assert gathered.payload_bytes(cfg) == Payload(gather=8 * 1000, exact=1000 * 4, dense=10 * 4)
    # the sparse exchange: the pairs by alltoall, two rounds of 256 counts (each below 4 · 1000 <
    # 2^12: five 12-bit counts to an 8-byte word, 52 words a round), an even share of the
    # selection by allgather
    sparse = Plan.build(NAMES, [60_000, 40_000], replace(one, exchange="sparse"), ("c.bias",), (10,), ranks=4)
    assert sparse.payload_bytes(cfg) == Payload(gather=2000, alltoall=8000, select=2 * 52 * 8, exact=4000, dense=40)
    assert sparse.collectives(cfg) == [("alltoall", 8000.0), ("allreduce", 416.0), ("allreduce", 416.0),
                                       ("allgather", 2000.0), ("allreduce", 4040.0)]
    layer = Plan.build(NAMES, [60_000, 40_000], GsConfig(scope="layer", ratio=0.01, sketch_dtype="float32"), ranks=4)
    assert [g.k for g in layer.groups] == [600, 400]
    assert GsConfig(k=50).k_for(2000) == 50


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"ratio": 0.0}, ValueError, r"ratio must be in \(0.0, 1.0\]"),
        ({"ratio": 1.5}, ValueError, "ratio"),
        ({"ratio": "0.1"}, TypeError, "ratio must be a number"),
        ({"ratio": 0.1, "k": 10}, ValueError, "give either ratio or k, not both"),
        ({"k": 0}, ValueError, "k must be in"),
        ({"k": 2.5}, TypeError, "k must be an int"),
        ({"rows": 0}, ValueError, "rows must be in"),
        ({"width": 0}, ValueError, "width must be in"),
        ({"width": 0.5}, ValueError, r"width must be in \[1.0, "),
        ({"candidates": 0}, ValueError, "candidates must be in"),
        ({"candidates": 2, "exact": False}, ValueError, "candidates=2 needs the exact round"),
        ({"prefilter": -1}, ValueError, "prefilter must be in"),
        ({"scope": "model"}, ValueError, "scope must be one of"),
        ({"sketch_dtype": "bfloat16"}, ValueError, "sketch_dtype must be one of"),
        ({"seed": -1}, ValueError, "seed"),
        ({"exact": 1}, TypeError, "exact must be a bool"),
        ({"momentum": 1.0}, ValueError, "momentum"),
        ({"backend": "opencl"}, ValueError, "backend must be one of"),
        ({"min_size": True}, TypeError, "min_size must be an int"),
        ({"nonfinite": "ignore"}, ValueError, "nonfinite must be one of"),
        ({"check_every": -1}, ValueError, "check_every must be in"),
        ({"apply": "best"}, ValueError, "apply must be one of"),
        ({"exchange": "gather"}, ValueError, "exchange must be one of"),
    ],
)
def test_invalid_options_are_named(options, error, match):
    with pytest.raises(error, match=match):
        GsConfig(**options)
    with pytest.raises(error, match=match):
        GsSketch(**options)


def test_unknown_option_is_named():
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['ratoi'\]"):
        GsSketch(ratoi=0.1)


def test_compress_outside_a_distributed_optimizer_is_an_error():
    with pytest.raises(RuntimeError, match="inside hvd.DistributedOptimizer"):
        GsSketch.compress(torch.randn(5000))


def test_integer_and_sparse_tensors_pass_through():
    for t in (torch.arange(5000), torch.randn(3000).to_sparse()):
        out, ctx = GsSketch.compress(t)
        assert out is t and ctx is None and GsSketch.decompress(out, ctx) is t
