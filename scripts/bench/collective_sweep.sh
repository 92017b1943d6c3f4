#!/usr/bin/env bash
# Collective size sweeps and ping-pongs on shaped links (scripts/bench/shaped.sh), the data
# scripts/bench/cost_model.py --collectives fits α and β per collective algorithm from.
#   bash scripts/bench/collective_sweep.sh OUT.jsonl [RATES] [RANKS] [args...]
# For each link setting (unshaped "local", then each RATE; default "100mbit 1gbit") and each
# rank count (default "2 4"): scripts/bench/collective_sweep.py through mpirun as
# bench_throughput.sh launches its runs (one OpenMP thread per rank, TCP only), after a ping-pong
# between ranks 0 and 1 (scripts/bench/pingpong.py). Extra args go to collective_sweep.py.
# Every row carries the sweep's run_id (one per invocation of this script). An existing OUT is
# refused unless --append is among the extra args.
# Root only (shaped.sh); it runs itself inside one shaped.sh session of max(RANKS) ranks.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ARGS=("$@")
OUT="${1:?output file}"; RATES="${2:-100mbit 1gbit}"; RANKS="${3:-2 4}"
shift 3 || shift $#
N=$(tr ' ' '\n' <<<"$RANKS" | sort -n | tail -1)
APPEND=0
for arg in "$@"; do if [[ $arg == --append ]]; then APPEND=1; fi; done
if [[ $APPEND == 0 && -e $OUT ]]; then
  echo "$OUT exists: pass --append (after RANKS) to add this sweep's rows to it, or choose another OUT" >&2
  exit 2
fi
if [[ -z ${SHAPED_RANKS:-} ]]; then
  exec bash "$ROOT/scripts/bench/shaped.sh" local "$N" -- bash "${BASH_SOURCE[0]}" "${ARGS[@]}"
fi
((SHAPED_RANKS >= N)) || { echo "inside a shaped.sh session of $SHAPED_RANKS ranks, $N needed" >&2; exit 2; }
PY="${GS_VENV:-$ROOT/.venv}/bin/python"
RUN_ID="$(date -u +%Y%m%dT%H%M%SZ)-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')"  # every row of this sweep

run() {  # run NP PROGRAM ARGS...: shaped.sh's mpirun over its first NP ranks
  local np="$1"; shift
  timeout 900 mpirun -np "$np" --mca mpi_yield_when_idle 1 -x OMP_NUM_THREADS=1 -x NUMBA_NUM_THREADS=1 \
    -x TF_CPP_MIN_LOG_LEVEL=3 -x PYTHONPATH="${PYTHONPATH:-}" "$PY" "$@"
}

for rate in local $RATES; do
  shaped_rate "$rate"
  echo "[collective_sweep] $rate: ping-pong (${SECONDS} s)" >&2
  run 2 "$ROOT/scripts/bench/pingpong.py" --label "$rate" --out "$OUT" --append --run-id "$RUN_ID" >/dev/null
  for np in $RANKS; do
    echo "[collective_sweep] $rate, $np ranks (${SECONDS} s)" >&2
    run "$np" "$ROOT/scripts/bench/collective_sweep.py" --label "$rate" --out "$OUT" --append --run-id "$RUN_ID" \
      "$@" >&2
  done
done
echo "[collective_sweep] done in ${SECONDS} s" >&2
