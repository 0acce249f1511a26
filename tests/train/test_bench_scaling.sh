#!/usr/bin/env bash
# The scaling report end to end on the tiny preset: jobs/bench_scaling.sh runs
# vqa_train and the PyTorch DDP reference (jobs/ddp_reference.py) at 1, 2 and
# 3 ranks (3 oversubscribes 2 cores), and
#   - both models have the same parameter count (the script's own check),
#   - the table has a row per implementation and rank count with samples/s > 0,
#     vqa-hpc's phase breakdown in ms and its ratio to DDP, efficiency exactly
#     1 at 1 rank (S_1 / (1 x S_1)),
#   - the PNG is a PNG;
# then with the DDP model made different on purpose (DDP_FLAGS=--hidden 32)
# the script must stop with "PARAMETER COUNTS DIFFER" before any DDP timing.
#
#   tests/train/test_bench_scaling.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
# shellcheck source=tests/support/script_test.sh
source "$(dirname "$0")/../support/script_test.sh"
script_test_begin scaling "$1" "$2"

settings=(PRESET=tiny IMAGE_SIZE=32 BATCH_PER_RANK=4 STEPS=2 REPEATS=1 CONTROLS=0)

# ---- 1. a full report at 1, 2, 3 ranks ----------------------------------
if ! env "${settings[@]}" RANKS="1 2 3" OUT_DIR="$work/report" \
  bash "$source_dir/jobs/bench_scaling.sh" "$build_dir" >"$work/report.log" 2>&1; then
  cat "$work/report.log" >&2
  fail "jobs/bench_scaling.sh exited non-zero"
else
  grep -q '^parameter counts agree: vqa_train and jobs/ddp_reference.py both [0-9]*$' "$work/report.log" ||
    fail "no 'parameter counts agree' line"
  csv=$work/report/scaling.csv
  for impl in vqa-hpc pytorch-ddp; do
    for ranks in 1 2 3; do
      row=$(grep "^$impl,$ranks," "$csv" || true)
      [[ -n $row ]] || { fail "no $impl row at $ranks ranks in scaling.csv"; continue; }
      IFS=, read -r -a f <<<"$row"
      # f: impl ranks samples/s step_ms efficiency ratio data_wait h2d forward backward comm optimizer runs
      awk -v v="${f[2]}" 'BEGIN {exit !(v > 0)}' || fail "$impl x$ranks: samples/s ${f[2]} is not > 0"
      if [[ $ranks == 1 && ${f[4]} != 1.0000 ]]; then
        fail "$impl x1: efficiency ${f[4]}, expected exactly 1.0000"
      fi
      if [[ $impl == vqa-hpc ]]; then
        awk -v v="${f[5]}" 'BEGIN {exit !(v > 0)}' || fail "vqa-hpc x$ranks: ratio to DDP '${f[5]}' is not > 0"
        for i in 6 7 8 9 10 11; do
          [[ ${f[$i]} =~ ^[0-9]+\.[0-9]+$ ]] || fail "vqa-hpc x$ranks: phase column $i is '${f[$i]}', not a number of ms"
        done
        awk -v v="${f[8]}" 'BEGIN {exit !(v > 0)}' || fail "vqa-hpc x$ranks: forward ${f[8]} ms is not > 0"
      fi
    done
  done
  [[ $(head -c 4 "$work/report/scaling.png" | od -An -tx1 | tr -d ' \n') == 89504e47 ]] ||
    fail "scaling.png is not a PNG"
  [[ $(grep -c '^pytorch-ddp,' "$work/report/runs.csv") == 3 ]] || fail "runs.csv does not hold 3 DDP runs"
  grep -q '^impl  *ranks  *samples/s' "$work/report/scaling.txt" || fail "scaling.txt has no table header"
fi

# ---- 2. a different model on the DDP side must stop the script -----------
if env "${settings[@]}" RANKS="1" OUT_DIR="$work/mismatch" DDP_FLAGS="--hidden 32" \
  bash "$source_dir/jobs/bench_scaling.sh" "$build_dir" >"$work/mismatch.log" 2>&1; then
  fail "jobs/bench_scaling.sh succeeded although the DDP model has --hidden 32"
fi
grep -q 'PARAMETER COUNTS DIFFER: vqa_train [0-9]*, jobs/ddp_reference.py [0-9]*' "$work/mismatch.log" ||
  { cat "$work/mismatch.log" >&2; fail "no 'PARAMETER COUNTS DIFFER' message"; }
if grep -q '^pytorch-ddp,' "$work/mismatch/runs.csv" 2>/dev/null; then
  fail "a DDP run was timed despite the mismatch"
fi

if ((failures)); then
  echo "FAIL: $failures check(s) failed" >&2
  exit 1
fi
echo "PASS: scaling report at 1-3 ranks with the DDP reference; a model mismatch stops it"
