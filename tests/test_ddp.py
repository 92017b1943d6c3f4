"""gs_hook inside DistributedDataParallel under a real ``torchrun`` (gloo, CPU, 2 and 3 ranks;
DDP's idioms and torch.compile at 2), and its updates against the Horovod adapter's for the
same batches and options (tests/workers/ddp_scenarios.py)."""

from __future__ import annotations

import math

import pytest
from differ import assert_at_most, assert_ranks_agree

from gs_horovod.engine.density import DENSE

SIZES = (2, 3)
EXCHANGES = ("sketch", "allgather", "sparse")


def pytest_generate_tests(metafunc):
    if "exchange" in metafunc.fixturenames:
        metafunc.parametrize("exchange", EXCHANGES)


@pytest.fixture(scope="module", params=SIZES, ids=[f"{n}ranks" for n in SIZES])
def ranks(request, tmp_path_factory):
    from conftest import torchrun

    n = request.param
    return torchrun("ddp_scenarios.py", n, tmp_path_factory.mktemp(f"ddp{n}"), "all" if n == 2 else "quick")


@pytest.mark.slow
def test_k_equal_d_is_ddp_default_allreduce_over_several_buckets(ranks, exchange):
    for r in (r[exchange] for r in ranks):
        assert_at_most(r["exact_plain_max_abs_diff"], 1e-6, "k = D against DDP's default hook, max abs difference")
        assert r["exact_plain_steps"] == 4  # one engine step per DDP step, not one per bucket
        assert len(r["topk_global_buckets"]) >= 2


@pytest.mark.slow
@pytest.mark.parametrize("label", ["global", "fixed"])
def test_one_global_top_k_across_all_buckets(ranks, exchange, label):
    ranks = [r[exchange] for r in ranks]
    sizes = ranks[0]["sizes"]
    k = math.ceil(0.02 * sum(sizes)) if label == "global" else 100
    for r in ranks:
        assert len(r[f"topk_{label}_buckets"]) >= 2
        # k nonzeros over every bucket's update together (k per bucket would be k·buckets)
        assert r[f"topk_{label}_nonzeros"] == [k] * 3
        assert len(set(r[f"topk_{label}_digests"])) == 3
    assert_ranks_agree([r[f"topk_{label}_digests"] for r in ranks], "each step's update")


@pytest.mark.slow
def test_layer_scope_takes_k_of_every_tensor(ranks, exchange):
    ranks = [r[exchange] for r in ranks]
    sizes = ranks[0]["sizes"]
    for r in ranks:
        assert r["topk_layer_per_tensor"] == [math.ceil(0.02 * d) for d in sizes]
    assert_ranks_agree([r["topk_layer_digests"] for r in ranks], "each step's update")


@pytest.fixture(scope="module")
def horovod(ranks, tmp_path_factory):
    """The same batches and options through the Horovod adapter, every exchange, on as many ranks."""
    from conftest import horovodrun

    return horovodrun("ddp_scenarios.py", len(ranks), "gloo", tmp_path_factory.mktemp("horovod"), "horovod")


@pytest.mark.slow
def test_updates_equal_the_horovod_adapters(ranks, horovod, exchange):
    n = len(ranks)
    for r, h in zip(ranks, horovod):
        r, h = r[exchange], h[exchange]
        assert len(r["updates"]) == len(h["updates"]) == 3
        # the DDP model itself as GsState's model: the same updates as its module
        assert r["updates_ddp_as_model"] == r["updates"]
        for step, (mine, theirs) in enumerate(zip(r["updates"], h["updates"])):
            # 2 ranks: bitwise (one addition per element, whatever the ring); 3 ranks: gloo's
            # sum order in Horovod and in torch.distributed may differ by an ulp
            tolerance = 0.0 if n == 2 else 1e-6
            difference = [abs(a - b) for a, b in zip(mine, theirs)]
            worst = max(range(len(difference)), key=difference.__getitem__)
            assert_at_most(difference[worst], tolerance, f"update of step {step}: the hook's "
                           f"against Horovod's, max abs difference at [{worst}]", hook=mine[worst],
                           horovod=theirs[worst])


@pytest.mark.slow
def test_resume_from_rank0_file_or_per_rank_files_is_bitwise_the_straight_run(ranks, exchange):
    ranks = [r[exchange] for r in ranks]
    for r in ranks:
        for label in ("gathered", "local"):
            names, straight_names, difference = r[f"{label}_own_residuals_back"]
            assert names == straight_names, f"{label}: residuals of {names}, the straight run's of {straight_names}"
            assert difference == 0, f"{label}: a residual differs from the straight run's by {difference}"
            assert r[f"{label}_resumed"] == r["straight"], f"{label}: the model differs from the straight run's"
        assert r["not_loaded_resumed"] != r["straight"]  # the residuals matter
    assert_ranks_agree([r["straight"] for r in ranks], "the straight run's model")


@pytest.mark.slow
def test_nan_on_one_rank_raises_on_every_rank_and_commits_nothing(ranks):
    # the 2-rank job, the sketch: the rule for every exchange is asserted on simulated ranks
    # (tests/test_gs_sgd.py), this the hook's part of it
    if "nonfinite" not in ranks[0]["scenarios"]:
        pytest.skip("run in the 2-rank job")
    for r in (r["sketch"] for r in ranks):
        assert r["nan_raise_error"].startswith("GsSketch: the gradient of '2.weight' is NaN or infinite")
        # (the parameters cannot move: the hook raised inside backward, before the optimizer)
        assert r["nan_raise_residual_change"] == 0, f"residuals moved by up to {r['nan_raise_residual_change']}"
        # nonfinite="skip", at ratio 0.05 and at the default density's dense step: a zero
        # update, the residuals kept, the step counted as skipped
        for mode in ("skip", "dense_skip"):
            assert r[f"nan_{mode}_error"] is None
            assert r[f"nan_{mode}_update_nonzeros"] == 0, f"{mode}: {r[f'nan_{mode}_update_nonzeros']} updated"
            moved = r[f"nan_{mode}_residual_change"]
            assert moved == 0, f"{mode}: residuals moved by up to {moved}"
            assert r[f"nan_{mode}_skipped"] == 1
        assert r["nan_dense_skip_level"] == DENSE and r["nan_skip_level"] == 0  # (0: a fixed ratio)


@pytest.mark.slow
def test_options_that_differ_across_ranks_fail_on_every_rank(ranks):
    for r in ranks:
        assert r["mismatch_seed_error"].startswith("ValueError: GsSketch options differ across ranks")
        assert f"seed={r['rank']}" in r["mismatch_seed_error"]


@pytest.mark.slow
@pytest.mark.parametrize("idiom", ["no_sync", "unused", "static_graph", "autocast"])
def test_ddp_idioms_with_k_equal_d_match_the_default_hook(ranks, idiom):
    if len(ranks) != 2:
        pytest.skip("DDP's idioms run in the 2-rank job")
    for r in ranks:
        assert r[f"exact_{idiom}_max_abs_diff"] <= 1e-6
        assert r[f"exact_{idiom}_steps"] == 4


@pytest.mark.slow
def test_bf16_autocast_trains_and_ranks_agree(ranks):
    if len(ranks) != 2:
        pytest.skip("DDP's idioms run in the 2-rank job")
    # 3 steps of ratio=0.05, min_size=64 under bf16 autocast: finite, and it trained: at least
    # one step's k of the compressed coordinates moved from their initial values
    k = math.ceil(0.05 * sum(d for d in ranks[0]["sketch"]["sizes"] if d >= 64))
    for r in ranks:
        assert r["autocast_gs_nonfinite"] == 0, f"{r['autocast_gs_nonfinite']} parameters not finite"
        assert r["autocast_gs_moved"] >= k, f"rank {r['rank']}: {r['autocast_gs_moved']} coordinates moved, k = {k}"
    assert_ranks_agree([r["autocast_gs_digest"] for r in ranks], "the model after 3 autocast steps")


@pytest.mark.slow
def test_torch_compiled_ddp_model_runs_the_hook(ranks):
    if len(ranks) != 2:
        pytest.skip("DDP's idioms run in the 2-rank job")
    for r in ranks:
        assert "compile_error" not in r, r.get("compile_error")
        assert r["compile_steps"] == 3
        assert r["compile_max_abs_diff"] <= 1e-5  # compiled kernels against eager default DDP


@pytest.mark.slow
def test_powersgd_bytes_as_counted_for_the_benchmarks(ranks):
    if len(ranks) != 2:
        pytest.skip("run in the 2-rank job")
    for r in ranks:
        # 2 dense steps (start_powerSGD_iter), then P, Q and the uncompressed tensors per bucket
        assert r["powersgd_counted_bytes"] == r["powersgd_expected_bytes"] > 0


def test_bad_input_names_the_parameter(tmp_path):
    """In this process, on a 1-rank gloo group: a model that is not a module, an unknown option
    and an option out of range each raise naming it; before init_process_group, a clear error;
    a state saved with other options or by another number of ranks is refused at load."""
    import torch
    import torch.distributed as dist

    from gs_horovod.ddp import GsState

    model = torch.nn.Linear(4, 2)
    with pytest.raises(RuntimeError, match="init_process_group"):
        GsState(model=model)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with pytest.raises(TypeError, match="model must be a torch.nn.Module or None, got dict"):
            GsState(model={"weight": model.weight})
        with pytest.raises(TypeError, match="process_group must be a torch.distributed.ProcessGroup or None, got "
                                            "Linear; pass the module as model="):
            GsState(model)
        with pytest.raises(TypeError, match=r"GsState got unknown option\(s\) \['raito'\]; allowed: .*'ratio'"):
            GsState(model=model, raito=0.1)
        with pytest.raises(ValueError, match=r"ratio must be in \(0.0, 1.0\], got 2"):
            GsState(model=model, ratio=2)
        assert repr(GsState(model=model, ratio=0.5)).startswith("GsState(GsConfig(scope='global', ratio=0.5")
        # a checkpoint saved with other options, or by another number of ranks, is refused
        saved = GsState(model=model, ratio=0.5).state_dict()
        with pytest.raises(ValueError, match="saved with different options: seed=0 saved, 1 now"):
            GsState(model=model, ratio=0.5, seed=1).load_state_dict(saved)
        two_ranks = {**saved, "world_size": 2, "ranks": saved["ranks"] * 2}
        with pytest.raises(ValueError, match="saved by 2 ranks, this job has 1"):
            GsState(model=model, ratio=0.5).load_state_dict(two_ranks)
    finally:
        dist.destroy_process_group()
