"""Bytes per rank per step of every method variant for one d-element gradient (default d =
25.6M, as ResNet-50, k = 0.1 %): counted from the sizes for P up to 1024, and measured on real
ranks.

    python scripts/bench/bench_wire.py --table --plot docs/wire.png --out docs/wire_counted.json   # counted
    horovodrun -np 2 -H localhost:2 --gloo python scripts/bench/bench_wire.py --measure --out docs/wire_P2.json
    horovodrun -np 4 -H localhost:4 --gloo python scripts/bench/bench_wire.py --measure --out docs/wire_P4.json

Counted: each variant's collectives of one step from the gradient's shape alone
(``cost_model.planned``: the baselines' ``Reducer.planned``, gs-SGD's ``Plan.payload_bytes``,
Horovod's dense allreduce), turned into bytes by :mod:`gs_horovod.transports.collective_cost`. Measured: one step of
each variant on this rank, its meter's bytes (``gs_bench.methods.distributed_optimizer``).
"payload" is what a rank hands to collectives (its own contribution); "wire" is what goes
through the busiest rank (sent + received) under each collective's algorithm: ring allreduce
and allgather (Horovod), recursive doubling (gTop-k, GsSketch transport="mpi"), star (Sketched-SGD).
A smoke run: ``--d 100000`` with either mode.
"""

from __future__ import annotations

import argparse
import json

from gs_bench.variants import gs_config, parse_variant, planned, reducer, takes_ratio, variant_label
from gs_horovod.transports.collective_cost import total_wire_bytes

VARIANTS = ("none", "fp16", "gs", "gs:transport=mpi", "topk", "gtopk", "sketched", "powersgd:rank=1", "powersgd:rank=4")
MEASURED = tuple(v for v in VARIANTS if v != "gs:transport=mpi")  # transport=mpi needs Horovod's MPI controller


def counted(shape: tuple[int, int], ratio: float, ranks: int) -> dict[str, tuple[float, float]]:
    """{variant: (payload bytes per rank, wire bytes through the busiest rank)} for one step."""
    out = {}
    for v in VARIANTS:
        step = planned(*parse_variant(v), [shape], ranks, ratio)
        out[v] = (sum(n for _, n in step), total_wire_bytes(step, ranks))
    return out


def measure(shape: tuple[int, int], ratio: float) -> dict[str, tuple[float, float]]:
    """One step of every measured variant on this rank (under horovodrun): {variant: (payload,
    wire)} bytes as its meter saw them."""
    import horovod.torch as hvd
    import torch

    from gs_bench.methods import distributed_optimizer

    hvd.init()
    torch.set_num_threads(1)
    results = {}
    for v in MEASURED:
        method, options = parse_variant(v)
        param = torch.nn.Parameter(torch.zeros(shape))
        opt, meter = distributed_optimizer(method, torch.optim.SGD([param], lr=0.0), [("w", param)],
                                           ratio if takes_ratio(method) else None, **options)
        g = torch.Generator().manual_seed(hvd.rank())
        (param * torch.randn(shape, generator=g)).sum().backward()
        opt.step()
        results[v] = meter.per_step()
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (``scripts/check_docs.py`` parses every documented command with it)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d", type=int, default=25_600_000,
                   help="gradient elements (a 5000 × d/5000 matrix when it divides)")
    p.add_argument("--ratio", type=float, default=0.001)
    p.add_argument("--measure", action="store_true", help="run one step of each variant (under horovodrun)")
    p.add_argument("--table", action="store_true", help="print the counted table for P = 2 … 1024")
    p.add_argument("--plot", help="write a log-log plot of wire bytes vs P to this PNG")
    p.add_argument("--out")
    args = p.parse_args(argv)
    if not (args.measure or args.table or args.plot or args.out):
        p.error("give --measure (under horovodrun) or --table / --plot / --out")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    d = args.d
    shape = (5000, d // 5000) if d % 5000 == 0 else (d, 1)
    if args.measure:
        import horovod.torch as hvd

        measured = measure(shape, args.ratio)
        if hvd.rank() == 0:
            expect = counted(shape, args.ratio, hvd.size())
            print(f"P = {hvd.size()}, d = {d:,} as {shape[0]} × {shape[1]}, ratio {args.ratio}: bytes per rank per "
                  "step, measured on rank 0 (its meter) vs counted from the shape")
            print("| variant | payload measured | payload counted | wire measured | wire counted |\n"
                  "|---|---|---|---|---|")
            for v, (pay, wire) in measured.items():
                print(f"| {variant_label(*parse_variant(v))} | {pay:,.0f} | {expect[v][0]:,.0f} | {wire:,.0f} "
                      f"| {expect[v][1]:,.0f} |")
            if args.out:
                with open(args.out, "w") as f:
                    json.dump({"ranks": hvd.size(), "d": d, "ratio": args.ratio, "measured_rank0": measured,
                               "counted": {v: expect[v] for v in measured}}, f, indent=1)
        return
    sizes = [2 ** i for i in range(1, 11)]
    table = {P: counted(shape, args.ratio, P) for P in sizes}
    if args.table:
        config = gs_config({}, args.ratio)[0]
        sk = reducer("sketched", {}, args.ratio)
        k = config.k_for(d)
        print(f"d = {d:,}, k = {k:,} (ratio {args.ratio}); gs: GsSketch defaults (rows {config.rows}, cols "
              f"{config.width}·k, {config.candidates}·k candidates, {config.sketch_dtype} sketch); Sketched-SGD: "
              f"rows {sk.rows}, cols {sk.width}·k, {sk.p2}·k candidates; MB through the busiest rank per step "
              "(payload per rank in the first row)")
        print("| P | " + " | ".join(variant_label(*parse_variant(v)) for v in VARIANTS) + " |")
        print("|---|" + "---|" * len(VARIANTS))
        print("| payload | " + " | ".join(f"{table[2][v][0] / 1e6:,.3f}" for v in VARIANTS) + " |")
        for P in sizes:
            print(f"| {P} | " + " | ".join(f"{table[P][v][1] / 1e6:,.3f}" for v in VARIANTS) + " |")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for v in VARIANTS:
            ax.plot(sizes, [table[P][v][1] / 1e6 for P in sizes], marker="o", label=variant_label(*parse_variant(v)))
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
