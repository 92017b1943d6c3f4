"""How evenly the sparse exchange's owners are loaded, by ownership rule, on real gradients.

    python scripts/bench/bench_owner_loads.py --out docs/owner_loads.json

Each of P ranks takes the gradient of its own 64-image micro-batch (the digits MLP 64-256-128-10
on scikit-learn's digits; the MNIST-5k CNN), its top k = D/1000 coordinates of the compressed
tensors (the pairs it sends), and the rule assigns each to an owner: ``hash`` (the engine's:
one row of the sketch's hash with P columns) or ``blockB`` (block-cyclic: owner (i // B) mod P,
whose local indices would be dense, so each index would cost about log2 P bits less in the
compact wire). Per rule: the median over ranks of the largest owner's share over the mean
(what one rank sends), and the largest owner's total received over the mean (what the busiest
owner receives). 1.0 is even.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from gs_bench.workloads import MnistCNN, digits_mlp, digits_shard, mnist5k
from gs_horovod.kernels.hashing import hash_keys
from gs_horovod.kernels.torch_ops import TorchOps

RULES = ("hash", "block16", "block64", "block256")


def owners(idx: torch.Tensor, rule: str, P: int) -> torch.Tensor:
    if rule == "hash":
        return TorchOps("torch").owner_of(idx, P, hash_keys(0))
    return (idx // int(rule.removeprefix("block"))) % P


def gradients(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, P: int) -> list[torch.Tensor]:
    out = []
    for r in range(P):
        batch = torch.randint(0, len(x), (64,), generator=torch.Generator().manual_seed(r))
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
        out.append(torch.cat([p.grad.reshape(-1) for _, p in sorted(model.named_parameters()) if p.numel() >= 1024]))
    return out


def measure(workload: str, P: int) -> list[dict]:
    torch.manual_seed(0)
    if workload == "digits MLP":
        model, (x, y, _, _) = digits_mlp(), digits_shard()
        x, y = torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y)
    else:
        model, data = MnistCNN(), mnist5k()
        x, y = torch.as_tensor(data[0], dtype=torch.float32).view(-1, 1, 28, 28), torch.as_tensor(data[1])
    grads = gradients(model, x, y, P)
    D = grads[0].numel()
    k = max(1, D // 1000)
    tops = [torch.topk(g.abs(), k).indices for g in grads]
    rows = []
    for rule in RULES:
        counts = [torch.bincount(owners(t, rule, P), minlength=P).float() for t in tops]
        received = sum(counts)
        rows.append({"workload": workload, "D": D, "k": k, "P": P, "rule": rule,
                     "sent_max_over_mean": statistics.median(float(c.max() / c.mean()) for c in counts),
                     "received_max_over_mean": float(received.max() / received.mean())})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| workload | P | k | " + " | ".join(RULES) + " |", "|---|---|---|" + "---|" * len(RULES)]
    for (w, P) in dict.fromkeys((r["workload"], r["P"]) for r in rows):
        cells = {r["rule"]: r for r in rows if r["workload"] == w and r["P"] == P}
        k = next(iter(cells.values()))["k"]
        lines.append(f"| {w} | {P} | {k} | " + " | ".join(
            f"{cells[rule]['received_max_over_mean']:.2f} ({cells[rule]['sent_max_over_mean']:.2f})" for rule in RULES)
            + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, nargs="+", default=[16, 64])
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args()
    rows = [row for w in ("digits MLP", "MNIST-5k CNN") for P in args.ranks for row in measure(w, P)]
    print(table(rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
