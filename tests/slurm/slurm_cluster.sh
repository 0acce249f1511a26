# shellcheck shell=bash
# A real single-node Slurm for the tests, from Debian's slurmctld, slurmd,
# slurm-client and munge packages, living entirely in one temporary folder
# (sourced by the tests in this folder).
#
#   slurm_cluster_start DIR   writes a munge key and slurm.conf into DIR,
#                             starts munged, slurmctld and slurmd (as children
#                             of the test, in the foreground mode of each, no
#                             systemd), exports SLURM_CONF and waits until the
#                             node is idle
#   slurm_cluster_stop        cancels every job, `scontrol shutdown`, ends the
#                             daemons it started (by their pids) and munged
#   slurm_test_begin TAG      for a test script: exits 77 (CTest: skipped)
#                             unless root, sets `work` to a fresh temporary
#                             folder, installs the traps below and starts
#                             the clock of stage (below)
#   fail MESSAGE..., stage MESSAGE...
#                             the test's failure (slurm_test_fail) and
#                             headings with the seconds since its begin
#
# A test calls slurm_cluster_stop from its EXIT trap (slurm_test_begin's does,
# and prints the daemons' logs when the test failed) and turns INT, TERM, HUP
# and PIPE into an exit, so the cluster goes away however the test ends; if
# the test is killed outright, the daemons get SIGTERM from the kernel
# (parent-death signal).
#
# How it is configured, and why:
# - one node named after this host (slurmd looks itself up by `hostname -s`)
#   at 127.0.0.1 with this machine's CPU count (at least 2), one partition;
# - ProctrackType=proctrack/linuxproc and TaskPlugin=task/none: no cgroups
#   (containers and CI machines rarely let a test mount or delegate them);
#   proctrack/pgid left a hung slurmstepd behind. With linuxproc a process
#   that outlives its batch script is not killed at job end, so the job
#   scripts must not leave children behind;
# - SlurmUser=root, munge with its own key and socket in DIR (AuthInfo=
#   socket=...), free TCP ports: nothing collides with a site's Slurm or
#   another test;
# - cred_expire=10: a requeued job waits for the job credential to expire
#   before it may start again (default 120 s + a minute); 10 s keeps the
#   preemption test short;
# - no accounting daemon: `scontrol show job` reports states, restarts and
#   exit codes while MinJobAge keeps finished jobs listed.

slurm_cluster_pids=()
slurm_cluster_dir=""

slurm_cluster_log() { echo "[slurm-cluster $(date +%H:%M:%S)] $*"; }

# The test Slurm runs as root (slurmd runs jobs as the submitting user, and
# SlurmUser is root here).
slurm_test_begin() {
  if [[ $(id -u) -ne 0 ]]; then
    echo "SKIP: the test Slurm runs as root; run this test as root"
    exit 77
  fi
  work=$(mktemp -d "${TMPDIR:-/tmp}/vqa-slurm-$1-XXXXXX")
  trap slurm_test_end EXIT
  trap 'exit 130' INT TERM HUP PIPE
  slurm_test_started=$SECONDS
}

# fail MESSAGE... and stage MESSAGE..., for the test scripts: the test's
# failure (slurm_test_fail), and a heading with the seconds since the test
# began (slurm_test_begin, slurm_multinode_test_begin).
slurm_test_started=$SECONDS
fail() { slurm_test_fail "$@"; }
stage() { echo "---- [$((SECONDS - slurm_test_started)) s] $*"; }

# slurm_test_end [STOP]: a test's EXIT trap: the daemons' logs when it
# failed, STOP (default slurm_cluster_stop), its folder removed, its status kept.
slurm_test_end() {
  local status=$?
  ((status == 0)) || slurm_cluster_dump_logs
  "${1:-slurm_cluster_stop}"
  rm -rf "$work"
  slurm_test_repeat_failure
  exit "$status"
}

# slurm_test_fail MESSAGE...: ends a test with exit 1: the message, then the
# job's output ($output, where set) without the resolved configuration's
# "name = value" lines. The EXIT trap prints the message once more after
# the daemons' logs, so that the last lines of a long failure say what failed.
slurm_test_fail() {
  slurm_test_failure="FAIL: $*"
  echo "$slurm_test_failure" >&2
  if [[ -n ${output:-} && -f $output ]]; then
    echo "---- job output ($output, without its resolved configuration)" >&2
    grep -v -E '^[a-z0-9-]+ = ' "$output" >&2 || true
  fi
  exit 1
}

slurm_test_repeat_failure() {
  [[ -z ${slurm_test_failure:-} ]] || echo "$slurm_test_failure (see above)" >&2
}

# slurm_free_port START: the first port from START on that nothing listens on.
slurm_free_port() {
  local port=$1
  while ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; do
    port=$((port + 1))
  done
  echo "$port"
}

# slurm_daemon COMMAND...: runs a daemon in the foreground, set to get
# SIGTERM when the test's shell dies, so that a test killed outright (CTest's
# timeout) leaves no daemon behind; slurm_cluster_stop handles the rest.
slurm_daemon() {
  exec setpriv --pdeathsig TERM "$@"
}

# slurm_munge_start DIR: a fresh munge key in DIR/munge and munged on it,
# its socket DIR/munge/munge.socket (a file: it serves processes in any
# network namespace alike), its pid first in slurm_cluster_pids.
slurm_munge_start() {
  local dir=$1
  mkdir -p "$dir"/{log,munge}
  chmod 700 "$dir/munge"
  # munge: a fresh random key, readable by root only (munged checks).
  head -c 1024 /dev/urandom >"$dir/munge/munge.key"
  chmod 400 "$dir/munge/munge.key"
  # --force: munged refuses a socket folder under a world-writable /tmp.
  slurm_daemon munged --foreground --force --socket="$dir/munge/munge.socket" \
    --key-file="$dir/munge/munge.key" --seed-file="$dir/munge/munge.seed" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
    >"$dir/log/munged.out" 2>&1 &
  slurm_cluster_pids+=($!)
}

# slurm_munge_wait DIR: waits for munged's socket before the daemons need it.
slurm_munge_wait() {
  local dir=$1 i
  for ((i = 0; i < 100; i++)); do
    [[ -S $dir/munge/munge.socket ]] && return 0
    sleep 0.1
  done
  slurm_cluster_log "munged did not start"
  cat "$dir/log/munged.out" "$dir/log/munged.log" >&2 2>/dev/null || true
  return 1
}

# slurm_conf_common DIR CONTROLLER_PORT DAEMON_PORT: the slurm.conf lines
# every test cluster shares (all but SlurmctldHost, the slurmd paths, the
# nodes and the partition).
slurm_conf_common() {
  local dir=$1 controller_port=$2 daemon_port=$3
  cat <<EOF
ClusterName=vqatest
SlurmctldPort=$controller_port
SlurmdPort=$daemon_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=10
StateSaveLocation=$dir/state
SlurmctldPidFile=$dir/slurmctld.pid
SlurmctldLogFile=$dir/log/slurmctld.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SchedulerType=sched/builtin
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MinJobAge=600
KillWait=10
SlurmdParameters=config_overrides
EOF
}

slurm_cluster_start() {
  local dir=$1
  slurm_cluster_dir=$dir
  local node
  node=$(hostname -s)
  mkdir -p "$dir"/{state,spool,log}
  slurm_munge_start "$dir"

  # Ports from a pid-dependent base, so that tests run at the same time on
  # one machine do not race for the same ones.
  # The node's CPU count: what this process may use (nproc would answer
  # OMP_NUM_THREADS if set), at least 2 for the tests' 2-rank jobs;
  # config_overrides lets slurmd accept more CPUs than the machine has.
  local cpus
  cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
  ((cpus >= 2)) || cpus=2

  local controller_port daemon_port
  controller_port=$(slurm_free_port $((20000 + $$ % 20000)))
  daemon_port=$(slurm_free_port $((controller_port + 1)))

  {
    echo "SlurmctldHost=$node(127.0.0.1)"
    slurm_conf_common "$dir" "$controller_port" "$daemon_port"
    cat <<EOF
SlurmdSpoolDir=$dir/spool
SlurmdPidFile=$dir/slurmd.pid
SlurmdLogFile=$dir/log/slurmd.log
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    # More partitions of the same node, for commands that name a site's
    # (SLURM_TEST_PARTITIONS="cpu gpu").
    local partition
    for partition in ${SLURM_TEST_PARTITIONS:-}; do
      echo "PartitionName=$partition Nodes=ALL MaxTime=INFINITE State=UP"
    done
  } >"$dir/slurm.conf"
  export SLURM_CONF=$dir/slurm.conf

  slurm_munge_wait "$dir" || return 1

  slurm_daemon slurmctld -D -f "$SLURM_CONF" >"$dir/log/slurmctld.out" 2>&1 &
  slurm_cluster_pids+=($!)
  slurm_daemon slurmd -D -f "$SLURM_CONF" >"$dir/log/slurmd.out" 2>&1 &
  slurm_cluster_pids+=($!)

  local i
  for ((i = 0; i < 300; i++)); do
    if sinfo -h -o %T 2>/dev/null | grep -qx idle; then
      slurm_cluster_log "Slurm up in $dir: node $node idle, $cpus CPUs," \
        "slurmctld port $controller_port ($(sinfo --version))"
      return 0
    fi
    sleep 0.1
  done
  slurm_cluster_log "the node did not become idle within 30 s:"
  sinfo -N -l >&2 || true
  slurm_cluster_dump_logs
  return 1
}

slurm_cluster_dump_logs() {
  local log
  for log in "$slurm_cluster_dir"/log/*; do
    [[ -s $log ]] || continue
    echo "---- $(basename "$log") (last 30 lines)" >&2
    tail -n 30 "$log" >&2
  done
}

# slurm_cluster_stop: safe to call twice and after a failed start.
slurm_cluster_stop() {
  [[ -n $slurm_cluster_dir ]] || return 0
  local i pid
  if ((${#slurm_cluster_pids[@]} > 1)); then
    # Cancel the jobs first: with proctrack/linuxproc, processes of a job
    # still running when slurmd stops would be left behind.
    scancel --full --user="$(id -un)" 2>/dev/null || true
    for ((i = 0; i < 150; i++)); do
      [[ -z $(squeue -h -t running,completing -o %i 2>/dev/null) ]] && break
      sleep 0.1
    done
    scontrol shutdown >/dev/null 2>&1 || true
  fi
  # Give the daemons 10 s to exit on their own, then end them; munged last
  # (it is the first pid).
  for ((i = ${#slurm_cluster_pids[@]} - 1; i >= 0; i--)); do
    pid=${slurm_cluster_pids[i]}
    if ((i == 0)); then kill "$pid" 2>/dev/null || true; fi
    local tries
    for ((tries = 0; tries < 100; tries++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      slurm_cluster_log "pid $pid still running after 10 s: killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
  done
  slurm_cluster_pids=()
  slurm_cluster_dir=""
}

# slurm_job_field JOB FIELD: one field of `scontrol show job` (e.g. JobState,
# Restarts, ExitCode), empty if the job is unknown.
slurm_job_field() {
  scontrol -o show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}

# slurm_wait_job JOB REGEX TIMEOUT: waits until the job's state matches REGEX
# (e.g. 'COMPLETED|FAILED'); prints the state; fails after TIMEOUT seconds.
slurm_wait_job() {
  local job=$1 pattern=$2 timeout=$3 state="" start=$SECONDS
  while ((SECONDS - start < timeout)); do
    state=$(slurm_job_field "$job" JobState)
    if [[ $state =~ ^($pattern)$ ]]; then
      echo "$state"
      return 0
    fi
    sleep 0.2
  done
  slurm_cluster_log "job $job still '$state' (reason $(slurm_job_field "$job" Reason))" \
    "after $timeout s (waiting for $pattern)" >&2
  sinfo -N -o '%N %T %C' >&2 || true
  return 1
}

# slurm_start_requeued JOB SINCE: starts the requeued JOB without waiting for
# the scheduler. Slurm sets a requeued job's begin time cred_expire + 1 s
# (11 s with the tests' cred_expire=10) past the requeue, so that the next
# start cannot meet the old, revoked credential ("Job credential revoked");
# its main scheduler may then take up to a minute to start it. This waits
# until 13 s after SINCE (the test's $SECONDS when it saw the requeue) and
# brings the start forward as an operator would. The scheduler may have
# started the job in the meantime: then the update fails, and there is
# nothing to bring forward (a test ended here once when it took that failure
# for its own).
slurm_start_requeued() {
  local job=$1 since=$2 state
  while ((SECONDS - since < 13)); do sleep 0.5; done
  scontrol update JobId="$job" StartTime=now 2>/dev/null && return 0
  state=$(slurm_job_field "$job" JobState)
  if [[ $state == PENDING ]]; then
    slurm_cluster_log "scontrol update JobId=$job StartTime=now failed with the job still pending" >&2
    return 1
  fi
  slurm_cluster_log "job $job was already $state: the scheduler started it at its begin time"
}
