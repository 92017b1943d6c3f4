"""What a torch.distributed job on gloo needs to restart and to finish cleanly under
``torchrun`` (torch 2.13, CPU), for the DDP and FSDP2 adapters and any user script:

- :func:`init_process_group`: ``dist.init_process_group`` with the store's keys kept apart per
  torchrun attempt. Workers restarted by ``torchrun --max-restarts`` reach the same agent
  store (same ``MASTER_PORT``) with the same keys, and gloo's full-mesh connect may read the
  address a killed worker of the previous attempt published: "Gloo connectFullMesh failed ...
  Connection refused", or a hang (docs/reliability.md counts both).
- :func:`release_gloo_workers_at_exit`: at interpreter exit, a gloo worker thread may still be
  dropping its last finished work, which holds Python objects (autograd's thread-local context,
  a hook's bucket tensor); if the interpreter is finalizing when that thread asks for the GIL,
  CPython ends the thread inside a noexcept destructor and the rank aborts ("terminate called
  without an active exception", SIGABRT) after its work is done, even after
  ``destroy_process_group()`` (DDP's lazy imports keep the group alive). An exit handler that
  lets go of the GIL for a moment lets those threads finish first. Registered by
  :func:`init_process_group` and by the DDP and FSDP2 states' collectives
  (:class:`~gs_horovod.transports.dist.DistCollectives`).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from .transports.dist import release_gloo_workers_at_exit


def init_process_group(backend: str = "gloo", **kwargs: Any) -> None:
    """``dist.init_process_group(backend, **kwargs)`` for a script that ``torchrun`` may
    restart: under torchrun's agent store its keys go under ``attempt<TORCHELASTIC_RESTART_COUNT>/``;
    elsewhere (no torchrun, or ``init_method``/``store`` given) it is torch's call as it is."""
    release_gloo_workers_at_exit()
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if attempt is None or not agent_store or {"init_method", "store"} & set(kwargs):
        dist.init_process_group(backend, **kwargs)
        return
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), size, is_master=False,
                          timeout=kwargs.get("timeout", timedelta(minutes=30)))
    dist.init_process_group(backend, store=dist.PrefixStore(f"attempt{attempt}", store), rank=rank,
                            world_size=size, **kwargs)
