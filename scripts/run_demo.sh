#!/usr/bin/env bash
# The main job: sets up the environment if needed, then trains the MNIST-5k CNN on 2 Horovod
# ranks with GsSketch. Extra arguments go to scripts/bench/train_torch.py (e.g. --compression none).
# `--launcher torchrun` (first) runs the same demo on 2 torchrun ranks instead: DistributedDataParallel
# with gs_horovod.ddp.gs_hook (or --compression powersgd / fp16 / none: torch's hooks, DDP's default).
# The console shows rank 0's progress bar, a line per epoch and a summary; scripts/console.py
# drops TensorFlow's start-up notices (horovodrun's build check imports TensorFlow) and
# passes every other line, warnings and errors included. The long Gloo timeout lets a rank
# wait for a slower one (first-step kernel compilation on a busy machine takes > 30 s).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh"
export PATH="${GS_VENV:-$ROOT/.venv}/bin:$PATH" TF_CPP_MIN_LOG_LEVEL=2 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
cd "$ROOT"
LAUNCHER=horovodrun
case "${1:-}" in
  --launcher) LAUNCHER="${2:?--launcher takes horovodrun or torchrun}"; shift 2 ;;
  --launcher=*) LAUNCHER="${1#--launcher=}"; shift ;;
esac
case "$LAUNCHER" in
  horovodrun)
    echo "gs_horovod demo: 2 ranks (horovodrun --gloo), MNIST-5k CNN${*:+, arguments: $*}"
    horovodrun -np 2 -H localhost:2 --gloo --gloo-timeout-seconds 300 python scripts/bench/train_torch.py "$@" 2>&1 | python scripts/console.py ;;
  torchrun)
    echo "gs_horovod demo: 2 ranks (torchrun, DDP + communication hook), MNIST-5k CNN${*:+, arguments: $*}"
    torchrun --standalone --nproc_per_node 2 scripts/bench/train_torch.py "$@" 2>&1 | python scripts/console.py ;;
  *) echo "run_demo.sh: --launcher must be horovodrun or torchrun, got '$LAUNCHER'" >&2; exit 2 ;;
esac
