"""``gs_horovod.threads``: the engine's CPU kernels take the node's cores shared among its ranks,
unless the user set a count (NUMBA_NUM_THREADS, OMP_NUM_THREADS, torch.set_num_threads)."""

from __future__ import annotations

import numba
import pytest
import torch

from gs_horovod import threads
from gs_horovod.kernels import numba_cpu  # noqa: F401 - Numba's threading layer as the engine selects it
from gs_horovod.threads import kernel_threads, local_size, threads_per_rank


def rule(**given) -> int:
    facts = {"cpus": 16, "ranks_on_node": 4, "env": {}, "torch_threads": 16, "torch_set": False, "numba_max": 16}
    return kernel_threads(**{**facts, **given})[0]


def test_the_node_is_shared_among_its_ranks() -> None:
    assert rule() == 4  # 16 cores, 4 ranks on the node
    assert rule(ranks_on_node=2) == 8
    assert rule(ranks_on_node=1) == 16
    assert rule(ranks_on_node=None) == 16  # nothing says how many: this rank alone
    assert rule(cpus=2, ranks_on_node=2, torch_threads=2, numba_max=2) == 1  # the 2-core VM, 2 ranks
    assert rule(cpus=2, ranks_on_node=4, torch_threads=2, numba_max=2) == 1  # more ranks than cores: at least 1
    assert rule(cpus=16, ranks_on_node=3) == 5  # rounded down


def test_never_more_than_torch_or_numba_allow() -> None:
    assert rule(torch_threads=2) == 2
    assert rule(numba_max=3) == 3


def test_a_count_the_user_set_wins() -> None:
    # NUMBA_NUM_THREADS: Numba's own maximum, whatever torch or the node say
    assert rule(env={"NUMBA_NUM_THREADS": "12"}, numba_max=12) == 12
    assert kernel_threads(cpus=16, ranks_on_node=4, env={"NUMBA_NUM_THREADS": "12"}, torch_threads=1,
                          torch_set=True, numba_max=12) == (12, "NUMBA_NUM_THREADS")
    # OMP_NUM_THREADS or torch.set_num_threads: the kernels follow torch's count, not the share
    assert rule(env={"OMP_NUM_THREADS": "16"}) == 16
    assert rule(env={"OMP_NUM_THREADS": "1"}, torch_threads=1) == 1
    assert rule(torch_set=True, torch_threads=12) == 12
    assert rule(torch_set=True, torch_threads=12, numba_max=8) == 8
    # an empty variable is not a setting
    assert rule(env={"OMP_NUM_THREADS": "", "NUMBA_NUM_THREADS": ""}) == 4


def test_local_size_from_the_launchers_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("horovod.torch", "horovod.tensorflow"):
        monkeypatch.delitem(__import__("sys").modules, name, raising=False)
    assert local_size({}) is None
    assert local_size({"LOCAL_WORLD_SIZE": "4"}) == 4  # torchrun
    assert local_size({"HOROVOD_LOCAL_SIZE": "3"}) == 3  # horovodrun --gloo
    assert local_size({"OMPI_COMM_WORLD_LOCAL_SIZE": "8"}) == 8  # mpirun, horovodrun --mpi
    assert local_size({"MPI_LOCALNRANKS": "2"}) == 2  # MPICH
    assert local_size({"LOCAL_WORLD_SIZE": "x", "OMPI_COMM_WORLD_LOCAL_SIZE": "0", "MPI_LOCALNRANKS": "5"}) == 5


def test_local_size_prefers_an_initialised_horovod(monkeypatch: pytest.MonkeyPatch) -> None:
    class Hvd:
        def __init__(self, up: bool) -> None:
            self.up = up

        def is_initialized(self) -> bool:
            return self.up

        def local_size(self) -> int:
            return 6

    monkeypatch.setitem(__import__("sys").modules, "horovod.torch", Hvd(True))
    assert local_size({"LOCAL_WORLD_SIZE": "2"}) == 6
    monkeypatch.setitem(__import__("sys").modules, "horovod.torch", Hvd(False))
    monkeypatch.delitem(__import__("sys").modules, "horovod.tensorflow", raising=False)
    assert local_size({"LOCAL_WORLD_SIZE": "2"}) == 2


def test_threads_per_rank() -> None:
    assert threads_per_rank(2, 2) == 1
    assert threads_per_rank(4, 16) == 4
    assert threads_per_rank(32, 16) == 1
    assert threads_per_rank(0, 16) == 16


def test_the_kernels_take_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """``numba_threads`` (called before every Numba kernel) sets Numba's count to the rule's for
    this process: with 2 ranks said to share its cores, half of them (at least 1); after an
    explicit ``torch.set_num_threads``, torch's count."""
    before_torch, before_numba = torch.get_num_threads(), numba.get_num_threads()
    for name in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", *threads.LOCAL_SIZE_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(threads, "_TORCH_AT_IMPORT", before_torch)
    try:
        threads.reset()
        want = max(1, min(threads.cores() // 2, before_torch, numba.config.NUMBA_NUM_THREADS))
        assert threads.numba_threads() == want == numba.get_num_threads()
        torch.set_num_threads(1 if before_torch > 1 else 2)
        want = min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)
        assert threads.numba_threads() == want == numba.get_num_threads()
    finally:
        torch.set_num_threads(before_torch)
        numba.set_num_threads(before_numba)
        threads.reset()


def test_the_engine_step_runs_at_the_ranks_share_and_restores_torchs_count(monkeypatch):
    import torch

    from gs_horovod import threads

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        monkeypatch.setattr(threads, "_FACTS", {"cpus": 4, "ranks_on_node": 2, "env": {}})
        with threads.engine_share() as inside:
            assert inside == torch.get_num_threads() == 2
        assert torch.get_num_threads() == 4
        torch.set_num_threads(1)  # below the share: left as it is
        with threads.engine_share() as inside:
            assert inside == torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
