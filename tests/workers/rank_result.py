"""Where a worker leaves its rank's result: ``OUT_DIR/rank<r>.json`` (read back by
``conftest.horovodrun``)."""

from __future__ import annotations

import json
from pathlib import Path


def result_path(out_dir: str | Path, rank: int) -> Path:
    return Path(out_dir) / f"rank{rank}.json"


def write_result(out_dir: str | Path, rank: int, result: dict) -> None:
    Path(out_dir).mkdir(parents=True, exist_ok=True)  # run alone, a worker may be given a new folder
    result_path(out_dir, rank).write_text(json.dumps(result))
