#!/usr/bin/env bash
# The job scripts without a batch system:
#   - every Slurm batch script refuses to run outside an allocation, with a
#     message that says so, and exit status 2;
#   - jobs/launch_local.sh picks one rank per GPU (CUDA_VISIBLE_DEVICES) or
#     per core, shares the cores out (ranks x threads <= cores), starts the
#     ranks under mpirun with OMP_NUM_THREADS set and each rank bound to cores
#     of its own, passes --threads to vqa_train unless given, and refuses bad
#     options;
#   - the collective deadline the batch scripts pass (VQA_COMM_TIMEOUT,
#     train_multinode.sbatch: 120 s) gives way to a --comm-timeout on the
#     command line or in the config.
#
#   tests/slurm/test_job_scripts.sh SOURCE_DIR
set -euo pipefail
cd "$1"
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

echo "---- batch scripts outside an allocation"
for script in jobs/slurm/*.sbatch; do
  status=0
  message=$(env -u SLURM_JOB_ID bash "$script" jobs/configs/quickstart.ini 2>&1) || status=$?
  echo "$script: exit $status: $message"
  ((status == 2)) || fail "$script exited $status outside an allocation, expected 2"
  [[ $message == *"not inside a Slurm allocation"* ]] || fail "$script did not say why it refused"
done

echo "---- the collective deadline of the batch scripts"
grep -qxF "export VQA_COMM_TIMEOUT=\${VQA_COMM_TIMEOUT:-120}" jobs/slurm/train_multinode.sbatch ||
  fail "train_multinode.sbatch does not default VQA_COMM_TIMEOUT to 120"
config_with_deadline=$(mktemp)
trap 'rm -f "$config_with_deadline"' EXIT
printf 'epochs = 1\ncomm-timeout = 45\n' >"$config_with_deadline"
# deadline_args [VQA_COMM_TIMEOUT] CONFIG ARGS...: what lib.sh adds to vqa_train's options.
deadline_args() {
  (
    VQA_COMM_TIMEOUT=$1
    shift
    source jobs/slurm/lib.sh
    slurm_comm_timeout_args "$@"
    echo "${comm_timeout_args[*]}"
  )
}
check_deadline() { # EXPECTED [VQA_COMM_TIMEOUT] CONFIG ARGS...
  local want=$1 got
  shift
  got=$(deadline_args "$@")
  echo "VQA_COMM_TIMEOUT='$1' ${*:2}: '$got'"
  [[ $got == "$want" ]] || fail "VQA_COMM_TIMEOUT='$1' ${*:2}: added '$got', expected '$want'"
}
check_deadline "--comm-timeout 120" 120 jobs/configs/quickstart.ini --epochs 2
check_deadline "" 120 jobs/configs/quickstart.ini --epochs 2 --comm-timeout 10
check_deadline "" 120 jobs/configs/quickstart.ini --comm-timeout=10
check_deadline "" 120 "$config_with_deadline" --epochs 2
check_deadline "" "" jobs/configs/quickstart.ini --epochs 2

echo "---- launch_local.sh: rank and thread choice"
# dry_run ARGS...: the launcher's two lines for ARGS, nothing started.
dry_run() { jobs/launch_local.sh --dry-run "$@"; }

plan=$(CUDA_VISIBLE_DEVICES=0,1,2 dry_run true)
echo "$plan"
[[ $plan == *"3 GPU(s)"*"3 rank(s)"* && $plan == *"mpirun -np 3 "* ]] ||
  fail "three visible GPUs did not give three ranks"

plan=$(CUDA_VISIBLE_DEVICES='' dry_run true)
echo "$plan"
[[ $plan =~ ([0-9]+)\ core\(s\):\ ([0-9]+)\ rank\(s\)\ x\ ([0-9]+)\ thread ]] ||
  fail "no 'N core(s): R rank(s) x T thread(s)' line"
cores=${BASH_REMATCH[1]} ranks=${BASH_REMATCH[2]} threads=${BASH_REMATCH[3]}
usable=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
((cores >= 1 && cores <= usable)) || fail "$cores cores reported, $usable CPUs usable"
((ranks == cores && threads == 1)) || fail "no GPUs: expected $cores ranks x 1 thread"
[[ $plan == *"--bind-to core"* ]] || fail "ranks not bound to cores"

plan=$(CUDA_VISIBLE_DEVICES='' dry_run --ranks 1 build/vqa_train --config x.ini)
echo "$plan"
[[ $plan == *"-np 1 --map-by slot:PE=$cores --bind-to core"* ]] ||
  fail "one rank should get all $cores cores"
[[ $plan == *"vqa_train --config x.ini --threads $cores" ]] ||
  fail "--threads $cores not passed to vqa_train"
plan=$(CUDA_VISIBLE_DEVICES='' dry_run --ranks 1 build/vqa_train --threads 1)
[[ $plan == *"vqa_train --threads 1" ]] || fail "--threads added although given: $plan"
plan=$(CUDA_VISIBLE_DEVICES='' dry_run --ranks $((cores + 1)) true)
[[ $plan == *"--oversubscribe --bind-to none"* ]] ||
  fail "more ranks than cores must run oversubscribed and unbound: $plan"

for bad in "--ranks 0" "--ranks two" "--threads -1" "--frobnicate"; do
  status=0
  # shellcheck disable=SC2086  # split the option from its value
  message=$(jobs/launch_local.sh $bad true 2>&1) || status=$?
  ((status == 2)) || fail "launch_local.sh $bad exited $status, expected 2"
  echo "launch_local.sh $bad: $message"
done

echo "---- launch_local.sh: ranks started under mpirun"
ranks=2
threads=$((cores / ranks > 0 ? cores / ranks : 1))
# shellcheck disable=SC2016  # expanded by each rank's sh, not here
report='echo "rank=$OMPI_COMM_WORLD_RANK of $OMPI_COMM_WORLD_SIZE threads=$OMP_NUM_THREADS" \
  "cpus=$(sed -n "s/^Cpus_allowed_list:[[:space:]]*//p" /proc/self/status)"'
output=$(CUDA_VISIBLE_DEVICES='' jobs/launch_local.sh --ranks "$ranks" sh -c "$report")
echo "$output"
for rank in 0 1; do
  grep -q "^rank=$rank of 2 threads=$threads " <<<"$output" ||
    fail "rank $rank missing or without OMP_NUM_THREADS=$threads"
done
if ((cores >= ranks)); then
  cpu_sets=$(grep '^rank=' <<<"$output" | grep -o 'cpus=.*' | sort -u | wc -l)
  ((cpu_sets == ranks)) || fail "the $ranks ranks are not bound to different cores"
fi
echo "PASS: batch scripts refuse outside Slurm and pass their collective deadline unless one is given; launch_local.sh chose, bound and started the ranks"
