#!/usr/bin/env bash
# Bandwidth-shaped throughput of the LSTM language model on the standard library's sources.
# Each rank runs in its own network namespace on a veth link to a bridge and is pinned to one
# core (rank i on core i mod nproc, one OpenMP and one Numba thread; more ranks than cores
# share them). Links are "local" (unshaped) or shaped to a RATE in both directions by tc tbf.
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
# uses TCP only (no shared-memory shortcut). Rank 0 appends a JSON line per phase to OUT.
# The documented full run and its time: scripts/bench/bench_throughput.py.
# Root only; addresses 10.77.0.0/24 exist only inside these namespaces and the bridge.
# Everything it creates is removed on exit, failure included.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:?output file}"; RATES="${2:-100mbit 1gbit}"
VARIANTS="${3:-gs gtopk gtopk:scope=layer topk sketched powersgd:rank=1 powersgd:rank=4 none fp16}"
RANKS="${4:-2 4}"; REPEATS="${5:-3}"
shift 5 || shift $#
[[ $REPEATS =~ ^[1-9][0-9]*$ ]] || { echo "REPEATS must be a positive integer, got '$REPEATS'" >&2; exit 2; }
RATIO="${RATIO:-0.001}"
read -ra VARIANT_LIST <<<"$VARIANTS"
N=$(tr ' ' '\n' <<<"$RANKS" | sort -n | tail -1); NET=10.77.0; BR=gsbr0; CORES=$(nproc)
export PMIX_MCA_gds=hash  # PMIx's shared-memory data store logs a harmless error here
# rtc_hwloc_vmhole none (in run): orted does not share its hwloc topology through a mapped
# segment; that write (hwloc_shmem_topology_write) segfaulted orted at launch here now and then
PY="${GS_VENV:-$ROOT/.venv}/bin/python"
AGENT="$(mktemp /tmp/gs_netns_agent.XXXXXX)"; WORK="$AGENT.d"; SYNC="$WORK/sync"  # SYNC: the phases' handshake

cleanup() {
  for i in $(seq 0 $((N - 1))); do
    ip netns del "gsns$i" 2>/dev/null || true
    ip link del "gsv$i" 2>/dev/null || true  # left behind if a rank still held its namespace
  done
  ip link del "$BR" 2>/dev/null || true
  rm -rf "$AGENT" "$WORK"
}
trap cleanup EXIT
cleanup
mkdir -p "$SYNC"

# mpirun's remote-shell agent: "AGENT HOST COMMAND..." runs COMMAND in HOST's namespace, on one
# core, with its own TMPDIR: every namespace has the same host name, and orteds that share
# /tmp/ompi.HOST raced creating their session directories there ("File exists")
cat > "$AGENT" <<AGENT_EOF
#!/bin/sh
host="\$1"; shift
i=\$((\${host##*.} - 1))
mkdir -p "$WORK/tmp\$i"
exec ip netns exec "gsns\$i" env TMPDIR="$WORK/tmp\$i" taskset -c \$((i % $CORES)) /bin/sh -c "\$*"
AGENT_EOF
chmod +x "$AGENT"

ip link add "$BR" type bridge
ip addr add "$NET.254/24" dev "$BR"
ip link set "$BR" up
for i in $(seq 0 $((N - 1))); do
  ip netns add "gsns$i"
  ip link add "gsv$i" type veth peer name eth0 netns "gsns$i"
  ip link set "gsv$i" master "$BR" up
  ip netns exec "gsns$i" ip addr add "$NET.$((i + 1))/24" dev eth0
  ip netns exec "gsns$i" ip link set eth0 up
  ip netns exec "gsns$i" ip link set lo up
done

run() {  # run NP PROGRAM ARGS...: mpirun over the first NP namespaces
  local np="$1"; shift
  local hosts; hosts="$(seq -s, -f "$NET.%g:1" 1 "$np")"
  timeout 900 mpirun --allow-run-as-root -np "$np" -H "$hosts" --bind-to none \
    --mca plm_rsh_agent "$AGENT" --mca btl tcp,self --mca mpi_yield_when_idle 1 \
    --mca rtc_hwloc_vmhole none \
    --mca btl_tcp_if_include "$NET.0/24" --mca oob_tcp_if_include "$NET.0/24" \
    -x OMP_NUM_THREADS=1 -x NUMBA_NUM_THREADS=1 -x TF_CPP_MIN_LOG_LEVEL=3 -x PYTHONPATH="${PYTHONPATH:-}" "$PY" "$@" >/dev/null
}

shape() {  # shape RATE: every link shaped in both directions by a fresh tc tbf ("local": unshaped)
  for i in $(seq 0 $((N - 1))); do
    tc qdisc del dev "gsv$i" root 2>/dev/null || true
    ip netns exec "gsns$i" tc qdisc del dev eth0 root 2>/dev/null || true
    if [[ $1 != local ]]; then
      tc qdisc add dev "gsv$i" root tbf rate "$1" burst 1mbit latency 100ms
      ip netns exec "gsns$i" tc qdisc add dev eth0 root tbf rate "$1" burst 1mbit latency 100ms
    fi
  done
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
  tc -s qdisc show dev gsv0 | sed -n "s/^ *Sent \([0-9]*\) bytes.*/[bench_throughput] gsv0 sent \1 bytes at $1/p" >&2
}

phases() {  # phases NP ARGS...: one launch of bench_throughput.py, a phase per link setting
  local np="$1" rate pid prev=local; shift
  rm -f "$SYNC"/*
  shape local  # start-up (broadcast of the model included) on unshaped links
  run "$np" "$ROOT/scripts/bench/bench_throughput.py" --labels local $RATES --sync "$SYNC" "$@" &
  pid=$!
  for rate in local $RATES; do
    until [[ -e $SYNC/ready.$rate ]]; do
      kill -0 "$pid" 2>/dev/null || { wait "$pid"; return 1; }  # the launch ended early: its status
      sleep 0.05
    done
    [[ $prev == local ]] || sent "$prev"
    shape "$rate"
    touch "$SYNC/go.$rate"
    prev=$rate
  done
  wait "$pid"
  [[ $prev == local ]] || sent "$prev"
}

V=${#VARIANT_LIST[@]}
for rep in $(seq 1 "$REPEATS"); do
  for rate in local $RATES; do
    shape "$rate"
    echo "[bench_throughput] repeat $rep/$REPEATS, $rate: ping-pong (${SECONDS} s)" >&2
    run 2 "$ROOT/scripts/bench/pingpong.py" --label "$rate" --out "$OUT"
  done
  for np in $RANKS; do
    for j in $(seq 0 $((V - 1))); do
      word="${VARIANT_LIST[$(((j + rep - 1) % V))]}"
      variant_flags "$word"
      echo "[bench_throughput] repeat $rep/$REPEATS, $np ranks: $word, local $RATES (${SECONDS} s)" >&2
      phases "$np" "${FLAGS[@]}" --repeat "$rep" --out "$OUT" "$@"
    done
  done
done
echo "[bench_throughput] done in ${SECONDS} s" >&2
