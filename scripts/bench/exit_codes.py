"""How often a finished torchrun job exits 0: each case run ``--runs`` times under
``torchrun --standalone --nproc_per_node 2`` (one thread a rank), its exit codes and the runs
in which a rank aborted at exit ("terminate called without an active exception") counted.

    python scripts/bench/exit_codes.py --runs 20 --out docs/exit_codes.json
    python scripts/bench/exit_codes.py --runs 8 --timeout 120 --cases ddp_restart_torch_init \
        --out docs/exit_codes.json --append

Cases: ``ddp_two_steps`` (scripts/bench/ddp_two_steps.py: GsState, two steps), the same with
``--hook none`` (torch's DDP without gs_horovod: the abort this guards against), the torchrun demo
(scripts/bench/train_torch.py, one epoch), FSDP2 (scripts/bench/train_fsdp.py, 2 × 1,
one epoch), and a restart under ``--max-restarts 1`` (rank 1 killed after the first step) with
the group from gs_horovod's ``init_process_group`` and from torch's. Refuses an existing
``--out`` unless ``--append`` (which replaces the cases run again, keeps the others); each case
records ``code`` (the commit) and ``run_id`` (one per invocation, :mod:`gs_bench.runs`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Optional

from gs_bench.runs import new_run_id

ROOT = Path(__file__).resolve().parents[2]
CASES = {
    "ddp_two_steps": ["scripts/bench/ddp_two_steps.py"],
    "ddp_two_steps_without_gs_horovod": ["scripts/bench/ddp_two_steps.py", "--hook", "none"],
    "train_torch_torchrun": ["scripts/bench/train_torch.py", "--epochs", "1"],
    "train_fsdp": ["scripts/bench/train_fsdp.py", "--replicas", "2", "--epochs", "1"],
    "ddp_restart": ["--max-restarts", "1", "scripts/bench/ddp_two_steps.py", "--killed"],
    "ddp_restart_torch_init": ["--max-restarts", "1", "scripts/bench/ddp_two_steps.py", "--killed", "--init", "torch"],
}
ABORT = "terminate called without an active exception"


def run_case(args: list[str], runs: int, timeout: float) -> dict:
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    codes, aborted, seconds = Counter(), 0, []
    for _ in range(runs):
        start = time.perf_counter()
        try:
            proc = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", *args], cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=timeout)
            code, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as hung:
            code, output = "timed out", str(hung.stdout or "") + str(hung.stderr or "")
        seconds.append(time.perf_counter() - start)
        codes[code] += 1
        aborted += ABORT in output
    return {"command": ["torchrun", "--standalone", "--nproc_per_node", "2", *args], "runs": runs,
            "exit_codes": {str(k): v for k, v in sorted(codes.items(), key=str)}, "runs_with_an_abort": aborted,
            "exit_0": codes[0], "median_seconds": sorted(seconds)[len(seconds) // 2]}


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    p.add_argument("--timeout", type=float, default=300, help="seconds a run may take (then: 'timed out')")
    p.add_argument("--out", required=True)
    p.add_argument("--append", action="store_true", help="add to an existing --out")
    return p.parse_args(argv)


def main() -> None:
    args = parse_args()
    out = Path(args.out)
    if out.exists() and not args.append:
        sys.exit(f"{out} exists: pass --append to add to it, or another --out")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    run_id = new_run_id()
    record = json.loads(out.read_text()) if out.exists() else {"cases": {}}
    for name in args.cases:
        record["cases"][name] = {**run_case(CASES[name], args.runs, args.timeout), "code": commit.stdout.strip(),
                                 "run_id": run_id, "timeout_seconds": args.timeout}
        print(name, json.dumps(record["cases"][name]), flush=True)
        out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
