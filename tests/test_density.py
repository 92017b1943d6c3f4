"""The adaptive density (ratio="auto", the default): the rule from injected timings, agreement
across ranks that measure differently, what each level sends, and checkpoints across a change
of level. Simulated ranks with a modelled link and an injected compute clock, so every number
is deterministic."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import horovodrun, torchrun
from differ import assert_equal, assert_ranks_agree

from gs_horovod.engine import CommStats, EngineState, GsConfig, GsSgd, Plan
from gs_horovod.engine.density import BLIND, CHOICES, DENSE, LEVELS, WINDOW, Density, choose, ramp_floor, schedule
from gs_horovod.kernels.torch_ops import TorchOps
from gs_horovod.transports.collective_cost import total_wire_bytes
from gs_horovod.transports.simulated import SimulatedRanks

D = 200_000


def wire_of(level: float, ranks: int = 2) -> float:
    plan = Plan.build(["w"], [D], GsConfig(), ranks=ranks, level=level)
    return total_wire_bytes(plan.collectives(GsConfig()), ranks)


# --- the rule, from injected seconds ---------------------------------------------------------

def test_a_fast_link_stays_dense():
    dense = {DENSE: 0.01}  # 10 ms of exchange against 100 ms of compute
    assert choose(0.5, 0.1, dense, wire_of) == DENSE


def test_a_slow_link_goes_sparse_and_as_dense_as_the_budget_allows():
    per_byte = 0.5 / wire_of(DENSE)  # the dense exchange took 0.5 s
    chosen = choose(0.5, 0.1, {DENSE: 0.5}, wire_of)
    assert chosen in LEVELS
    assert wire_of(chosen) * per_byte <= 0.05, "the chosen level's predicted seconds exceed the budget"
    denser = CHOICES[CHOICES.index(chosen) + 1]
    assert wire_of(denser) * per_byte > 0.05, f"{denser} also fits the budget, yet {chosen} was chosen"


def test_the_selections_own_seconds_do_not_push_k_down_but_can_make_dense_the_choice():
    unmeasured = choose(0.5, 0.1, {DENSE: 0.12}, wire_of)
    assert unmeasured in LEVELS
    slow_selection = {DENSE: 0.12, unmeasured: 0.15}  # its window: 0.15 s, mostly the selection
    assert choose(0.5, 0.1, {**slow_selection, unmeasured: 0.055}, wire_of) == unmeasured
    assert choose(0.5, 0.1, slow_selection, wire_of) == DENSE, "dense costs less than the sparse level"


def test_before_any_sparse_level_ran_dense_is_left_only_for_twice_the_budget():
    """The first trial of a sparse level is priced without the selection's seconds, so the rule
    leaves dense only where its tail exceeds BLIND times the budget; once a sparse level was
    measured, the plain comparison holds."""
    allowed = 0.5 * 0.1
    just_under, just_over = {DENSE: BLIND * allowed * 0.99}, {DENSE: BLIND * allowed * 1.01}
    assert choose(0.5, 0.1, just_under, wire_of) == DENSE
    tried = choose(0.5, 0.1, just_over, wire_of)
    assert tried in LEVELS
    assert choose(0.5, 0.1, {**just_under, tried: allowed * 0.9}, wire_of) == tried, "measured: plain rule"
    assert choose(0.5, 0.1, {DENSE: allowed * 0.99}, wire_of) == DENSE


def test_bounds_the_sparsest_level_when_nothing_fits_and_dense_at_one_rank():
    assert choose(0.5, 0.001, {DENSE: 100.0}, wire_of) == LEVELS[0]
    assert choose(0.5, 0.1, {}, lambda level: 0.0) == DENSE  # one rank: no wire at any level


def test_more_compute_a_step_buys_a_denser_level():
    per_second = {DENSE: 1.0}
    chosen = [choose(0.5, compute, per_second, wire_of) for compute in (0.001, 0.1, 0.5, 1.0, 3.0)]
    assert chosen == sorted(chosen) and chosen[0] == LEVELS[0] and chosen[-1] == DENSE, chosen
    assert len(set(chosen)) >= 4, chosen


def test_a_window_takes_the_least_exchange_and_the_slowest_compute():
    d = Density(DENSE, WINDOW)
    waited = np.array([[0.5, 0.30, 0.30, WINDOW, 0], [0.4, 0.05, 0.05, WINDOW, 0]])  # rank 0 waited for rank 1
    assert d.decide(lambda local: waited, wire_of, 0.5) == DENSE  # 0.01 s of exchange ≤ 0.5 · 0.1 s
    assert d.seconds == {DENSE: 0.01} and d.links == {DENSE: 0.01} and d.measured == 0
    d = Density(DENSE, WINDOW)
    assert d.decide(lambda local: waited[::-1] * [1, 12, 12, 1, 1], wire_of, 0.5) in LEVELS  # 0.12 s > 2 · 0.05 s


def test_a_dense_step_beside_backward_costs_its_tail_and_prices_bytes_by_its_link():
    """Overlapped dense steps: the exposed seconds t_x decide dense against sparse, the link's
    seconds t_l price a byte for the sparse levels."""
    hidden = {DENSE: 0.01}  # 0.01 s exposed after backward
    assert choose(0.5, 0.1, hidden, wire_of, {DENSE: 0.5}) == DENSE  # the tail fits the budget
    tail = {DENSE: 0.2}
    by_link, by_tail = choose(0.5, 0.1, tail, wire_of, {DENSE: 0.6}), choose(0.5, 0.1, tail, wire_of)
    assert by_link in LEVELS and by_tail in LEVELS and by_link < by_tail, (by_link, by_tail)
    d = Density()
    d.observe(None, 1.0)
    d.observe(0.1, 9.0)  # the level's first step: not counted
    for _ in range(WINDOW):
        d.observe(0.1, 0.2, 0.6)
    assert d.decide(lambda local: local[None], wire_of, 0.5) == by_link
    assert d.seconds[DENSE] == pytest.approx(0.2) and d.links[DENSE] == pytest.approx(0.6)


def test_the_ramp_falls_as_dgc_by_a_quarter_of_its_steps_and_never_lowers_the_budgets_level():
    floors = [ramp_floor(s, 40) for s in range(44)]
    assert floors == [0.2] * 10 + [0.05] * 10 + [0.02] * 10 + [0.005] * 10 + [0.0] * 4
    assert ramp_floor(0, 0) == 0.0 and ramp_floor(3, 4) == 0.005
    assert schedule(0.001, 0, 40, False) == 0.2 and schedule(0.1, 25, 40, False) == 0.1
    assert schedule(DENSE, 0, 40, False) == DENSE and schedule(0.001, 40, 40, False) == 0.001
    assert schedule(0.001, 40, 40, True) == DENSE, "a critical regime is sent dense"


def test_a_level_the_ramp_forced_is_not_learned_from():
    """The ramp's 0.2 (here 1 s a step, mostly its selection and union) would price every sparse
    level and make dense the rule's choice after the ramp; its seconds are not recorded."""
    d = Density(DENSE, WINDOW, seconds={DENSE: 0.5})
    rows = {DENSE: [0.1, 0.5, 0.5, 1, 0], 0.2: [0.1, 1.0, 1.0, 1, 0], 0.005: [0.1, 0.02, 0.02, 1, 0]}
    levels = []
    for step in (6, 8, 40, 46):
        d.measured = WINDOW
        every = np.array([rows.get(d.level, rows[0.005])] * 2) * WINDOW
        levels.append(d.decide(lambda local, every=every: every, wire_of, 0.5, step=step, ramp=40))
    ruled = levels[-1]
    assert levels[:2] == [0.2, 0.2] and ruled in LEVELS and ruled < 0.2, levels
    assert 0.2 not in d.seconds and not d.forced, d.seconds


def test_a_critical_regime_is_a_change_of_the_mean_gradient_norm_by_eta():
    """The ranks' mean ‖g‖ of successive windows: 1.0, 1.4 (+40 %), 2.2 (+57 %), 2.3 (+5 %),
    1.1 (-52 %); a 0.5 s dense step against 0.1 s of compute: sparse unless critical."""
    d = Density(0.01, WINDOW, seconds={DENSE: 0.5})
    levels = []
    for norm in [1.0, 1.4, 2.2, 2.3, 1.1]:
        d.measured = WINDOW
        seconds = 0.5 if d.level == DENSE else 0.001
        every = np.array([[0.1, seconds, seconds, 1, 0.5 * norm], [0.1, seconds, seconds, 1, 1.5 * norm]]) * WINDOW
        levels.append(d.decide(lambda local, every=every: every, wire_of, 0.5, critical=0.5))
        assert d.last_norm == pytest.approx(norm)
    sparse = levels[0]
    assert sparse in LEVELS and levels == [sparse, sparse, DENSE, sparse, DENSE], levels
    assert d.forced and Density.from_state(d.state_dict()) == d  # the last DENSE is the regime's, not the rule's
    d.restart()
    assert d.last_norm is None and not d.forced and d.norm == 0.0


def test_density_state_survives_its_state_dict():
    d = Density(0.02, 3, 0.4, 0.1, {DENSE: 0.5, 0.02: 0.04}, 1, 0.3, {DENSE: 0.9, 0.02: 0.04}, 2.5, 0.7, True)
    assert Density.from_state(d.state_dict()) == d
    before_links = {k: v for k, v in d.state_dict().items()
                    if k not in ("link", "links", "norm", "last_norm", "forced")}
    assert Density.from_state(before_links) == Density(0.02, 3, 0.4, 0.1, {DENSE: 0.5, 0.02: 0.04}, 1, 0.1)
    with pytest.raises(ValueError, match="saved density level 0.3"):
        Density.from_state({**d.state_dict(), "level": 0.3})


# --- options ---------------------------------------------------------------------------------

def test_auto_is_the_default_and_explicit_ratio_or_k_is_fixed():
    assert GsConfig().adaptive and GsConfig(ratio="auto") == GsConfig()
    assert not GsConfig(ratio=0.01).adaptive and not GsConfig(k=10).adaptive
    assert GsConfig().k_for(10_000) == 100  # a plan built outside a measured step: 0.01
    assert GsConfig().k_for(10_000, 0.05) == 500


@pytest.mark.parametrize("options, match", [
    ({"budget": 0.0}, r"budget must be in \(0.0"),
    ({"budget": 0.5, "ratio": 0.01}, "budget applies to ratio='auto' only, not with a fixed ratio"),
    ({"budget": 0.5, "k": 10}, "budget applies to ratio='auto' only, not with a fixed k"),
    ({"ramp": 100, "ratio": 0.01}, r"ramp applies to ratio='auto' only, not with a fixed ratio \(ramp=100\)"),
    ({"critical": 0.5, "k": 10}, r"critical applies to ratio='auto' only, not with a fixed k \(critical=0.5\)"),
    ({"ramp": -1}, r"ramp must be in \[0, "),
    ({"critical": -0.5}, r"critical must be in \[0.0, "),
    ({"candidates": 4}, "candidates=4 exceeds prefilter=1"),
    ({"candidates": 4, "prefilter": 2, "exchange": "sparse"}, "candidates=4 exceeds prefilter=2"),
])
def test_bad_density_options_raise_naming_them(options, match):
    with pytest.raises(ValueError, match=match):
        GsConfig(**options)


def test_candidates_above_the_prefilter_are_fine_where_nothing_caps_them():
    GsConfig(candidates=4, exchange="sketch")
    GsConfig(candidates=4, prefilter=0)
    plan = Plan.build(["w"], [D], GsConfig(ratio=0.01, candidates=4, prefilter=4), ranks=8)
    assert plan.groups[0].nominated == 4 * plan.groups[0].k  # not capped


def test_a_level_is_only_for_auto():
    with pytest.raises(ValueError, match="ratio='auto' only"):
        Plan.build(["w"], [D], GsConfig(ratio=0.01), ranks=2, level=0.02)


# --- on simulated ranks ----------------------------------------------------------------------

class Run:
    """P simulated ranks on a modelled link; each step adds ``compute[rank]`` seconds of
    injected compute to the rank's clock, which otherwise counts only the link."""

    def __init__(self, ranks: int, link: tuple[float, float], compute: list[float], **options):
        self.group = SimulatedRanks(ranks, link=link)
        self.compute, self.fake = compute, [0.0] * ranks
        config = GsConfig(backend="torch", **options)
        self.states = [EngineState(GsSgd(config, TorchOps("torch"), comm), CommStats(),
                                   clock=lambda comm=comm: comm.link_seconds + self.fake[comm.rank])
                       for comm in self.group.comms]

    def steps(self, count: int, first: int = 0, scale: float = 1.0) -> list[dict[str, torch.Tensor]]:
        updates = []
        for t in range(first, first + count):
            def one(rank, comm, t=t):
                self.fake[rank] += self.compute[rank]
                g = torch.randn(D, generator=torch.Generator().manual_seed(1000 * t + rank)) * scale
                return self.states[rank].step({"w": g, "b": torch.ones(10) * rank})
            updates.append(self.group.run(one))
        return updates

    def levels(self, count: int, first: int = 0, scale: float = 1.0) -> list[float]:
        """The level of each of ``count`` steps, the same on every rank."""
        out = []
        for t in range(first, first + count):
            self.steps(1, t, scale)
            assert len({s.stats.density for s in self.states}) == 1, f"the ranks' levels differ at step {t}"
            out.append(self.states[0].stats.density)
        return out


SLOW = (5e-5, 1.25e7)  # 100 Mbit/s
FAST = (5e-5, 1.25e9)  # 10 Gbit/s


def test_dense_steps_first_in_float16_then_the_link_decides():
    slow, fast = Run(2, SLOW, [0.02, 0.02]), Run(2, FAST, [0.02, 0.02])
    slow.steps(1)
    stats = slow.states[0].stats
    assert stats.density == DENSE and stats.dense_bytes == (D + 10) * 2, "the first step is dense float16"
    slow.steps(3 * (WINDOW + 1))
    fast.steps(3 * (WINDOW + 1) + 1)
    assert fast.states[0].stats.density == DENSE and fast.states[0].stats.density_changes == 0
    level = slow.states[0].stats.density
    assert level in LEVELS and slow.states[0].plan.groups[0].k == math.ceil(level * D)
    assert stats.density_changes >= 1


def test_ranks_that_measure_differently_choose_alike_from_the_slowest_compute_and_least_exchange():
    run = Run(3, SLOW, [0.01, 0.03, 0.06])
    run.steps(2 * (WINDOW + 1) + 1)
    levels = {s.density.level for s in run.states}
    assert len(levels) == 1
    seconds = run.states[0].density.seconds[DENSE]
    link = [c.link_seconds for c in run.group.comms]
    assert seconds <= min(link) / (2 * (WINDOW + 1)) * 1.01, "the exchange is not the least of the ranks'"

    def wire(level: float) -> float:
        return run.states[0]._wire([("b", 10), ("w", D)], level)

    expected = choose(0.5, 0.06, {DENSE: seconds}, wire)
    assert levels == {expected}, "the level is not the one the slowest rank's compute (0.06 s) gives"
    assert expected != choose(0.5, 0.03, {DENSE: seconds}, wire), "the test cannot tell the max from the mean"


def test_the_ramp_holds_the_level_above_its_floor_then_hands_it_back_to_the_budget():
    plain = Run(2, SLOW, [0.0005, 0.0005]).levels(60)
    ramped = Run(2, SLOW, [0.0005, 0.0005], ramp=48).levels(60)
    assert set(plain[WINDOW + 2:]) == {plain[-1]} and plain[-1] < 0.005, plain
    assert all(level >= ramp_floor(t, 48) for t, level in enumerate(ramped)), ramped
    assert {0.2, 0.05, 0.02, 0.005} <= set(ramped[:48]) and ramped[-1] == plain[-1], ramped


def test_a_jump_of_the_gradient_norm_sends_the_next_window_dense_on_every_rank():
    plain, critical = Run(2, SLOW, [0.0005, 0.0005]), Run(2, SLOW, [0.0005, 0.0005], critical=0.5)
    assert critical.levels(30) == plain.levels(30), "a steady norm is no critical regime"
    after = critical.levels(30, 30, scale=3.0)
    assert DENSE in after[:2 * (WINDOW + 1)] and after[-1] == plain.levels(30, 30, scale=3.0)[-1], after
    norms = [s.density.last_norm for s in critical.states]
    assert norms[0] == norms[1] == pytest.approx(3 * math.sqrt(D), rel=0.02), "not the ranks' agreed mean ‖g‖"


def test_a_restore_across_a_change_of_level_continues_bitwise():
    whole = Run(2, SLOW, [0.02, 0.02])
    whole.steps(2 * (WINDOW + 1))
    assert whole.states[0].density.changes >= 1, "no change of level before the checkpoint"
    saved = [s.tensors() for s in whole.states]
    clocks = [(s._ended, c.link_seconds) for s, c in zip(whole.states, whole.group.comms)]
    fake = list(whole.fake)
    later = whole.steps(2 * WINDOW, first=2 * (WINDOW + 1))
    assert len(whole.states[0].density.seconds) >= 2, "no decision after the checkpoint"

    def resumed(restore: bool) -> tuple[Run, list]:
        run = Run(2, SLOW, [0.02, 0.02])
        run.fake = list(fake)
        for state, comm, tensors, (ended, link) in zip(run.states, run.group.comms, saved, clocks):
            state.restore(tensors if restore else {n: {**t, "density": None} for n, t in tensors.items()})
            state._ended, comm.link_seconds = ended, link  # the clock as the uninterrupted run had it
        return run, run.steps(2 * WINDOW, first=2 * (WINDOW + 1))

    run, again = resumed(True)
    assert run.states[0].density == whole.states[0].density
    for a, b in zip(later, again):
        for x, y in zip(a, b):
            for name in x:
                assert torch.equal(x[name], y[name]), f"update of {name} differs after the restore"
    _, control = resumed(False)  # the residuals without the saved density: another level
    assert not all(torch.equal(x["w"], y["w"]) for a, b in zip(later, control) for x, y in zip(a, b))


def test_a_dense_float16_overflow_raises_on_every_rank_and_says_so():
    run = Run(2, SLOW, [0.02, 0.02])
    run.steps(1)
    before = [s.residual.clone() for s in run.states]

    def one(rank, comm):
        with pytest.raises(FloatingPointError, match="overflowed float16"):
            run.states[rank].step({"w": torch.full((D,), 1e6), "b": torch.ones(10)})

    run.group.run(one)
    assert all(torch.equal(s.residual, b) for s, b in zip(run.states, before))


def test_an_explicit_ratio_keeps_a_fixed_level():
    run = Run(2, SLOW, [0.02, 0.02], ratio=0.01)
    run.steps(2 * (WINDOW + 1))
    state = run.states[0]
    assert state.density is None and state.stats.density == 0.0
    assert state.plan.groups[0].k == math.ceil(0.01 * D)


def test_every_rank_gets_every_ranks_measurements_alike():
    group = SimulatedRanks(3)
    states = [EngineState(GsSgd(GsConfig(), TorchOps("torch"), c), CommStats()) for c in group.comms]
    got = group.run(lambda r, c: states[r]._share(np.array([r, 2.0 * r, 1.0])))
    assert all(np.array_equal(g, got[0]) for g in got)
    assert np.array_equal(got[0], [[0, 0, 1], [1, 2, 1], [2, 4, 1]])


# --- every torch adapter on real ranks, with the adaptive default ---------------------------

FIRST_DECISION = WINDOW + 2  # step 0 has no compute before it; step 1 is a level's first


@pytest.fixture(scope="module", params=["horovod", "ddp", "fsdp", "tensorflow"])
def adapter_ranks(request, tmp_path_factory):
    if request.param == "tensorflow":
        pytest.importorskip("tensorflow")
    out = tmp_path_factory.mktemp(f"density_{request.param}")
    if request.param in ("horovod", "tensorflow"):
        ranks = horovodrun("density_ranks.py", 2, "gloo", out, request.param)
    else:
        ranks = torchrun("density_ranks.py", 2, out, request.param)
    assert_equal(ranks[0]["scenarios"], ["tight", "loose", "ramped"], f"{request.param}: the scenarios run")
    return ranks


@pytest.mark.slow
def test_every_adapter_starts_dense_then_every_rank_takes_the_chosen_level(adapter_ranks):
    for r in adapter_ranks:
        tight, loose = r["tight"], r["loose"]
        assert tight["levels"][:FIRST_DECISION] == [DENSE] * FIRST_DECISION, tight["levels"]
        assert tight["levels"][FIRST_DECISION:] == [LEVELS[0]] * (len(tight["levels"]) - FIRST_DECISION), \
            tight["levels"]
        assert tight["changes"] == 1 and tight["gather_bytes"] > 0
        assert loose["levels"] == [DENSE] * len(loose["levels"]) and loose["changes"] == 0
        assert loose["gather_bytes"] == 0 and loose["dense_bytes"] > 0
        ramped = r["ramped"]["levels"]
        assert ramped == [DENSE] * FIRST_DECISION + [0.05] * (len(ramped) - FIRST_DECISION), \
            f"the ramp's 0.05 does not hold after the first window under the tight budget: {ramped}"
        assert r["tight"]["last_norm"] is None, "the gradient norm is measured without critical"
    norms = [r["ramped"]["last_norm"] for r in adapter_ranks]
    assert norms[0] is not None and norms[0] > 0 and len(set(norms)) == 1, \
        f"the ranks' first window's mean gradient norm under critical: {norms}"
    for label in ("tight", "loose", "ramped"):
        digests = [r[label]["digests"] for r in adapter_ranks]
        assert_ranks_agree(digests, f"{label}: the model's digest after each step")
        assert len(set(digests[0])) == len(digests[0]), f"{label}: the model did not change every step"


@pytest.mark.slow
def test_tensorflow_checkpoints_carry_the_density(adapter_ranks):
    """TensorFlow's GsSketch: ``local_state_dict()`` holds the rule's state after a change of
    level, and a fresh GsSketch that loads it holds the same (before its first step)."""
    if "saved_density" not in adapter_ranks[0]["tight"]:
        pytest.skip("TensorFlow's GsSketch only")
    for r in adapter_ranks:
        tight = r["tight"]
        (saved,) = tight["saved_density"].values()
        assert saved["level"] == tight["levels"][-1] == LEVELS[0] and saved["changes"] == tight["changes"] == 1
        assert tight["reloaded_density"] == tight["saved_density"]


@pytest.mark.slow
def test_horovod_hands_dense_steps_to_its_own_allreduce_in_float16_as_backward_produces_them(adapter_ranks):
    """At the DENSE level with zero residuals GsSketch's compress returns the flag and the
    gradient in float16 (Horovod's allreduce overlaps backward, as with Compression.fp16), and
    the step applies the ranks' mean of the float16 gradients; sparse levels hand one flag."""
    if "handed" not in adapter_ranks[0]["loose"]:
        pytest.skip("Horovod's compress only")
    sizes = [10, 64, 64, 640, 2048, 4096]  # density_ranks.mlp's parameters
    for r in adapter_ranks:
        loose, tight = r["loose"], r["tight"]
        early = [["torch.float16", d + 1] for d in sizes]
        assert all(h == early for h in loose["handed"]), loose["handed"]
        assert max(loose["errors"]) <= 2.0 ** -11 * 4, loose["errors"]  # within float16 rounding of the sum
        assert tight["handed"][-1] == [["torch.float32", 1]] * len(sizes), tight["handed"][-1]
        assert tight["handed"][0] == loose["handed"][0]  # dense until the first decision


@pytest.mark.slow
def test_ddp_allreduces_each_bucket_in_float16_as_it_arrives_while_the_step_is_dense(adapter_ranks):
    """GsState's hook at the DENSE level with zero residuals: one float16 allreduce per bucket
    (issued by that bucket's hook, overlapping backward), no engine allreduce of the whole
    vector; at a sparse level the engine's exchange instead."""
    if "collectives" not in adapter_ranks[0]["loose"]:
        pytest.skip("DDP's hook only")
    d = 10 + 64 + 64 + 640 + 2048 + 4096  # density_ranks.mlp's parameters
    for r in adapter_ranks:
        loose = [tuple(c) for c in r["loose"]["collectives"]]
        buckets = [n for kind, n in loose if kind == "allreduce"]  # (the others: the density's allgathers)
        steps = len(r["loose"]["levels"])
        assert len(buckets) > steps, loose  # DDP rebuilds its buckets after step 0
        assert sum(buckets) == steps * 2 * d, (sum(buckets), steps * 2 * d)  # every coordinate in float16, once
        sparse = sum(n for kind, n in r["tight"]["collectives"] if kind == "allreduce")
        assert sparse < steps * 2 * d, r["tight"]["collectives"]
