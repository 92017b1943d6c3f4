"""GsSketch inside hvd.DistributedOptimizer on real Horovod ranks (gloo and MPI, 2 and 3), each
exchange named in the test id: one horovodrun job per setup runs every scenario for the
sketch, the allgather and the sparse exchange (tests/workers/torch_scenarios.py). Byte counts
are checked against the tensors handed to Horovod's collectives (tests/workers/handed_over.py).
The MPI setups run the adapter's core checks; one more 2-rank MPI job runs the options the
gloo setups cover beyond them (test_the_mpi_controller_runs_the_options_left_to_gloo)."""

from __future__ import annotations

import math

import pytest
from differ import assert_at_most, assert_equal, assert_ranks_agree

pytestmark = pytest.mark.slow  # every test here launches processes

SETUPS = [(2, "gloo"), (3, "gloo"), (2, "mpi"), (3, "mpi")]
EXCHANGES = ("sketch", "allgather", "sparse")
DENSE_ELEMENTS = 64 * 64 + 64 + 64 * 32 + 32 + 32 * 10 + 10  # the workers' MLP
SMALL_ELEMENTS = 32 + 10  # its tensors under min_size=64: sent exactly


def pytest_generate_tests(metafunc):
    if "exchange" in metafunc.fixturenames:
        metafunc.parametrize("exchange", EXCHANGES)


@pytest.fixture(scope="module", params=SETUPS, ids=[f"{n}ranks-{c}" for n, c in SETUPS])
def ranks(request, tmp_path_factory):
    from conftest import horovodrun

    n, controller = request.param
    # the 600-step convergence runs once (2 ranks, gloo); under the MPI controller (several
    # times slower here) the adapter's core checks and transport="mpi" only
    scenarios = "all" if (n, controller) == SETUPS[0] else controller  # groups of the worker's SCENARIOS
    return horovodrun("torch_scenarios.py", n, controller, tmp_path_factory.mktemp(f"{controller}{n}"), scenarios,
                      timeout=480)


def of(ranks: list[dict], exchange: str) -> list[dict]:
    return [r[exchange] for r in ranks]


OPTIONS = ["exact_True", "exact_False", "candidates2", "apply_all", "prefilter0"]
LEFT_TO_GLOO = "run in the gloo setups and once under MPI (test_the_mpi_controller_runs_the_options_left_to_gloo)"


def skip_unless_ran(ranks: list[dict], scenario: str) -> None:
    """Skips a setup whose group of scenarios leaves ``scenario`` out (the MPI setups)."""
    if scenario not in ranks[0]["scenarios"]:
        pytest.skip(LEFT_TO_GLOO)


def check_k_equal_d(rs: list[dict], op: str) -> None:
    """op=hvd.Average and hvd.Sum: k = D gives Horovod's dense result with the same op."""
    for r in rs:
        dense_norm, gs_norm = r[f"k_equals_d_{op}_norms"]
        assert_at_most(r[f"k_equals_d_{op}_max_abs_diff"], 1e-6, f"op {op}: k = D against Horovod's dense result, "
                       "max abs difference", dense_norm=dense_norm, gs_norm=gs_norm)
        assert r[f"k_equals_d_{op}_changed"] > 1e-3, f"op {op}: the parameters did not move"


def check_identical_update(rs: list[dict], label: str) -> None:
    digests = [r[f"{label}_digests"] for r in rs]
    assert len(set(digests[0])) == len(digests[0]), f"{label}: parameters did not change every step {digests[0]}"
    assert_ranks_agree(digests, f"{label}: the model after each step")


def check_stats(rs: list[dict], exchange: str, label: str) -> None:
    for rank, r in enumerate(rs):
        counted, stats = r[f"{label}_counted"], r[f"{label}_stats"]
        assert counted["unknown"] == []
        # the exact round carries the small tensors when it runs
        got = {f: counted[f] for f in ("sketch", "gather", "alltoall", "select")}
        got["exact+dense"] = counted["exact"] + counted["dense"]
        want = {f: stats[f"{f}_bytes"] for f in ("sketch", "gather", "alltoall", "select")}
        want["exact+dense"] = stats["exact_bytes"] + stats["dense_bytes"]
        assert_equal(got, want, f"{label}, rank {rank}: bytes handed to Horovod (got) and in stats (want)")
        assert stats["steps"] == len(r[f"{label}_digests"])
        # what the exchange sends: sketch tables for the sketch, pairs for the others
        if exchange == "sketch":
            assert counted["sketch"] > 0 and counted["gather"] == counted["alltoall"] == 0, (label, counted)
        else:
            assert counted["sketch"] == 0 and counted["gather"] > 0, (label, counted)
            assert (counted["alltoall"] > 0 and counted["select"] > 0) == (exchange == "sparse"), (label, counted)
        # Horovod's optimizer allreduces one float32 placeholder per parameter per step (not in stats)
        assert r[f"{label}_optimizer_bytes"] == 4 * 6 * stats["steps"]


def check_warmup(rs: list[dict]) -> None:
    for r in rs:
        after_warmup, after_more = r["warmup_max_abs_diff"]
        assert after_warmup <= 1e-6 < 1e-4 < after_more, f"max abs difference from dense Horovod after 2 and 4 " \
            f"steps: {r['warmup_max_abs_diff']}"
        # 2 dense steps of every element, then only the small tensors are counted as dense
        elements = r["warmup_elements"]
        assert_equal(r["warmup_dense_bytes"], [2 * 4 * elements, 2 * 4 * (elements + SMALL_ELEMENTS)],
                     "dense bytes after 2 and 4 steps")


def check_state_keys_and_dtype(rs: list[dict], dtype: str) -> None:
    for r in rs:
        # 6 optimizer steps; the last layer had no gradient on steps 0 and 3 (Horovod sends
        # zeros for it) and backward_passes_per_step=2: every parameter was compressed 6 times
        # (biases of 32 and 10 elements are under min_size: they pass through the exact round)
        compressed = ("0.weight", "0.bias", "2.weight", "4.weight")
        assert r[f"{dtype}_state_steps"] == {f"s.{dtype}.{n}": 6 for n in compressed}
        dt = {"bf16": "torch.bfloat16", "fp64": "torch.float64"}[dtype]
        assert r[f"{dtype}_grad_dtypes"] == r[f"{dtype}_param_dtypes"] == [dt]
        assert r[f"{dtype}_nonfinite"] == 0, f"{dtype}: {r[f'{dtype}_nonfinite']} parameters not finite"
        assert r[f"{dtype}_changed"] > 0, f"{dtype}: the parameters did not move"
    assert_ranks_agree([r[f"{dtype}_digest"] for r in rs], f"{dtype}: the model after 6 steps")


def check_grouped(rs: list[dict]) -> None:
    for r in rs:
        assert r["groups_grouped_digest"] == r["groups_plain_digest"], \
            f"groups=2 changed the model: max abs difference {r['groups_max_abs_diff']}"


@pytest.mark.parametrize("op", ["avg", "sum"])
def test_k_equal_d_is_dense_allreduce(ranks, exchange, op):
    skip_unless_ran(ranks, f"k_equals_d_{op}")
    check_k_equal_d(of(ranks, exchange), op)


@pytest.mark.parametrize("label", OPTIONS)
def test_every_rank_applies_the_identical_update(ranks, exchange, label):
    skip_unless_ran(ranks, label)
    check_identical_update(of(ranks, exchange), label)


@pytest.mark.parametrize("label", OPTIONS)
def test_stats_count_the_bytes_handed_to_horovod(ranks, exchange, label):
    skip_unless_ran(ranks, label)
    check_stats(of(ranks, exchange), exchange, label)


def test_warmup_steps_are_dense_then_compressed(ranks, exchange):
    skip_unless_ran(ranks, "warmup")
    check_warmup(of(ranks, exchange))


def test_training_stays_close_to_dense(ranks, exchange):
    if "convergence" not in ranks[0]["scenarios"]:
        pytest.skip("the convergence run is done in the 2-rank gloo setup")
    # k = 2 % of the coordinates: a coordinate waits ~50 steps in the residual before it is
    # sent, but error feedback sends every gradient eventually, so after 600 steps (12 such
    # delays) gs-SGD trails dense by a small gap (sketch measured: loss 0.197 vs 0.130,
    # accuracy 0.945 vs 0.967)
    for r in ranks:
        dense_loss, dense_acc = r["dense_loss_acc"]
        gs_loss, gs_acc = r[exchange]["gs_loss_acc"]
        assert gs_loss <= dense_loss + 0.15
        assert gs_acc >= dense_acc - 0.05
        assert r[exchange]["gs_bytes_per_step"] < 0.6 * r["dense_bytes_per_step"]


@pytest.mark.parametrize("dtype", ["bf16", "fp64"])
def test_state_is_keyed_by_parameter_across_none_grads_and_accumulation(ranks, exchange, dtype):
    skip_unless_ran(ranks, "dtypes")
    check_state_keys_and_dtype(of(ranks, exchange), dtype)


def test_grouped_allreduce_gives_the_same_model(ranks, exchange):
    skip_unless_ran(ranks, "groups")
    check_grouped(of(ranks, exchange))


@pytest.fixture(scope="module")
def mpi_options(tmp_path_factory):
    from conftest import horovodrun

    return horovodrun("torch_scenarios.py", 2, "mpi", tmp_path_factory.mktemp("mpi_options"), "options", timeout=480)


def test_the_mpi_controller_runs_the_options_left_to_gloo(mpi_options, exchange):
    """One 2-rank job under Horovod's MPI controller ("options" scenarios) runs what the MPI
    setups above skip as duplicates of the gloo runs, against the same references: op Sum
    against Horovod's dense Sum, exact=False, candidates=2 (prefilter=2), apply="all" and
    prefilter=0 against the bytes handed to Horovod and across ranks, the warm-up against
    dense Horovod, bf16/fp64 parameters, and grouped allreduce against the same run without."""
    rs = of(mpi_options, exchange)
    check_k_equal_d(rs, "sum")
    for label in OPTIONS[1:]:
        check_identical_update(rs, label)
        check_stats(rs, exchange, label)
    check_warmup(rs)
    for dtype in ("bf16", "fp64"):
        check_state_keys_and_dtype(rs, dtype)
    check_grouped(rs)


def test_mpi_merge_matches_horovod_merge_or_refuses_gloo_clearly(ranks, exchange):
    if "mpi_digests" not in ranks[0].get(exchange, {}):
        for r in ranks:
            assert "needs Horovod's MPI controller" in r["mpi_merge_under_gloo_error"]
        return
    P = len(ranks)
    for rank, r in enumerate(of(ranks, exchange)):
        assert_at_most(r["mpi_k_equals_d_max_abs_diff"], 1e-6, "k = D against dense Horovod, max abs difference")
        counted, stats = r["mpi_counted"], r["mpi_stats"]
        assert counted["unknown"] == []
        got = {f: counted[f] for f in ("sketch", "gather", "alltoall", "select")}
        got["exact+dense"] = counted["exact"] + counted["dense"]
        want = {f: stats[f"{f}_bytes"] for f in ("sketch", "gather", "alltoall", "select")}
        want["exact+dense"] = stats["exact_bytes"] + stats["dense_bytes"]
        assert_equal(got, want, f"rank {rank}: bytes handed to the engine's collectives (got) and in stats (want)")
        # 10 steps of tree allreduces: sketch + exact round; the small tensors; the two
        # threshold rounds + the small tensors
        assert r["mpi_merge_calls"] == {"sketch": 20, "allgather": 10, "sparse": 30}[exchange]
        # the tree sends each merged payload once per doubling round (at most log2 P + 1 of them)
        tree = counted["sketch"] + counted["select"] + counted["exact"] + counted["dense"]
        rounds = r["mpi_merge_bytes"] / tree
        assert 1 <= rounds <= math.ceil(math.log2(P)) + 1
    digests = [r["mpi_digests"] for r in of(ranks, exchange)]
    assert len(set(digests[0])) == 10, f"the parameters did not change every step: {digests[0]}"
    assert_ranks_agree(digests, "transport='mpi': the model after each step")
    if exchange == "sketch":  # comm=MPI.COMM_WORLD: the same model as the default communicator
        assert all(r["mpi_comm_digest"] == r["mpi_digests"][-1] for r in of(ranks, exchange))


METHODS = ["gs", "none", "fp16", "topk", "gtopk", "sketched", "powersgd"]


def test_every_registered_method_is_metered_here():
    from gs_bench.methods import METHODS as REGISTERED

    assert sorted(METHODS) == sorted(REGISTERED)


@pytest.mark.parametrize("method", METHODS)
def test_meters_count_the_bytes_handed_to_horovod(ranks, method):
    P = len(ranks)
    if method == "gtopk" and P & (P - 1):  # the one method a rank count rules out
        assert not any("baseline_gtopk" in r for r in ranks), "gTop-k ran on a rank count not a power of two"
        pytest.skip("gTop-k runs on a power of two ranks")
    for r in ranks:
        recorded = sorted(key for key in r if key.startswith("baseline_"))
        assert f"baseline_{method}" in r, f"rank {r['rank']} recorded no baseline_{method}, only {recorded}"
        b = r[f"baseline_{method}"]
        assert b["nonfinite"] == 0, f"{b['nonfinite']} parameters not finite"
        if method == "gs":
            # GsSketch's payload, plus the per-parameter float32 placeholders Horovod's optimizer
            # allreduces and the options check at the first step, which its meter leaves out
            extra = b["optimizer_per_step"] + b["engine_checks_per_step"]
            assert b["optimizer_per_step"] == 4 * b["parameters"]
            assert b["counted_per_step"] - extra == pytest.approx(b["meter_payload_per_step"])
        else:
            assert b["counted_per_step"] == pytest.approx(b["meter_payload_per_step"])
        if method == "fp16":
            assert b["counted_per_step"] == 2 * DENSE_ELEMENTS
        if method == "none":
            assert b["counted_per_step"] == 4 * DENSE_ELEMENTS


def test_backend_auto_runs_the_numba_kernels_on_cpu_tensors(ranks):
    for r in ranks:
        assert r["auto_backends_used"] == ["numba"]


def test_calls_outside_an_optimizer_are_refused(ranks):
    for r in ranks:
        assert "compresses gradients inside hvd.DistributedOptimizer" in r["outside_optimizer_error"]


def test_adasum_is_refused_naming_the_ops_supported(ranks):
    for r in ranks:
        assert "ValueError: GsSketch supports op=hvd.Average or hvd.Sum, not Adasum" in r["adasum_error"]


def test_options_that_differ_across_ranks_fail_on_every_rank(ranks):
    for r in ranks:
        # same payload shapes, different hashes: caught by the options digest at the first step
        assert r["mismatch_seed_error"].startswith("ValueError: GsSketch options differ across ranks")
        # different sketch shapes: Horovod's own negotiation refuses the allreduce first
        assert "Mismatched" in r["mismatch_rows_error"] or "options differ" in r["mismatch_rows_error"]
