# shellcheck shell=bash
# Shared body of the batch scripts in jobs/slurm/ (sourced by them; bash).
#
# slurm_train_job CONFIG [vqa_train options...]
#   Runs vqa_train over the whole allocation, one rank per Slurm task, in the
#   run directory ${VQA_RUN_DIR:-runs/<config name>-<job id>} with
#   `--resume auto`. A requeued job keeps its job id, so it finds its own
#   directory and continues from the latest checkpoint; a new job pointed at
#   an old directory (VQA_RUN_DIR=runs/x-123 sbatch ...) does the same. A
#   completed run (vqa_train's DONE marker covers --epochs) is not trained
#   again: vqa_train says so and exits 0 (more --epochs continue it).
#
# Preemption. The batch scripts ask for SIGUSR1 some minutes before the time
# limit (#SBATCH --signal=B:USR1@T: B = to this batch shell only). The shell
# traps SIGUSR1 and SIGTERM and sends SIGUSR1 to the launcher, which passes it
# to every rank (mpirun and srun both forward SIGUSR1; on SIGTERM mpirun would
# kill the ranks at once instead). The ranks agree collectively to stop at the
# next optimiser step, rank 0 writes a checkpoint, and every rank exits with
# 75 (EX_TEMPFAIL). This script turns 75 into `scontrol requeue`: Slurm ends
# the job, puts it back in the queue with the same id and
# SLURM_RESTART_COUNT + 1, and the next start resumes. A cancelled job
# (scancel: SIGTERM) also leaves a checkpoint when the ranks finish it within
# Slurm's KillWait, but is not requeued. The launcher runs in
# the background and the shell waits for it, so no process outlives the
# script (with proctrack/linuxproc Slurm would not clean one up).
#
# Environment knobs (all optional):
#   VQA_LAUNCHER   auto (default) | srun | mpirun. auto takes srun when
#                  `srun --mpi=list` offers pmix, else mpirun.
#   VQA_SRUN_MPI   the srun PMI plugin (default pmix). Open MPI 4 as Debian
#                  and Ubuntu build it starts under srun only with PMIx
#                  (pmi2 and none fail in MPI_Init); an Open MPI built
#                  --with-pmi may take pmi2. mpirun works either way: inside
#                  an allocation it reads the nodes from Slurm and starts its
#                  daemons with srun itself.
#   VQA_BUILD      build directory holding vqa_train and vqa_prep (default build)
#   VQA_RUN_DIR    run directory (default runs/<config name>-<job id>)
#   VQA_NCCL_ENV   file sourced for the NCCL settings (default jobs/slurm/nccl_env.sh)
#   VQA_SIGNAL_SECONDS  the T of a --signal=B:USR1@T given to sbatch on the
#                  command line (the job only sees the script's own #SBATCH
#                  line); used to warn about a time limit shorter than T
#   VQA_RECOVER_RESTARTS  restarts inside the allocation after a lost node
#                  (default 0: off; train_multinode.sbatch sets 2)
#   VQA_RECOVER_MIN_NODES  fewest surviving nodes to restart on (default: half
#                  the allocation's nodes, rounded up); below it the job is
#                  requeued instead
#   VQA_SRUN_WAIT  srun --wait on more than one node: seconds srun waits for
#                  the other ranks once one has ended, before it ends the
#                  step (default 30)
#   VQA_COMM_TIMEOUT  vqa_train's --comm-timeout (the collective deadline)
#                  for this job, unless the command line or the config file
#                  sets one (default: none given, vqa_train's 600 s;
#                  train_multinode.sbatch sets 120: see the recovery notes)
#
# Recovery inside the allocation (VQA_RECOVER_RESTARTS > 0). A lost node
# leaves the ranks on the others blocked in a collective; vqa_train's
# watchdog (--comm-timeout, hence VQA_COMM_TIMEOUT: the recovery waits that
# long before it can start) ends them with MPI_Abort, upon which srun ends
# the step within KillWait + 2 s (at most VQA_SRUN_WAIT s after the first
# rank's end, plus that, when ranks end without MPI_Abort), mpirun once its
# daemon on the lost node is gone. The script then asks
# every node of the allocation for a trivial step (srun --overlap -w NODE
# true, in parallel, VQA_RECOVER_PROBE_SECONDS each, default 30): the nodes
# that do not answer are lost. None lost: the failure was something else
# and the script ends as without recovery. Otherwise it starts vqa_train
# again on the survivors (--resume auto: the last complete checkpoint),
# with the same --global-batch: vqa_train turns the missing ranks into
# gradient accumulation, and the script lowers --batch-per-rank where the
# global batch would not divide (fewer nodes, same global batch); a global
# batch that no per-rank batch makes divide falls back to the requeue.
# --overlap: the lost step never completes on the lost node, so Slurm keeps
# its resources allocated; without it a new step waits for them. The job
# needs --no-kill (train_multinode.sbatch has it): without it Slurm ends
# the whole job when it marks the lost node DOWN. Below
# VQA_RECOVER_MIN_NODES survivors, or a global batch that cannot be kept,
# the script requeues the job as for a preemption (which waits in the queue
# again); after VQA_RECOVER_RESTARTS restarts in one start of the job it
# ends with the launcher's status. The batch shell runs on the first node:
# that node lost ends the job (Slurm's --requeue then applies).

# The exit status with which vqa_train reports "stopped on request after
# writing a checkpoint" (src/runtime/stop_request.h: kExitStopRequested).
readonly VQA_EXIT_STOP_REQUESTED=75

slurm_log() { echo "[vqa-slurm $(date +%H:%M:%S)] $*"; }

# slurm_choose_launcher: prints srun or mpirun.
slurm_choose_launcher() {
  local launcher=${VQA_LAUNCHER:-auto}
  case "$launcher" in
    srun | mpirun) echo "$launcher" ;;
    auto)
      if srun --mpi=list 2>&1 | grep -qw "${VQA_SRUN_MPI:-pmix}"; then
        echo srun
      else
        echo mpirun
      fi
      ;;
    *)
      echo "VQA_LAUNCHER=$launcher: expected auto, srun or mpirun" >&2
      return 2
      ;;
  esac
}

# slurm_launch_command LAUNCHER THREADS [RANKS]: fills the array
# launch_command with the launcher and its flags for one rank per task,
# THREADS cores each, RANKS ranks (default: the job's tasks).
slurm_launch_command() {
  local launcher=$1 threads=$2 ranks=${3:-$SLURM_NTASKS}
  if [[ $launcher == srun ]]; then
    # --cpus-per-task again: Slurm 22.05's srun no longer inherits it from
    # sbatch. No --gpu-bind: every rank must see all GPUs of its node, since
    # vqa_train takes GPU <local rank> itself. --kill-on-bad-exit: one rank
    # failing ends the step instead of leaving the others waiting.
    launch_command=(srun "--mpi=${VQA_SRUN_MPI:-pmix}" --kill-on-bad-exit=1
      "--ntasks=$ranks" "--cpus-per-task=$threads")
    # A lost node's tasks never report their end. vqa_train's watchdog ends
    # the others with MPI_Abort, which srun turns into the step's end within
    # KillWait + 2 s; ranks that end otherwise (exit, crash) would leave srun
    # waiting for the lost node's tasks until Slurm marks it DOWN
    # (SlurmdTimeout): --wait bounds that.
    ((${SLURM_JOB_NUM_NODES:-1} > 1)) && launch_command+=("--wait=${VQA_SRUN_WAIT:-30}")
  else
    # Open MPI reads the nodes and tasks per node from the allocation.
    # PE=threads binds each rank to its own cores, next to each other.
    launch_command=(mpirun -np "$ranks" --map-by "slot:PE=$threads" --bind-to core)
    # Ranks on other nodes get the environment of the srun that started
    # Open MPI's daemons; -x says explicitly what they must see.
    local variable
    for variable in OMP_NUM_THREADS $(compgen -e | grep '^NCCL_' || true); do
      launch_command+=(-x "$variable")
    done
    # TCP keepalive for mpirun's daemons: a lost node ends the job in about
    # 20 s instead of 8 minutes (the file says why).
    [[ -f jobs/mpirun-tune.conf ]] && launch_command+=(--tune "$PWD/jobs/mpirun-tune.conf")
    # Open MPI refuses root unless told; containers and CI run jobs as root.
    [[ $(id -u) -eq 0 ]] && launch_command+=(--allow-run-as-root)
  fi
  return 0
}

# slurm_run_forwarding_signals COMMAND...: runs COMMAND in the background,
# forwards SIGUSR1 and SIGTERM to it as SIGUSR1, waits until it has exited
# and sets launch_status to its exit status.
slurm_run_forwarding_signals() {
  local child signals_before
  slurm_signals_seen=0
  "$@" &
  child=$!
  # Each trap carries this child's pid, expanded as the trap is set: SC2064
  # warns that double quotes do that, and here it is meant.
  # shellcheck disable=SC2064
  trap "slurm_forward_stop USR1 $child" USR1
  # shellcheck disable=SC2064  # as above
  trap "slurm_forward_stop TERM $child" TERM
  while :; do
    signals_before=$slurm_signals_seen
    launch_status=0
    wait "$child" || launch_status=$?
    # `wait` also returns when a trapped signal arrives: wait again then.
    ((slurm_signals_seen != signals_before)) || break
  done
  trap - USR1 TERM
}

slurm_forward_stop() {
  local signal=$1 child=$2
  slurm_signals_seen=$((slurm_signals_seen + 1))
  slurm_log "SIG$signal received: asking the ranks to checkpoint and stop (SIGUSR1 to pid $child)"
  kill -USR1 "$child" 2>/dev/null || true
}

# slurm_check_time_limit: warns when the job's time limit leaves no time
# before the SIGUSR1 warning: Slurm sends it at the first time-limit sweep
# (every 30 s) once the job is within T seconds of its limit, so a job with
# --time=5 (minutes) and --signal=B:USR1@300 is told to stop as it starts,
# and would checkpoint and requeue after every step. T is read from the
# script's own #SBATCH --signal line; VQA_SIGNAL_SECONDS overrides it (for a
# --signal given on the sbatch command line, which the job cannot see).
slurm_check_time_limit() {
  local lead limit seconds=0 days=0 part
  lead=$(sed -n 's/^#SBATCH --signal=B:USR1@\([0-9]*\).*/\1/p' "$0" 2>/dev/null | head -n 1)
  lead=${VQA_SIGNAL_SECONDS:-${lead:-0}}
  limit=$(scontrol -o show job "$SLURM_JOB_ID" 2>/dev/null | grep -o 'TimeLimit=[0-9:-]*' || true)
  limit=${limit#TimeLimit=}
  [[ -n $limit && $lead -gt 0 ]] || return 0
  if [[ $limit == *-* ]]; then
    days=${limit%%-*}
    limit=${limit#*-}
  fi
  local parts
  IFS=: read -r -a parts <<<"$limit"
  for part in "${parts[@]}"; do
    seconds=$((seconds * 60 + 10#$part))
  done
  seconds=$((seconds + days * 86400))
  if ((seconds <= lead + 60)); then
    slurm_log "warning: time limit ${seconds} s, SIGUSR1 ${lead} s before it: the run will be" \
      "told to stop almost at once, and requeue after every few steps; submit with a longer" \
      "--time or a smaller --signal=B:USR1@<seconds>"
  fi
  return 0
}

# slurm_lost_nodes NODE...: prints the nodes among NODE... that do not run a
# trivial step (srun --overlap: the failed step may still hold their
# resources), one a line; asks them all at once.
slurm_lost_nodes() {
  local node probes=() pids=() i
  for node in "$@"; do
    timeout --kill-after=2 "${VQA_RECOVER_PROBE_SECONDS:-30}" srun --overlap --nodes=1 --ntasks=1 \
      --ntasks-per-node=1 --cpus-per-task=1 "--nodelist=$node" true >/dev/null 2>&1 &
    pids+=($!)
    probes+=("$node")
  done
  for i in "${!pids[@]}"; do
    wait "${pids[i]}" || echo "${probes[i]}"
  done
}

# slurm_resolved_value RUN_DIR KEY: KEY's value in the run's resolved
# configuration (RUN_DIR/config.ini, written by vqa_train's rank 0).
slurm_resolved_value() {
  sed -n "s/^$2 = //p" "$1/config.ini" 2>/dev/null | tail -n 1
}

# slurm_recovery_batch RUN_DIR RANKS: prints the per-rank batch that keeps
# the run's global batch on RANKS ranks: the largest that divides
# global / RANKS and is not above the run's; nothing when none does.
slurm_recovery_batch() {
  local global per_rank
  global=$(slurm_resolved_value "$1" global-batch)
  per_rank=$(slurm_resolved_value "$1" batch-per-rank)
  [[ $global =~ ^[0-9]+$ && $per_rank =~ ^[0-9]+$ ]] || return 0
  ((global % $2 == 0)) || return 0
  local b
  for ((b = per_rank; b >= 1; b--)); do
    ((global / $2 % b == 0)) && echo "$b" && return 0
  done
}

# slurm_requeue_job RUN_DIR CONFIG WHY: requeues this job (its next start
# resumes) while Slurm still has it RUNNING; returns 1 when it does not.
slurm_requeue_job() {
  local resume_hint="VQA_RUN_DIR=$1 sbatch ... $2"
  # While the job is still RUNNING (the time-limit warning, a signal sent on
  # purpose, a lost node) hand it back to the queue. A job that Slurm is
  # already ending (COMPLETING: scancel, the time limit itself, a
  # preemption, which requeues by itself if the site preempts with REQUEUE)
  # is left to end: Slurm would accept the requeue of a cancelled job and
  # start it again.
  local state
  state=$(scontrol -o show job "$SLURM_JOB_ID" 2>/dev/null | grep -o 'JobState=[A-Z_]*' || true)
  state=${state#JobState=}
  if [[ $state != RUNNING ]]; then
    slurm_log "$3; job $SLURM_JOB_ID is ${state:-in an unknown state}" \
      "(cancelled, out of time or preempted), so this script does not requeue it;" \
      "to continue: $resume_hint"
    return 1
  fi
  # Slurm ends this shell as part of the requeue: say it first.
  slurm_log "$3; requeueing job $SLURM_JOB_ID: its next start resumes from" \
    "$1/checkpoints/latest"
  scontrol requeue "$SLURM_JOB_ID" && return 0
  slurm_log "'scontrol requeue $SLURM_JOB_ID' failed; to continue: $resume_hint"
  return 1
}

# slurm_recover RUN_DIR CONFIG: after a failed launch, finds the lost nodes
# among `nodes` and either sets up the next launch on the survivors (nodes,
# launch_extra; returns 0) or ends the job: returns 1 to end with the
# launcher's status, 2 when it requeued the job.
slurm_recover() {
  local run_dir=$1 config=$2 lost=() survivors=() node
  ((recoveries < ${VQA_RECOVER_RESTARTS:-0})) || {
    ((${VQA_RECOVER_RESTARTS:-0} == 0)) ||
      slurm_log "no restart left inside the allocation ($recoveries of $VQA_RECOVER_RESTARTS used)"
    return 1
  }
  mapfile -t lost < <(slurm_lost_nodes "${nodes[@]}")
  if ((${#lost[@]} == 0)); then
    slurm_log "every node of the allocation answers: not a lost node, no restart"
    return 1
  fi
  for node in "${nodes[@]}"; do
    [[ " ${lost[*]} " == *" $node "* ]] || survivors+=("$node")
  done
  local minimum=${VQA_RECOVER_MIN_NODES:-$(((SLURM_JOB_NUM_NODES + 1) / 2))}
  local why="lost node(s) ${lost[*]} ($((SECONDS - launched)) s after the launch)"
  if ((${#survivors[@]} < minimum)); then
    slurm_requeue_job "$run_dir" "$config" \
      "$why: ${#survivors[@]} node(s) left, fewer than VQA_RECOVER_MIN_NODES=$minimum" && return 2
    return 1
  fi
  local ranks=$((${#survivors[@]} * tasks_per_node)) per_rank
  per_rank=$(slurm_recovery_batch "$run_dir" "$ranks")
  if [[ -z $per_rank ]]; then
    slurm_requeue_job "$run_dir" "$config" "$why: global batch" \
      "$(slurm_resolved_value "$run_dir" global-batch) does not divide over $ranks ranks" && return 2
    return 1
  fi
  recoveries=$((recoveries + 1))
  nodes=("${survivors[@]}")
  launch_extra=(--batch-per-rank "$per_rank")
  slurm_log "$why; restart $recoveries of ${VQA_RECOVER_RESTARTS} inside the allocation on" \
    "${#nodes[@]} node(s) [$(IFS=,; echo "${nodes[*]}")], $ranks rank(s), global batch" \
    "$(slurm_resolved_value "$run_dir" global-batch) = $ranks x $per_rank x accumulation," \
    "from the last complete checkpoint"
  return 0
}

# slurm_restart_command LAUNCHER: turns launch_command into a launch on
# `nodes` only, tasks_per_node ranks each (see the recovery notes above).
slurm_restart_command() {
  local list
  list=$(IFS=,; echo "${nodes[*]}")
  if [[ $1 == srun ]]; then
    launch_command+=(--overlap "--nodes=${#nodes[@]}" "--ntasks-per-node=$tasks_per_node"
      "--nodelist=$list")
  else
    # The survivors as hosts, and --overlap for the srun through which
    # mpirun starts its daemons.
    launch_command+=(-H "${list//,/:$tasks_per_node,}:$tasks_per_node"
      --mca plm_slurm_args --overlap)
  fi
}

# slurm_comm_timeout_args CONFIG ARGS...: fills `comm_timeout_args` with
# --comm-timeout $VQA_COMM_TIMEOUT when VQA_COMM_TIMEOUT is set and neither
# ARGS (vqa_train's options) nor CONFIG sets --comm-timeout: vqa_train
# refuses an option given twice, and its command line would override the
# config's.
slurm_comm_timeout_args() {
  local config=$1 arg
  shift
  comm_timeout_args=()
  [[ -n ${VQA_COMM_TIMEOUT:-} ]] || return 0
  for arg in "$@"; do
    [[ $arg == --comm-timeout || $arg == --comm-timeout=* ]] && return 0
  done
  grep -Eq '^[[:space:]]*comm-timeout[[:space:]]*=' "$config" && return 0
  comm_timeout_args=(--comm-timeout "$VQA_COMM_TIMEOUT")
}

# slurm_without_batch_option ARGS...: ARGS without --batch-per-rank and
# its value (vqa_train refuses an option given twice), into `user_args`.
slurm_without_batch_option() {
  user_args=()
  while (($#)); do
    case "$1" in
      --batch-per-rank) shift ;;
      --batch-per-rank=*) ;;
      *) user_args+=("$1") ;;
    esac
    shift || true
  done
}

slurm_train_job() {
  if (($# < 1)); then
    echo "usage: sbatch [sbatch options] jobs/slurm/<script>.sbatch CONFIG.ini [vqa_train options...]" >&2
    exit 2
  fi
  local config=$1
  shift
  local build=${VQA_BUILD:-build}
  local train=$build/vqa_train
  if [[ ! -f $config ]]; then
    echo "config file '$config' not found (relative to $PWD)" >&2
    exit 2
  fi
  if [[ ! -x $train ]]; then
    echo "$train not found or not executable: build it first (cmake --build $build --target vqa_train) or set VQA_BUILD" >&2
    exit 2
  fi
  if [[ -z ${SLURM_NTASKS:-} ]]; then
    echo "SLURM_NTASKS is unset: submit with --ntasks-per-node (one task per GPU), as the scripts' #SBATCH lines do" >&2
    exit 2
  fi
  local name
  name=$(basename "$config" .ini)
  local run_dir=${VQA_RUN_DIR:-runs/$name-$SLURM_JOB_ID}
  mkdir -p "$run_dir"

  local restarts=${SLURM_RESTART_COUNT:-0}
  slurm_log "job $SLURM_JOB_ID start $((restarts + 1)) (SLURM_RESTART_COUNT=$restarts)" \
    "on ${SLURM_JOB_NUM_NODES:-1} node(s) [${SLURM_JOB_NODELIST:-?}], $SLURM_NTASKS task(s), run directory $run_dir"

  slurm_check_time_limit

  local threads=${SLURM_CPUS_PER_TASK:-1}
  export OMP_NUM_THREADS=$threads
  # shellcheck source=jobs/slurm/nccl_env.sh
  source "${VQA_NCCL_ENV:-jobs/slurm/nccl_env.sh}"

  local launcher
  launcher=$(slurm_choose_launcher)
  local nodes=() tasks_per_node recoveries=0 launch_extra=() user_args=("$@") launched
  local comm_timeout_args
  slurm_comm_timeout_args "$config" "$@"
  mapfile -t nodes < <(scontrol show hostnames "${SLURM_JOB_NODELIST:-}" 2>/dev/null)
  tasks_per_node=$((SLURM_NTASKS / ${SLURM_JOB_NUM_NODES:-1}))
  while :; do
    local launch_command=()
    if ((recoveries == 0)); then
      slurm_launch_command "$launcher" "$threads"
    else
      slurm_launch_command "$launcher" "$threads" $((${#nodes[@]} * tasks_per_node))
      slurm_restart_command "$launcher"
    fi
    local command=("${launch_command[@]}" "$train" --config "$config" --out "$run_dir"
      --resume auto --threads "$threads" "${comm_timeout_args[@]}" "${user_args[@]}"
      "${launch_extra[@]}")
    slurm_log "launcher $launcher:$(printf ' %q' "${command[@]}")"

    launched=$SECONDS
    slurm_run_forwarding_signals "${command[@]}"
    slurm_log "$launcher exited with status $launch_status"
    ((launch_status != 0 && launch_status != VQA_EXIT_STOP_REQUESTED)) || break
    local recovered=0
    slurm_recover "$run_dir" "$config" || recovered=$?
    ((recovered == 2)) && return 0
    ((recovered == 0)) || break
    slurm_without_batch_option "${user_args[@]}"
  done

  if ((launch_status == VQA_EXIT_STOP_REQUESTED)); then
    # The ranks checkpointed and stopped on request.
    slurm_requeue_job "$run_dir" "$config" "checkpoint written" && return 0
  fi
  return "$launch_status"
}

# slurm_require_build_tool NAME: path of build tool NAME, or exits with a message.
slurm_require_build_tool() {
  local tool=${VQA_BUILD:-build}/$1
  if [[ ! -x $tool ]]; then
    echo "$tool not found or not executable: build it first or set VQA_BUILD" >&2
    exit 2
  fi
  echo "$tool"
}

# slurm_recipe_convert CONFIG DIR: the `vqa_prep convert` arguments the
# recipe CONFIG (jobs/configs/<recipe>.ini) needs, one per line: the words of
# its `# prep-convert:` comment lines, in order, with {dir} replaced by DIR
# (the dataset's folder), then `-o` and the recipe's train-data. Exits with
# a message when CONFIG has no such line.
slurm_recipe_convert() {
  local config=$1 dir=$2 line word found=0 words
  while IFS= read -r line; do
    [[ $line =~ ^#[[:space:]]*prep-convert:(.*)$ ]] || continue
    found=1
    read -r -a words <<<"${BASH_REMATCH[1]}"
    for word in "${words[@]}"; do
      printf '%s\n' "${word//\{dir\}/$dir}"
    done
  done <"$config"
  if ((!found)); then
    echo "$config has no '# prep-convert:' line: it names no dataset to convert" \
      "(recipes that do: $(grep -l '^# *prep-convert:' jobs/configs/*.ini | xargs -n1 basename |
        sed 's/\.ini$//' | tr '\n' ' '))" >&2
    exit 2
  fi
  printf '%s\n' -o "$(sed -n 's/^train-data *= *//p' "$config" | tail -n 1)"
}
