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
# the script must stop with "PARAMETER COUNTS DIFFER" before any DDP timing;
# then the second setting (MAX_LEN=32, DDP_ATTENTION=torch, and a variant's
# flags, VARIANTS="--bucket-mb 5", run beside the default: a row of its own
# at each rank count, named in the report) runs, and the
# nn.MultiheadAttention model equals the explicit one (1e-5, same weights).
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

# ---- 3. the second setting: questions padded to 32, nn.MultiheadAttention --
if ! env "${settings[@]}" RANKS="1 2" MAX_LEN=32 DDP_ATTENTION=torch VARIANTS="--bucket-mb 5" OUT_DIR="$work/padded" \
  bash "$source_dir/jobs/bench_scaling.sh" "$build_dir" >"$work/padded.log" 2>&1; then
  cat "$work/padded.log" >&2
  fail "jobs/bench_scaling.sh MAX_LEN=32 DDP_ATTENTION=torch exited non-zero"
else
  grep -q '^parameter counts agree: ' "$work/padded.log" || fail "MAX_LEN=32: no 'parameter counts agree' line"
  grep -q 'questions padded to 32 tokens' "$work/padded/scaling.txt" || fail "MAX_LEN=32 not in the report's header"
  grep -q 'attention torch' "$work/padded/scaling.txt" || fail "DDP_ATTENTION=torch not in the report's header"
  grep -q '^vqa-hpc,2,' "$work/padded/scaling.csv" || fail "MAX_LEN=32: no vqa-hpc row at 2 ranks"
  for ranks in 1 2; do
    grep -q "^vqa-hpc-v1,$ranks," "$work/padded/scaling.csv" || fail "VARIANTS: no vqa-hpc-v1 row at $ranks ranks"
  done
  grep -q '^vqa-hpc-v1: --bucket-mb 5$' "$work/padded/scaling.txt" || fail "VARIANTS: the variant's flags not in the report"
fi
# The nn.MultiheadAttention model computes what the explicit one does, given
# the same weights (1e-5, float32), with padded keys: the comparison is of
# two implementations of one model.
python=$(torch_python 'import torch')
if [[ -z $python ]]; then
  fail "no python3 that can import torch"
elif ! "$python" - "$source_dir/jobs" <<'EOF' >"$work/attention.log" 2>&1; then
import sys
import torch
sys.path.insert(0, sys.argv[1])
import ddp_reference as ref
torch.manual_seed(3)
explicit = ref.MultiHeadAttention(32, 4, 0.0)
packed = ref.TorchAttention(32, 4, 0.0)
with torch.no_grad():
    inner = packed.attention
    inner.in_proj_weight.copy_(torch.cat([explicit.query.weight, explicit.key.weight, explicit.value.weight]))
    inner.in_proj_bias.copy_(torch.cat([explicit.query.bias, torch.zeros(32), explicit.value.bias]))
    inner.out_proj.weight.copy_(explicit.output.weight)
    inner.out_proj.bias.copy_(explicit.output.bias)
queries, keys = torch.randn(3, 5, 32), torch.randn(3, 7, 32)
mask = torch.ones(3, 7, dtype=torch.int64)
mask[0, 4:] = 0
mask[2, 1:] = 0
bias = ref.attention_key_bias(mask, torch.float32)
worst = 0.0
for kv, key_bias in ((keys, bias), (queries, None)):
    difference = (explicit(queries, kv, key_bias) - packed(queries, kv, key_bias)).abs().max().item()
    worst = max(worst, difference)
print("largest difference", worst)
sys.exit(0 if worst <= 1e-5 else 1)
EOF
  cat "$work/attention.log" >&2
  fail "jobs/ddp_reference.py: nn.MultiheadAttention differs from the explicit attention by more than 1e-5"
fi

if ((failures)); then
  echo "FAIL: $failures check(s) failed" >&2
  exit 1
fi
echo "PASS: scaling report at 1-3 ranks with the DDP reference; a model mismatch stops it; questions padded to 32 with nn.MultiheadAttention; $(cat "$work/attention.log")"
