#!/usr/bin/env bash
# Preemption under a real single-node Slurm: submits the synthetic quickstart
# through jobs/slurm/train_1node.sbatch, signals the batch shell with SIGUSR1
# mid-run (what `#SBATCH --signal=B:USR1@T` does before the time limit), and
# checks that the job
#   - stopped at a step boundary with a checkpoint (the "stopped by SIGUSR1"
#     line, checkpoints/latest naming a file that exists),
#   - was requeued by its script (Restarts=1, "requeued" in its output),
#   - started again with SLURM_RESTART_COUNT=1, resumed from the checkpoint,
#     completed (DONE marker), and
#   - ended with the same metrics.jsonl as an uninterrupted run of the same
#     configuration started with jobs/launch_local.sh: every non-timing field
#     of every epoch equal (tolerance 0).
#
#   tests/slurm/test_preemption.sh SOURCE_DIR BUILD_DIR [mpirun|srun]
#
# Needs root (see test_submit.sh); exits 77 (CTest: skipped) otherwise.
set -euo pipefail
source_dir=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
launcher=${3:-mpirun}
# shellcheck source=tests/slurm/slurm_cluster.sh
source "$source_dir/tests/slurm/slurm_cluster.sh"

slurm_test_begin preempt

slurm_cluster_start "$work/slurm"
# 8 optimiser steps per epoch (512 questions, global batch 64), 2 epochs.
"$build/vqa_prep" synth -o "$work/synth.h5" --train-questions 512 --test-questions 64 \
  --seed 9 >/dev/null
cd "$source_dir"
# Each step waits 150 ms for data (a test-only delay that changes no number):
# the tiny preset's steps alone take about 25 ms, and the signal, which
# reaches the ranks a few hundred ms after it is sent, must land inside epoch 0.
train_args=(--config jobs/configs/quickstart.ini --train-data "$work/synth.h5" --epochs 2
  --progress off --log-every-steps 1 --test-data-delay-ms 150)

echo "---- uninterrupted reference run (jobs/launch_local.sh, 2 ranks)"
jobs/launch_local.sh --ranks 2 --threads 1 "$build/vqa_train" "${train_args[@]}" \
  --out "$work/reference" >"$work/reference.log" 2>&1 ||
  { cat "$work/reference.log"; fail "the reference run failed"; }
grep '^launch_local.sh\|^+ mpirun' "$work/reference.log"

echo "---- the same run as a Slurm job (launcher $launcher), signalled mid-run"
# --time=30: far from the script's own warning (300 s before the limit).
run_dir=$work/run
job=$(sbatch --parsable --output="$work/job-%j.out" --ntasks-per-node=2 --cpus-per-task=1 \
  --gpus-per-node=0 --time=30 \
  --export="ALL,VQA_LAUNCHER=$launcher,VQA_BUILD=$build,VQA_RUN_DIR=$run_dir" \
  jobs/slurm/train_1node.sbatch "${train_args[@]:1}")
output=$work/job-$job.out
echo "submitted job $job"

# Signal once the first optimiser step is logged: the stop then falls inside
# the first epoch, so the resume starts mid-epoch and a whole epoch follows.
start=$SECONDS
until grep -q "epoch 0 step 1/" "$output" 2>/dev/null; do
  ((SECONDS - start < 90)) || fail "job $job logged no optimiser step within 90 s"
  [[ $(slurm_job_field "$job" JobState) =~ ^(PENDING|RUNNING|CONFIGURING)$ ]] ||
    fail "job $job ended before it could be signalled"
  sleep 0.1
done
scancel --batch --signal=USR1 "$job"
signalled=$SECONDS
echo "job $job: SIGUSR1 sent to the batch shell after $((signalled - start)) s"

# The script requeues the job once the ranks have checkpointed: Restarts goes
# to 1 and the job waits in the queue.
until [[ $(slurm_job_field "$job" Restarts) == 1 ]]; do
  ((SECONDS - signalled < 60)) || fail "job $job was not requeued within 60 s"
  sleep 0.2
done
requeued=$SECONDS
echo "job $job requeued $((SECONDS - signalled)) s after the signal:" \
  "$(slurm_job_field "$job" JobState) ($(slurm_job_field "$job" Reason))"
grep -q "stopped by SIGUSR1" "$run_dir/train.log" "$output" ||
  fail "no 'stopped by SIGUSR1' line from vqa_train"
[[ -f $run_dir/checkpoints/latest ]] || fail "no checkpoints/latest after the stop"
checkpoint=$(cat "$run_dir/checkpoints/latest")
[[ -f $checkpoint || -f $run_dir/checkpoints/$checkpoint ]] ||
  fail "checkpoints/latest names '$checkpoint', which does not exist"
echo "checkpoint after the stop: $checkpoint"
epochs_before=$(grep -c . "$run_dir/metrics.jsonl" 2>/dev/null || true)
((${epochs_before:-0} == 0)) || fail "the job had finished an epoch before it stopped"

slurm_start_requeued "$job" "$requeued" || fail "could not start the requeued job $job"
state=$(slurm_wait_job "$job" 'COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY' 150) ||
  fail "the requeued job $job did not finish"
restarts=$(slurm_job_field "$job" Restarts)
echo "job $job: $state, exit code $(slurm_job_field "$job" ExitCode), restarts $restarts," \
  "$((SECONDS - signalled)) s after the signal"
echo "---- job $job output (both starts)"
cat "$output"
[[ $state == COMPLETED ]] || fail "job $job ended $state"
((restarts == 1)) || fail "job $job restarted $restarts times, expected 1"
grep -q "requeueing job $job" "$output" || fail "the job script did not report the requeue"
grep -q "SLURM_RESTART_COUNT=1" "$output" || fail "the second start did not see SLURM_RESTART_COUNT=1"
grep -q "resumed from .* at epoch 0 (after" "$output" ||
  fail "vqa_train did not report resuming inside epoch 0 from the checkpoint"
[[ -f $run_dir/DONE ]] || fail "no DONE marker after the resumed run"

echo "---- final metrics: resumed job vs uninterrupted run"
python3 "$source_dir/tests/slurm/compare_metrics.py" "$work/reference/metrics.jsonl" \
  "$run_dir/metrics.jsonl" || fail "the resumed run differs from the uninterrupted one"
echo "PASS: job $job (launcher $launcher) stopped inside epoch 0, was requeued $restarts" \
  "time(s), resumed and matched the uninterrupted run"
