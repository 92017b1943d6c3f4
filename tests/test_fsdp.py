"""GsFsdpState on FSDP2 shards across replicas under a real ``torchrun`` (gloo, CPU): 4 ranks as
2 × 2 (replicate × shard) and 2 ranks as 2 × 1 and 1 × 2, one job each
(tests/workers/fsdp_scenarios.py); updates recomputed in NumPy from every rank's shard
gradients; k = D against FSDP's native HSDP; a rank killed mid-step; the example's LM on 2 × 2."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, WORKERS, rank_env, torchrun, torchrun_command
from differ import assert_at_most, assert_equal, assert_ranks_agree

MESHES = ("2x2", "2x1", "1x2")


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Both jobs, started once: {mesh label: every rank's result for that mesh}."""
    four = torchrun("fsdp_scenarios.py", 4, tmp_path_factory.mktemp("fsdp4"), "2x2")
    two = torchrun("fsdp_scenarios.py", 2, tmp_path_factory.mktemp("fsdp2"), "2x1,1x2", "quick")
    return {label: [r[label] for r in (four if label == "2x2" else two)] for label in MESHES}


@pytest.fixture(params=MESHES)
def ranks(request, jobs):
    return jobs[request.param]


def peers(ranks: list[dict], r: int) -> list[dict]:
    """The results of rank r's replicate group (the ranks holding its shards), in group order."""
    return [ranks[q] for q in ranks[r]["replicate_ranks"]]


def flat(named: dict[str, list[float]]) -> np.ndarray:
    """Tensors by name, concatenated in name order (the engine's order), float32."""
    return np.concatenate([np.asarray(named[n], np.float32) for n in sorted(named)])


@pytest.mark.slow
def test_ratio_one_is_the_mean_over_the_replicate_group(ranks):
    for r, mine in enumerate(ranks):
        record = mine["exact"]
        assert record["steps"] == record["traffic_steps"] == 3 and record["exchange"] == "allgather"
        group = [p["exact"]["inputs"] for p in peers(ranks, r)]
        for step, update in enumerate(record["updates"]):
            expected = sum(flat(g[step]) for g in group) / np.float32(len(group))
            assert np.abs(flat(update) - expected).max() <= 1e-6


def pre_filtered(inputs: list[list[dict]], step: int, residuals: list[np.ndarray], ratio: float):
    """(a, fed, k) of one step of one replicate group: a = e + g per rank; each rank's top-k of
    |a| (k = ceil(ratio · D), ties to the lower index)."""
    a = [residuals[q] + flat(inputs[q][step]) for q in range(len(inputs))]
    k = math.ceil(ratio * len(a[0]))
    return a, [np.argsort(-np.abs(x), kind="stable")[:k] for x in a], k


def replay(inputs: list[list[dict]], ratio: float, select) -> list[np.ndarray]:
    """Each step's update of every rank of one replicate group, recomputed: ``select(a, fed, k)``
    gives the update and, per rank, the coordinates of its a that went into it (zeroed: e)."""
    residuals = [np.zeros_like(flat(inputs[0][0])) for _ in range(len(inputs))]
    updates = []
    for step in range(len(inputs[0])):
        a, fed, k = pre_filtered(inputs, step, residuals, ratio)
        update, sent = select(a, fed, k)
        updates.append(update)
        for x, idx in zip(a, sent):
            x[idx] = 0
        residuals = a
    return updates


def union_sum(a: list[np.ndarray], fed: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The mean over ranks of what each fed, and which coordinates any rank fed."""
    total, in_union = np.zeros_like(a[0]), np.zeros(len(a[0]), bool)
    for x, idx in zip(a, fed):
        total[idx] += x[idx]
        in_union[idx] = True
    return total / np.float32(len(a)), in_union


def top_k_allgather(inputs: list[list[dict]], ratio: float) -> list[np.ndarray]:
    """Top-k allgather: each rank's top-k of |a|; their union applied with the sum over ranks of
    what each fed, over P; e = a without what this rank fed."""
    return replay(inputs, ratio, lambda a, fed, k: (union_sum(a, fed)[0], fed))


def top_k_of_the_union(inputs: list[list[dict]], ratio: float) -> list[np.ndarray]:
    """The sparse exchange's selection: of the union of the ranks' top-k, the k of largest
    |sum over ranks / P| (ties to the lower index) applied; e = a without what this rank fed of
    those k."""
    def select(a: list[np.ndarray], fed: list[np.ndarray], k: int) -> tuple[np.ndarray, list[np.ndarray]]:
        means, in_union = union_sum(a, fed)
        union = np.flatnonzero(in_union)
        chosen = union[np.lexsort((union, -np.abs(means[union])))[:k]]
        update = np.zeros_like(means)
        update[chosen] = means[chosen]
        return update, [np.intersect1d(idx, chosen) for idx in fed]

    return replay(inputs, ratio, select)


@pytest.mark.slow
def test_top_k_allgather_update_equals_numpy_from_every_ranks_shard_gradients(ranks):
    for r, mine in enumerate(ranks):
        assert mine["allgather"]["exchange"] == "allgather" and mine["allgather"]["steps"] == 3
        expected = top_k_allgather([p["allgather"]["inputs"] for p in peers(ranks, r)], 0.05)
        for got, want in zip(mine["allgather"]["updates"], expected):
            assert 0 < np.count_nonzero(want) < len(want) / 5  # sparse: the residuals carry the rest
            assert np.abs(flat(got) - want).max() <= 1e-6


@pytest.mark.slow
def test_sparse_exchange_update_equals_numpy_from_every_ranks_shard_gradients(ranks):
    # exchange="sparse" under FSDP2: the pairs to their owners over the replicate group, the
    # top k of the union's sums back to every rank
    for r, mine in enumerate(ranks):
        assert mine["sparse"]["exchange"] == "sparse" and mine["sparse"]["steps"] == 3
        group = [p["sparse"]["inputs"] for p in peers(ranks, r)]
        for step, (got, want) in enumerate(zip(mine["sparse"]["updates"], top_k_of_the_union(group, 0.05))):
            got, k = flat(got), math.ceil(0.05 * len(want))
            assert np.count_nonzero(want) == k  # exactly k applied (top-k allgather: its union of up to P·k)
            assert np.array_equal(np.flatnonzero(got), np.flatnonzero(want)), \
                f"rank {r} step {step}: applied {np.flatnonzero(got)[:20]}…, expected {np.flatnonzero(want)[:20]}…"
            assert np.abs(got - want).max() <= 1e-6, f"rank {r} step {step}"


@pytest.mark.slow
def test_ratio_one_trains_as_native_hsdp(ranks):
    for r in ranks:
        assert r["native"]["max_abs_diff"] <= 1e-6
        assert r["native"]["steps"] == 4


@pytest.mark.slow
def test_accumulation_with_set_requires_all_reduce_false_steps_once_per_update(ranks):
    for r in ranks:
        assert r["accumulate"]["max_abs_diff"] <= 1e-6  # native HSDP accumulating the same micro-batches
        assert r["accumulate"]["steps"] == 4  # 4 optimizer steps of 2 micro-batches: no step on the first


@pytest.mark.slow
def test_one_global_top_k_over_every_modules_shards(ranks):
    for r in ranks:
        top = r["topk_global"]
        d = sum(top["sizes"].values())
        assert top["steps"] == 3
        assert [sum(step.values()) for step in top["nonzeros"]] == [math.ceil(0.02 * d)] * 3
        touched = {n for step in top["nonzeros"] for n, count in step.items() if count}
        assert len(touched) > 1  # one selection across modules, not k per module
        layer = r["topk_layer"]
        for step in layer["nonzeros"]:
            assert step == {n: math.ceil(0.02 * size) for n, size in layer["sizes"].items()}
    assert len({r["topk_global"]["digest"] for r in ranks}) == 1  # every replica of every shard alike


@pytest.mark.slow
def test_bf16_parameters_with_f32_or_bf16_reduction(jobs):
    ranks = jobs["2x2"]
    for rank, r in enumerate(ranks):
        assert_at_most(r["bf16_reduce_float32"]["max_abs_diff"], 1e-6, f"rank {rank}: f32 reduction, max |Δ| to native")
        # native HSDP all-reduces in bf16, the engine averages the f32-cast shards: bf16 rounding apart
        assert_at_most(r["bf16_reduce_bfloat16"]["max_abs_diff"], 1e-3,
                       f"rank {rank}: bf16 reduction, max |Δ| to native")
        # the update went back as bf16
        assert_equal(r["bf16_model"]["grad_dtypes"], ["torch.bfloat16"], f"rank {rank}: bf16 model, gradient dtypes")
        assert_at_most(r["bf16_model"]["max_abs_diff"], 1e-6, f"rank {rank}: bf16 model, max |Δ| to native")
        assert_equal(r["bf16_gs"]["nonfinite"], 0, f"rank {rank}: default options, non-finite weights")
        assert_equal(r["bf16_gs"]["steps"], 3, f"rank {rank}: default options, GsSketch steps")
        # and it trained: every parameter moved from its initial value in 3 steps of k = 5 %
        moved = r["bf16_gs"]["moved"]
        assert all(count > 0 for count in moved.values()), f"coordinates moved per parameter: {moved}"
    assert_ranks_agree([r["bf16_gs"]["digest"] for r in ranks], "default options: the model after 3 steps")


@pytest.mark.slow
def test_resume_beside_dcp_is_bitwise_the_straight_run(jobs):
    ranks = jobs["2x2"]
    for r in ranks:
        for label in ("gathered", "local"):
            names, straight_names, difference = r[f"{label}_own_residuals_back"]
            assert names == straight_names, f"{label}: residuals of {names}, the straight run's of {straight_names}"
            assert difference == 0, f"{label}: a residual differs from the straight run's by {difference}"
            assert r[f"{label}_resumed"] == r["straight"], f"{label}: the model differs from the straight run's"
        assert r["not_loaded_resumed"] != r["straight"]  # the residuals matter
    assert_ranks_agree([r["straight"] for r in ranks], "the straight run's model")


@pytest.mark.slow
def test_a_checkpoint_of_other_options_or_another_mesh_is_refused(jobs):
    for rank, r in enumerate(jobs["2x2"]):
        assert r["other_options_error"] == ("ValueError: GsSketch state was saved with different options: "
                                            "seed=0 saved, 1 now")
        assert r["other_mesh_error"].startswith(
            "ValueError: GsSketch state was saved with different options: mesh=(2, 2) saved, (1, 4) now")
        assert (rank < 2) == ("mesh_coordinate" not in r["other_mesh_error"])  # (0, r) in both meshes for r < 2


@pytest.mark.slow
def test_nan_on_one_rank_raises_on_every_rank_and_commits_nothing(jobs):
    # the 2×2 mesh (both dimensions > 1); the rule itself: tests/test_gs_sgd.py on simulated ranks
    ranks = jobs["2x2"]
    for r in ranks:
        assert r["nan_raise"]["error"].startswith("FloatingPointError: GsSketch: the gradient of '2.weight' is NaN or "
                                                  "infinite on at least one rank at step 1")
        assert r["nan_raise"]["residual_change"] == 0, f"residuals moved by up to {r['nan_raise']['residual_change']}"
        skip = r["nan_skip"]
        assert skip["error"] is None and skip["skipped"] == 1
        assert skip["update_abs_sum"] == [0.0], f"the skipped step's update: sum of |update| {skip['update_abs_sum']}"
        assert skip["residual_change"] == 0, f"residuals moved by up to {skip['residual_change']}"
        assert skip["then_nonfinite"] == 0, f"{skip['then_nonfinite']} parameters not finite after the next step"
    # the NaN reached one shard of one replicate group (when R > 1 or S > 1 the others raised all the same)
    assert sum(r["nan_raise"]["nan_in_own_shard"] for r in ranks) == 1


@pytest.mark.slow
def test_refusals_raise_on_every_rank(jobs):
    for rank, r in enumerate(jobs["2x2"]):
        assert r["mismatch_seed_error"].startswith("ValueError: GsSketch options differ across ranks")
        assert f"seed={rank}" in r["mismatch_seed_error"]
        assert r["stale_error"].startswith("RuntimeError: GsFsdpState: on 4 rank(s) FSDP added this backward's "
                                           "gradient to a .grad that still held the last update")
        assert r["mixed_error"].startswith("RuntimeError: GsFsdpState: in this backward some FSDP modules want the "
                                           "all-reduce and others have set_requires_all_reduce(False)")
        assert r["layout_error"].startswith("ValueError: GsFsdpState: the ranks of a replicate group hold different "
                                            "shards")


@pytest.mark.slow
def test_rank0_alone_saving_raises_there_within_the_timeout_then_every_rank_raises(jobs):
    ranks = jobs["2x2"]
    error = ranks[0]["alone_save_error"]
    assert error.startswith("RuntimeError: GsFsdpState.state_dict() is a collective: every rank calls it at the "
                            "same point, but not every rank called it within checkpoint_timeout=3 s")
    assert 3.0 <= ranks[0]["alone_save_seconds"] < 30
    assert "GsFsdpState.state_dict() is a collective" in ranks[0]["next_step_error"]
    for r in ranks[1:]:
        assert "alone_save_error" not in r
        assert r["next_step_error"] == ("RuntimeError: GsFsdpState: another rank called state_dict() alone and is out "
                                        "of step with this one (state_dict() is a collective: call it on every rank "
                                        "at the same point)")


@pytest.mark.slow
def test_a_rank_killed_mid_step_under_torchrun_ends_the_job(tmp_path):
    """Rank 3 of 2 × 2 SIGKILLs itself inside its third step; torchrun's agent stops the others."""
    cmd = [*torchrun_command(4), sys.executable, str(WORKERS / "fsdp_scenarios.py"), str(tmp_path), "killed"]
    env = rank_env()
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0
    assert "Signal 9 (SIGKILL) received by PID" in proc.stderr or "exitcode  : -9" in proc.stderr, proc.stderr[-3000:]
    assert not list(tmp_path.glob("rank*.json"))


def test_bad_input_names_the_parameter(tmp_path):
    """In this process, on a 1-rank gloo group: what is refused at construction, each naming it."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from gs_horovod.fsdp import GsFsdpState, register_fsdp_hooks

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    with pytest.raises(RuntimeError, match="init_process_group"):
        GsFsdpState(model=model)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match=r"parameter '0.weight' is not sharded by fully_shard"):
            GsFsdpState(model=model)
        mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("replicate", "shard"))
        native = fully_shard(torch.nn.Linear(4, 2), mesh=mesh)
        with pytest.raises(ValueError, match=r"parameter 'weight' is sharded on a 2-D mesh \('replicate', 'shard'\): "
                                             "there FSDP all-reduces across replicas itself"):
            GsFsdpState(model=native)
        fully_shard(model[0], mesh=mesh["shard"])
        fully_shard(model, mesh=mesh["shard"])
        with pytest.raises(TypeError, match="replicate_group must be a torch.distributed.ProcessGroup or None, got "
                                            "DeviceMesh; pass mesh.get_group"):
            GsFsdpState(mesh, model=model)
        with pytest.raises(TypeError, match="model must be the torch.nn.Module fully_shard was applied to, got dict"):
            GsFsdpState(model=dict(model.named_parameters()))
        with pytest.raises(TypeError, match=r"GsFsdpState got unknown option\(s\) \['raito'\]; allowed: .*'ratio'"):
            GsFsdpState(model=model, raito=0.1)
        with pytest.raises(ValueError, match=r"ratio must be in \(0.0, 1.0\], got 2"):
            GsFsdpState(model=model, ratio=2)
        state = GsFsdpState(mesh.get_group("replicate"), model=model, ratio=0.5)
        assert repr(state).startswith("GsFsdpState(GsConfig(scope='global', ratio=0.5") and "mesh=(1, 1)" in repr(state)
        with pytest.raises(ValueError, match="model must be the module state was built with"):
            register_fsdp_hooks(model[0], state)
        register_fsdp_hooks(model, state)
        saved = state.state_dict()
        with pytest.raises(ValueError, match="saved with different options: seed=0 saved, 1 now"):
            GsFsdpState(model=model, ratio=0.5, seed=1).load_state_dict(saved)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("compression", ["gs", "none"])
def test_the_example_trains_the_lm_on_2x2(tmp_path, compression):
    """``train_fsdp.py --model lm`` under torchrun on 4 ranks as 2 × 2, a tiny LSTM for 2 steps:
    a finite held-out perplexity after each; gs hands the replicate group fewer bytes a step than
    the rank's shard (half the model), which plain HSDP's all-reduce receives whole."""
    from gs_bench.workloads import LstmLM

    out = tmp_path / "history.json"
    cmd = [*torchrun_command(4), sys.executable, str(ROOT / "scripts" / "bench" / "train_fsdp.py"), "--model", "lm",
           "--steps", "2", "--eval-every", "1", "--hidden", "64", "--embed", "16", "--batch-size", "2", "--seq", "16",
           "--eval-windows", "2", "--eval-seq", "32", "--compression", compression, "--json", str(out)]
    env = rank_env()
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["ranks"] == 4 and [h["epoch"] for h in result["history"]] == [1, 2]
    assert all(math.isfinite(h["perplexity"]) and 1 < h["perplexity"] < 1000 for h in result["history"])
    shard = sum(p.numel() * p.element_size() for p in LstmLM(embed=16, hidden=64).parameters()) // 2
    assert result["dense_bytes_per_step"] == shard
    sent, wire = result["history"][-1]["bytes_per_step"], result["history"][-1]["wire_bytes_per_step"]
    if compression == "gs":
        assert 0 < sent < shard and 0 < wire < 2 * shard  # the ring all-reduce among 2 sends 2 × the shard
    else:
        assert (sent, wire) == (shard, 2 * shard)
    assert f"summary (4 ranks, --compression {compression})" in proc.stdout
