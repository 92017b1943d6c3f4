"""HSDP with FSDP2 and gs-SGD: the CNN sharded by ``fully_shard`` within a group of ranks, its
gradients reduced across the replica groups by ``GsFsdpState`` (``register_fsdp_hooks``).

    torchrun --standalone --nproc_per_node 4 scripts/examples/train_fsdp.py --replicas 2

The ranks form a ``--replicas`` R × S mesh (S = ranks / R). ``--ratio R`` fixes the fraction of
coordinates sent a step (default: ``ratio="auto"``). The benchmark harness's version, with dense
HSDP beside it, the LM and the byte counts: scripts/bench/train_fsdp.py.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from data import MnistCNN, mnist5k
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from gs_horovod.fsdp import GsFsdpState, register_fsdp_hooks
from gs_horovod.torchrun import init_process_group


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=2, help="R; S = ranks / R shard the model")
    p.add_argument("--ratio", type=float, help="k / d (default: ratio='auto')")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    return p.parse_args(argv)


def main() -> None:
    args = parse_args()
    init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # every rank starts from the same weights
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (args.replicas, size // args.replicas), mesh_dim_names=("replicate", "shard"))

    model = MnistCNN()
    for layer in model:  # each layer with parameters, then the root, sharded over this rank's row
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh["shard"])
    fully_shard(model, mesh=mesh["shard"])
    options = {} if args.ratio is None else {"ratio": args.ratio}
    state = GsFsdpState(mesh.get_group("replicate"), model=model, **options)
    register_fsdp_hooks(model, state)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    x_train, y_train, x_test, y_test = map(torch.from_numpy, mnist5k(rank, size))
    steps = len(x_train) // args.batch_size
    for epoch in range(args.epochs):
        order = torch.randperm(len(x_train))
        for step in range(steps):
            batch = order[step * args.batch_size:(step + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x_train[batch]), y_train[batch])
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        if rank == 0:
            print(f"epoch {epoch + 1}  loss {loss.item():.4f}  held-out accuracy {accuracy:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
