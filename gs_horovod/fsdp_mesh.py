"""The HSDP layout :class:`~gs_horovod.fsdp.GsFsdpState` accepts: every trainable parameter
sharded by ``fully_shard`` on one 1-D shard mesh, and a replicate group that meets it in this
rank alone, the two spanning the job. Each check raises ValueError naming the fix."""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

OWNER = "GsFsdpState"


def group_ranks(group: Optional[dist.ProcessGroup]) -> list[int]:
    """The global ranks of ``group`` (None: the default group), in group-rank order."""
    return list(range(dist.get_world_size())) if group is None else dist.get_process_group_ranks(group)


def shard_ranks(params: dict[str, torch.nn.Parameter]) -> list[int]:
    """The global ranks of the one 1-D mesh every parameter of ``params`` is sharded on."""
    if not params:
        raise ValueError(f"{OWNER}: the model has no parameter with requires_grad")
    found: Optional[list[int]] = None
    for name, p in params.items():
        if not isinstance(p, DTensor):
            raise ValueError(f"{OWNER}: parameter {name!r} is not sharded by fully_shard; apply "
                             "fully_shard(module, mesh=mesh['shard']) to every module, the root too")
        if p.device_mesh.ndim != 1:
            raise ValueError(f"{OWNER}: parameter {name!r} is sharded on a {p.device_mesh.ndim}-D mesh "
                             f"{p.device_mesh.mesh_dim_names}: there FSDP all-reduces across replicas itself "
                             "(native HSDP), densely; apply fully_shard(module, mesh=mesh['shard']) (1-D) and "
                             "pass mesh.get_group('replicate')")
        ranks = group_ranks(p.device_mesh.get_group())
        if found is not None and ranks != found:
            raise ValueError(f"{OWNER}: parameter {name!r} is sharded over ranks {ranks}, others over {found}; "
                             "every module must use the same shard mesh")
        found = ranks
    return found


def layout(params: dict[str, torch.nn.Parameter],
           replicate_group: Optional[dist.ProcessGroup]) -> tuple[tuple[int, int], tuple[int, int], list[int]]:
    """(mesh (R, S), this rank's coordinate (replicate index, shard index), the replicate
    group's global ranks) of ``params`` sharded on their shard mesh and ``replicate_group``."""
    shards, replicas = shard_ranks(params), group_ranks(replicate_group)
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank not in replicas:
        raise ValueError(f"replicate_group {replicas} does not hold this rank ({rank})")
    if set(shards) & set(replicas) != {rank}:
        raise ValueError(f"replicate_group {replicas} must meet the shard mesh's ranks {shards} in "
                         f"this rank ({rank}) alone: pass mesh.get_group('replicate') of the mesh whose 'shard' "
                         "dimension fully_shard was given")
    if len(shards) * len(replicas) != world:
        raise ValueError(f"{OWNER} agrees on every step and checkpoints over the default group, so the mesh must "
                         f"span the job: replicate_group of {len(replicas)} × shard mesh of "
                         f"{len(shards)} ranks is not the world size {world}")
    return (len(replicas), len(shards)), (replicas.index(rank), shards.index(rank)), replicas


def mixed_layout(count: float, coordinate: tuple[int, int], mesh: tuple[int, int], replicas: list[int]) -> str:
    """The ValueError text when ``count`` ranks found their replicate group holding other shards."""
    return (f"{OWNER}: the ranks of a replicate group hold different shards ({count:g} rank(s) found so; this rank "
            f"holds shard {coordinate[1]} of {mesh[1]} with replicate ranks {replicas}): pass "
            "mesh.get_group('replicate') of the mesh whose 'shard' dimension fully_shard was given")
