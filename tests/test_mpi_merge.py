"""tree_allreduce on real MPI ranks (mpirun, P = 2, 3, 4, oversubscribed)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, WORKERS, mpirun_command

pytestmark = pytest.mark.slow  # every test here launches processes


def mpirun(np_: int, out_dir: Path) -> list[dict]:
    cmd = [*mpirun_command(np_), sys.executable, str(WORKERS / "mpi_merge.py"), str(out_dir)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OMPI_MCA_mpi_yield_when_idle="1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(np_)]


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"P{n}")
def ranks(request, tmp_path_factory):
    return mpirun(request.param, tmp_path_factory.mktemp(f"mpi{request.param}"))


def test_equals_mpi_allreduce_and_is_identical_on_every_rank(ranks):
    for case in ranks[0]["cases"]:
        per_rank = [r["cases"][case] for r in ranks]
        tol = (1e-5 if "float32" in case else 1e-12) * max(1.0, per_rank[0]["scale"])
        assert all(c["max_abs_diff"] <= tol for c in per_rank), case
        assert len({c["digest"] for c in per_rank}) == 1, case
        assert all(c["input_unchanged"] for c in per_rank), case


def expected_doubling(leader_index: int, leaders: int) -> int:
    """Rounds one leader takes part in: log2 of the power of two below ``leaders``, plus the
    fold before and after for the pairs that fold (the even one of a pair does only those 2)."""
    pof2 = 1 << (leaders.bit_length() - 1)
    extra = leaders - pof2
    if leader_index < 2 * extra:
        return 2 if leader_index % 2 == 0 else int(math.log2(pof2)) + 2
    return int(math.log2(pof2))


def expected_sends(leader_index: int, leaders: int) -> int:
    """Messages one leader sends: the even rank of a folding pair only hands its data over;
    the odd one receives it without sending, then sends in every doubling round and once more
    to return the total; the others send once per doubling round."""
    pof2 = 1 << (leaders.bit_length() - 1)
    extra = leaders - pof2
    if leader_index < 2 * extra:
        return 1 if leader_index % 2 == 0 else int(math.log2(pof2)) + 1
    return int(math.log2(pof2))


def test_flat_bytes_and_rounds_follow_recursive_doubling(ranks):
    P = len(ranks)
    for n, itemsize in ((1000, 4), (100_003, 8)):
        case = f"flat/{'float32' if itemsize == 4 else 'float64'}/{n}"
        for r in ranks:
            c = r["cases"][case]
            rounds = expected_doubling(r["rank"], P)
            assert c["doubling_rounds"] == rounds
            assert c["node_rounds"] == 0
            assert c["bytes_sent"] == expected_sends(r["rank"], P) * n * itemsize
        if P & (P - 1) == 0:  # power of two: exactly log2 P rounds, n·itemsize each, on every rank
            assert {r["cases"][case]["bytes_sent"] for r in ranks} == {int(math.log2(P)) * n * itemsize}


def test_node_aware_reduces_to_leaders_first(ranks):
    P = len(ranks)
    hosts = math.ceil(P / 2)
    case = "2_per_host/float32/1000"
    leaders = [r for r in ranks if r["cases"][case]["is_leader"]]
    assert [r["rank"] for r in leaders] == list(range(0, P, 2))
    for i, r in enumerate(leaders):
        c = r["cases"][case]
        assert c["leaders"] == hosts
        assert c["doubling_rounds"] == expected_doubling(i, hosts)
    for r in ranks:
        c = r["cases"][case]
        assert c["node_rounds"] == (2 if c["node_size"] > 1 else 0)
        if not c["is_leader"]:
            assert c["doubling_rounds"] == 0 and c["bytes_sent"] == 1000 * 4  # its Reduce contribution
    # one real host: every rank on it, one leader, no doubling at all
    real = [r["cases"]["host/float32/1000"] for r in ranks]
    assert sum(c["is_leader"] for c in real) == 1 and all(c["node_size"] == P for c in real)


@pytest.mark.parametrize(("forced", "expected"), [(None, "False"), ("1", "True"), ("0", "False")])
def test_cuda_aware_mpi_is_detected_not_assumed(forced, expected):
    # Debian's Open MPI is built without CUDA: MPIX_Query_cuda_support() answers 0 here
    env = {k: v for k, v in os.environ.items() if k != "GS_HOROVOD_CUDA_AWARE_MPI"}
    if forced is not None:
        env["GS_HOROVOD_CUDA_AWARE_MPI"] = forced
    code = "from gs_horovod.transports.mpi import cuda_aware_mpi; print(cuda_aware_mpi())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == expected, out.stderr
