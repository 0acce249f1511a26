#!/usr/bin/env bash
# Emulated hosts on one machine: N network namespaces ("hosts"), each with a
# host name of its own, joined through a switch namespace (a Linux bridge) by
# veth links shaped with tc's token bucket filter, so that MPI, gloo or NCCL's
# socket transport between them crosses a link of a chosen rate as it would
# between two nodes. Every host has the same interface name, vqa0 (so
# GLOO_SOCKET_IFNAME=vqa0 / NCCL_SOCKET_IFNAME=vqa0 work in all of them), with
# address 10.201.0.(i+1)/24, and runs its processes on a core of its own
# (host i on core i mod the core count).
#
#   jobs/emulated_hosts.sh up NAME HOSTS [--rate R] [--burst B] [--latency L] [--owner PID]
#   jobs/emulated_hosts.sh shape NAME [--rate R] [--burst B] [--latency L]
#   jobs/emulated_hosts.sh exec NAME I COMMAND...        run COMMAND on host I
#   jobs/emulated_hosts.sh mpirun NAME [MPIRUN ARGS...]  mpirun on host 0, one rank per host
#   jobs/emulated_hosts.sh down NAME                     end the hosts' processes, remove all
#   jobs/emulated_hosts.sh list                          the sets that exist, with their owners
#
# NAME: letters, digits and '-', at most 12 characters; host i is the
# namespace (and host name) NAME-hI. R: a tc rate (1gbit, 500mbit, ...) or
# "none" (the veth's own speed); B: tc's burst (default: 2 ms of the rate,
# at least 64kb, so that the timer's granularity does not cap the rate);
# L: the longest a packet waits in the shaper's queue (default 20ms). Each
# direction of each link is shaped: a host's egress and the switch port's
# egress towards it, as a switch port of that speed would.
#
# Clean-up: `down`, or the owner's end. With --owner PID (default: the
# caller's parent, e.g. the script that ran `up`) a watcher started with setsid
# removes the set once that process has ended, however it ended (SIGKILL
# included); `up` also removes sets left by owners that no longer exist.
# mpirun starts the daemons of hosts 1..N-1 through jobs/netns_rsh_agent.sh
# (no ssh needed); a rank file binds rank i to host i's core.
# Needs root and iproute2 (ip, tc), util-linux (unshare, taskset, setsid).
set -euo pipefail

state_root=${VQA_HOSTS_STATE:-/run/vqa-emulated-hosts}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
subnet=10.201.0

die() {
  echo "emulated_hosts.sh: $*" >&2
  exit 2
}

check_name() {
  [[ $1 =~ ^[A-Za-z0-9][A-Za-z0-9-]{0,11}$ ]] ||
    die "NAME must be 1-12 letters, digits or '-', got '$1'"
}

host_count() {
  [[ -f $state_root/$1/hosts ]] || die "no emulated hosts named '$1' (jobs/emulated_hosts.sh list)"
  cat "$state_root/$1/hosts"
}

core_of_host() {
  local cores
  cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
  echo $(($1 % cores))
}

# parse_shape ARGS...: sets rate, burst, latency from --rate/--burst/--latency.
parse_shape() {
  rate=none burst="" latency=20ms owner=$PPID
  while (($#)); do
    case $1 in
      --rate) rate=${2:?--rate needs a value} ;;
      --burst) burst=${2:?--burst needs a value} ;;
      --latency) latency=${2:?--latency needs a value} ;;
      --owner) owner=${2:?--owner needs a value} ;;
      *) die "unknown option '$1'" ;;
    esac
    shift 2
  done
  [[ $rate == none || $rate =~ ^[0-9.]+([kmgt]?bit)$ ]] ||
    die "--rate must be a tc rate such as 1gbit or 500mbit, or none; got '$rate'"
  [[ -z $burst || $burst =~ ^[0-9]+[kmg]?b?$ ]] || die "--burst must be a tc size such as 256kb, got '$burst'"
  [[ $latency =~ ^[0-9.]+(ms|us|s)$ ]] || die "--latency must be a time such as 20ms, got '$latency'"
  [[ $owner =~ ^[0-9]+$ ]] || die "--owner must be a process id, got '$owner'"
}

# Bits per second of a tc rate ("1gbit" -> 1000000000).
rate_bits() {
  awk -v r="$1" 'BEGIN {
    n = r + 0; unit = r; sub(/^[0-9.]+/, "", unit)
    m = (unit == "kbit") ? 1e3 : (unit == "mbit") ? 1e6 : (unit == "gbit") ? 1e9 : (unit == "tbit") ? 1e12 : 1
    printf "%.0f\n", n * m }'
}

# shape_link NAMESPACE DEVICE: the token bucket (or none) on DEVICE's egress.
shape_link() {
  local ns=$1 dev=$2
  ip -n "$ns" link set "$dev" up
  tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null || true
  [[ $rate == none ]] && return 0
  local b=$burst
  if [[ -z $b ]]; then
    # 2 ms of the rate, at least 64 KiB (a GSO packet on veth is up to 64 KiB).
    b=$(awk -v bits="$(rate_bits "$rate")" 'BEGIN { b = bits / 8 * 0.002; if (b < 65536) b = 65536; printf "%.0f\n", b }')
  fi
  tc -n "$ns" qdisc add dev "$dev" root tbf rate "$rate" burst "$b" latency "$latency"
}

apply_shape() {
  local name=$1 hosts i
  hosts=$(host_count "$name")
  for ((i = 0; i < hosts; i++)); do
    shape_link "$name-h$i" vqa0
    shape_link "$name-sw" "p$i"
  done
  echo "$rate ${burst:-auto} $latency" >"$state_root/$name/shape"
}

remove_set() {
  local name=$1 ns pid
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$name-(h[0-9]+|sw)$" || true); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
  done
  sleep 0.2
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$name-(h[0-9]+|sw)$" || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "${state_root:?}/$name"
}

# Sets whose owner has ended (a killed benchmark or test).
remove_orphans() {
  local dir name owner
  for dir in "$state_root"/*/; do
    [[ -d $dir ]] || continue
    name=$(basename "$dir")
    owner=$(cat "$dir/owner" 2>/dev/null || echo 0)
    kill -0 "$owner" 2>/dev/null || remove_set "$name"
  done
}

command_up() {
  local name=${1:?usage: up NAME HOSTS [options]} hosts=${2:?usage: up NAME HOSTS [options]}
  shift 2
  check_name "$name"
  [[ $hosts =~ ^[1-9][0-9]?$ ]] || die "HOSTS must be 1-99, got '$hosts'"
  parse_shape "$@"
  [[ $(id -u) -eq 0 ]] || die "needs root (network namespaces)"
  mkdir -p "$state_root"
  remove_orphans
  [[ ! -e $state_root/$name ]] || die "emulated hosts '$name' exist already (down first)"
  mkdir -p "$state_root/$name"
  echo "$hosts" >"$state_root/$name/hosts"
  echo "$owner" >"$state_root/$name/owner"
  # From here on a failure removes what was made.
  trap 'remove_set "$name"' ERR
  local sw=$name-sw i tmp
  ip netns add "$sw"
  ip -n "$sw" link add vqabr type bridge
  ip -n "$sw" link set vqabr up
  ip -n "$sw" link set lo up
  : >"$state_root/$name/hostfile"
  : >"$state_root/$name/rankfile"
  for ((i = 0; i < hosts; i++)); do
    ip netns add "$name-h$i"
    # Unique names while the pair is made, then each end renamed in its namespace.
    tmp=vqa$$x$i
    ip link add "${tmp}a" netns "$name-h$i" type veth peer name "${tmp}b" netns "$sw"
    ip -n "$name-h$i" link set "${tmp}a" name vqa0
    ip -n "$sw" link set "${tmp}b" name "p$i"
    ip -n "$sw" link set "p$i" master vqabr
    ip -n "$name-h$i" addr add "$subnet.$((i + 1))/24" dev vqa0
    ip -n "$name-h$i" link set lo up
    echo "$name-h$i slots=1" >>"$state_root/$name/hostfile"
    echo "rank $i=$name-h$i slot=$(core_of_host "$i")" >>"$state_root/$name/rankfile"
  done
  apply_shape "$name"
  trap - ERR
  # The watcher: removes the set once the owner has gone, however it went.
  # shellcheck disable=SC2016  # the inner shell expands its own arguments
  setsid bash -c 'while kill -0 "$1" 2>/dev/null && [ -d "$2" ]; do sleep 1; done
                  [ -d "$2" ] && exec "$3" down "$4"' watcher "$owner" "$state_root/$name" \
    "$here/emulated_hosts.sh" "$name" </dev/null >/dev/null 2>&1 &
  echo "emulated_hosts.sh: $hosts hosts $name-h0..$name-h$((hosts - 1)) on vqa0 ($subnet.1-$hosts), link ${rate}, owner $owner"
}

command_shape() {
  local name=${1:?usage: shape NAME [options]}
  shift
  check_name "$name"
  parse_shape "$@"
  apply_shape "$name"
}

command_exec() {
  local name=${1:?usage: exec NAME I COMMAND...} index=${2:?usage: exec NAME I COMMAND...}
  shift 2
  check_name "$name"
  local hosts
  hosts=$(host_count "$name")
  if ! [[ $index =~ ^[0-9]+$ ]] || ((index >= hosts)); then
    die "host index must be 0..$((hosts - 1)), got '$index'"
  fi
  (($#)) || die "exec needs a command"
  local host=$name-h$index
  # shellcheck disable=SC2016  # the inner shell expands its own arguments
  exec ip netns exec "$host" unshare --uts \
    sh -c 'hostname "$0" && core=$1 && shift && exec taskset -c "$core" "$@"' "$host" "$(core_of_host "$index")" "$@"
}

command_mpirun() {
  local name=${1:?usage: mpirun NAME [MPIRUN ARGS...]}
  shift
  check_name "$name"
  local hosts
  hosts=$(host_count "$name")
  local root_flags=()
  [[ $(id -u) -eq 0 ]] && root_flags=(--allow-run-as-root)
  # mpirun itself is not pinned: Open MPI hands the launching process's
  # allowed cores to its daemons, which would put every rank on host 0's
  # core. The rank file binds rank i to host i's core instead. Open MPI 5's
  # mpirun (PRRTE 3.0) takes it as --map-by rankfile:file=PATH, but rejects
  # a PATH with a '-' in it ("unrecognized qualifier"; it also rewrites
  # --rankfile PATH into that form), as the state folder's name has: there
  # it reads the file through descriptor 3 instead.
  local rankfile=$state_root/$name/rankfile placement
  if [[ $(mpirun --version 2>/dev/null) =~ Open\ MPI\)\ ([0-9]+)\. ]] && ((BASH_REMATCH[1] >= 5)); then
    placement=(--map-by rankfile:file=/dev/fd/3)
  else
    placement=(--rankfile "$rankfile")
  fi
  # shellcheck disable=SC2016  # the inner shell expands its own arguments
  exec ip netns exec "$name-h0" unshare --uts sh -c 'hostname "$0" && shift && exec "$@"' \
    "$name-h0" _ mpirun "${root_flags[@]}" -np "$hosts" \
    --hostfile "$state_root/$name/hostfile" "${placement[@]}" \
    --mca plm_rsh_agent "$here/netns_rsh_agent.sh" \
    --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include vqa0 --mca oob_tcp_if_include vqa0 \
    "$@" 3<"$rankfile"
}

command_list() {
  local dir
  for dir in "$state_root"/*/; do
    [[ -d $dir ]] || continue
    echo "$(basename "$dir"): $(cat "$dir/hosts") hosts, link $(cat "$dir/shape" 2>/dev/null), owner $(cat "$dir/owner")"
  done
}

case ${1:-} in
  up | shape | exec | mpirun | list)
    command=$1
    shift
    "command_$command" "$@"
    ;;
  down)
    check_name "${2:?usage: down NAME}"
    remove_set "$2"
    ;;
  *) die "usage: $0 up|shape|exec|mpirun|down|list ... (see the comment at the top)" ;;
esac
