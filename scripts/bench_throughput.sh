#!/usr/bin/env bash
# Bandwidth-shaped throughput of the LSTM language model on the standard library's sources.
# Each rank runs in its own network namespace on a veth link to a bridge and is pinned to one
# core (rank i on core i mod nproc, one OpenMP and one Numba thread; more ranks than cores
# share them). For the label "local" (the links unshaped) and each RATE (every link shaped in
# both directions by tc tbf): an MPI ping-pong between ranks 0 and 1 (scripts/pingpong.py:
# latency α and bandwidth β for scripts/cost_model.py). Then, per rank count and method, the
# method of scripts/bench_throughput.py under mpirun (TCP only, so no shared-memory shortcut)
# unshaped and at each RATE, back to back. The unshaped run gives the cost model its compute
# time per (method, ranks). Rank 0 appends JSON lines to OUT.
# Root only; addresses 10.77.0.0/24 exist only inside these namespaces and the bridge.
# Everything it creates is removed on exit, failure included.
#   bash scripts/bench_throughput.sh OUT.jsonl "1gbit 10gbit" "none fp16 gs topk gtopk sketched powersgd" "2 4" [args...]
# Extra args go to bench_throughput.py (e.g. --ratio 0.001 --steps 3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:?output file}"; RATES="${2:-1gbit 10gbit}"; METHODS="${3:-none fp16 gs topk gtopk sketched powersgd}"
RANKS="${4:-2 4}"
shift 4 || shift $#
N=$(tr ' ' '\n' <<<"$RANKS" | sort -n | tail -1); NET=10.77.0; BR=gsbr0; CORES=$(nproc)
export PMIX_MCA_gds=hash  # PMIx's shared-memory data store logs a harmless error here
# rtc_hwloc_vmhole none (in run): orted does not share its hwloc topology through a mapped
# segment; that write (hwloc_shmem_topology_write) segfaulted orted at launch here now and then
PY="${GS_VENV:-$ROOT/.venv}/bin/python"
AGENT="$(mktemp /tmp/gs_netns_agent.XXXXXX)"

cleanup() {
  for i in $(seq 0 $((N - 1))); do
    ip netns del "gsns$i" 2>/dev/null || true
    ip link del "gsv$i" 2>/dev/null || true  # left behind if a rank still held its namespace
  done
  ip link del "$BR" 2>/dev/null || true
  rm -f "$AGENT"
}
trap cleanup EXIT
cleanup

# mpirun's remote-shell agent: "AGENT HOST COMMAND..." runs COMMAND in HOST's namespace, on one core
cat > "$AGENT" <<AGENT_EOF
#!/bin/sh
host="\$1"; shift
i=\$((\${host##*.} - 1))
exec ip netns exec "gsns\$i" taskset -c \$((i % $CORES)) /bin/sh -c "\$*"
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

shape() {  # shape RATE: every link shaped in both directions by tc tbf ("local": unshaped)
  for i in $(seq 0 $((N - 1))); do
    if [[ $1 == local ]]; then
      tc qdisc del dev "gsv$i" root 2>/dev/null || true
      ip netns exec "gsns$i" tc qdisc del dev eth0 root 2>/dev/null || true
    else
      tc qdisc replace dev "gsv$i" root tbf rate "$1" burst 1mbit latency 100ms
      ip netns exec "gsns$i" tc qdisc replace dev eth0 root tbf rate "$1" burst 1mbit latency 100ms
    fi
  done
}

for rate in local $RATES; do
  shape "$rate"
  echo "[bench_throughput] $rate: ping-pong" >&2
  run 2 "$ROOT/scripts/pingpong.py" --label "$rate" --out "$OUT"
done
# each method's unshaped (calibration) run and its shaped runs back to back, so that the
# machine's load drifts as little as possible between the cost model's compute and its check
for np in $RANKS; do
  for method in $METHODS; do
    for rate in local $RATES; do
      shape "$rate"
      echo "[bench_throughput] $rate $np ranks: $method" >&2
      run "$np" "$ROOT/scripts/bench_throughput.py" --compression "$method" --label "$rate" --out "$OUT" "$@"
      if [[ $rate != local ]]; then  # proof that the traffic crossed the shaped link
        tc -s qdisc show dev gsv0 | sed -n 's/^ *Sent \([0-9]*\) bytes.*/[bench_throughput] gsv0 sent \1 bytes at this rate/p' >&2
      fi
    done
  done
done
