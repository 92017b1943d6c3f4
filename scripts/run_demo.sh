#!/usr/bin/env bash
# The main job: sets up the environment if needed, then trains the digits MLP on 2 Horovod
# ranks with GsSketch. Extra arguments go to scripts/train_torch.py (e.g. --compression none).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh"
export PATH="${GS_VENV:-$ROOT/.venv}/bin:$PATH" TF_CPP_MIN_LOG_LEVEL=2 OMP_NUM_THREADS=1
cd "$ROOT"
exec horovodrun -np 2 -H localhost:2 --gloo python scripts/train_torch.py "$@"
