#!/usr/bin/env bash
# The test command: sets up the environment if needed, checks style, runs the whole suite.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh"
export PATH="${GS_VENV:-$ROOT/.venv}/bin:$PATH" TF_CPP_MIN_LOG_LEVEL=2
cd "$ROOT"
ruff check .
exec python -m pytest tests "$@"
