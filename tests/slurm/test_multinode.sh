#!/usr/bin/env bash
# The multi-node batch script on a real multi-node Slurm: two emulated hosts
# (network namespaces on a 1 Gbit/s tc-shaped link), one slurmd on each
# (slurm_multinode_cluster.sh), and jobs/slurm/train_multinode.sbatch
# submitted unchanged with --nodes=2, one CPU rank per node, the test's site
# settings on the sbatch command line as the other Slurm tests give them.
# For each launcher that jobs/slurm/lib.sh offers:
#   - srun --mpi=pmix and mpirun inside the allocation: the job completes
#     (exit 0, DONE) with the script's collective deadline (--comm-timeout
#     120), train.log and the job output place rank 0 and rank 1 on
#     the two different hosts, the gradients crossed the shaped link (the
#     bytes each host's shaper sent during the job), and the metrics equal a
#     single-host run with the same global batch (1 rank accumulating the
#     two micro-batches of 16, started with jobs/launch_local.sh): train and
#     test loss within 1e-5 relative; the two launchers' runs equal each
#     other exactly (every non-timing field);
#   - srun --mpi=pmi2: refused, the job FAILED with no DONE marker. Open MPI
#     4 (Debian's speaks PMIx only) fails in MPI_Init, after vqa_train's
#     note naming srun --mpi=pmix (Open MPI's own message that it was not
#     built with Slurm's PMI support may be cut off); Open MPI 5 finds no PMIx
#     server and starts each task as a singleton, which vqa_train refuses
#     at start-up ("the ranks did not find each other", naming
#     srun --mpi=pmix) instead of training once per task as rank 0;
# then that after the cluster is stopped no Slurm or munge daemon, network
# namespace or veth link of it is left, and that a second cluster whose
# owner is killed with SIGKILL is gone as well within 15 s.
#
#   tests/slurm/test_multinode.sh SOURCE_DIR BUILD_DIR
#
# Needs root and network namespaces; exits 77 (CTest: skipped) otherwise.
set -euo pipefail
source_dir=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
# shellcheck source=tests/slurm/slurm_multinode_cluster.sh
source "$source_dir/tests/slurm/slurm_multinode_cluster.sh"

slurm_multinode_test_begin multinode
slurm_multinode_test_cluster mn 2
sinfo -N -o '%N %T %c %o'

# 256 questions, global batch 32: 8 optimiser steps per epoch, 2 epochs.
"$build/vqa_prep" synth -o "$work/synth.h5" --train-questions 256 --test-questions 64 \
  --seed 11 >/dev/null
cd "$source_dir"
config=jobs/configs/quickstart.ini
train_args=(--train-data "$work/synth.h5" --epochs 2 --progress off)

stage "single-host reference: 1 rank, global batch 32 as 2 micro-batches of 16 (jobs/launch_local.sh)"
jobs/launch_local.sh --ranks 1 --threads 1 "$build/vqa_train" --config "$config" "${train_args[@]}" \
  --out "$work/reference" >"$work/reference.log" 2>&1 ||
  { tail -n 30 "$work/reference.log"; fail "the single-host reference run failed"; }

# shaper_bytes HOST: bytes host HOST's link has sent (its tbf qdisc).
shaper_bytes() {
  tc -s -n "$name-h$1" qdisc show dev vqa0 | awk '/^ Sent/ {print $2; exit}'
}

# submit LAUNCHER SRUN_MPI RUN_DIR: prints the job id.
submit() {
  sbatch --parsable --output="$work/job-%j.out" --nodes=2 --ntasks-per-node=1 \
    --cpus-per-task=1 --gpus-per-node=0 --time=30 \
    --export="ALL,VQA_LAUNCHER=$1,VQA_SRUN_MPI=$2,VQA_BUILD=$build,VQA_RUN_DIR=$3" \
    jobs/slurm/train_multinode.sbatch "$config" "${train_args[@]}"
}

# run_job LAUNCHER SRUN_MPI RUN_DIR: submits, waits, prints the job's output;
# sets job, state, exit_code, output, sent (bytes per host, "h0 h1").
run_job() {
  local before0 before1 begin=$SECONDS
  before0=$(shaper_bytes 0)
  before1=$(shaper_bytes 1)
  job=$(submit "$@")
  output=$work/job-$job.out
  state=$(slurm_wait_job "$job" 'COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY' 150) ||
    fail "job $job ($1) did not finish within 150 s"
  exit_code=$(slurm_job_field "$job" ExitCode)
  sent="$(($(shaper_bytes 0) - before0)) $(($(shaper_bytes 1) - before1))"
  echo "job $job ($1${2:+ --mpi=$2}): $state, exit code $exit_code, nodes" \
    "$(slurm_job_field "$job" NodeList), $((SECONDS - begin)) s; bytes sent by h0, h1: $sent"
  echo "---- job $job output"
  cat "$output"
}

# check_trained LAUNCHER RUN_DIR: the checks every working launcher passes.
check_trained() {
  local launcher=$1 run_dir=$2
  [[ $state == COMPLETED && $exit_code == 0:0 ]] ||
    fail "job $job ($launcher) ended $state with exit code $exit_code"
  grep -q "launcher $launcher: $launcher " "$output" || fail "job $job did not launch with $launcher"
  [[ -f $run_dir/DONE ]] || fail "no DONE marker in $run_dir"
  # The batch script's collective deadline (VQA_COMM_TIMEOUT), as vqa_train resolved it.
  [[ $(sed -n 's/^comm-timeout = //p' "$run_dir/config.ini") == 120 ]] ||
    fail "job $job: $run_dir/config.ini has no comm-timeout = 120"
  # Where each rank ran, as vqa_train's train.log names it (each rank's own
  # host name, here the emulated host's).
  local rank_hosts
  rank_hosts=$(sed -n 's/^ranks by host: //p' "$run_dir/train.log" | head -n 1)
  echo "ranks by host (train.log): $rank_hosts"
  [[ $rank_hosts == "$name-h0 0; $name-h1 1" ]] ||
    fail "job $job: expected rank 0 on $name-h0 and rank 1 on $name-h1, got: '$rank_hosts'"
  # The gradients crossed the shaped link: the bus bandwidth the run
  # measured for its allreduces is the link's (1 Gbit/s = 0.125 GB/s each
  # way, a little more while tc's burst lasts), not shared memory's (GB/s);
  # and each host's shaper sent at least a copy of the gradients per step
  # (a 2-rank ring sends (n-1)/n x 2 = 1 copy per step each way; the
  # start-up probes send more).
  python3 - "$run_dir/metrics.jsonl" <<'PY' || fail "job $job: the allreduces did not run at the link's speed"
import json, sys
for record in map(json.loads, open(sys.argv[1])):
    bus = record["bus_gbps"]
    print(f"epoch {record['epoch']}: allreduce bus bandwidth {bus:.3f} GB/s")
    assert 0 < bus < 0.3, bus
PY
  local bytes_per_step steps=16 bytes
  bytes_per_step=$(sed -n 's/^gradients: .*, \([0-9][0-9]*\) bytes per step.*/\1/p' "$run_dir/train.log" | head -n 1)
  [[ -n $bytes_per_step ]] || fail "job $job: train.log has no 'gradients: ... bytes per step' line"
  for bytes in $sent; do
    ((bytes >= bytes_per_step * steps)) || fail "a host sent $bytes bytes over its link during job" \
      "$job, less than $steps steps' gradients ($steps x $bytes_per_step)"
  done
  python3 "$source_dir/tests/slurm/compare_metrics.py" --keys train_loss,test_loss --tolerance 1e-5 \
    "$work/reference/metrics.jsonl" "$run_dir/metrics.jsonl" ||
    fail "job $job ($launcher): losses differ from the single-host run by more than 1e-5"
}

stage "train_multinode.sbatch --nodes=2, launcher srun --mpi=pmix"
run_job srun pmix "$work/run-srun"
check_trained srun "$work/run-srun"

stage "train_multinode.sbatch --nodes=2, launcher mpirun (its daemons started through Slurm)"
run_job mpirun "" "$work/run-mpirun"
check_trained mpirun "$work/run-mpirun"
stage "srun vs mpirun: the same arithmetic across the same two hosts"
python3 "$source_dir/tests/slurm/compare_metrics.py" "$work/run-srun/metrics.jsonl" \
  "$work/run-mpirun/metrics.jsonl" || fail "the srun and mpirun runs differ"

stage "train_multinode.sbatch --nodes=2, launcher srun --mpi=pmi2 (expected: refused)"
run_job srun pmi2 "$work/run-pmi2"
[[ $state == FAILED ]] || fail "job $job (srun --mpi=pmi2) ended $state; expected FAILED"
ompi_major=0
[[ $(mpirun --version 2>/dev/null) =~ Open\ MPI\)\ ([0-9]+)\. ]] && ompi_major=${BASH_REMATCH[1]}
if ((ompi_major >= 5)); then
  refusal="the ranks did not find each other"
  grep -q "$refusal" "$output" ||
    fail "job $job (srun --mpi=pmi2, Open MPI $ompi_major) failed without vqa_train's message" \
      "that the ranks did not find each other"
  grep -q "srun --mpi=pmix" "$output" || fail "job $job: the refusal does not name srun --mpi=pmix"
  # Each task refuses; --kill-on-bad-exit may end the second before it says so.
  echo "tasks that printed the refusal: $(grep -c "$refusal" "$output" || true)"
else
  # Open MPI's own explanation may not reach srun's output before the step
  # is ended (its PMIx client's "OPAL ERROR: Unreachable" line alone does);
  # vqa_train says it before MPI_Init.
  refusal="OMPI was not built with SLURM's PMI support"
  grep -q "$refusal" "$output" || refusal="srun started this task with --mpi=pmi2"
  grep -q "$refusal" "$output" ||
    fail "job $job (srun --mpi=pmi2) failed without a message naming the missing PMI support"
  grep -q "srun --mpi=pmix" "$output" || fail "job $job: the refusal does not name srun --mpi=pmix"
fi
echo "srun --mpi=pmi2 refused (Open MPI $ompi_major): $(grep -m 1 "$refusal" "$output" | cut -c 1-200)"
[[ ! -f $work/run-pmi2/DONE ]] || fail "the pmi2 job wrote a DONE marker"

stage "stop: no daemon, namespace or link left"
slurm_multinode_stop
leftovers=""
for _ in $(seq 50); do
  leftovers=$(slurm_multinode_leftovers)
  [[ -z $leftovers ]] && break
  sleep 0.2
done
[[ -z $leftovers ]] || fail "after the stop: $leftovers"
echo "nothing of cluster $name is left"

stage "a cluster whose owner is killed with SIGKILL goes too"
killed=${name}k
# shellcheck disable=SC2016  # the inner shell expands its own arguments
bash -c 'source "$1"; slurm_multinode_start "$2" "$3" 2 >"$2.log" 2>&1 && echo up >"$2.up"
                exec sleep 600' owner "$source_dir/tests/slurm/slurm_multinode_cluster.sh" \
  "$work/killed" "$killed" </dev/null >/dev/null 2>&1 &
owner=$!
for _ in $(seq 300); do
  [[ -f $work/killed.up ]] && break
  kill -0 "$owner" 2>/dev/null || break
  sleep 0.1
done
[[ -f $work/killed.up ]] || { cat "$work/killed.log" >&2; fail "the second cluster did not come up"; }
# The owner's shell is the parent of the daemons (the parent-death signal)
# and the owner of the hosts (their watcher); `exec sleep` keeps its pid.
kill -KILL "$owner"
wait "$owner" 2>/dev/null || true
killed_at=$SECONDS
slurm_multinode_name=$killed
for _ in $(seq 75); do
  leftovers=$(slurm_multinode_leftovers)
  [[ -z $leftovers ]] && break
  sleep 0.2
done
[[ -z $leftovers ]] || fail "15 s after its owner was killed: $leftovers"
echo "cluster $killed gone $((SECONDS - killed_at)) s after SIGKILL to its owner"
slurm_multinode_name=""

stage "PASS: train_multinode.sbatch across 2 hosts with srun --mpi=pmix and mpirun," \
  "equal to the single-host run; pmi2 refused; nothing left behind"
