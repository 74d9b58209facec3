#!/usr/bin/env bash
# Two "hosts" on one machine for data-parallel tests: network namespaces toy-a (10.77.0.1) and
# toy-b (10.77.0.2) joined by a veth pair, and an OpenMPI launcher agent that starts the
# remote side with `ip netns exec` instead of ssh. Needs root (CAP_NET_ADMIN).
#   scripts/netns-hosts.sh up            make them (idempotent)
#   scripts/netns-hosts.sh down          remove them
#   scripts/netns-hosts.sh rate RATE     limit the veth to RATE (tc tbf, e.g. 200mbit; "off" lifts it)
#   scripts/netns-hosts.sh mpirun ARGS   run mpirun from toy-a with one process per host:
#       scripts/netns-hosts.sh mpirun build/toy train --out runs/two-hosts ...
# TCP only, on the veth (no shared memory between the "hosts"); the launcher daemons probe
# their connection every 2 s so that a network that goes away ends them too (not after 15 min).
set -euo pipefail
cd "$(dirname "$0")/.."
A=toy-a B=toy-b IPA=10.77.0.1 IPB=10.77.0.2
agent=$(pwd)/scripts/netns-hosts.sh

case "${1:-}" in
  up)
    ip netns list | grep -qw "$A" || ip netns add "$A"
    ip netns list | grep -qw "$B" || ip netns add "$B"
    if ! ip -n "$A" link show toy-va >/dev/null 2>&1; then
      ip link add toy-va type veth peer name toy-vb
      ip link set toy-va netns "$A"
      ip link set toy-vb netns "$B"
      ip -n "$A" addr add "$IPA/24" dev toy-va
      ip -n "$B" addr add "$IPB/24" dev toy-vb
    fi
    for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
    ip -n "$A" link set toy-va up
    ip -n "$B" link set toy-vb up
    echo "netns-hosts: $A ($IPA) <-> $B ($IPB) up"
    ;;
  down)
    ip netns del "$A" 2>/dev/null || true
    ip netns del "$B" 2>/dev/null || true
    echo "netns-hosts: down"
    ;;
  rate)
    rate=${2:-off}
    tc -n "$A" qdisc del dev toy-va root 2>/dev/null || true
    tc -n "$B" qdisc del dev toy-vb root 2>/dev/null || true
    if [ "$rate" != off ]; then
      tc -n "$A" qdisc add dev toy-va root tbf rate "$rate" burst 256kb latency 100ms
      tc -n "$B" qdisc add dev toy-vb root tbf rate "$rate" burst 256kb latency 100ms
    fi
    ;;
  link)  # netns-hosts.sh link up|down: the veth itself (a network that goes away)
    ip -n "$A" link set toy-va "$2"
    ip -n "$B" link set toy-vb "$2"
    ;;
  agent)  # (OpenMPI calls this as its rsh agent: agent HOST COMMAND...)
    shift
    host=$1
    shift
    ns="$A"
    [ "$host" = "$IPB" ] && ns="$B"
    # (as root, OpenMPI's daemon wants these as the launcher does)
    exec ip netns exec "$ns" env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 sh -c "$*"
    ;;
  mpirun)
    shift
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
    exec ip netns exec "$A" mpirun -np 2 -H "$IPA,$IPB" --mca plm_rsh_agent "$agent agent" \
      --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
      --mca oob_tcp_keepalive_time 4 --mca oob_tcp_keepalive_intvl 2 --mca oob_tcp_keepalive_probes 2 \
      -x OMPI_MCA_btl_vader_single_copy_mechanism "$@"
    ;;
  *)
    echo "usage: scripts/netns-hosts.sh up|down|rate RATE|link up|down|mpirun ARGS" >&2
    exit 2
    ;;
esac
