#!/usr/bin/env bash
# Submits the synthetic quickstart through the project's own batch script
# (jobs/slurm/train_1node.sbatch) to a real single-node Slurm started by this
# test, with the launcher the script picks (srun --mpi=pmix here). Checks
# that the job completes with exit code 0, wrote one metrics.jsonl record per
# epoch and the DONE marker, and that a job submitted again into the
# completed run directory does not train again, and that a cancelled job is
# not requeued by its script. (Both launchers, preemption
# and the numbers against a run without Slurm: test_preemption.sh.)
#
#   tests/slurm/test_submit.sh SOURCE_DIR BUILD_DIR
#
# Needs root (slurmd runs the jobs as the submitting user, and SlurmUser is
# root here); exits 77 (CTest: skipped) otherwise.
set -euo pipefail
source_dir=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
# shellcheck source=tests/slurm/slurm_cluster.sh
source "$source_dir/tests/slurm/slurm_cluster.sh"

slurm_test_begin submit

slurm_cluster_start "$work/slurm"
"$build/vqa_prep" synth -o "$work/synth.h5" --train-questions 256 --test-questions 64 \
  --seed 5 >/dev/null

# Submitted as a user would, from the repository root; only the node shape
# (2 CPU tasks, no GPUs), the time limit and the paths differ. The limit must
# stay well above the script's SIGUSR1 warning (300 s before it): with
# --time=5 (minutes) Slurm sends the warning at its first time-limit sweep.
cd "$source_dir"
epochs=2
# submit RUN_DIR [vqa_train options...]: prints the job id. The launcher is left to the script
# (auto, the default): it takes srun --mpi=pmix when `srun --mpi=list` offers
# PMIx, as Debian's Slurm does.
submit() {
  sbatch --parsable --output="$work/job-%j.out" --ntasks-per-node=2 --cpus-per-task=1 \
    --gpus-per-node=0 --time=30 \
    --export="ALL,VQA_LAUNCHER=auto,VQA_BUILD=$build,VQA_RUN_DIR=$1" \
    jobs/slurm/train_1node.sbatch jobs/configs/quickstart.ini \
    --train-data "$work/synth.h5" --epochs "$epochs" --progress off "${@:2}"
}

run_dir=$work/run
first_job=$(submit "$run_dir")
echo "submitted job $first_job"
state=$(slurm_wait_job "$first_job" 'COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY' 120) ||
  fail "job $first_job did not finish"
exit_code=$(slurm_job_field "$first_job" ExitCode)
echo "job $first_job: $state, exit code $exit_code, restarts $(slurm_job_field "$first_job" Restarts)"
echo "---- job $first_job output"
cat "$work/job-$first_job.out"
[[ $state == COMPLETED && $exit_code == 0:0 ]] ||
  fail "job $first_job ended $state with exit code $exit_code"
grep -q "launcher srun: srun --mpi=pmix " "$work/job-$first_job.out" ||
  fail "job $first_job did not choose srun --mpi=pmix"
metrics=$run_dir/metrics.jsonl
[[ -f $metrics ]] || fail "no $metrics"
lines=$(grep -c . "$metrics")
((lines == epochs)) || fail "$metrics has $lines lines, expected $epochs"
python3 - "$metrics" "$epochs" <<'PY' || fail "$metrics is not one complete record per epoch"
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
assert [r["epoch"] for r in records] == list(range(int(sys.argv[2]))), records
for r in records:
    assert 0.0 <= r["overall"] <= 1.0 and r["train_loss"] > 0 and r["samples"] > 0, r
print(f"metrics.jsonl: {len(records)} epochs, overall accuracy {records[-1]['overall']:.4f}")
PY
[[ -f $run_dir/DONE ]] || fail "no DONE marker in $run_dir"

# A completed run directory is not trained again.
before=$(md5sum "$metrics")
job=$(submit "$run_dir")
state=$(slurm_wait_job "$job" 'COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY' 60) ||
  fail "job $job did not finish"
echo "job $job into the completed run directory: $state"
cat "$work/job-$job.out"
[[ $state == COMPLETED ]] || fail "job $job ended $state"
grep -q "nothing to do" "$work/job-$job.out" || fail "job $job did not report the run complete"
[[ $(md5sum "$metrics") == "$before" ]] || fail "job $job changed the metrics"

# A job that is cancelled (scancel: SIGTERM to the job) stops, but its
# script must not requeue it (Slurm would accept that and start it again).
cancelled_job=$(submit "$work/run-cancelled" --log-every-steps 1)
output=$work/job-$cancelled_job.out
start=$SECONDS
until grep -q "epoch 0 step 1/" "$output" 2>/dev/null; do
  ((SECONDS - start < 90)) || fail "job $cancelled_job logged no optimiser step within 90 s"
  sleep 0.1
done
scancel "$cancelled_job"
until grep -q "srun exited with status" "$output"; do
  ((SECONDS - start < 120)) || fail "the batch script of job $cancelled_job did not finish"
  sleep 0.2
done
sleep 2 # a requeue, had there been one, shows by now
cat "$output"
state=$(slurm_job_field "$cancelled_job" JobState)
restarts=$(slurm_job_field "$cancelled_job" Restarts)
echo "job $cancelled_job after scancel: $state, restarts $restarts"
[[ $state == CANCELLED && $restarts == 0 ]] ||
  fail "the cancelled job $cancelled_job is $state with $restarts restarts"

echo "PASS: job $first_job completed the quickstart through the batch script;" \
  "job $job left the completed run alone; job $cancelled_job stayed cancelled"
