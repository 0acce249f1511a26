#!/usr/bin/env bash
# vqa_train refuses to start when srun started several tasks but MPI made
# each a world of its own (Open MPI 5 under srun --mpi=pmi2 starts
# "singletons" that would each train alone as rank 0): a process with
# SLURM_STEP_NUM_TASKS=2 in its environment, started without mpirun, must
# exit non-zero with the message that the ranks did not find each other and
# naming srun --mpi=pmix. The same environment under mpirun -np 1
# (OMPI_COMM_WORLD_SIZE set), and a 1-task step, start as usual.
#
#   tests/runtime/test_lone_slurm_task.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
# shellcheck source=tests/support/script_test.sh
source "$(dirname "$0")/../support/script_test.sh"
script_test_begin lone-slurm-task "$1" "$2"
train=$build_dir/vqa_train
cd "$work"
# `--help` exits 0 once MPI is up, so each case is only the start-up.
unset OMPI_COMM_WORLD_SIZE

status=0
SLURM_STEP_NUM_TASKS=2 "$train" --help >help.out 2>lone.err || status=$?
if ((status == 0)); then
  fail "2 srun tasks, MPI world of 1: vqa_train exited 0; expected a refusal"
fi
grep -q "srun started 2 tasks (SLURM_STEP_NUM_TASKS) but MPI sees a world of 1 rank: the ranks did not find each other" lone.err ||
  fail "2 srun tasks, MPI world of 1: no message that the ranks did not find each other"
grep -q "srun --mpi=pmix" lone.err || fail "the refusal does not name srun --mpi=pmix"
echo "2 tasks, world of 1: exit $status: $(grep -m 1 'did not find' lone.err | cut -c 1-160)..."

status=0
SLURM_STEP_NUM_TASKS=1 "$train" --help >/dev/null 2>one.err || status=$?
((status == 0)) || { cat one.err >&2; fail "a 1-task step: vqa_train exited $status"; }

root_flags=()
[[ $(id -u) -eq 0 ]] && root_flags=(--allow-run-as-root)
status=0
SLURM_STEP_NUM_TASKS=2 mpirun "${root_flags[@]}" -np 1 "$train" --help >/dev/null 2>mpirun.err || status=$?
((status == 0)) || { cat mpirun.err >&2; fail "mpirun -np 1 inside a 2-task step: vqa_train exited $status"; }
! grep -q "did not find each other" mpirun.err || fail "mpirun -np 1 was refused as a lone srun task"
echo "1-task step and mpirun -np 1: started as usual"
script_test_end lone_slurm_task
