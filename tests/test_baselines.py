"""The baseline exchanges on real Horovod ranks (2 and 4, gloo)."""

from __future__ import annotations

import pytest
from conftest import horovodrun

from gs_horovod.baselines import METHODS


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}ranks")
def ranks(request, tmp_path_factory):
    return horovodrun("baselines.py", request.param, "gloo", tmp_path_factory.mktemp(f"baselines{request.param}"))


@pytest.mark.parametrize("method", sorted(METHODS))
def test_uncompressed_setting_equals_dense_allreduce(ranks, method):
    assert all(r[f"{method}_full_max_abs_diff"] <= 1e-5 for r in ranks)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_rank_applies_the_identical_update(ranks, method):
    assert len({r[f"{method}_digest"] for r in ranks}) == 1


@pytest.mark.parametrize("method", sorted(METHODS))
def test_counted_bytes_match_the_size_formula(ranks, method):
    for r in ranks:
        if method == "sketched" and r["rank"] == 0:  # rank 0 also broadcasts the candidates
            assert r[f"{method}_bytes_counted"] > r[f"{method}_bytes_predicted"]
        else:
            assert r[f"{method}_bytes_counted"] == r[f"{method}_bytes_predicted"]
