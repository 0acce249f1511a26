#!/usr/bin/env bash
# rsh agent for mpirun across network namespaces (--mca plm_rsh_agent), used by
# jobs/emulated_hosts.sh and the network-partition test: mpirun runs
# `netns_rsh_agent.sh HOST COMMAND...` to start its daemon on HOST, and here a
# host is the network namespace of that name. Like ssh, the agent hands the
# command to a shell (Open MPI quotes its arguments for one), inside the
# namespace and a UTS namespace of its own whose host name is HOST.
set -euo pipefail
host=$1
shift
# $0 of the inner shell is the host name; the command is joined as ssh would.
exec ip netns exec "$host" unshare --uts sh -c "hostname \"\$0\" && $*" "$host"
