#!/usr/bin/env bash
# No silent CPU run on a GPU host: with a stand-in nvidia-smi first on PATH
# (it lists one H100), a build that cannot use a GPU (here: a CPU-only
# LibTorch, or no GPU at all) must refuse the GPU recipe
# jobs/configs/vqa_rad.ini (device = cuda) and --device auto, on every rank,
# with exit non-zero within 5 s and a message that says why and how to get a
# CUDA LibTorch: once through jobs/launch_local.sh (which counts the stand-in's
# GPU and starts 1 rank), once under mpirun -np 2. The quickstart's
# configuration (device = cpu) must still train there (2 optimiser steps), and
# its train.log must open with the device and the libraries' versions.
#
#   tests/train/test_device_guard.sh SOURCE_DIR BUILD_DIR
#
# Exits 77 (SKIP) on a host whose build drives a real GPU: there the guard
# has nothing to refuse.
set -euo pipefail
# shellcheck source=tests/support/script_test.sh
source "$(dirname "$0")/../support/script_test.sh"
script_test_begin device_guard "$1" "$2"
# The suite hides GPUs from a CPU-only LibTorch (cmake/VqaTesting.cmake);
# this test is about the host that does not.
unset CUDA_VISIBLE_DEVICES
train=$build_dir/vqa_train
recipe=$source_dir/jobs/configs/vqa_rad.ini
# The refusal's words (src/train/setup.cpp, why_no_usable_gpu).
expected='this host has 1 NVIDIA GPU (nvidia-smi -L), but '
remedy='VQA_TORCH_FROM_PYTHON=ON|LibTorch.s CUDA sees no usable GPU|no GPU communicator'

# -DVQA_TORCH_FROM_PYTHON=ON (configure only): a python whose torch gives a
# LibTorch with CMake files is built against (Torch_DIR is its); one that
# cannot import torch, or whose torch has no TorchConfig.cmake, is refused
# at configure time naming the remedy.
generator=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$build_dir/CMakeCache.txt")
torch_cmake=$(sed -n 's/^Torch_DIR:PATH=//p' "$build_dir/CMakeCache.txt")
mkdir -p "$work/python"
# configure_with PYTHON_SCRIPT_BODY: configures a fresh folder with
# VQA_TORCH_FROM_PYTHON=ON and a stand-in python; output in $work/configure.log.
configure_with() {
  printf '#!/bin/sh\n%s\n' "$1" >"$work/python/python"
  chmod +x "$work/python/python"
  rm -rf "$work/configure"
  cmake -S "$source_dir" -B "$work/configure" -G "$generator" -DVQA_TORCH_FROM_PYTHON=ON \
    -DVQA_PYTHON="$work/python/python" -DVQA_BUILD_TESTS=OFF -DVQA_USE_CCACHE=OFF \
    >"$work/configure.log" 2>&1
}
# The build's LibTorch seen through a link of its own (TorchConfig.cmake
# finds its prefix four folders up), so that Torch_DIR shows whose it is.
torch_prefix=$(cd "$torch_cmake/../../../.." && pwd)
ln -s "$torch_prefix" "$work/torch-prefix"
python_torch_cmake=$work/torch-prefix/${torch_cmake#"$torch_prefix"/}
if configure_with "echo '$(dirname "$python_torch_cmake")'" &&
  grep -q "^Torch_DIR:PATH=$python_torch_cmake\$" "$work/configure/CMakeCache.txt" &&
  grep -q "LibTorch from $work/python/python's torch" "$work/configure.log"; then
  echo "VQA_TORCH_FROM_PYTHON=ON: configured against the stand-in python's LibTorch ($python_torch_cmake)"
else
  tail -n 20 "$work/configure.log" >&2
  grep '^Torch_DIR' "$work/configure/CMakeCache.txt" >&2 || true
  fail "VQA_TORCH_FROM_PYTHON=ON did not configure against the python's torch ($python_torch_cmake)"
fi
# expect_refused WHAT PYTHON_SCRIPT_BODY PATTERN: configuring with that
# stand-in python must fail with an error matching PATTERN.
expect_refused() {
  local what=$1 body=$2 pattern=$3
  if configure_with "$body"; then
    fail "VQA_TORCH_FROM_PYTHON=ON configured with $what"
  elif ! tr -s ' \n' ' ' <"$work/configure.log" | grep -q "$pattern"; then
    tail -n 20 "$work/configure.log" >&2
    fail "VQA_TORCH_FROM_PYTHON=ON with $what: not the expected error"
  else
    echo "VQA_TORCH_FROM_PYTHON=ON with $what: refused at configure time"
  fi
}
expect_refused "a python without torch" \
  "echo \"ModuleNotFoundError: No module named 'torch'\" >&2; exit 1" \
  "cannot import torch (exit 1: ModuleNotFoundError.*pip install torch.*CMAKE_PREFIX_PATH=/path/to/libtorch"
expect_refused "a torch without CMake files (as Debian's python3-torch)" \
  "echo $work/no-cmake-files" "no Torch/TorchConfig.cmake"
rm -rf "$work/configure"

# The quickstart's configuration, 2 optimiser steps on 1 CPU rank: also says
# which build this is.
"$build_dir/vqa_prep" synth --train-questions 64 --test-questions 32 -o "$work/synth.h5" >/dev/null
mkdir -p "$work/bin"
cat >"$work/bin/nvidia-smi" <<'EOF'
#!/bin/sh
# A stand-in: the listing of a host with one GPU.
echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-2b2a7f0e-0c7e-4a8b-9a43-0f3c1d6e5a11)"
EOF
chmod +x "$work/bin/nvidia-smi"
real_gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
export PATH=$work/bin:$PATH

cd "$work"  # the recipe's relative paths (data/, runs/) land here
if ! mpirun --allow-run-as-root -np 1 "$train" --config "$source_dir/jobs/configs/quickstart.ini" \
  --train-data "$work/synth.h5" --out "$work/quickstart" --epochs 1 --max-steps-per-epoch 2 \
  --eval-every 0 --progress off >"$work/quickstart.log" 2>&1; then
  cat "$work/quickstart.log" >&2
  fail "the quickstart's configuration (device = cpu) did not run with an nvidia-smi on PATH"
else
  grep -q '^vqa_train: 1 rank(s), device cpu' "$work/quickstart.log" ||
    fail "the quickstart did not say 'device cpu'"
  echo "quickstart (device = cpu, stand-in nvidia-smi on PATH): ran 2 steps on the CPU"
fi
first=$(head -n 1 "$work/quickstart/train.log" 2>/dev/null || true)
echo "train.log, line 1: $first"
if [[ ! $first =~ ^(device\ cpu;\ )?LibTorch\ [0-9]+\.[0-9]+\.[0-9]+[^\ ]*\ \((CPU|CUDA)\ build\)\;\ CUDA\ (none|[0-9]+\.[0-9]+)\;\ cuDNN\ (none|[0-9.]+)\;\ NCCL\ (none|[0-9]+\.[0-9]+\.[0-9]+)$ ]]; then
  fail "train.log's first line does not name LibTorch's version and build, CUDA, cuDNN and NCCL"
fi
head -n 8 "$work/quickstart/train.log" | grep -q 'device cpu' ||
  fail "train.log's first 8 lines do not name the device"
if [[ $first == *"(CUDA build)"* ]] && ((real_gpus > 0)); then
  echo "SKIP: a CUDA build on a host with $real_gpus GPU(s): the guard has nothing to refuse"
  exit 77
fi

# seconds_of COMMAND...: runs it (output discarded, status ignored) and
# prints how long it took.
seconds_of() {
  local start
  start=$(date +%s.%N)
  "$@" >/dev/null 2>&1 || true
  awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'
}

# The refusal must come within 5 s of the program's start-up: on a loaded
# machine, loading LibTorch alone (`vqa_train --help` under mpirun -np 2)
# can take seconds, which the limit adds.
startup=$(seconds_of mpirun --allow-run-as-root --oversubscribe -np 2 "$train" --help)
limit=$(awk -v s="$startup" 'BEGIN { printf "%.2f", s + 5 }')
echo "start-up (mpirun -np 2 vqa_train --help): $startup s; limit $limit s"

# refused LOG WHAT COMMAND...: COMMAND must exit non-zero within the limit
# with the refusal on stderr; prints how many ranks said it.
refused() {
  local log=$1 what=$2
  shift 2
  local start seconds ranks status=0
  start=$(date +%s.%N)
  "$@" >"$log" 2>&1 || status=$?
  seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
  ranks=$(grep -c "^\[vqa\] error on rank [0-9/]* (.*): .*$expected" "$log" || true)
  echo "$what: exit $status after $seconds s, the refusal from $ranks rank(s)"
  grep -m 1 "^\[vqa\] error on rank" "$log" | cut -c 1-400 || true
  if ((status == 0)); then
    fail "$what: exited 0 (trained on the CPU?)"
    tail -n 5 "$log" >&2
  fi
  awk -v s="$seconds" -v l="$limit" 'BEGIN { exit !(s < l) }' ||
    fail "$what: took $seconds s (limit $limit s)"
  ((ranks >= 1)) || fail "$what: no '$expected' refusal"
  grep -qE "$remedy" "$log" || fail "$what: the refusal does not say how to get a usable GPU"
  if grep -q "^vqa_train: .*device cpu" "$log"; then fail "$what: it started training on the CPU"; fi
}

refused "$work/launch.log" "launch_local.sh, vqa_rad.ini (device = cuda)" \
  bash "$source_dir/jobs/launch_local.sh" "$train" --config "$recipe" --out "$work/vqa_rad"
grep -q '^launch_local.sh: 1 GPU(s), .*: 1 rank(s)' "$work/launch.log" ||
  fail "launch_local.sh did not count the stand-in's GPU (1 rank)"
refused "$work/np2.log" "mpirun -np 2, vqa_rad.ini (device = cuda)" \
  mpirun --allow-run-as-root --oversubscribe -np 2 "$train" --config "$recipe" --out "$work/vqa_rad2"
refused "$work/auto.log" "mpirun -np 2, the quickstart with --device auto" \
  mpirun --allow-run-as-root --oversubscribe -np 2 "$train" --config "$source_dir/jobs/configs/quickstart.ini" \
  --device auto --train-data "$work/synth.h5" --out "$work/auto" --epochs 1 --progress off

script_test_end device_guard
