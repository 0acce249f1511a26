# shellcheck shell=bash
# A multi-node Slurm for the tests: one slurmd per emulated host
# (jobs/emulated_hosts.sh: a network namespace with its own host name and
# address on a tc-shaped link), slurmctld and munged on this machine, all
# living in one temporary folder (sourced by the tests in this folder, after
# or instead of slurm_cluster.sh, whose helpers it uses).
#
#   slurm_multinode_test_begin TAG
#                     for a test script: exits 77 (CTest: skipped) unless
#                     root with network namespaces, sets `work` to a fresh
#                     temporary folder, installs the traps below and starts
#                     the clock of stage (slurm_cluster.sh: fail and stage)
#   slurm_multinode_test_cluster PREFIX HOSTS
#                     the test's cluster: `name` set to PREFIX and the
#                     test's pid (10 characters at most), then
#                     slurm_multinode_start "$work/slurm" "$name" HOSTS on
#                     a 1 Gbit/s link
#   slurm_multinode_start DIR NAME HOSTS [emulated_hosts.sh up options]
#                     brings up HOSTS emulated hosts NAME-h0.. (the nodes,
#                     named after them), a controller link, munged, slurmctld
#                     and one slurmd per host; exports SLURM_CONF and waits
#                     until every node is idle
#   slurm_multinode_stop
#                     cancels every job, `scontrol shutdown`, ends the
#                     daemons by pid, then the hosts (`emulated_hosts.sh
#                     down`: every process left in a namespace, the
#                     namespaces, the veth links); safe to call twice
#   slurm_multinode_kill_host I, slurm_multinode_start_slurmd I
#                     host I lost (every process on it killed), and back
#   slurm_multinode_leftovers
#                     prints what of the cluster still exists (daemons,
#                     namespaces, veth links inside them or on this
#                     machine), nothing when all is gone
#
# How the pieces fit, and why:
# - The hosts are network namespaces joined by a bridge in NAME-sw. This
#   machine joins the bridge too, through a veth link of its own (NAME-c,
#   10.201.0.254, not shaped): it is the head node, where slurmctld runs
#   and where the test calls sbatch, squeue and scontrol as a user would on
#   a login node. The link lives and dies with NAME-sw.
# - slurmd of host I runs in that host's network namespace, entered with
#   `nsenter --net` only: `ip netns exec` would also mount a fresh /sys, where
#   slurmd finds no cgroup tree and stops ("Unable to initialize cgroup
#   plugin"). Around it `unshare --uts --mount`: its own host name (NAME-hI,
#   which slurmd, the job steps and vqa_train report) and a private mount
#   table in which this cluster's hosts file is bound over /etc/hosts, so
#   that the node names resolve to the hosts' addresses for everything the
#   jobs start (Open MPI resolves the allocation's node names) while this
#   machine's /etc/hosts is never touched. The slurmd is pinned to its host's
#   core (host I on core I mod the cores, as emulated_hosts.sh pins its
#   processes), so ranks on different hosts do not share a core.
# - One slurm.conf serves every node: SlurmdSpoolDir, SlurmdPidFile and
#   SlurmdLogFile name the node (%n); NodeAddr is the host's address and
#   SlurmctldHost names the head node's address, so Slurm itself needs no name
#   resolution. One munged: its socket is a file, reachable from every
#   namespace.
# - Each node has 1 CPU (its core). The test cluster is otherwise configured
#   as slurm_cluster.sh's (proctrack/linuxproc, task/none, cred_expire=10).
# - However the test ends: its EXIT trap stops all (and prints the logs on
#   failure); INT, TERM, HUP and PIPE become an exit; killed outright, the
#   daemons get SIGTERM from the kernel (parent-death signal) and the
#   emulated hosts' watcher removes the namespaces with every process left
#   in them (slurmstepd, ranks) once the test's shell is gone.

here_multinode=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/slurm/slurm_cluster.sh
source "$here_multinode/slurm_cluster.sh"

slurm_multinode_hosts_script=$here_multinode/../../jobs/emulated_hosts.sh
slurm_multinode_name=""
slurm_multinode_controller_address=10.201.0.254
# Daemons of these names that ran before the cluster started (not ours).
slurm_multinode_daemons_before=""

slurm_multinode_test_begin() {
  if [[ $(id -u) -ne 0 ]]; then
    echo "SKIP: the test Slurm and the emulated hosts need root; run this test as root"
    exit 77
  fi
  local tool
  for tool in ip tc nsenter unshare setpriv taskset munged slurmctld slurmd sbatch; do
    if ! command -v "$tool" >/dev/null; then
      echo "SKIP: $tool not found (iproute2, util-linux, slurmctld, slurmd, slurm-client, munge)"
      exit 77
    fi
  done
  if ! ip netns add "vqa-probe-$$" 2>/dev/null; then
    echo "SKIP: cannot create a network namespace (ip netns add)"
    exit 77
  fi
  ip netns del "vqa-probe-$$"
  work=$(mktemp -d "${TMPDIR:-/tmp}/vqa-slurm-$1-XXXXXX")
  trap 'slurm_test_end slurm_multinode_stop' EXIT
  trap 'exit 130' INT TERM HUP PIPE
  slurm_test_started=$SECONDS
}

slurm_multinode_test_cluster() {
  # emulated_hosts.sh takes names of 12 characters at most.
  name=$1$$
  name=${name:0:10}
  stage "cluster: $2 emulated hosts on a 1 Gbit/s link, one slurmd each"
  slurm_multinode_start "$work/slurm" "$name" "$2" --rate 1gbit
}

# slurm_multinode_daemons: pids and names of the Slurm and munge daemons on
# this machine, one "pid name" a line; not zombies (an ended slurmstepd
# whose parent went first stays one until init reaps it).
slurm_multinode_daemons() {
  ps -e -o pid=,stat=,comm= |
    awk '$2 !~ /^Z/ && $3 ~ /^(slurmctld|slurmd|slurmstepd|munged)$/ {print $1, $3}'
}

slurm_multinode_start() {
  local dir=$1 name=$2 hosts=$3
  shift 3
  slurm_multinode_daemons_before=$(slurm_multinode_daemons)
  slurm_cluster_dir=$dir
  slurm_multinode_name=$name
  mkdir -p "$dir"/{state,spool,log,run,tmp}

  # The hosts, owned by the test's shell: its watcher removes them once that
  # shell has gone, however it went.
  "$slurm_multinode_hosts_script" up "$name" "$hosts" --owner $$ "$@" >"$dir/log/hosts.out" 2>&1 || {
    cat "$dir/log/hosts.out" >&2
    slurm_cluster_log "emulated_hosts.sh up $name $hosts $* failed"
    return 1
  }
  slurm_cluster_log "$(cat "$dir/log/hosts.out")"

  # The head node's link to the hosts' switch.
  ip link add "$name-c" type veth peer name ctl netns "$name-sw"
  ip -n "$name-sw" link set ctl master vqabr
  ip -n "$name-sw" link set ctl up
  ip addr add "$slurm_multinode_controller_address/24" dev "$name-c"
  ip link set "$name-c" up

  # The hosts' addresses, as emulated_hosts.sh gave them; the hosts file that
  # every node sees as /etc/hosts.
  local i host address head
  head=$(hostname -s)
  local node_lines=() addresses=()
  {
    echo "127.0.0.1 localhost"
    echo "$slurm_multinode_controller_address $head"
    for ((i = 0; i < hosts; i++)); do
      host=$name-h$i
      address=$(ip -n "$host" -4 -o addr show dev vqa0 | awk '{print $4}' | cut -d/ -f1)
      [[ -n $address ]] || {
        slurm_cluster_log "host $host has no address on vqa0"
        return 1
      }
      addresses+=("$address")
      echo "$address $host"
      mkdir -p "$dir/spool/$host" "$dir/tmp/$host"
      node_lines+=("NodeName=$host NodeAddr=$address CPUs=1 State=UNKNOWN")
    done
  } >"$dir/hosts"

  slurm_munge_start "$dir"
  local controller_port daemon_port
  controller_port=$(slurm_free_port $((20000 + $$ % 20000)))
  daemon_port=$(slurm_free_port $((controller_port + 1)))
  {
    echo "SlurmctldHost=$head($slurm_multinode_controller_address)"
    slurm_conf_common "$dir" "$controller_port" "$daemon_port"
    echo "SlurmdSpoolDir=$dir/spool/%n"
    echo "SlurmdPidFile=$dir/run/slurmd-%n.pid"
    echo "SlurmdLogFile=$dir/log/slurmd-%n.log"
    # Every node its own temporary folder: the PMIx plugin makes
    # TmpFS/spmix_appdir_<uid>_<job>.<step> on each node of a step, and with
    # one /tmp for all hosts the second node would find the first's.
    echo "TmpFS=$dir/tmp/%n"
    printf '%s\n' "${node_lines[@]}"
    echo "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
  } >"$dir/slurm.conf"
  export SLURM_CONF=$dir/slurm.conf
  slurm_munge_wait "$dir" || return 1

  slurm_daemon slurmctld -D -f "$SLURM_CONF" >"$dir/log/slurmctld.out" 2>&1 &
  slurm_cluster_pids+=($!)

  for ((i = 0; i < hosts; i++)); do
    slurm_multinode_start_slurmd "$i"
  done

  local idle
  for ((i = 0; i < 300; i++)); do
    idle=$(sinfo -h -N -o '%N %T' 2>/dev/null | awk '$2 == "idle"' | wc -l)
    if ((idle == hosts)); then
      slurm_cluster_log "Slurm up in $dir: $hosts nodes idle ($(sinfo -h -N -o '%N' | paste -sd ' ')" \
        "at ${addresses[*]}), slurmctld at $slurm_multinode_controller_address:$controller_port" \
        "($(sinfo --version))"
      return 0
    fi
    sleep 0.1
  done
  slurm_cluster_log "not every node became idle within 30 s:"
  sinfo -N -l >&2 || true
  slurm_cluster_dump_logs
  return 1
}

# slurm_multinode_start_slurmd I: starts host I's slurmd (also again, after
# slurm_multinode_kill_host: the host comes back).
slurm_multinode_start_slurmd() {
  local i=$1 dir=$slurm_cluster_dir cores
  local host=$slurm_multinode_name-h$i
  cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
  # shellcheck disable=SC2016  # the inner shell expands its own arguments
  slurm_daemon nsenter --net="/run/netns/$host" unshare --uts --mount --propagation private \
    sh -c 'hostname "$1" && mount --bind "$2" /etc/hosts &&
           exec taskset -c "$3" slurmd -D -N "$1" -f "$4"' slurmd "$host" "$dir/hosts" \
    $((i % cores)) "$SLURM_CONF" >>"$dir/log/slurmd-$host.out" 2>&1 &
  slurm_cluster_pids+=($!)
}

# slurm_multinode_kill_host I: host I dies: SIGKILL to every process in its
# network namespace (its slurmd, slurmstepd, the ranks), as a power cut
# would end them; its link stays up, so peers see their connections reset.
slurm_multinode_kill_host() {
  local host=$slurm_multinode_name-h$1 pid
  for pid in $(ip netns pids "$host" 2>/dev/null); do
    kill -KILL "$pid" 2>/dev/null || true
  done
}

slurm_multinode_stop() {
  slurm_cluster_stop
  if [[ -n $slurm_multinode_name ]]; then
    "$slurm_multinode_hosts_script" down "$slurm_multinode_name" >/dev/null 2>&1 || true
    # The head node's end of the controller link goes with NAME-sw; in case
    # the switch namespace never came up:
    ip link del "$slurm_multinode_name-c" 2>/dev/null || true
  fi
}

slurm_multinode_leftovers() {
  local name=$slurm_multinode_name
  [[ -n $name ]] || return 0
  local daemons
  daemons=$(comm -13 <(echo "$slurm_multinode_daemons_before" | sort) \
    <(slurm_multinode_daemons | sort))
  [[ -z $daemons ]] || echo "daemons still running: $(tr '\n' ' ' <<<"$daemons")"
  local namespaces
  namespaces=$(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$name-(h[0-9]+|sw)$" || true)
  [[ -z $namespaces ]] || echo "namespaces left: $(tr '\n' ' ' <<<"$namespaces")"
  # The veth links: emulated_hosts.sh makes both ends of each host's pair
  # inside the namespaces (vqa0 in NAME-hI, pI in NAME-sw), never on this
  # machine, and a pair goes with either of its namespaces; the controller
  # link joins this machine (NAME-c) to NAME-sw (ctl). So they are looked for
  # inside each of the cluster's namespaces still there, and here: NAME-c and
  # any link whose peer is in one of them (link-netns).
  local links=() ns
  for ns in $namespaces; do
    mapfile -t -O "${#links[@]}" links < <(ip -n "$ns" -o link show type veth 2>/dev/null |
      awk -v ns="$ns" '{sub(/:$/, "", $2); print ns ":" $2}')
  done
  mapfile -t -O "${#links[@]}" links < <(ip -o link show type veth 2>/dev/null |
    grep -E "^[0-9]+: $name-|link-netns $name-(h[0-9]+|sw)( |$)" | awk '{sub(/:$/, "", $2); print $2}')
  ((${#links[@]} == 0)) || echo "veth links left: ${links[*]}"
  [[ ! -e ${VQA_HOSTS_STATE:-/run/vqa-emulated-hosts}/$name ]] ||
    echo "emulated hosts state left: ${VQA_HOSTS_STATE:-/run/vqa-emulated-hosts}/$name"
  return 0
}
