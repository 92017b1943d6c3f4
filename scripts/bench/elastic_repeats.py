"""The elastic demo repeated as ``tests/test_elastic.py`` runs it, to see how often it finishes
and how far its held-out accuracy spreads: ``scripts/examples/elastic_demo.sh --epochs E
--ratio 0.01`` with a worker killed after step ``--kill-at`` and a slot added after ``--add-at``,
``--runs`` times, then once uninterrupted. Each run has ``--limit`` seconds; one that is not over
by then is killed and recorded as ``timed out`` (a hang: an uninterrupted run takes about 20 s).

    python scripts/bench/elastic_repeats.py --runs 10 --out docs/elastic_repeats.jsonl

One JSON line per run: ``outcome`` (``finished`` or ``timed out``), ``wall_seconds`` (the
demo's, start-up included), the demo's summary (``accuracy``, ``steps``, ``resets``, ...) where
it finished, the settings, and
``horovod_edits`` (the edits ``scripts/setup_env.sh`` built this venv's Horovod with; "none
recorded" for a build from before it recorded them). Where the kill lands is timing: the demo
polls rank 0's progress every 0.5 s, so repeats of one seed differ in their steps and accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gs_bench.runs import add_out_flags, append_line, check_out, stamp

ROOT = Path(__file__).resolve().parents[2]


def horovod_edits() -> str:
    """What ``scripts/setup_env.sh`` wrote beside the venv it built Horovod in."""
    edits = Path(os.environ.get("GS_VENV", ROOT / ".venv")) / ".gs_horovod_edits"
    return edits.read_text().strip() if edits.exists() else "none recorded"


def demo(kill_at: int, add_at: int, epochs: int, seed: int, limit: float) -> dict:
    """One run of the demo: its outcome, wall seconds and (if it finished) its summary."""
    with tempfile.TemporaryDirectory() as tmp:
        summary = Path(tmp) / "summary.json"
        env = dict(os.environ, KILL_AT=str(kill_at), ADD_AT=str(add_at), SUMMARY=str(summary))
        cmd = ["bash", str(ROOT / "scripts/examples/elastic_demo.sh"), "--epochs", str(epochs), "--ratio", "0.01",
               "--seed", str(seed)]
        start = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            proc.wait(timeout=limit)
            outcome = "finished" if proc.returncode == 0 and summary.exists() else f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            outcome = "timed out"
        finally:
            subprocess.run(["pkill", "-9", "-s", str(proc.pid)], check=False)  # the demo's whole session
            subprocess.run(["pkill", "-9", "-f", "scripts/examples/train_elastic.py"], check=False)
            proc.wait()
        return {**(json.loads(summary.read_text()) if outcome == "finished" else {}),
                "outcome": outcome, "wall_seconds": round(time.monotonic() - start, 1)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``scripts/check_docs.py`` parses every documented command with it)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=10, help="faulted runs (then one uninterrupted)")
    p.add_argument("--kill-at", type=int, default=20, help="the global step after which a worker is killed")
    p.add_argument("--add-at", type=int, default=40, help="the global step after which a slot is added")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=float, default=120, help="seconds a run may take before it counts as a hang")
    add_out_flags(p, "one JSON line per run", required=True)
    return p.parse_args(argv)


def main() -> None:
    args = parse_args()
    check_out(args.out, args.append)
    fields = {**stamp(), "horovod_edits": horovod_edits(), "epochs": args.epochs, "seed": args.seed, "ratio": 0.01}
    for i in range(args.runs + 1):
        kill_at = args.kill_at if i < args.runs else 0
        row = {**fields, "run": i, "kill_at": kill_at, "add_at": args.add_at if kill_at else 0,
               **demo(kill_at, args.add_at, args.epochs, args.seed, args.limit)}
        append_line(args.out, row)
        print(json.dumps({k: row.get(k) for k in ("run", "kill_at", "outcome", "wall_seconds", "accuracy", "steps")}),
              file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
