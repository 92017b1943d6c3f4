#!/usr/bin/env bash
# Horovod elastic with GsSketch: the MNIST-5k CNN (scripts/examples/train_elastic.py) on 2 workers
# of localhost under horovodrun --gloo --min-np 1 --max-np 3 and a host discovery script. Part-way
# this script kills one worker with SIGKILL (training goes on with 1 rank, rolled back to the last
# commit), later adds a slot (a new worker joins; 2 ranks again), and ends with the summary:
# held-out accuracy, resets seen, ranks at the end.
#   bash scripts/examples/elastic_demo.sh                      # GsSketch
#   bash scripts/examples/elastic_demo.sh --compression none   # dense, for comparison
# Arguments go to train_elastic.py. The two workers start on "localhost" and "127.0.0.1" (both
# this machine): Horovod blacklists the host of a failed worker, so the slot is added on the other.
# KILL_AT / ADD_AT: the global steps after which the kill and the add happen (defaults 60, 120;
# KILL_AT=0: neither, the uninterrupted run). SUMMARY=FILE keeps the summary's JSON there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bash "$ROOT/scripts/setup_env.sh"
export PATH="${GS_VENV:-$ROOT/.venv}/bin:$PATH" TF_CPP_MIN_LOG_LEVEL=2 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
KILL_AT="${KILL_AT:-60}" ADD_AT="${ADD_AT:-120}"
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
printf 'localhost:1\n127.0.0.1:1\n' > "$work/hosts"
printf '#!/bin/sh\ncat %s\n' "$work/hosts" > "$work/discover.sh"
chmod +x "$work/discover.sh"

step() { python -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$work/progress" "$1" 2>/dev/null || echo 0; }
wait_for() {  # wait_for FIELD MIN: until rank 0's progress has FIELD >= MIN (or training ended)
  while kill -0 "$run" 2>/dev/null && (( $(step "$1") < $2 )); do sleep 0.5; done
}
wait_for_one_rank() {  # until rank 0 reports from a world of one rank (the reset after the kill is over)
  while kill -0 "$run" 2>/dev/null && (( $(step ranks) != 1 )); do sleep 0.5; done
}

echo "gs_horovod elastic demo: horovodrun --gloo -np 2 --min-np 1 --max-np 3${*:+, arguments: $*}"
cd "$ROOT"
horovodrun --gloo -np 2 --min-np 1 --max-np 3 --host-discovery-script "$work/discover.sh" \
  --gloo-timeout-seconds 120 \
  python scripts/examples/train_elastic.py --progress "$work/progress" --json "$work/summary.json" "$@" \
  > >(python scripts/console.py) 2>&1 &
run=$!

if (( KILL_AT > 0 )); then
  wait_for step "$KILL_AT"
  read -r pid host < <(python -c 'import json,sys; w=json.load(open(sys.argv[1]))["workers"][1]; print(*w)' "$work/progress")
  echo "elastic_demo: step $(step step): SIGKILL to rank 1 (pid $pid on $host)"
  kill -9 "$pid"
  wait_for_one_rank
  wait_for step "$ADD_AT"
  survivor=$([ "$host" = localhost ] && echo 127.0.0.1 || echo localhost)
  echo "elastic_demo: step $(step step): one slot added on $survivor"
  printf '%s:2\n' "$survivor" > "$work/hosts"
fi
wait "$run"
echo "elastic_demo: summary $(tr -d '\n ' < "$work/summary.json")"
[ -z "${SUMMARY:-}" ] || cp "$work/summary.json" "$SUMMARY"
