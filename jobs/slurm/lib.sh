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

# slurm_launch_command LAUNCHER THREADS: fills the array launch_command with
# the launcher and its flags for one rank per task, THREADS cores each.
slurm_launch_command() {
  local launcher=$1 threads=$2
  if [[ $launcher == srun ]]; then
    # --cpus-per-task again: Slurm 22.05's srun no longer inherits it from
    # sbatch. No --gpu-bind: every rank must see all GPUs of its node, since
    # vqa_train takes GPU <local rank> itself. --kill-on-bad-exit: one rank
    # failing ends the step instead of leaving the others waiting.
    launch_command=(srun "--mpi=${VQA_SRUN_MPI:-pmix}" --kill-on-bad-exit=1
      "--ntasks=$SLURM_NTASKS" "--cpus-per-task=$threads")
  else
    # Open MPI reads the nodes and tasks per node from the allocation.
    # PE=threads binds each rank to its own cores, next to each other.
    launch_command=(mpirun -np "$SLURM_NTASKS" --map-by "slot:PE=$threads" --bind-to core)
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
  local launch_command=()
  slurm_launch_command "$launcher" "$threads"
  local command=("${launch_command[@]}" "$train" --config "$config" --out "$run_dir"
    --resume auto --threads "$threads" "$@")
  slurm_log "launcher $launcher:$(printf ' %q' "${command[@]}")"

  slurm_run_forwarding_signals "${command[@]}"
  slurm_log "$launcher exited with status $launch_status"

  if ((launch_status == VQA_EXIT_STOP_REQUESTED)); then
    local resume_hint="VQA_RUN_DIR=$run_dir sbatch ... $config"
    # The ranks checkpointed and stopped on request. While the job is still
    # RUNNING (the time-limit warning, a signal sent on purpose) hand it back
    # to the queue. A job that Slurm is already ending (COMPLETING: scancel,
    # the time limit itself, a preemption, which requeues by itself if the
    # site preempts with REQUEUE) is left to end: Slurm would accept the
    # requeue of a cancelled job and start it again.
    local state
    state=$(scontrol -o show job "$SLURM_JOB_ID" 2>/dev/null | grep -o 'JobState=[A-Z_]*' || true)
    state=${state#JobState=}
    if [[ $state != RUNNING ]]; then
      slurm_log "checkpoint written; job $SLURM_JOB_ID is ${state:-in an unknown state}" \
        "(cancelled, out of time or preempted), so this script does not requeue it;" \
        "to continue: $resume_hint"
      return "$launch_status"
    fi
    # Slurm ends this shell as part of the requeue: say it first.
    slurm_log "checkpoint written; requeueing job $SLURM_JOB_ID: its next start resumes from" \
      "$run_dir/checkpoints/latest"
    if scontrol requeue "$SLURM_JOB_ID"; then
      return 0
    fi
    slurm_log "'scontrol requeue $SLURM_JOB_ID' failed; to continue: $resume_hint"
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
