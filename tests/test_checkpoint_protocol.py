"""The checkpoint protocol of gs_horovod.compressor (gather to rank 0, scatter back, errors
raised on every rank) on P threads whose alltoall of bytes meets at a barrier; the real
Horovod runs are in tests/test_checkpoints.py."""

from __future__ import annotations

import threading
from typing import Any, Callable

import pytest

from gs_horovod.checkpoint import CheckpointApi, check_local_state, gather_state, options_difference, scatter_state

OPTIONS = {"ratio": 0.05, "seed": 0}


class Alltoall:
    """An alltoall of bytes between ``size`` threads."""

    def __init__(self, size: int) -> None:
        self.size, self.barrier = size, threading.Barrier(size)
        self.slots: list[list[bytes]] = [[] for _ in range(size)]

    def of(self, rank: int) -> Callable[[list[bytes]], list[bytes]]:
        def exchange(out: list[bytes]) -> list[bytes]:
            assert len(out) == self.size
            self.slots[rank] = out
            self.barrier.wait()
            received = [self.slots[src][rank] for src in range(self.size)]
            self.barrier.wait()
            return received

        return exchange


def on_ranks(size: int, fn: Callable[[int, Callable], Any]) -> list[Any]:
    """``fn(rank, exchange)`` on ``size`` threads: each rank's result or the exception it raised."""
    group, results = Alltoall(size), [None] * size

    def main(rank: int) -> None:
        try:
            results[rank] = fn(rank, group.of(rank))
        except Exception as e:  # noqa: BLE001 - returned for the test to inspect
            results[rank] = e

    threads = [threading.Thread(target=main, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a rank was left waiting in a collective"
    return results


def local(rank: int, size: int, options: dict = OPTIONS) -> dict:
    return {"options": options, "world_size": size, "rank": rank, "tensors": {"w": [rank] * 3}}


def test_gather_then_scatter_hands_each_rank_its_own_state():
    saved = on_ranks(3, lambda r, ex: gather_state(local(r, 3), ex, r, 3))
    assert saved[1] is None and saved[2] is None
    assert saved[0]["world_size"] == 3 and [p["tensors"]["w"] for p in saved[0]["ranks"]] == [[0] * 3, [1] * 3, [2] * 3]
    back = on_ranks(3, lambda r, ex: scatter_state(saved[0] if r == 0 else None, ex, r, 3, OPTIONS))
    assert back == [local(r, 3) for r in range(3)]


def test_another_world_size_fails_on_every_rank():
    saved = on_ranks(2, lambda r, ex: gather_state(local(r, 2), ex, r, 2))[0]
    errors = on_ranks(3, lambda r, ex: scatter_state(saved if r == 0 else None, ex, r, 3, OPTIONS))
    assert all(isinstance(e, ValueError) for e in errors)
    assert {str(e) for e in errors} == {"GsSketch state was saved by 2 ranks, this job has 3: residuals are per "
                                        "rank, so resume with 2 ranks, or leave the GsSketch state out to start "
                                        "residuals from zero"}


def test_options_that_differ_on_one_rank_fail_on_every_rank_naming_it():
    saved = on_ranks(3, lambda r, ex: gather_state(local(r, 3), ex, r, 3))[0]
    mine = [OPTIONS, {**OPTIONS, "ratio": 0.1}, OPTIONS]
    errors = on_ranks(3, lambda r, ex: scatter_state(saved if r == 0 else None, ex, r, 3, mine[r]))
    assert {str(e) for e in errors} == {"GsSketch state was saved with different options: ratio=0.05 saved, "
                                        "0.1 now (on rank(s) [1] of 3)"}


def test_rank0_passing_nothing_restores_nothing_on_every_rank():
    assert on_ranks(2, lambda r, ex: scatter_state(None, ex, r, 2, OPTIONS)) == [None, None]


def test_rank0_passing_a_local_state_fails_on_every_rank():
    errors = on_ranks(2, lambda r, ex: scatter_state(local(0, 2) if r == 0 else None, ex, r, 2, OPTIONS))
    assert all(isinstance(e, ValueError) and "this is one rank's state" in str(e) for e in errors)


class ThreadRank(CheckpointApi):
    """CheckpointApi on one of P threads: ``_exchange`` the threads' alltoall, ``_arrive`` a sum
    over the threads that meet at a barrier within the timeout (None when one never comes)."""

    def __init__(self, rank: int, group: Alltoall, sums: list[float]) -> None:
        self.rank, self.group, self.sums, self.loaded = rank, group, sums, None
        self._exchange = group.of(rank)
        self.checkpoint_timeout = 0.5

    def local_state_dict(self) -> dict:
        return local(self.rank, self.group.size)

    def _load(self, state: dict) -> None:
        self.loaded = state

    def _options(self) -> dict:
        return OPTIONS

    def _rank(self) -> int:
        return self.rank

    def _size(self) -> int:
        return self.group.size

    def _arrive(self, value: float, name: str, timeout: float) -> float | None:
        self.sums[self.rank] = value
        try:
            self.group.barrier.wait(timeout)
        except threading.BrokenBarrierError:
            return None
        return sum(self.sums)


def test_rank0_alone_loading_restores_every_rank_at_the_next_agreement():
    saved = on_ranks(3, lambda r, ex: gather_state(local(r, 3), ex, r, 3))[0]
    group, sums = Alltoall(3), [0.0] * 3
    ranks = [ThreadRank(r, group, sums) for r in range(3)]
    ranks[0].load_state_dict(saved)  # rank 0 alone: nothing waits
    assert [r.step_flag() for r in ranks] == [1.0, 0.0, 0.0] and ranks[1].loaded is None
    on_ranks(3, lambda r, ex: ranks[r].agree(1.0))  # the step's flags, summed
    assert [r.loaded for r in ranks] == [local(r, 3) for r in range(3)]
    assert [r.step_flag() for r in ranks] == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="saved by 3 ranks, this job has 2"):
        ThreadRank(0, Alltoall(2), [0.0] * 2).load_state_dict(saved)  # at once, on rank 0


def test_rank0_alone_saving_raises_within_the_timeout_and_the_next_agreement_everywhere():
    group, sums = Alltoall(2), [0.0] * 2
    ranks = [ThreadRank(r, group, sums) for r in range(2)]
    with pytest.raises(RuntimeError, match=r"ThreadRank.state_dict\(\) is a collective: every rank calls it at the "
                                           r"same point, but not every rank called it within checkpoint_timeout=0.5 s"):
        ranks[0].state_dict()
    assert [r.step_flag() for r in ranks] == [65536.0, 0.0]
    for r in ranks:
        with pytest.raises(RuntimeError, match="state_dict"):
            r.agree(65536.0)


def test_options_difference_names_each_option():
    diff = options_difference({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4})
    assert diff == "b=2 saved, 3 now; c='<absent>' saved, 4 now"
    assert options_difference(OPTIONS, dict(OPTIONS)) == ""


def test_a_state_saved_before_the_wire_option_loads_and_other_options_still_count():
    now = {**OPTIONS, "wire": "compact"}
    older = local(0, 2)  # its options have no "wire": written before the option existed
    assert check_local_state(older, now, 2) == ""
    assert "wire='fp32' saved, 'compact' now" in check_local_state(local(0, 2, {**OPTIONS, "wire": "fp32"}), now, 2)
    assert "ratio=0.05 saved, 0.1 now" in check_local_state(older, {**now, "ratio": 0.1}, 2)


def test_a_state_saved_before_ramp_and_critical_loads_where_they_are_off_and_is_refused_where_not():
    now = {**OPTIONS, "ramp": 0, "critical": 0.0}
    older = local(0, 2)  # no "ramp" or "critical": saved before they existed, with both off
    assert check_local_state(older, now, 2) == ""
    assert "ramp=0 saved, 40 now" in check_local_state(older, {**now, "ramp": 40}, 2)
    assert "critical=0.0 saved, 0.5 now" in check_local_state(older, {**now, "critical": 0.5}, 2)


def test_a_state_saved_with_the_former_merge_option_loads_as_transport():
    """``merge`` became ``transport``: a state saved under the old name compares as the new one."""
    now = {**OPTIONS, "transport": "horovod"}
    assert check_local_state(local(0, 2, {**OPTIONS, "merge": "horovod"}), now, 2) == ""
    assert check_local_state(local(0, 2, {**OPTIONS, "transport": "horovod"}), now, 2) == ""
    differs = check_local_state(local(0, 2, {**OPTIONS, "merge": "mpi"}), now, 2)
    assert "transport='mpi' saved, 'horovod' now" in differs and "merge" not in differs
