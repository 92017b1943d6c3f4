#!/usr/bin/env bash
# Runs a command whose ranks talk over shaped links: RANKS network namespaces, each on its own
# veth link to a bridge, every link shaped to RATE in both directions by tc tbf ("local": not
# shaped). Rank i runs in namespace i at address NET.(i+1) on an interface named as the bridge
# (so that one name is the link everywhere, launcher included), pinned to core i mod nproc.
#   scripts/bench/shaped.sh RATE RANKS -- COMMAND [ARGS...]
#   scripts/bench/shaped.sh 1gbit 4 -- horovodrun -np 4 python train.py
#   scripts/bench/shaped.sh 100mbit 2 -- mpirun -np 2 python scripts/bench/pingpong.py --out pp.jsonl
#   scripts/bench/shaped.sh 1gbit 4 -- torchrun train.py
#   scripts/bench/shaped.sh --check        (exit 0 when this machine permits it; else why, exit 3)
# RATE: a tc rate (100mbit, 1gbit, 500kbit, ...) or "local".
# COMMAND runs in the host namespace with these on its PATH (and as the first word, whatever
# path it is given by):
#   mpirun      Open MPI's, with -H (the RANKS addresses, one slot each) unless given, TCP only
#               (no shared-memory shortcut) on the namespaces' subnet, --bind-to none, and as
#               its remote shell the ssh below;
#   horovodrun  with -H (as above) and --network-interfaces (the links) unless given; its MPI
#               mode runs the mpirun above (checked here). Its Gloo mode (--gloo) starts its
#               ranks through the ssh below but they fail to connect: Horovod 0.28.1's Gloo
#               pairs dialled 127.0.0.1 here; use the MPI mode, or torchrun;
#   ssh         "ssh [OPTIONS] ADDRESS COMMAND": COMMAND in the namespace of ADDRESS, on its
#               core, with its own TMPDIR (the namespaces share one host name);
#   shaped_rate "shaped_rate RATE": reshapes every link now (a script's phases; traffic in
#               flight continues at the new rate).
# torchrun: one torchrun per namespace, each with --nnodes RANKS --node-rank i --nproc-per-node 1
# --master-addr (rank 0's address) --master-port 29500 and GLOO_SOCKET_IFNAME (the link); give
# it the script and the other options only.
# Exported to COMMAND: SHAPED_HOSTS (the -H list), SHAPED_RANKS, SHAPED_LINK (the bridge-side
# interface of rank 0's link, for `tc -s qdisc show dev $SHAPED_LINK`).
# Root only (namespaces, veth, tc). Each session takes a free subnet 10.77.S.0/24 (S from 0)
# under a lock, so sessions may run side by side; everything it creates is removed on exit,
# failure included. Its exit status is COMMAND's (torchrun: the first non-zero of them).
set -euo pipefail

fail() { echo "shaped.sh: $*" >&2; exit 3; }

check() {  # exit 0 when namespaces, veth, a bridge and tc tbf can be created here; else why, exit 3
  [[ $(id -u) == 0 ]] || fail "needs root (network namespaces, veth links and tc), running as uid $(id -u)"
  local c
  for c in ip tc taskset mpirun; do command -v "$c" >/dev/null || fail "needs '$c' on PATH"; done
  local ns="gschk$$" err
  err=$( { ip netns add "$ns" && ip link add "gschk$$" type veth peer name eth0 netns "$ns" &&
           tc qdisc add dev "gschk$$" root tbf rate 1gbit burst 1mbit latency 100ms; } 2>&1) || {
    ip netns del "$ns" 2>/dev/null || true; ip link del "gschk$$" 2>/dev/null || true
    fail "cannot create a network namespace, veth link and tc qdisc here: ${err:-unknown error}"; }
  ip link del "gschk$$" 2>/dev/null || true
  ip netns del "$ns"
}

if [[ ${1:-} == --check ]]; then check; exit 0; fi
RATE="${1:-}"; N="${2:-}"
[[ $RATE == local || $RATE =~ ^[0-9]+(\.[0-9]+)?[kmgt]?(bit|bps)$ ]] || fail "RATE must be a tc rate (e.g. 1gbit) or 'local', got '$RATE'"
[[ $N =~ ^[1-9][0-9]*$ ]] && ((N <= 253)) || fail "RANKS must be 1 … 253, got '$N'"
shift 2
[[ ${1:-} == -- ]] && shift
(($#)) || fail "no command; usage: shaped.sh RATE RANKS -- COMMAND [ARGS...]"
check

REAL_MPIRUN="$(command -v mpirun)"
REAL_HOROVODRUN="$(command -v horovodrun || true)"
case "$(basename "$1")" in
  horovodrun) REAL_HOROVODRUN="$(command -v "$1")" ;;
  mpirun) REAL_MPIRUN="$(command -v "$1")" ;;
esac
CORES=$(nproc)
WORK="$(mktemp -d /tmp/gs_shaped.XXXXXX)"; BIN="$WORK/bin"; mkdir -p "$BIN"
LOCKS=/tmp/gs_shaped.locks; mkdir -p "$LOCKS"
S=""
for s in $(seq 0 255); do  # a free subnet: a lock directory per S; a dead owner's lock is taken over
  if mkdir "$LOCKS/$s" 2>/dev/null; then S=$s; break; fi
  owner=$(cat "$LOCKS/$s/pid" 2>/dev/null || true)
  if [[ -n $owner ]] && ! kill -0 "$owner" 2>/dev/null && rm -rf "$LOCKS/$s" && mkdir "$LOCKS/$s" 2>/dev/null; then
    S=$s; break
  fi
done
[[ -n $S ]] || fail "no free subnet 10.77.S.0/24 (all 256 locked in $LOCKS)"
echo $$ >"$LOCKS/$S/pid"
NET=10.77.$S; BR="gs${S}br"; NS="gs${S}n"; VETH="gs${S}v"

cleanup() {
  for i in $(seq 0 $((N - 1))); do
    ip netns del "$NS$i" 2>/dev/null || true
    ip link del "$VETH$i" 2>/dev/null || true  # left behind if a process still held its namespace
  done
  ip link del "$BR" 2>/dev/null || true
  rm -rf "$WORK" "$LOCKS/$S"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
cleanup_stale() {  # a dead session's leftovers under this S
  for i in $(seq 0 252); do
    ip netns del "$NS$i" 2>/dev/null || ip link del "$VETH$i" 2>/dev/null || break
  done
  ip link del "$BR" 2>/dev/null || true
}
cleanup_stale
echo $$ >"$LOCKS/$S/pid"

ip link add "$BR" type bridge
ip addr add "$NET.254/24" dev "$BR"
ip link set "$BR" up
for i in $(seq 0 $((N - 1))); do
  ip netns add "$NS$i"
  ip link add "$VETH$i" type veth peer name "$BR" netns "$NS$i"
  ip link set "$VETH$i" master "$BR" up
  ip netns exec "$NS$i" ip addr add "$NET.$((i + 1))/24" dev "$BR"
  ip netns exec "$NS$i" ip link set "$BR" up
  ip netns exec "$NS$i" ip link set lo up
done

cat >"$BIN/shaped_rate" <<EOF
#!/bin/sh
# shaped_rate RATE: every link shaped to RATE in both directions by a fresh tc tbf ("local": none)
set -e
rate="\$1"
for i in \$(seq 0 $((N - 1))); do
  tc qdisc del dev "$VETH\$i" root 2>/dev/null || true
  ip netns exec "$NS\$i" tc qdisc del dev "$BR" root 2>/dev/null || true
  if [ "\$rate" != local ]; then
    tc qdisc add dev "$VETH\$i" root tbf rate "\$rate" burst 1mbit latency 100ms
    ip netns exec "$NS\$i" tc qdisc add dev "$BR" root tbf rate "\$rate" burst 1mbit latency 100ms
  fi
done
EOF

cat >"$BIN/ssh" <<EOF
#!/bin/sh
# ssh [OPTIONS] ADDRESS [OPTIONS] COMMAND...: COMMAND in ADDRESS's namespace, on its core, with
# its own TMPDIR (options are skipped, before the address and after it, as ssh takes them)
host=""
while [ \$# -gt 0 ]; do
  case "\$1" in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;
    -*) shift ;;
    *) [ -z "\$host" ] || break; host="\${1#*@}"; shift ;;
  esac
done
case "\$host" in
  $NET.*) i=\$((\${host##*.} - 1)) ;;
  *) echo "shaped.sh ssh: \$host is not one of the shaped ranks ($NET.1 … $NET.$N)" >&2; exit 255 ;;
esac
mkdir -p "$WORK/tmp\$i"
exec ip netns exec "$NS\$i" env TMPDIR="$WORK/tmp\$i" taskset -c \$((i % $CORES)) /bin/sh -c "\$*"
EOF

HOSTS="$(seq -s, -f "$NET.%g:1" 1 "$N")"
cat >"$BIN/mpirun" <<EOF
#!/bin/bash
# Open MPI's mpirun over the shaped ranks: -H unless given, TCP on $NET.0/24 only, the ssh above
set -e
args=("\$@") extra=()
given() { local a; for a in "\${args[@]}"; do [[ \$a == "\$1" ]] && return 0; done; return 1; }
mca() { given "\$1" || extra+=(--mca "\$1" "\$2"); }
given -H || given --host || given -host || given --hostfile || given -hostfile || extra+=(-H "$HOSTS")
given --bind-to || given -bind-to || extra+=(--bind-to none)
[[ \$(id -u) != 0 ]] || given --allow-run-as-root || extra+=(--allow-run-as-root)
mca plm_rsh_agent "$BIN/ssh"
mca btl tcp,self
mca btl_tcp_if_include "$NET.0/24"
mca oob_tcp_if_include "$NET.0/24"
mca rtc_hwloc_vmhole none  # orted does not share its topology through a mapped segment (it segfaulted writing it here)
PMIX_MCA_gds=hash exec "$REAL_MPIRUN" "\${extra[@]}" "\${args[@]}"
EOF

cat >"$BIN/horovodrun" <<EOF
#!/bin/bash
# horovodrun over the shaped ranks: -H and --network-interfaces unless given; its mpirun and ssh are the ones beside it
hosts=(-H "$HOSTS") nics=(--network-interfaces "$BR")
for a in "\$@"; do
  case "\$a" in
    -H|--hosts|-hostfile|--hostfile|--host-discovery-script) hosts=() ;;
    --network-interface*) nics=() ;;
  esac
done
exec "$REAL_HOROVODRUN" "\${hosts[@]}" "\${nics[@]}" "\$@"
EOF
chmod +x "$BIN"/*

export PATH="$BIN:$PATH" SHAPED_HOSTS="$HOSTS" SHAPED_RANKS="$N" SHAPED_LINK="${VETH}0"
"$BIN/shaped_rate" "$RATE"
echo "[shaped] $N ranks at $NET.1 … $NET.$N, links $RATE" >&2

status=0
case "$(basename "$1")" in
  torchrun)
    torchrun="$(command -v "$1")"; shift
    pids=()
    for i in $(seq 0 $((N - 1))); do
      "$BIN/ssh" "$NET.$((i + 1))" "$(printf '%q ' env GLOO_SOCKET_IFNAME="$BR" "$torchrun" --nnodes "$N" \
        --node-rank "$i" --nproc-per-node 1 --master-addr "$NET.1" --master-port 29500 "$@")" &
      pids+=($!)
    done
    for pid in "${pids[@]}"; do
      wait "$pid" || { rc=$?; ((status)) || status=$rc; }
    done
    ;;
  horovodrun) shift; "$BIN/horovodrun" "$@" || status=$? ;;
  mpirun) shift; "$BIN/mpirun" "$@" || status=$? ;;
  *) "$@" || status=$? ;;
esac
exit "$status"
