"""The adaptive density (``ratio="auto"``, the default) on real ranks, one adapter per run; one
JSON per rank with, per step, the level the step ran at (``stats.density``) and a digest of
the model after it.

    horovodrun -np 2 -H localhost:2 --gloo python tests/workers/density_ranks.py OUT_DIR {horovod,tensorflow} [NAME ...]
    torchrun --standalone --nproc_per_node 2 tests/workers/density_ranks.py OUT_DIR {ddp,fsdp} [NAME ...]

Budgets make the rule's choice independent of the machine's timings; the scenarios (NAME:
``tight``, ``loose``, ``ramped``; none: all; results under ``result[NAME]``): ``tight``,
``budget=1e-9`` (no level fits: the sparsest after the first window), ``loose``, ``budget=1e6``
(dense fits: stays dense), and ``ramped``, the tight budget with ``ramp=16`` and
``critical=0.5`` (the ramp's 0.05 after the first window; the gradient norms measured and
agreed). E.g. the tight budget under DDP alone:

    torchrun --standalone --nproc_per_node 2 tests/workers/density_ranks.py /tmp/out ddp tight
"""

import hashlib
import sys

import torch
import torch.nn.functional as F
from rank_result import write_result
from scenario import Scenarios

STEPS = 12
OPTIONS = {"tight": {"budget": 1e-9}, "loose": {"budget": 1e6},
           "ramped": {"budget": 1e-9, "ramp": 16, "critical": 0.5}}


def mlp() -> torch.nn.Sequential:
    """32-64-64-10, tanh: 6,922 parameters."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 10))


def digest(params: list[torch.Tensor]) -> str:
    return hashlib.sha256(torch.cat([p.detach().float().reshape(-1) for p in params]).numpy().tobytes()).hexdigest()


def params(model: torch.nn.Module) -> list[torch.Tensor]:
    return list(model.parameters())


def full_params(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.full_tensor() for p in model.parameters()]


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int, stats, full) -> dict:
    levels, digests = [], []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        levels.append(stats.density)
        digests.append(digest(full(model)))
    return {"levels": levels, "digests": digests, "gather_bytes": stats.gather_bytes,
            "dense_bytes": stats.dense_bytes, "changes": stats.density_changes}


def horovod():
    """Horovod's DistributedOptimizer with GsSketch: (this rank, a run for one scenario's options)."""
    import horovod.torch as hvd

    from gs_horovod.torch import GsSketch

    class Payloads(GsSketch):
        """GsSketch that notes what each compress hands Horovod: (dtype, elements) per step."""

        def compress(self, tensor):
            payload, ctx = super().compress(tensor)
            self.handed.append((str(payload.dtype), payload.numel()))
            return payload, ctx

    def run(options: dict) -> dict:
        model = mlp()
        gs = Payloads(min_size=64, **options)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(), compression=gs)
        handed, errors = [], []
        for step in range(STEPS):
            gs.handed = []
            g = torch.Generator().manual_seed(1000 * step + hvd.rank())
            x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            local = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
            opt.synchronize()
            # the reference: every rank's gradient rounded to float16, averaged in float32
            errors.append(max(float((p.grad - hvd.allgather(local[name].half().float()[None]).mean(0)).abs().max())
                              for name, p in model.named_parameters()))
            with opt.skip_synchronize():
                opt.step()
            handed.append(sorted(gs.handed))
        model = mlp()
        gs = GsSketch(min_size=64, **options)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(), compression=gs)
        out = train(model, opt, hvd.rank(), gs.stats, params)
        (engine, _), = gs._states.values()  # one optimizer's EngineState
        return {**out, "handed": handed, "errors": errors, "last_norm": engine.density.last_norm}

    hvd.init()
    return hvd.rank(), run


def ddp():
    """DDP with GsState's hook: (this rank, a run for one scenario's options)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from gs_horovod.ddp import GsState, gs_hook

    def run(options: dict) -> dict:
        model = DistributedDataParallel(mlp(), bucket_cap_mb=0.01)  # buckets of 2,500 floats: 3 buckets
        state = GsState(model=model, min_size=64, **options)
        model.register_comm_hook(state, gs_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        out = train(model, opt, dist.get_rank(), state.stats, params)
        state.comm.traffic.end_step()  # the collectives of the whole run (DDP's GsState does not end steps)
        return {**out, "collectives": state.comm.traffic.last_step, "last_norm": state.engine.density.last_norm}

    dist.init_process_group("gloo")
    return dist.get_rank(), run


def fsdp():
    """FSDP2 (HSDP mesh, one shard per replicate) with GsFsdpState: (this rank, a run for one scenario's options)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from gs_horovod.fsdp import GsFsdpState, register_fsdp_hooks

    def run(options: dict) -> dict:
        model = mlp()
        for layer in (model[0], model[2], model[4]):
            fully_shard(layer, mesh=mesh["shard"])
        fully_shard(model, mesh=mesh["shard"])
        state = GsFsdpState(mesh.get_group("replicate"), model=model, min_size=64, **options)
        register_fsdp_hooks(model, state)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        return {**train(model, opt, dist.get_rank(), state.stats, full_params),
                "last_norm": state.engine.density.last_norm}

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(), 1), mesh_dim_names=("replicate", "shard"))
    return dist.get_rank(), run


def tensorflow():
    """Horovod's DistributedGradientTape with the TensorFlow GsSketch, the step in a
    ``tf.function`` (graph mode, as Keras runs it): (this rank, a run for one scenario's options).
    Also records the density saved by ``local_state_dict()`` and what a fresh GsSketch holds
    after loading it (``reloaded_density``)."""
    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    from gs_horovod.tensorflow import GsSketch

    def run(options: dict) -> dict:
        torch_model = mlp()  # the same initial weights as the torch adapters'
        layers = [torch_model[0], torch_model[2], torch_model[4]]
        weights = [tf.Variable(w, name=f"{kind}{i}") for i, layer in enumerate(layers)
                   for kind, w in (("w", layer.weight.detach().numpy().T), ("b", layer.bias.detach().numpy()))]
        gs = GsSketch(min_size=64, **options)
        opt = tf.keras.optimizers.SGD(0.1)

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                h = x
                for i in range(0, len(weights), 2):
                    h = h @ weights[i] + weights[i + 1]
                    h = tf.tanh(h) if i + 2 < len(weights) else h
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, h))
            grads = hvd.DistributedGradientTape(tape, compression=gs).gradient(loss, weights)
            opt.apply_gradients(zip(grads, weights))

        levels, digests = [], []
        for s in range(STEPS):
            g = torch.Generator().manual_seed(1000 * s + hvd.rank())
            x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
            step(tf.constant(x.numpy()), tf.constant(y.numpy()))
            levels.append(gs.stats.density)
            digests.append(hashlib.sha256(np.concatenate([w.numpy().reshape(-1) for w in weights]).tobytes())
                           .hexdigest())
        saved = gs.local_state_dict()
        fresh = GsSketch(min_size=64, **options)
        fresh.load_local_state_dict(saved)
        (measured,) = gs._traced.levels.values()
        return {"levels": levels, "digests": digests, "gather_bytes": gs.stats.gather_bytes,
                "dense_bytes": gs.stats.dense_bytes, "changes": gs.stats.density_changes,
                "last_norm": measured.density.last_norm, "saved_density": saved["density"],
                "reloaded_density": fresh.local_state_dict()["density"]}

    hvd.init()
    return hvd.rank(), run


SCENARIOS = Scenarios()


@SCENARIOS
def tight(result: dict, run) -> None:
    result["tight"] = run(OPTIONS["tight"])


@SCENARIOS
def loose(result: dict, run) -> None:
    result["loose"] = run(OPTIONS["loose"])


@SCENARIOS
def ramped(result: dict, run) -> None:
    result["ramped"] = run(OPTIONS["ramped"])


def main(out_dir: str, adapter: str, *names: str) -> None:
    adapters = {"horovod": horovod, "ddp": ddp, "fsdp": fsdp, "tensorflow": tensorflow}
    if adapter not in adapters:
        raise SystemExit(f"unknown adapter {adapter!r}; {' '.join(adapters)}")
    SCENARIOS.selected(names)  # an unknown name ends the job before the ranks meet
    rank, run = adapters[adapter]()
    result: dict = {"rank": rank}
    result["scenarios"] = SCENARIOS.run(names, result, run)
    write_result(out_dir, rank, result)


if __name__ == "__main__":
    main(*sys.argv[1:])
