"""The engine's exchanges on simulated ranks (the fast tier) and on every real transport
(Horovod over gloo, ``transport="mpi"`` over mpi4py, torch.distributed under torchrun; slow) at 2,
3 and 4 ranks, against a NumPy recomputation of the step from every rank's gradients
(tests/workers/exchanges.py)."""

from __future__ import annotations

import json
import math

import pytest
from differ import assert_equal, assert_ranks_agree

from gs_horovod.engine.exchanges import EXCHANGES

SETUPS = [("simulated", 2), ("simulated", 3), ("simulated", 4), ("horovod", 2), ("horovod", 4), ("mpi", 3),
          ("ddp", 3)]
CASES = ("random", "ties", "one_region", "zero_rank")
K = 45  # ceil(0.01 · 4500)
RUNS = ("sparse", "allgather", "sketch", "compact_sparse", "compact_allgather", "compact8_sparse", "compact8_allgather")


def simulated(n: int) -> list[dict]:
    """The worker's scenarios on ``n`` simulated ranks in this process, each rank's result as
    the JSON a real rank writes."""
    from workers.exchanges import scenarios

    from gs_horovod.transports.simulated import SimulatedRanks

    def rank(r, comm):
        gather = lambda x: comm.allgather(x[None], f"test.gather.{x.numel()}")  # noqa: E731
        return json.loads(json.dumps(scenarios(lambda: comm, gather, r, n)))

    return SimulatedRanks(n).run(rank)


@pytest.fixture(scope="module", params=[pytest.param(s, marks=() if s[0] == "simulated" else pytest.mark.slow,
                                                     id=f"{s[0]}-{s[1]}ranks") for s in SETUPS])
def ranks(request, tmp_path_factory):
    from conftest import horovodrun, torchrun

    kind, n = request.param
    if kind == "simulated":
        return simulated(n)
    out = tmp_path_factory.mktemp(f"{kind}{n}")
    # real ranks: the worker's "transport" group, what depends on the transport (the resume and
    # the compact wires' NaN are the engine's alone: asserted on the simulated ranks)
    if kind == "ddp":
        return torchrun("exchanges.py", n, out, kind, "transport")
    return horovodrun("exchanges.py", n, "mpi" if kind == "mpi" else "gloo", out, kind, "transport")


def skip_unless_ran(ranks: list[dict], scenario: str) -> None:
    if scenario not in ranks[0]["scenarios"]:
        pytest.skip(f"{scenario}: the engine's alone, asserted on the simulated ranks")


def check_bitwise(r: dict, key: str, what: str) -> None:
    """The worker's comparison (``bitwise``) of an update with the NumPy recomputation."""
    against = r[key]
    assert against["equal"], f"{what}: {against['differing']} coordinates differ from the NumPy recomputation, " \
        f"the first [{against['first']}]: got {against['values'][0]!r}, want {against['values'][1]!r}"


@pytest.mark.parametrize("case", CASES)
def test_sparse_update_is_the_top_k_of_the_unions_sums_bitwise(ranks, case):
    # random: mostly disjoint heavy coordinates; ties: magnitudes 1 and 2 only (ties broken by
    # lower index); one_region: every heavy coordinate in the first owner's region; zero_rank:
    # one rank's gradient is zero
    for rank, r in enumerate(ranks):
        check_bitwise(r, f"{case}_against_reference", f"rank {rank} of {len(ranks)}")
        assert r[f"{case}_nonzeros"] == K
        assert r[f"{case}_small_max_abs"] <= 1e-6


@pytest.mark.parametrize("case", CASES)
def test_each_owner_receives_the_pairs_the_hash_gives_it(ranks, case):
    # every rank's K pairs routed by the documented hash (recomputed in plain integers by the
    # worker, from every rank's gradients): exactly what each rank's alltoall delivered
    owned, by_hand = [r[f"{case}_owned"] for r in ranks], ranks[0][f"{case}_owned_by_hand"]
    assert owned == by_hand, f"received {owned}, the hash gives {by_hand}"
    assert sum(owned) == len(ranks) * K


def evenly(owned: list[int]) -> bool:
    """Whether P owners' shares of P·K pairs each lie within 4σ of K, σ that of a fair split
    (binomial, P·K trials of 1/P: at P = 2 about 4.7 pairs, at P = 4 about 5.8)."""
    P = len(owned)
    sigma = math.sqrt(P * K * (1 / P) * (1 - 1 / P))
    return all(abs(n - K) <= 4 * sigma for n in owned)


@pytest.mark.parametrize("case", ["random", "one_region"])
def test_owners_share_the_pairs_evenly(ranks, case):
    # owners are a hash of the index: the P·K pairs, all heavy ones in the first 200
    # coordinates or not, spread over the P owners about evenly; contiguous regions of D/P
    # would hand one_region's pairs to the first owner, which the same check refuses
    owned = [r[f"{case}_owned"] for r in ranks]
    assert sum(owned) == len(ranks) * K
    assert evenly(owned), f"pairs per owner {owned}, mean {K}"
    if case == "one_region":
        by_region = ranks[0]["one_region_owned_by_region"]
        assert not evenly(by_region), f"regions would own {by_region}: the check cannot tell them apart"


def histogram_bytes(P: int) -> int:
    """Two rounds of 256 counts, each below 2^b (b: the bits of the union's largest size, P·K),
    ⌊63/b⌋ of them to an 8-byte word."""
    return 2 * 8 * math.ceil(256 / (63 // (P * K).bit_length()))


@pytest.mark.parametrize("case", CASES)
def test_bytes_counted_are_the_bytes_handed_to_collectives(ranks, case):
    for r in ranks:
        counted, stats = r[f"{case}_counted"], r[f"{case}_stats"]
        assert counted.get("alltoall", 0) == stats["alltoall_bytes"] == 8 * K  # its own pairs, once
        assert counted.get("select", 0) == stats["select_bytes"] == histogram_bytes(len(ranks))
        assert counted.get("gather", 0) == stats["gather_bytes"]
        assert counted.get("dense", 0) == stats["dense_bytes"] == 40
    # every selected pair is gathered from its one owner, and each owner adds at most the
    # missing count of pairs from the threshold's 16-bit bin (trimmed on every rank alike)
    gathered = sum(r[f"{case}_counted"].get("gather", 0) for r in ranks) // 8
    assert K <= gathered <= K * len(ranks)


@pytest.mark.parametrize("wire", ["compact", "compact8"])
@pytest.mark.parametrize("case", CASES)
def test_compact_wires_are_the_top_k_of_the_rounded_sums_bitwise(ranks, case, wire):
    # each rank's values rounded (bfloat16; E4M3 at its message's scale), the owners' means
    # rounded before the threshold: the NumPy recomputation of exactly that, bit for bit
    for rank, r in enumerate(ranks):
        check_bitwise(r, f"{wire}_{case}_against_reference", f"rank {rank} of {len(ranks)}")
        assert r[f"{wire}_{case}_nonzeros"] == K


@pytest.mark.parametrize("case", CASES)
def test_compact_bytes_counted_are_the_encoded_bytes_handed_over(ranks, case):
    P = len(ranks)
    for r in ranks:
        for wire in ("compact", "compact8"):
            counted, stats = r[f"{wire}_{case}_counted"], r[f"{wire}_{case}_stats"]
            assert counted["alltoall"] == stats["alltoall_bytes"]
            assert counted["gather"] == stats["gather_bytes"]
            assert counted["select"] == stats["select_bytes"] == histogram_bytes(P)
        # under half of 8 bytes a pair, plus each message's 4-byte count; E4M3 values: the same
        # pairs to the same owners, a byte less a value and a 2-byte scale more a message
        compact, compact8 = r[f"compact_{case}_counted"]["alltoall"], r[f"compact8_{case}_counted"]["alltoall"]
        assert compact < 4 * K + 4 * P
        assert compact8 == compact - K + 2 * P
    fp32 = sum(r[f"{case}_counted"]["gather"] for r in ranks)
    assert sum(r[f"compact_{case}_counted"]["gather"] for r in ranks) < fp32 / 2 + 4 * P
    assert sum(r[f"compact8_{case}_counted"]["gather"] for r in ranks) < 3 * fp32 / 8 + 6 * P


@pytest.mark.parametrize("exchange", RUNS)
def test_residuals_keep_what_was_not_applied(ranks, exchange):
    for r in ranks:
        assert r[f"{exchange}_exchange"] == exchange.split("_")[-1]
        assert r[f"{exchange}_conservation_max_abs"] <= 1e-5, r[f"{exchange}_conservation_max_abs"]
    assert_ranks_agree([r[f"{exchange}_digest"] for r in ranks], "the sum of the applied updates")


@pytest.mark.parametrize("exchange", RUNS)
def test_every_exchanges_stats_count_the_bytes_handed_to_collectives(ranks, exchange):
    # 4 steps of each exchange and wire; the small tensors travel in the exact round when it
    # runs (counted there, in the stats as dense); the NaN flags' allreduce is no payload
    for r in ranks:
        counted, stats = r[f"{exchange}_steps_counted"], r[f"{exchange}_steps_stats"]
        got = {f: counted.get(f, 0) for f in ("sketch", "gather", "alltoall", "select")}
        got["exact+dense"] = counted.get("exact", 0) + counted.get("dense", 0)
        want = {f: stats[f"{f}_bytes"] for f in ("sketch", "gather", "alltoall", "select")}
        want["exact+dense"] = stats["exact_bytes"] + stats["dense_bytes"]
        assert_equal(got, want, "bytes handed to the collectives (got) and in stats (want):")
        assert sum(want.values()) > 0
        assert stats["steps"] == 4


def test_sparse_equals_the_allgathers_top_k_step_after_step(ranks):
    assert all(r["sparse_equals_allgather_topk"] for r in ranks)
    assert not math.isclose(ranks[0]["sparse_digest"], ranks[0]["sketch_digest"])  # the sketch differs


@pytest.mark.parametrize("label", ["resume", "warmup_resume"])
def test_resume_from_saved_state_is_bitwise(ranks, label):
    skip_unless_ran(ranks, "resume")
    # 4 steps straight; restored after 2 steps (of a 3-step warm-up for "warmup_resume"); the
    # control: steps 2 and 3 from a fresh state (digests of each step's update and residual)
    for r in ranks:
        digests = r[f"{label}_digests"]
        assert_equal(digests["resumed"], digests["straight"], "each step's update and residual, resumed (got) "
                     "and straight (want):")
        assert digests["not_restored"] != digests["straight"][2:], "the saved state changed nothing"


@pytest.mark.parametrize("wire", ["", "compact_", "compact8_"])
def test_nan_on_one_rank_raises_on_every_rank_and_commits_nothing(ranks, wire):
    skip_unless_ran(ranks, "nonfinite_compact" if wire else "nonfinite")
    for r in ranks:
        assert "'b.weight' is NaN or infinite on at least one rank" in r[f"{wire}nan_error"]
        assert r[f"{wire}nan_residual_change"] == 0, f"residuals moved by up to {r[f'{wire}nan_residual_change']}"


def test_options_that_differ_across_ranks_raise_on_every_rank(ranks):
    for r in ranks:
        assert "options differ across ranks" in r["options_error"]


class Ordered:
    """Counts the bytes handed over by collective name (:class:`workers.handed_over.Counter`)
    and keeps the names in the order they were issued."""

    def __init__(self) -> None:
        from workers.handed_over import Counter

        self.counter, self.order = Counter(), []

    def add(self, name: str, n: int) -> None:
        self.counter.add(name, n)
        self.order.append(name)


@pytest.mark.parametrize("wire", ["fp32", "compact"])
@pytest.mark.parametrize("exchange", list(EXCHANGES))
def test_an_exchange_issues_the_collectives_it_declares_and_its_stats_count_them(exchange, wire):
    # what CommStats, collectives_of and "auto" derive from an exchange's declaration holds: on
    # 3 simulated ranks a step issues the declared names in the declared order (then the step's
    # own allreduce: the exact round, or the small tensors), of the declared kinds, and the
    # bytes handed to each, added up by the byte kind it declares, are CommStats' counts
    import torch
    from workers.handed_over import CHECKS, CountingCollectives

    from gs_horovod.engine import CommStats, EngineState, GsConfig, GsSgd
    from gs_horovod.kernels.torch_ops import TorchOps
    from gs_horovod.transports.simulated import SimulatedRanks

    declared = EXCHANGES[exchange].collectives
    config = GsConfig(ratio=0.01, exchange=exchange, wire=wire, min_size=64, backend="torch")
    gen = torch.Generator().manual_seed(5)
    grads = [{n: torch.randn(d, generator=gen) for n, d in (("a", 3000), ("b", 1500), ("c", 10))} for _ in range(3)]

    def rank(r, comm):
        seen = Ordered()
        state = EngineState(GsSgd(config, TorchOps("torch"), CountingCollectives(comm, seen)), CommStats())
        state.step(grads[r])
        return seen, state

    for seen, state in SimulatedRanks(3).run(rank):
        plan, stats = state.plan, state.stats
        own = "gs_horovod.exact" if plan.exact else "gs_horovod.dense"
        assert [n for n in seen.order if n not in CHECKS] == [c.name for c in declared] + [own]
        kinds = [plan.allreduce_kind if c.kind == "allreduce" else c.kind for c in declared]
        assert [k for k, _ in plan.collectives(config)] == kinds + [plan.allreduce_kind]
        counted = {f: 0 for f in stats.counted() if f.endswith("_bytes")}
        for c in declared:
            counted[c.counts + "_bytes"] += seen.counter.by_name[c.name]
        counted["exact_bytes" if plan.exact else "dense_bytes"] += seen.counter.by_name[own]
        want = {f: getattr(stats, f) for f in counted}
        if plan.exact:  # the small tensors travel in the exact round, counted as dense
            want["exact_bytes"] += want.pop("dense_bytes")
            counted.pop("dense_bytes")
        assert counted == want and all(want[c.counts + "_bytes"] > 0 for c in declared)


def test_a_byte_kind_declared_two_ways_or_taken_from_the_step_is_refused(monkeypatch):
    from gs_horovod.engine import payload
    from gs_horovod.engine.exchanges.base import Collective, Exchange

    class Odd(Exchange):
        name = "odd"
        collectives = (Collective("odd.gather", "allreduce", "gather"),)  # the others' "gather" is an allgather

    monkeypatch.setitem(payload.EXCHANGES, "odd", Odd())
    with pytest.raises(ValueError, match="'odd' declares byte kind 'gather' as 1 allreduce"):
        payload._fields()
    Odd.collectives = (Collective("odd.exact", "allreduce", "exact"),)
    with pytest.raises(ValueError, match="the step's own"):
        payload._fields()
    Odd.collectives = (Collective("odd.first", "alltoall", "first"), Collective("odd.select", "allreduce", "select"))
    assert payload._issue_order() == ["sketch", "alltoall", "first", "select", "gather"]
