#!/usr/bin/env bash
# Bandwidth-shaped throughput: 4 ranks, each in its own network namespace on a veth link to a
# bridge, links shaped by tc (tbf) to each RATE; every method of scripts/bench_throughput.py
# runs under mpirun (TCP only, so no shared-memory shortcut), rank 0 appending JSON lines to
# OUT. The 4 ranks share this machine's cores, so idle MPI ranks yield (mpi_yield_when_idle).
# Root only; addresses 10.77.0.0/24 exist only inside these namespaces and the bridge.
# Everything it creates is removed on exit, failure included.
#   bash scripts/bench_throughput.sh OUT.jsonl "1gbit 10gbit" "none fp16 gs topk gtopk sketched powersgd" [args...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:?output file}"; RATES="${2:-1gbit 10gbit}"; METHODS="${3:-none fp16 gs topk gtopk sketched powersgd}"
shift 3 || true
N=4; NET=10.77.0; BR=gsbr0
export PMIX_MCA_gds=hash  # PMIx's shared-memory data store logs a harmless error here
PY="${GS_VENV:-$ROOT/.venv}/bin/python"
AGENT="$(mktemp /tmp/gs_netns_agent.XXXXXX)"

cleanup() {
  for i in $(seq 0 $((N - 1))); do ip netns del "gsns$i" 2>/dev/null || true; done
  ip link del "$BR" 2>/dev/null || true
  rm -f "$AGENT"
}
trap cleanup EXIT
cleanup

# mpirun's remote-shell agent: "AGENT HOST COMMAND..." runs COMMAND in HOST's namespace
cat > "$AGENT" <<AGENT_EOF
#!/bin/sh
host="\$1"; shift
exec ip netns exec "gsns\$((\${host##*.} - 1))" /bin/sh -c "\$*"
AGENT_EOF
chmod +x "$AGENT"

ip link add "$BR" type bridge
ip addr add "$NET.254/24" dev "$BR"
ip link set "$BR" up
hosts=""
for i in $(seq 0 $((N - 1))); do
  ip netns add "gsns$i"
  ip link add "gsv$i" type veth peer name eth0 netns "gsns$i"
  ip link set "gsv$i" master "$BR" up
  ip netns exec "gsns$i" ip addr add "$NET.$((i + 1))/24" dev eth0
  ip netns exec "gsns$i" ip link set eth0 up
  ip netns exec "gsns$i" ip link set lo up
  hosts="$hosts,$NET.$((i + 1)):1"
done

for rate in $RATES; do
  for i in $(seq 0 $((N - 1))); do  # shape both directions of every link
    tc qdisc replace dev "gsv$i" root tbf rate "$rate" burst 1mbit latency 100ms
    ip netns exec "gsns$i" tc qdisc replace dev eth0 root tbf rate "$rate" burst 1mbit latency 100ms
  done
  for method in $METHODS; do
    echo "[bench_throughput] $rate $method" >&2
    timeout 900 mpirun --allow-run-as-root -np "$N" -H "${hosts#,}" \
      --mca plm_rsh_agent "$AGENT" --mca btl tcp,self --mca mpi_yield_when_idle 1 \
      --mca btl_tcp_if_include "$NET.0/24" --mca oob_tcp_if_include "$NET.0/24" \
      -x OMP_NUM_THREADS=1 -x TF_CPP_MIN_LOG_LEVEL=3 \
      "$PY" "$ROOT/scripts/bench_throughput.py" --method "$method" --label "$rate" --out "$OUT" "$@"
  done
  # proof that the traffic crossed the shaped links: bytes through rank 0's link at this rate
  tc -s qdisc show dev gsv0 | sed -n 's/^ *Sent \([0-9]*\) bytes.*/[bench_throughput] gsv0 sent \1 bytes so far/p' >&2
done
