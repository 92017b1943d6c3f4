"""Runs of the benchmark scripts that write data files: an existing ``--out`` is refused unless
``--append`` is given, every record written carries its invocation's ``run_id`` (and the code's
commit), and readers keep one run per (setting, seed) where appended runs repeat each other.

A run id is the invocation's UTC start time and 3 random bytes, ``20250301T120501Z-9f3a61``: a
later run's id sorts after an earlier one's. Standard library only (the report imports it)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Hashable, Optional, Sequence, Union

ROOT = Path(__file__).resolve().parents[1]
PathLike = Union[str, "os.PathLike[str]"]


def new_run_id() -> str:
    """A short id unique to one invocation: UTC start time (seconds) and 6 hex digits."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


def code_version() -> Optional[str]:
    """The repository's short commit hash, None where git cannot tell."""
    try:
        proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def stamp(run_id: Optional[str] = None) -> dict[str, Any]:
    """The fields every record of one invocation carries: ``run_id`` (``run_id``, else a new one)
    and ``code`` (:func:`code_version`)."""
    return {"run_id": run_id or new_run_id(), "code": code_version()}


def add_out_flags(p: argparse.ArgumentParser, what: str, required: bool = False, run_id: bool = False) -> None:
    """``--out`` (appending ``what``), ``--append`` and, with ``run_id``, ``--run-id`` (for a
    wrapper that launches the script several times into one file as one run)."""
    p.add_argument("--out", required=required, help=f"append {what} to this file (refused if it exists, "
                                                     "unless --append)")
    p.add_argument("--append", action="store_true",
                   help="add to an existing --out (each record carries this invocation's run_id)")
    if run_id:
        p.add_argument("--run-id", help="the run_id to record (default: a new one for this invocation)")


def check_out(path: Optional[PathLike], append: bool) -> None:
    """Refuses an existing ``path`` unless ``append``: SystemExit (exit status 1) naming it."""
    if path and not append and os.path.exists(path):
        raise SystemExit(f"{path} exists: pass --append to add this run's records to it, or choose another --out")


def append_line(path: PathLike, record: dict[str, Any]) -> None:
    """Appends ``record`` to ``path`` as one JSON line."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def read_jsonl(paths: Sequence[PathLike]) -> tuple[list[dict[str, Any]], list[str]]:
    """The records of JSON-lines files, in order, and where each is (``PATH:LINE``, the path
    relative to the working directory where it lies under it)."""
    records, where = [], []
    for path in paths:
        shown = Path(path)
        with contextlib.suppress(ValueError):
            shown = shown.resolve().relative_to(Path.cwd().resolve())
        for number, line in enumerate(Path(path).read_text().splitlines(), 1):
            if line.strip():
                records.append(json.loads(line))
                where.append(f"{shown}:{number}")
    return records, where


_SAID: set[str] = set()


def _say(message: str) -> None:
    """``message`` on stderr, once per process (the report reads a file for many blocks)."""
    if message not in _SAID:
        _SAID.add(message)
        print(message, file=sys.stderr, flush=True)


def latest_runs(records: Sequence[dict[str, Any]], setting: Callable[[dict[str, Any]], Optional[Hashable]],
                where: Optional[Sequence[str]] = None,
                describe: Optional[Callable[[dict[str, Any]], str]] = None) -> list[dict[str, Any]]:
    """One record per ``setting(record)`` (the setting and the seed): that of the latest run, the
    greatest ``run_id``; a record without one is an older run of its own, a later one in
    ``records`` newer. The kept record stands where its setting first appears; a record whose
    setting is None (it cannot tell its seed) is kept as it is. For each setting
    with more than one run, a warning on stderr says which it used and which it dropped
    (``where[i]``: record i's place, e.g. ``PATH:LINE``; ``describe``: a setting's words)."""
    names = list(where) if where is not None else [f"record {i + 1}" for i in range(len(records))]
    groups: dict[Hashable, list[int]] = {}
    for i, r in enumerate(records):
        key = setting(r)
        groups.setdefault(("unique", i) if key is None else ("setting", key), []).append(i)

    def rank(i: int) -> tuple[int, str, int]:
        run = records[i].get("run_id")
        return (1, str(run), i) if run else (0, "", i)

    def name(i: int) -> str:
        run = records[i].get("run_id")
        return f"run {run} ({names[i]})" if run else f"{names[i]} (no run_id)"

    out = []
    for key, members in groups.items():
        kept = max(members, key=rank)
        out.append(records[kept])
        if len(members) > 1:
            dropped = ", ".join(name(i) for i in sorted(members, key=rank, reverse=True) if i != kept)
            what = describe(records[kept]) if describe else str(key[1])
            _say(f"warning: {len(members)} runs of {what}: using the latest, {name(kept)}; dropping {dropped}")
    return out


def one_wire(records: Sequence[dict[str, Any]], what: str) -> Optional[str]:
    """The wire format the ``records`` of one figure ran with (their ``wire`` field; a record
    from before the field carries None). ValueError naming ``what`` where they differ: a mean
    over seeds of two formats mixes two methods."""
    wires = {r.get("wire") for r in records}
    if len(wires) > 1:
        named = sorted("unrecorded" if w is None else w for w in wires)
        raise ValueError(f"{what} mixes records of wire formats {named}: rerun them alike, or label them apart")
    return next(iter(wires), None)
