#!/usr/bin/env bash
# Recovery inside the allocation: jobs/slurm/train_multinode.sbatch with
# --nodes=3 (one CPU rank per emulated host, slurm_multinode_cluster.sh),
# launcher srun --mpi=pmix (or mpirun: the first argument after the
# directories), global batch 24 (3 ranks x 4 x 2 accumulation steps).
# Mid-epoch 1, after epoch 0's checkpoint, every process on host 2 is
# killed. The survivors' watchdog (--comm-timeout 10) ends them, the
# launcher ends, the script finds host 2 lost (it alone does not run a
# probe step), logs the restart naming it, and starts vqa_train again on
# hosts 0 and 1 in the same job (same job id, no requeue: Restarts 0),
# resumed from epoch 0's checkpoint with the same global batch
# (2 ranks x 4 x 3 accumulation steps). Checked: the restart line names
# host 2 and 2 ranks; the resumed run places its ranks on hosts 0 and 1;
# the batch script ends 0; once host 2 is back the job is COMPLETED with
# no restart; the time from the loss to the first step after it is printed;
# the final metrics equal an uninterrupted 2-rank run with the same global
# batch (jobs/launch_local.sh, 2 ranks x 4 x 3) within 1e-5 relative for the
# losses and the accuracies (epoch 0 ran on 3 ranks: the same samples, the
# gradient sums in another order). About 2 minutes.
#
#   tests/slurm/test_multinode_recovery.sh SOURCE_DIR BUILD_DIR [srun|mpirun]
#
# Needs root and network namespaces; exits 77 (CTest: skipped) otherwise.
set -euo pipefail
source_dir=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
launcher=${3:-srun}
# shellcheck source=tests/slurm/slurm_multinode_cluster.sh
source "$source_dir/tests/slurm/slurm_multinode_cluster.sh"

slurm_multinode_test_begin recovery
slurm_multinode_test_cluster mr 3

# 192 questions, global batch 24: 8 optimiser steps per epoch; each step
# waits 100 ms for data (a test-only delay that changes no number) so that
# the kill lands mid-epoch.
"$build/vqa_prep" synth -o "$work/synth.h5" --train-questions 192 --test-questions 48 \
  --seed 11 >/dev/null
cd "$source_dir"
config=jobs/configs/quickstart.ini
train_args=(--train-data "$work/synth.h5" --epochs 3 --progress off --log-every-steps 1
  --global-batch 24 --batch-per-rank 4 --test-data-delay-ms 100 --save-every 1 --comm-timeout 10)

stage "uninterrupted reference: 2 ranks x 4 x 3 accumulation steps (jobs/launch_local.sh)"
jobs/launch_local.sh --ranks 2 --threads 1 "$build/vqa_train" --config "$config" "${train_args[@]}" \
  --out "$work/reference" >"$work/reference.log" 2>&1 ||
  { tail -n 30 "$work/reference.log"; fail "the reference run failed"; }

wait_for_line() { # FILE PATTERN TIMEOUT
  local start=$SECONDS
  until grep -q "$2" "$1" 2>/dev/null; do
    ((SECONDS - start < $3)) || { cat "$1"; fail "no '$2' in $1 within $3 s"; }
    sleep 0.1
  done
}

stage "train_multinode.sbatch --nodes=3, launcher $launcher; host 2 killed mid-epoch 1"
run_dir=$work/run
job=$(sbatch --parsable --output="$work/job-%j.out" --nodes=3 --ntasks-per-node=1 \
  --cpus-per-task=1 --gpus-per-node=0 --time=30 \
  --export="ALL,VQA_LAUNCHER=$launcher,VQA_SRUN_MPI=pmix,VQA_BUILD=$build,VQA_RUN_DIR=$run_dir,VQA_SRUN_WAIT=5,VQA_RECOVER_PROBE_SECONDS=8" \
  jobs/slurm/train_multinode.sbatch "$config" "${train_args[@]}")
output=$work/job-$job.out
wait_for_line "$output" "epoch 1 step 2/" 120
[[ -f $run_dir/checkpoints/latest ]] || fail "no checkpoint after epoch 0"
grep -q "gradient accumulation steps = 2" "$output" || fail "the first start did not accumulate 2 steps"
slurm_multinode_kill_host 2
killed=$SECONDS
killed_ns=$(date +%s%N)
echo "host 2 ($name-h2) killed"

wait_for_line "$output" "restart 1 of 2 inside the allocation" 120
restart_line=$(grep -m 1 "restart 1 of 2 inside the allocation" "$output")
echo "$restart_line"
[[ $restart_line == *"lost node(s) $name-h2 "* ]] || fail "the restart line does not name $name-h2 alone"
[[ $restart_line == *"2 rank(s), global batch 24 = 2 x 4 x accumulation"* ]] ||
  fail "the restart line does not keep global batch 24 on 2 ranks"
lines_before=$(grep -n -m 1 "restart 1 of 2 inside the allocation" "$output" | cut -d: -f1)
# The first optimiser step after the loss: the first step line of the restart.
start=$SECONDS
until tail -n "+$lines_before" "$output" | grep -q "epoch [0-9]* step [0-9]*/"; do
  ((SECONDS - start < 120)) || { cat "$output"; fail "no step after the restart within 120 s"; }
  sleep 0.05
done
first_step_s=$((($(date +%s%N) - killed_ns) / 1000000))
echo "loss to the first step after it: $((first_step_s / 1000)).$(printf %03d $((first_step_s % 1000))) s"

wait_for_line "$output" "$launcher exited with status 0" 180
cat "$output"
grep -q "resumed from .*epoch-0000.pt" "$output" || fail "the restart did not resume from epoch 0's checkpoint"
grep -q "gradient accumulation steps = 3" "$output" || fail "the restart did not accumulate 3 steps"
grep -q "ranks by host: $name-h0 0; $name-h1 1$" "$run_dir/train.log" ||
  fail "the restart did not run on hosts 0 and 1"
[[ -f $run_dir/DONE ]] || fail "no DONE marker"
echo "job $job: $(slurm_job_field "$job" JobState), restarts $(slurm_job_field "$job" Restarts)"

stage "host 2 back: the job ends COMPLETED, never requeued"
slurm_multinode_start_slurmd 2
state=$(slurm_wait_job "$job" 'COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|PENDING' 90) ||
  fail "job $job did not end once host 2 was back"
[[ $state == COMPLETED && $(slurm_job_field "$job" Restarts) == 0 ]] ||
  fail "job $job: $state, restarts $(slurm_job_field "$job" Restarts); expected COMPLETED, 0"
python3 "$source_dir/tests/slurm/compare_metrics.py" --keys train_loss,test_loss,overall,open,closed \
  --tolerance 1e-5 "$work/reference/metrics.jsonl" "$run_dir/metrics.jsonl" ||
  fail "the recovered run differs from the uninterrupted 2-rank run"

stage "PASS: host 2 lost $((SECONDS - killed)) s ago; the job went on on 2 hosts in its" \
  "allocation (launcher $launcher), first step $((first_step_s / 1000)) s after the loss," \
  "and ended COMPLETED with the uninterrupted run's metrics"
