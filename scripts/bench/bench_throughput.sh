#!/usr/bin/env bash
# Bandwidth-shaped throughput of the LSTM language model on the standard library's sources.
# The ranks run on the links of scripts/bench/shaped.sh (a network namespace per rank on a veth
# link to a bridge, rank i pinned to core i mod nproc), one OpenMP and one Numba thread each;
# links are "local" (unshaped) or shaped to a RATE in both directions by tc tbf.
#   RATIO=0.001 bash scripts/bench/bench_throughput.sh OUT.jsonl RATES VARIANTS RANKS REPEATS [args...]
# VARIANTS: words METHOD[:NAME=VALUE,...], e.g. "gs gtopk gtopk:scope=layer powersgd:rank=1
# none"; each option goes to a baseline as --opt NAME=VALUE, to gs as --gs NAME=VALUE. RATIO
# (default 0.001) goes as --ratio to the methods that select k = RATIO·D coordinates (gs, topk,
# gtopk, sketched); dense, fp16 and PowerSGD refuse one. Extra args go to every launch of
# scripts/bench/bench_throughput.py (e.g. --hidden 512 --steps 20).
# Order: the repeat loop is outermost, so drift spreads over every variant alike. Each repeat
# first runs an MPI ping-pong between ranks 0 and 1 at every link setting (scripts/bench/pingpong.py:
# α and β for scripts/bench/cost_model.py), then per rank count every variant, its order rotated by
# one per repeat, as ONE launch with a phase per link setting: unshaped first (the cost
# model's compute calibration), then each RATE; between phases the launch waits while this
# script reshapes the links (a ready/go file handshake, bench_throughput.py --sync). mpirun
# uses TCP only (no shared-memory shortcut). Rank 0 appends a JSON line per phase to OUT, each
# with the study's run_id (one per invocation of this script). An existing OUT is refused unless
# --append is among the extra args (then the study's rows go after the rows already there).
# The documented full run and its time: scripts/bench/bench_throughput.py.
# Root only (shaped.sh); it runs itself inside one shaped.sh session of max(RANKS) ranks.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ARGS=("$@")
OUT="${1:?output file}"; RATES="${2:-100mbit 1gbit}"
VARIANTS="${3:-gs gtopk gtopk:scope=layer topk sketched powersgd:rank=1 powersgd:rank=4 none fp16}"
RANKS="${4:-2 4}"; REPEATS="${5:-3}"
shift 5 || shift $#
[[ $REPEATS =~ ^[1-9][0-9]*$ ]] || { echo "REPEATS must be a positive integer, got '$REPEATS'" >&2; exit 2; }
RATIO="${RATIO:-0.001}"
APPEND=0
for arg in "$@"; do if [[ $arg == --append ]]; then APPEND=1; fi; done
if [[ $APPEND == 0 && -e $OUT ]]; then
  echo "$OUT exists: pass --append (after REPEATS) to add this study's rows to it, or choose another OUT" >&2
  exit 2
fi
read -ra VARIANT_LIST <<<"$VARIANTS"
N=$(tr ' ' '\n' <<<"$RANKS" | sort -n | tail -1)
if [[ -z ${SHAPED_RANKS:-} ]]; then
  exec bash "$ROOT/scripts/bench/shaped.sh" local "$N" -- bash "${BASH_SOURCE[0]}" "${ARGS[@]}"
fi
((SHAPED_RANKS >= N)) || { echo "inside a shaped.sh session of $SHAPED_RANKS ranks, $N needed" >&2; exit 2; }
PY="${GS_VENV:-$ROOT/.venv}/bin/python"
RUN_ID="$(date -u +%Y%m%dT%H%M%SZ)-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')"  # every row of this study
SYNC="$(mktemp -d /tmp/gs_bench_sync.XXXXXX)"  # the phases' ready/go handshake
trap 'rm -rf "$SYNC"' EXIT

run() {  # run NP PROGRAM ARGS...: shaped.sh's mpirun over its first NP ranks
  local np="$1"; shift
  timeout 900 mpirun -np "$np" --mca mpi_yield_when_idle 1 -x OMP_NUM_THREADS=1 -x NUMBA_NUM_THREADS=1 \
    -x TF_CPP_MIN_LOG_LEVEL=3 -x PYTHONPATH="${PYTHONPATH:-}" "$PY" "$@" >/dev/null
}

variant_flags() {  # variant_flags WORD: sets FLAGS to bench_throughput.py's flags for the variant
  local method="${1%%:*}" flag=--opt item
  local -a items=()
  FLAGS=(--compression "$method")
  case $method in gs|topk|gtopk|sketched) FLAGS+=(--ratio "$RATIO") ;; esac
  [[ $method == gs ]] && flag=--gs
  [[ $1 == *:* ]] && IFS=, read -ra items <<<"${1#*:}"
  for item in "${items[@]}"; do FLAGS+=("$flag" "$item"); done
}

sent() {  # sent RATE: proof that the last phase's traffic crossed the link shaped to RATE
  tc -s qdisc show dev "$SHAPED_LINK" | sed -n "s/^ *Sent \([0-9]*\) bytes.*/[bench_throughput] rank 0's link sent \1 bytes at $1/p" >&2
}

phases() {  # phases NP ARGS...: one launch of bench_throughput.py, a phase per link setting
  local np="$1" rate pid prev=local; shift
  rm -f "$SYNC"/*
  shaped_rate local  # start-up (broadcast of the model included) on unshaped links
  run "$np" "$ROOT/scripts/bench/bench_throughput.py" --labels local $RATES --sync "$SYNC" "$@" &
  pid=$!
  for rate in local $RATES; do
    until [[ -e $SYNC/ready.$rate ]]; do
      kill -0 "$pid" 2>/dev/null || { wait "$pid"; return 1; }  # the launch ended early: its status
      sleep 0.05
    done
    [[ $prev == local ]] || sent "$prev"
    shaped_rate "$rate"
    touch "$SYNC/go.$rate"
    prev=$rate
  done
  wait "$pid"
  [[ $prev == local ]] || sent "$prev"
}

V=${#VARIANT_LIST[@]}
for rep in $(seq 1 "$REPEATS"); do
  for rate in local $RATES; do
    shaped_rate "$rate"
    echo "[bench_throughput] repeat $rep/$REPEATS, $rate: ping-pong (${SECONDS} s)" >&2
    run 2 "$ROOT/scripts/bench/pingpong.py" --label "$rate" --out "$OUT" --append --run-id "$RUN_ID"
  done
  for np in $RANKS; do
    for j in $(seq 0 $((V - 1))); do
      word="${VARIANT_LIST[$(((j + rep - 1) % V))]}"
      variant_flags "$word"
      echo "[bench_throughput] repeat $rep/$REPEATS, $np ranks: $word, local $RATES (${SECONDS} s)" >&2
      phases "$np" "${FLAGS[@]}" --repeat "$rep" --out "$OUT" --append --run-id "$RUN_ID" "$@"
    done
  done
done
echo "[bench_throughput] done in ${SECONDS} s" >&2
