"""GsSketch for horovod.tensorflow on real ranks, and TF sketches equal to torch ones."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import horovodrun
from differ import assert_equal, assert_ranks_agree


@pytest.mark.parametrize("exchange", ["sketch", "allgather"])
@pytest.mark.parametrize("scope", ["global", "layer"])
def test_tf_and_torch_engines_give_the_same_update(scope, exchange):
    tf = pytest.importorskip("tensorflow")
    import torch

    from gs_horovod.engine import GsConfig, GsSgd, Plan
    from gs_horovod.kernels.tf_ops import TfOps
    from gs_horovod.kernels.torch_ops import TorchOps
    from gs_horovod.transports.simulated import SimulatedRanks

    rng = np.random.default_rng(0)
    grads = [[(rng.standard_normal(d) * rng.random(d) ** 4).astype(np.float32) for d in (3000, 2000)]
             for _ in range(2)]
    small = [[rng.standard_normal(10).astype(np.float32)] for _ in range(2)]
    cfg = GsConfig(scope=scope, ratio=0.02, momentum=0.5, exchange=exchange, backend="torch")
    plan = Plan.build(["a", "b"], [3000, 2000], cfg, ("c",), (10,), ranks=2)

    def run(ops, to):
        def rank(r, comm):
            res = GsSgd(cfg, ops, comm).step(plan, [to(g) for g in grads[r]], to(np.zeros(5000, np.float32)),
                                             to(np.zeros(5000, np.float32)), 0, True, [to(g) for g in small[r]])
            return [np.asarray(x) for x in (res.update, res.residual, res.momentum)]
        return SimulatedRanks(2).run(rank)[0]

    for a, b in zip(run(TorchOps("torch"), torch.from_numpy), run(TfOps(), tf.constant)):
        assert np.array_equal(a != 0, b != 0)
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return horovodrun("tf_scenarios.py", 2, "gloo", tmp_path_factory.mktemp("tf"), timeout=480)


@pytest.mark.slow
def test_k_equal_d_with_exact_round_is_dense_allreduce(ranks):
    assert all(r["k_equals_d_max_abs_diff"] <= 1e-6 for r in ranks)


EXCHANGES = ("sketch", "allgather", "sparse")


def pytest_generate_tests(metafunc):
    if "exchange" in metafunc.fixturenames and "ranks" in metafunc.fixturenames:  # the real-rank tests
        metafunc.parametrize("exchange", EXCHANGES)


@pytest.mark.slow
@pytest.mark.parametrize("graph", [True, False], ids=["tf.function", "eager"])
@pytest.mark.parametrize("exact", [True, False])
def test_every_rank_applies_the_identical_update_sketch(ranks, graph, exact):
    digests = [r[f"digests_graph_{graph}_exact_{exact}"] for r in ranks]
    assert len(set(digests[0])) == len(digests[0]), f"the model did not change every step: {digests[0]}"
    assert_ranks_agree(digests, "the model after each step")


@pytest.mark.slow
@pytest.mark.parametrize("exact", [True, False])
def test_eager_gives_the_same_bits_as_tf_function(ranks, exact):
    # Horovod runs the tape's allreduces in a tf.function either way
    for r in ranks:
        assert_equal(r[f"digests_graph_False_exact_{exact}"], r[f"digests_graph_True_exact_{exact}"],
                     "the model after each step, eager (got) and in a tf.function (want):")


@pytest.mark.slow
def test_warmup_is_dense_then_compressed_alike_on_every_rank(ranks, exchange):
    assert_ranks_agree([r[f"{exchange}_warmup_digests"] for r in ranks], "the model after each step")
    assert len(set(ranks[0][f"{exchange}_warmup_digests"])) == 4
    assert ranks[0][f"{exchange}_warmup_steps"] == [4]
    exchanged = {"sketch": "sketch_bytes", "allgather": "gather_bytes", "sparse": "alltoall_bytes"}[exchange]
    for r in ranks:  # the 2 warm-up steps are Horovod's dense allreduce
        assert r[f"{exchange}_warmup_dense_max_abs_diff"] <= 1e-6
        # and compression starts after them: the warm-up counted dense bytes only, the 2 steps
        # after it the exchange's own and no dense ones (every variable here is compressed) ...
        warm, after = r[f"{exchange}_warmup_stats"], r[f"{exchange}_after_warmup_stats"]
        assert warm["dense_bytes"] > 0, warm
        assert all(n == 0 for field, n in warm.items() if field.endswith("_bytes") and field != "dense_bytes"), warm
        assert after[exchanged] > 0 and after["dense_bytes"] == warm["dense_bytes"], after
        # ... so the weights left 4 dense steps' behind (k = 5 % of the coordinates a step)
        assert r[f"{exchange}_after_warmup_dense_max_abs_diff"] > 1e-3


@pytest.mark.slow
def test_checkpoint_resume_is_bitwise_identical(ranks):
    for r in ranks:
        assert r["resume_restored"] == r["resume_straight"], \
            f"restored and straight models differ by up to {r['resume_max_abs_diff']}"
        assert r["resume_steps"] == [8]
        # the control: the model restored but not GsSketch's state (residuals, momentum, steps)
        # ends elsewhere, so the comparison above can fail
        assert r["resume_not_loaded"] != r["resume_straight"] and r["resume_not_loaded_steps"] == [4]


@pytest.mark.slow
def test_a_nan_in_one_gradient_on_one_rank_raises_or_skips_and_commits_nothing_on_any_rank(ranks):
    # the sketch: the rule for every exchange is asserted on simulated ranks (tests/test_gs_sgd.py)
    for r in ranks:
        assert "GsSketch: the gradient of 'w2:0' is NaN or infinite on at least one rank at step 1" \
            in r["sketch_nan_raise_error"].replace("\\", "")
        assert r["sketch_nan_skip_error"] is None
        for mode in ("raise", "skip"):
            changed = r[f"sketch_nan_{mode}_changed"]  # indices into [residual of each variable..., the model]
            assert changed == [], f"{mode}: the step changed {changed}"
            assert r[f"sketch_nan_{mode}_steps"] == [1]


@pytest.mark.slow
def test_bfloat16_variables_train_alike_on_every_rank(ranks):
    assert ranks[0]["bf16_finite"]
    assert_ranks_agree([r["bf16_digest"] for r in ranks], "the model after 3 steps")
    for r in ranks:  # 3 steps moved every variable, the bfloat16 ones (w1 sketched, b1) included
        assert r["bf16_dtypes"] == {"w1:0": "bfloat16", "b1:0": "bfloat16", "w2:0": "float32"}
        assert all(count > 0 for count in r["bf16_moved"].values()), f"coordinates moved: {r['bf16_moved']}"


@pytest.mark.slow
def test_diverging_selections_and_options_fail_on_every_rank(ranks):
    for r in ranks:
        assert "GsSketch: ranks selected different coordinates at step 0" in r["check_every_error"]
        assert "GsSketch options differ across ranks" in r["mismatch_seed_error"]


@pytest.mark.slow
def test_variables_that_share_a_name_are_refused_on_every_rank(ranks):
    for r in ranks:
        assert "GsSketch keeps each variable's residual under its name, and these variables share one: 'w:0'; " \
            "give each variable a unique name" in r["shared_name_error"].replace("\\", "")


@pytest.mark.slow
@pytest.mark.parametrize("scope", ["global", "layer"])
def test_sparse_exchange_trains_bitwise_as_the_allgathers_top_k(ranks, scope):
    # DistributedGradientTape in a tf.function, the same start and batches, 4 steps
    sparse = [r[f"sparse_{scope}_digests"] for r in ranks]
    assert len(set(sparse[0])) == 4 and sparse[0] == sparse[1]  # it trains, alike on every rank
    assert all(r[f"sparse_{scope}_digests"] == r[f"gather_{scope}_digests"] for r in ranks)
    for r in ranks:
        stats, gather = r[f"sparse_{scope}_stats"], r[f"gather_{scope}_stats"]
        assert stats["steps"] == 4 and stats["alltoall_bytes"] > 0 and stats["select_bytes"] > 0
        assert gather["alltoall_bytes"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("wire", ["compact", "compact8"])
@pytest.mark.parametrize("pairs", ["sparse", "allgather"])
def test_compact_wire_trains_alike_on_every_rank_in_a_tf_function(ranks, pairs, wire):
    digests = [r[f"{wire}_{pairs}_digests"] for r in ranks]
    assert len(set(digests[0])) == 4 and digests[0] == digests[1]
    fp32 = ranks[0]["sparse_global_stats" if pairs == "sparse" else "gather_global_stats"]
    compact = ranks[0][f"compact_{pairs}_stats"]
    for r in ranks:
        stats = r[f"{wire}_{pairs}_stats"]
        assert stats["steps"] == 4
        assert 0 < stats["gather_bytes"] + stats["alltoall_bytes"] < (fp32["gather_bytes"] + fp32["alltoall_bytes"])
        if wire == "compact8":  # a byte less a value than bfloat16's
            assert stats["gather_bytes"] + stats["alltoall_bytes"] < compact["gather_bytes"] + compact["alltoall_bytes"]


@pytest.mark.slow
def test_keras_training_stays_close_to_dense(ranks):
    # 12 epochs of tf-keras fit, k = 5 % of the model's coordinates
    for r in ranks:
        (dense_loss, dense_acc), (gs_loss, gs_acc) = r["keras_dense"], r["keras_gs"]
        assert gs_acc >= dense_acc - 0.05 and gs_loss <= dense_loss + 0.15


@pytest.fixture(scope="module")
def mpi_ranks(tmp_path_factory):
    return horovodrun("tf_mpi.py", 2, "mpi", tmp_path_factory.mktemp("tf_mpi"), timeout=300)


@pytest.mark.slow
def test_tree_merge_over_mpi_matches_dense(mpi_ranks):
    for r in mpi_ranks:
        assert r["k_equals_d_max_abs_diff"] <= 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("exchange", EXCHANGES)
def test_tree_merge_over_mpi_agrees_across_ranks(mpi_ranks, exchange):
    for r in mpi_ranks:
        # tree allreduces in 4 steps: each step's 4-byte agreement of the ranks' checkpoint
        # flags, plus the sketch merge and the exact round; nothing more under the allgather
        # (MPI's Allgatherv; every tensor here is compressed); the two threshold rounds
        assert r[exchange]["merge_calls"] == 4 + {"sketch": 8, "allgather": 0, "sparse": 8}[exchange]
    digests = [r[exchange]["digests"] for r in mpi_ranks]
    assert len(set(digests[0])) == 4 and digests[0] == digests[1]
