"""Bytes per rank per step of every method for one d-element gradient (default d = 25.6M, as
ResNet-50, k = 0.1 %): measured on real ranks and counted from the sizes for P up to 1024.

    horovodrun -np 2 -H localhost:2 --gloo python scripts/bench_wire.py --measure --out docs/wire_P2.json
    horovodrun -np 4 -H localhost:4 --gloo python scripts/bench_wire.py --measure --out docs/wire_P4.json
    python scripts/bench_wire.py --table --plot docs/wire.png     # counted, P = 2 … 1024

"payload" is what a rank hands to collectives (its own contribution); "wire" is what goes
through the busiest rank (sent + received) under each collective's algorithm: ring allreduce
and allgather (Horovod), recursive doubling (gTop-k, GsSketch merge="mpi"), star (Sketched-SGD).
"""

from __future__ import annotations

import argparse
import json
import math

SKETCHED_ROWS, SKETCHED_WIDTH, P2 = 5, 4.0, 4  # Sketched-SGD's sketch and candidates (p2·k)


def gs_payload(d: int, k: int) -> int:
    """GsSketch's payload with its default options: sketch + exact round (+ nothing dense)."""
    from gs_horovod.gs_sgd import GsConfig, Layout

    config = GsConfig(k=k)
    return sum(Layout.build(["w"], [d], config).payload_bytes(config))


def counted(d: int, k: int, shape: tuple[int, int], ranks: int) -> dict[str, tuple[float, float]]:
    """{method: (payload bytes per rank, wire bytes through the busiest rank)}."""
    from gs_horovod.baselines.methods import GTopK, PowerSGD, SketchedSGD, TopKAllgather, ring_allreduce

    ratio = k / d
    rounds = math.ceil(math.log2(ranks)) + (0 if ranks & (ranks - 1) == 0 else 2)
    out = {
        "dense": (4 * d, ring_allreduce(4 * d, ranks)),
        "fp16": (2 * d, ring_allreduce(2 * d, ranks)),
        "gs (Horovod merge)": (gs_payload(d, k), ring_allreduce(gs_payload(d, k), ranks)),
        "gs (merge=mpi)": (gs_payload(d, k), 2 * rounds * gs_payload(d, k)),
    }
    for name, ex, sizes in (("topk allgather", TopKAllgather(ratio), [d]), ("gTop-k", GTopK(ratio), [d]),
                            ("Sketched-SGD", SketchedSGD(ratio, SKETCHED_ROWS, SKETCHED_WIDTH, P2), [d]),
                            ("PowerSGD r=4", PowerSGD(rank=4), [shape])):
        pay = ex.bytes_per_step(sizes, ranks) if name != "gTop-k" or ranks & (ranks - 1) == 0 else float("nan")
        wire = ex.wire_bytes(sizes, ranks) if name != "gTop-k" or ranks & (ranks - 1) == 0 else float("nan")
        out[name] = (pay, wire)
    return out


def measure(d: int, k: int, shape: tuple[int, int]) -> dict[str, float]:
    """One step of every method on this rank (under horovodrun); bytes its counters saw."""
    import horovod.torch as hvd
    import torch

    from gs_horovod.baselines import METHODS, ExchangeOptimizer
    from gs_horovod.torch import GsSketch

    hvd.init()
    torch.set_num_threads(1)
    results = {}
    for label in ("gs", *METHODS):
        param = torch.nn.Parameter(torch.zeros(shape))
        opt = torch.optim.SGD([param], lr=0.0)
        if label == "gs":
            gs = GsSketch(k=k)
            opt = hvd.DistributedOptimizer(opt, named_parameters=[("w", param)], compression=gs)
        else:
            kw = {"rank": 4} if label == "powersgd" else {}
            ex = METHODS[label](ratio=k / d, **kw)
            opt = ExchangeOptimizer(opt, [("w", param)], ex)
        g = torch.Generator().manual_seed(hvd.rank())
        (param * torch.randn(shape, generator=g)).sum().backward()
        opt.step()
        results[label] = gs.stats.total_bytes if label == "gs" else ex.bytes_sent
    return results


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--d", type=int, default=25_600_000)
    p.add_argument("--ratio", type=float, default=0.001)
    p.add_argument("--measure", action="store_true", help="run one step of each method (under horovodrun)")
    p.add_argument("--table", action="store_true", help="print the counted table for P = 2 … 1024")
    p.add_argument("--plot", help="write a log-log plot of wire bytes vs P to this PNG")
    p.add_argument("--out")
    args = p.parse_args()
    d, k = args.d, max(1, int(args.ratio * args.d))
    shape = (5000, d // 5000) if d % 5000 == 0 else (d, 1)
    if args.measure:
        import horovod.torch as hvd

        measured = measure(d, k, shape)
        if hvd.rank() == 0:
            expect = counted(d, k, shape, hvd.size())
            names = {"gs": "gs (Horovod merge)", "topk": "topk allgather", "gtopk": "gTop-k",
                     "sketched": "Sketched-SGD", "powersgd": "PowerSGD r=4"}
            print(f"P = {hvd.size()}, d = {d:,}, k = {k:,}: payload bytes per rank, measured on rank 0 vs counted")
            print("| method | measured (rank 0) | counted |\n|---|---|---|")
            for label, b in measured.items():
                print(f"| {names[label]} | {b:,.0f} | {expect[names[label]][0]:,.0f} |")
            if args.out:
                with open(args.out, "w") as f:
                    json.dump({"ranks": hvd.size(), "d": d, "k": k, "measured_rank0": measured}, f, indent=1)
        return
    sizes = [2 ** i for i in range(1, 11)]
    table = {P: counted(d, k, shape, P) for P in sizes}
    methods = list(table[2])
    if args.table:
        from gs_horovod.gs_sgd import GsConfig

        cfg = GsConfig(k=k)
        print(f"d = {d:,}, k = {k:,} (ratio {args.ratio}); gs: GsSketch defaults (rows {cfg.rows}, cols {cfg.width}·k, "
              f"{cfg.candidates}·k candidates, {cfg.sketch_dtype} sketch); Sketched-SGD: rows {SKETCHED_ROWS}, cols "
              f"{SKETCHED_WIDTH}·k, {P2}·k candidates; PowerSGD rank 4; MB through the busiest rank per step "
              "(payload per rank in the first row)")
        print("| P | " + " | ".join(methods) + " |")
        print("|---|" + "---|" * len(methods))
        print("| payload | " + " | ".join(f"{table[2][m][0] / 1e6:,.2f}" for m in methods) + " |")
        for P in sizes:
            print(f"| {P} | " + " | ".join(f"{table[P][m][1] / 1e6:,.2f}" for m in methods) + " |")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for m in methods:
            ax.plot(sizes, [table[P][m][1] / 1e6 for P in sizes], marker="o", label=m)
        ax.set(xscale="log", yscale="log", xlabel="ranks P", ylabel="MB through the busiest rank per step",
               title=f"d = {d / 1e6:.1f}M, k = {args.ratio:.1%} of d")
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({str(P): table[P] for P in sizes}, f, indent=1)


if __name__ == "__main__":
    main()
