"""The private torch internals :mod:`gs_horovod.fsdp` reads, in one place. Written against
torch 2.13; checked once, at import, and :func:`require` raises RuntimeError naming every
one this torch lacks (importing this module never raises for that)."""

from __future__ import annotations

import weakref
from typing import Any, Callable, Optional

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

TESTED = "2.13"


def _missing() -> list[str]:
    """The internals this torch lacks, by the name 2.13 gives them."""
    missing = []
    if not hasattr(FSDPModule, "_get_fsdp_state"):
        missing.append("FSDPModule._get_fsdp_state")
    if not hasattr(FSDPModule, "set_all_reduce_hook"):
        missing.append("FSDPModule.set_all_reduce_hook")
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
        from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
    except ImportError:
        missing.append("torch.distributed.fsdp._fully_shard (FSDPState, FSDPParamGroup)")
    else:
        import inspect

        if "_fsdp_param_groups" not in inspect.getsource(FSDPState.__init__):
            missing.append("FSDPState._fsdp_param_groups")
        init = inspect.getsource(FSDPParamGroup.__init__)
        missing += [f"FSDPParamGroup.{a}" for a in ("all_reduce_grads", "fsdp_params") if a not in init]
    if "_local_tensor" not in getattr(DTensor, "__slots__", ()):
        missing.append("DTensor._local_tensor")
    if not hasattr(torch._C, "_current_graph_task_id"):
        missing.append("torch._C._current_graph_task_id")
    if not hasattr(torch.autograd.Variable._execution_engine, "queue_callback"):
        missing.append("torch.autograd.Variable._execution_engine.queue_callback")
    return missing


MISSING = _missing()


def require(owner: str) -> None:
    """Raises RuntimeError naming what of :data:`MISSING` ``owner`` needs, if any."""
    if MISSING:
        raise RuntimeError(f"{owner} reads FSDP2 internals of torch {TESTED} that this torch {torch.__version__} "
                           f"does not have: {', '.join(MISSING)}")


def param_group(module: FSDPModule) -> Any:
    """``module``'s ``FSDPParamGroup``, or None when it manages no parameter."""
    groups = module._get_fsdp_state()._fsdp_param_groups
    return groups[0] if groups else None


def group_params(group: Any) -> list[DTensor]:
    """The sharded parameters of ``FSDPParamGroup`` ``group``."""
    return [fp.sharded_param for fp in group.fsdp_params]


def wants_all_reduce(group: Any) -> bool:
    """``group``'s ``set_requires_all_reduce`` flag in this backward."""
    return bool(group.all_reduce_grads)


def graph_task() -> int:
    """The id of the autograd graph task running now (-1 outside backward)."""
    return torch._C._current_graph_task_id()


def at_end_of_backward(callback: Callable[[], None]) -> None:
    """Queues ``callback`` to run when the running backward ends."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)


def unchanged(grad: Optional[DTensor], written: Optional[tuple[Any, int]]) -> bool:
    """Whether ``grad``'s local tensor is still the one ``written`` ((weakref, version), from
    :func:`write_grads`) recorded, unmodified since."""
    if grad is None or written is None:
        return False
    shard = grad._local_tensor
    return written[0]() is shard and shard._version == written[1]


def local_grads(params: dict[str, DTensor], sizes: dict[str, int]) \
        -> tuple[dict[str, torch.Tensor], dict[str, Optional[torch.Tensor]]]:
    """(name → this rank's shard of ``.grad`` flat (d,) f32, zeros of ``sizes[name]`` where
    ``.grad`` is None; name → the local tensor of ``.grad`` or None)."""
    grads, local = {}, {}
    for name, p in params.items():
        shard = local[name] = None if p.grad is None else p.grad._local_tensor
        grads[name] = (torch.zeros(sizes[name], dtype=torch.float32, device=p.device)
                       if shard is None else shard.detach().reshape(-1).float())
    return grads, local


def write_grads(params: dict[str, DTensor], updates: dict[str, torch.Tensor],
                local: dict[str, Optional[torch.Tensor]]) -> dict[str, tuple[Any, int]]:
    """Each update (d,) f32 into its parameter's sharded ``.grad`` in the grad's dtype (a new
    ``.grad`` where there was none and the update is not zero). Returns name → (weakref to the
    written local tensor, its version once all are written: a module's grads are views of one
    buffer, one counter)."""
    written = []
    for name, p in params.items():
        update, shard = updates[name], local[name]
        if shard is None:
            if not bool(update.any()):
                continue
            p.grad = DTensor.from_local(update.view(p.to_local().shape).to(p.dtype), p.device_mesh, p.placements,
                                        shape=p.shape, stride=p.stride())
            shard = p.grad._local_tensor
        else:
            shard.copy_(update.view(shard.shape))
        written.append((name, shard))
    return {name: (weakref.ref(shard), shard._version) for name, shard in written}
