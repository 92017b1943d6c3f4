"""The engine's exchanges on one transport, against a NumPy reference: on real ranks,

    horovodrun -np 3 -H localhost:3 --gloo python tests/workers/exchanges.py OUT_DIR horovod [NAME ...]
    horovodrun -np 3 -H localhost:3 --mpi  python tests/workers/exchanges.py OUT_DIR mpi [NAME ...]
    torchrun --standalone --nproc_per_node 3 --no-python python tests/workers/exchanges.py OUT_DIR ddp [NAME ...]

or on simulated ranks in the test's own process (:func:`scenarios` with a SimulatedComm).
NAME: a scenario (``one_step``, ``steps``, ``resume``, ``nonfinite``, ``nonfinite_compact``,
``options``) or a group (``all``, the default; ``transport``: what depends on the transport,
all but the resume and the compact wires' NaN), e.g. the step against NumPy alone:

    horovodrun -np 3 -H localhost:3 --gloo python tests/workers/exchanges.py /tmp/out horovod one_step

Each transport's collectives (Horovod's, ``transport="mpi"``'s, torch.distributed's, the
simulated ones) carry one :class:`gs_horovod.engine.state.EngineState` per exchange over
synthetic gradients with known heavy coordinates; every rank gathers every rank's gradients
and recomputes the step in NumPy, and counts the bytes its collectives really received. The
pytest side (tests/test_exchanges.py) asserts on the JSON each rank writes.
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any, Callable

import numpy as np
import torch

from gs_horovod.codecs import CODECS
from gs_horovod.engine import CommStats, EngineState, GsConfig, GsSgd
from gs_horovod.kernels.torch_ops import TorchOps

if __package__:  # imported by the fast tier (tests/test_exchanges.py) as workers.exchanges
    from .scenario import Scenarios
else:  # run as a script: tests/workers is on the path
    from scenario import Scenarios

COMPACT = ("compact", "compact8")  # the encoded pair wires
SIZES = {"a.weight": 3000, "b.weight": 1500, "c.bias": 10}  # c.bias is below min_size: sent exactly
EXCHANGES = ("sparse", "allgather", "sketch")
# each scenario(result, make, gather, rank, P): ``make`` gives fresh collectives, ``gather``
# every rank's equal-length tensor as (P, n)
SCENARIOS = Scenarios(transport=("one_step", "steps", "nonfinite", "options"))


class Counting:
    """Wraps a transport's collectives and counts the elements each call hands over and gets
    back, by collective (what the byte checks compare with the engine's own counts)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.size, self.averages = inner, inner.size, inner.averages
        self.allreduce_kind = inner.allreduce_kind
        self.sent: dict[str, int] = {}
        self.received = 0

    def _count(self, kind: str, x: torch.Tensor) -> None:
        self.sent[kind] = self.sent.get(kind, 0) + x.numel() * x.element_size()

    def allreduce(self, x: torch.Tensor, name: str) -> torch.Tensor:
        self._count("select" if name.startswith("gs_horovod.select") else name.split(".")[-1], x)
        return self.inner.allreduce(x, name)

    def allreduce_sum(self, x: torch.Tensor, name: str) -> torch.Tensor:
        self._count("select", x)
        return self.inner.allreduce_sum(x, name)

    def allgather(self, x: torch.Tensor, name: str) -> torch.Tensor:
        self._count("gather", x)
        return self.inner.allgather(x, name)

    def alltoall(self, x: torch.Tensor, splits: torch.Tensor, name: str,
                 kind: str = "alltoall") -> tuple[torch.Tensor, torch.Tensor]:
        self._count("alltoall", x)
        received, got = self.inner.alltoall(x, splits, name, kind)
        self.received = int(got.sum()) // 2  # pairs this rank owns
        return received, got

    def same_on_every_rank(self, value: Any, name: str) -> Any:
        return self.inner.same_on_every_rank(value, name)


def transport(kind: str) -> tuple[Callable[[], Any], Callable[[torch.Tensor], torch.Tensor], int, int]:
    """(a factory of fresh collectives, an allgather of equal-length tensors as (P, n), rank, P)."""
    if kind == "ddp":
        import torch.distributed as dist

        from gs_horovod.transports.dist import DistCollectives

        dist.init_process_group("gloo")
        P = dist.get_world_size()

        def gather(x: torch.Tensor) -> torch.Tensor:
            parts = [torch.empty_like(x) for _ in range(P)]
            dist.all_gather(parts, x)
            return torch.stack(parts)

        return lambda: DistCollectives(None), gather, dist.get_rank(), P
    import horovod.torch as hvd

    from gs_horovod.torch import GsSketch

    hvd.init()
    compressor = GsSketch(transport="mpi" if kind == "mpi" else "horovod")
    return (lambda: compressor._collectives(hvd.Average, hvd.global_process_set),
            lambda x: hvd.allgather(x[None], name=f"test.gather.{x.numel()}"), hvd.rank(), hvd.size())


def abs_key(x: np.ndarray) -> np.ndarray:
    return (x.astype(np.float32).view(np.int32) & 0x7FFFFFFF).astype(np.int64)


def top(x: np.ndarray, count: int) -> np.ndarray:
    """The ``count`` largest |x| (ties: lower index), ascending."""
    order = np.lexsort((np.arange(len(x)), -abs_key(x)))
    return np.sort(order[:count])


def reference(a: np.ndarray, k: int, small: np.ndarray, wire: str = "fp32") -> np.ndarray:
    """The step from zero residuals in NumPy: every rank's top-k of a_r (P, D) f32, their union's
    sums added in rank order in f32 and divided by P, the top k of those; then the exact mean
    of the small tensors (P, d). ``wire="compact"`` / ``"compact8"``: what those compute: each
    rank's values rounded as one message before the sums, and the means rounded before the top k
    (as one message here; the engine rounds each owner's means at that owner's scale, the same
    values while every mean lies within 2^-14 of the largest, as in every case here)."""
    compact = wire != "fp32"
    P, D = a.shape
    sums, fed = np.zeros(D, np.float32), np.zeros(D, bool)
    for r in range(P):
        mine = top(a[r], k)
        sums[mine] = sums[mine] + (CODECS[wire].rounded_numpy(a[r, mine]) if compact else a[r, mine])
        fed[mine] = True
    union = np.flatnonzero(fed)
    means = sums[union] / np.float32(P)
    if compact:
        means = CODECS[wire].rounded_numpy(means)
    update = np.zeros(D, np.float32)
    best = top(means, k)
    update[union[best]] = means[best]
    return np.concatenate([update, small.astype(np.float32).sum(0, dtype=np.float32) / np.float32(P)])


def owner_by_hand(i: int, P: int, seed: int = 0) -> int:
    """The rank that owns coordinate i under the sparse exchange, from the hash's documented
    spec (kernels/hashing.py: a sketch row of P columns) in plain Python integers, apart from
    the engine's code: K = splitmix64(seed), z = mix64(i XOR K), owner = ((z mod 2^32) · P) >> 32."""
    mask = (1 << 64) - 1

    def mix64(x: int) -> int:
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        return x ^ (x >> 31)

    key = mix64((seed + 0x9E3779B97F4A7C15) & mask)
    return ((mix64(i ^ key) & 0xFFFFFFFF) * P) >> 32


def gradients(kind: str, rank: int, P: int, seed: int) -> dict[str, torch.Tensor]:
    """Per-rank gradients: "random" (a few heavy coordinates per rank, mostly disjoint), "ties"
    (every magnitude 1 or 2), "one_region" (everything heavy in the first 200 coordinates),
    "zero_rank" (rank 1's gradient is zero)."""
    gen = torch.Generator().manual_seed(1000 * seed + rank)
    out = {n: torch.randn(d, generator=gen) * 0.01 for n, d in SIZES.items()}
    w = out["a.weight"]
    if kind == "ties":
        for n in out:
            out[n] = torch.where(torch.rand(SIZES[n], generator=gen) < 0.02, 2.0, 1.0) * \
                torch.sign(torch.randn(SIZES[n], generator=gen))
    elif kind == "one_region":
        w[:200] += torch.randn(200, generator=gen) * 10
    elif kind == "zero_rank" and rank == 1:
        out = {n: torch.zeros(d) for n, d in SIZES.items()}
    else:
        heavy = torch.randint(0, 4500, (20,), generator=gen)
        w[heavy[heavy < 3000]] += 5.0
    return out


def flat(step: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([step[n] for n in sorted(SIZES)])


def state(make: Callable[[], Any], **options: Any) -> tuple[EngineState, Counting]:
    """An engine on fresh collectives; ``wire="fp32"`` unless given (the NumPy references are
    of exact pairs; the compact cases name their wire)."""
    comm = Counting(make())
    config = GsConfig(ratio=0.01, **{"wire": "fp32", **options})
    return EngineState(GsSgd(config, TorchOps(), comm), CommStats()), comm


def digest(*tensors: torch.Tensor) -> str:
    """The tensors' bits, hashed (equal digests: bitwise equal)."""
    return hashlib.sha256(b"".join(t.numpy().tobytes() for t in tensors)).hexdigest()[:16]


def step_of(st: EngineState, grads: dict[str, torch.Tensor]) -> torch.Tensor:
    out = st.step({n: g.clone() for n, g in grads.items()})
    return torch.cat([out[n] for n in st.plan.all_names])


def scenarios(make: Callable[[], Any], gather: Callable[[torch.Tensor], torch.Tensor], rank: int, P: int,
              names: tuple[str, ...] = ()) -> dict[str, Any]:
    """The scenarios ``names`` stand for (none: all) on rank ``rank`` of ``P``: ``make`` gives
    fresh collectives, ``gather`` every rank's equal-length tensor as (P, n); returns this
    rank's result."""
    result: dict[str, Any] = {"ranks": P}
    result["scenarios"] = SCENARIOS.run(names, result, make, gather, rank, P)
    return result


def bitwise(got: np.ndarray, want: np.ndarray) -> dict[str, Any]:
    """Whether two float32 arrays are equal bit for bit, and where they first differ."""
    differ = np.flatnonzero(got.view(np.int32) != want.view(np.int32))
    first = int(differ[0]) if len(differ) else None
    return {"equal": not len(differ), "differing": len(differ), "first": first,
            "values": None if first is None else [float(got[first]), float(want[first])]}


@SCENARIOS
def one_step(result: dict, make: Callable[[], Any], gather: Callable[[torch.Tensor], torch.Tensor], rank: int,
              P: int) -> None:
    """One step of the sparse exchange (each wire) on four gradient cases, against NumPy."""
    layout_names = sorted(n for n, d in SIZES.items() if d >= 1024) + ["c.bias"]
    for case in ("random", "ties", "one_region", "zero_rank"):
        grads = gradients(case, rank, P, 0)
        everyone = gather(torch.cat([grads[n] for n in layout_names]))
        D = sum(SIZES[n] for n in layout_names[:-1])
        want = reference(everyone[:, :D].numpy(), 45, everyone[:, D:].numpy())
        st, comm = state(make, exchange="sparse")
        got = step_of(st, grads).numpy()
        # the compressed part bit for bit; the small tensors go through the transport's own
        # allreduce, whose order of addition is its own
        result[f"{case}_against_reference"] = bitwise(got[:D], want[:D])
        result[f"{case}_small_max_abs"] = float(np.abs(got[D:] - want[D:]).max())
        result[f"{case}_nonzeros"] = int(np.count_nonzero(got[:D]))
        result[f"{case}_owned"] = comm.received
        # what every owner should receive, recomputed: each rank's top k (from zero residuals)
        # routed by the hash written out above; and, for contrast, by contiguous regions of D/P
        fed = np.concatenate([top(everyone[q, :D].numpy(), 45) for q in range(P)])
        result[f"{case}_owned_by_hand"] = np.bincount([owner_by_hand(int(i), P) for i in fed], minlength=P).tolist()
        result[f"{case}_owned_by_region"] = np.bincount(fed * P // D, minlength=P).tolist()
        result[f"{case}_counted"] = comm.sent
        result[f"{case}_stats"] = vars(st.stats)
        # the compact wires: the same step on rounded values and rounded sums, bit for bit
        for wire in COMPACT:
            st, comm = state(make, exchange="sparse", wire=wire)
            got = step_of(st, grads).numpy()
            want = reference(everyone[:, :D].numpy(), 45, everyone[:, D:].numpy(), wire)
            result[f"{wire}_{case}_against_reference"] = bitwise(got[:D], want[:D])
            result[f"{wire}_{case}_nonzeros"] = int(np.count_nonzero(got[:D]))
            result[f"{wire}_{case}_counted"] = comm.sent
            result[f"{wire}_{case}_stats"] = vars(st.stats)


@SCENARIOS
def steps(result: dict, make: Callable[[], Any], gather: Callable[[torch.Tensor], torch.Tensor], rank: int,
          P: int) -> None:
    """4 steps of every exchange and wire: the sparse exchange against the allgather's top k,
    the residuals' conservation, the bytes counted."""
    # several steps: the sparse exchange's update and residuals equal the allgather's top k (the
    # same selection, the same sums); the sketch runs on the same transport; the residuals keep
    # what was not applied: Σ_r e_r + P·ΣΔ = Σ_r Σ_t g_r,t
    counted = {e: state(make, exchange=e, **({"apply": "topk"} if e == "allgather" else {})) for e in EXCHANGES}
    counted.update({f"{w}_{e}": state(make, exchange=e, wire=w) for e in ("sparse", "allgather") for w in COMPACT})
    runs = {e: st for e, (st, _) in counted.items()}
    applied = {e: torch.zeros(sum(SIZES.values())) for e in runs}
    total = torch.zeros(sum(SIZES.values()))
    for t in range(4):
        grads = gradients("random", rank, P, 10 + t)
        total += flat(grads)
        for e, st in runs.items():
            applied[e] += step_of(st, grads)
    same = torch.equal(applied["sparse"], applied["allgather"]) and \
        torch.equal(runs["sparse"].residual, runs["allgather"].residual)
    result["sparse_equals_allgather_topk"] = bool(same)
    for e, st in runs.items():
        D = st.plan.total
        kept = gather(st.residual).sum(0) + P * applied[e][:D]
        result[f"{e}_conservation_max_abs"] = float((kept - gather(total[:D]).sum(0)).abs().max())
        result[f"{e}_digest"] = float(applied[e].double().sum())
        result[f"{e}_exchange"] = st.plan.exchange
        result[f"{e}_steps_counted"] = counted[e][1].sent
        result[f"{e}_steps_stats"] = vars(st.stats)



@SCENARIOS
def resume(result: dict, make: Callable[[], Any], gather: Callable[[torch.Tensor], torch.Tensor], rank: int,
           P: int) -> None:
    """Restored from saved per-tensor state: bitwise the uninterrupted run."""
    # resume: a new state restored from the first one's per-tensor state after 2 steps continues
    # bitwise as the uninterrupted run (the region edges are not saved: they move no bit), also
    # 2 steps into a 3-step warm-up; the control, a fresh state from step 2, does not
    for label, options in (("resume", {}), ("warmup_resume", {"warmup_steps": 3})):
        whole, _ = state(make, exchange="sparse", **options)
        first, _ = state(make, exchange="sparse", **options)
        fresh = None
        digests: dict[str, list[str]] = {"straight": [], "resumed": [], "not_restored": []}
        for t in range(4):
            grads = gradients("one_region" if t % 2 else "random", rank, P, 20 + t)
            if t == 2:
                resumed, _ = state(make, exchange="sparse", **options)
                resumed.restore(first.tensors())
                first, fresh = resumed, state(make, exchange="sparse", **options)[0]
            for key, st in (("straight", whole), ("resumed", first), ("not_restored", fresh)):
                if st is not None:
                    digests[key].append(digest(step_of(st, grads), st.residual))
        result[f"{label}_digests"] = digests


def nan_on_last_rank(result: dict, make: Callable[[], Any], rank: int, P: int, wire: str, prefix: str) -> None:
    """NaN on one rank: every rank raises naming the tensor, and nothing is committed."""
    st, _ = state(make, exchange="sparse", wire=wire)
    step_of(st, gradients("random", rank, P, 30))
    before = st.residual.clone()
    bad = gradients("random", rank, P, 31)
    if rank == P - 1:
        bad["b.weight"][7] = float("nan")
    try:
        step_of(st, bad)
        result[f"{prefix}nan_error"] = ""
    except FloatingPointError as error:
        result[f"{prefix}nan_error"] = str(error)
    result[f"{prefix}nan_residual_change"] = float((st.residual - before).abs().max())


@SCENARIOS
def nonfinite(result: dict, make: Callable[[], Any], gather: Callable[[torch.Tensor], torch.Tensor], rank: int,
              P: int) -> None:
    """NaN on the last rank, the fp32 wire (:func:`nan_on_last_rank`)."""
    nan_on_last_rank(result, make, rank, P, "fp32", "")


@SCENARIOS
def nonfinite_compact(result: dict, make: Callable[[], Any], gather: Callable[[torch.Tensor], torch.Tensor],
                      rank: int, P: int) -> None:
    """NaN on the last rank, the compact wires (:func:`nan_on_last_rank`)."""
    for wire in COMPACT:
        nan_on_last_rank(result, make, rank, P, wire, f"{wire}_")


@SCENARIOS
def options(result: dict, make: Callable[[], Any], gather: Callable[[torch.Tensor], torch.Tensor], rank: int,
            P: int) -> None:
    """Options that differ across ranks: every rank raises."""
    st, _ = state(make, exchange="sparse", **({"seed": 1} if rank == 0 else {}))
    try:
        step_of(st, gradients("random", rank, P, 40))
        result["options_error"] = ""
    except ValueError as error:
        result["options_error"] = str(error)


def main(out_dir: str, kind: str, *names: str) -> None:
    from rank_result import write_result

    make, gather, rank, P = transport(kind)
    write_result(out_dir, rank, scenarios(make, gather, rank, P, names))
    if kind == "ddp":
        import torch.distributed as dist

        dist.destroy_process_group()  # before exit: gloo's threads may abort a rank left running


if __name__ == "__main__":
    main(*sys.argv[1:])
