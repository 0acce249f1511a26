#!/usr/bin/env bash
# The GPU check, in one command, on a machine with a GPU, CUDA, a CUDA
# PyTorch (whose wheel carries a full CUDA LibTorch) and the NCCL wheel:
#   1. builds vqa_train, vqa_allreduce_bench and the communicator tests
#      against that LibTorch with -DVQA_WITH_NCCL=ON, Open MPI, HDF5, Boost
#      and OpenCV coming from .gpu-check/debs (tests/gpu/make_bundle.sh),
#      unpacked into a prefix of their own;
#   2. runs the communicator tests (their NCCL cases need the GPU; they SKIP
#      without one) and vqa_allreduce_bench with NCCL (a wrong element makes
#      it fail);
#   3. trains the base preset for a few steps in bfloat16 on 1 rank (NCCL
#      refuses two ranks on one GPU) and prints samples/s, the step phases,
#      the peak GPU memory (nvidia-smi, sampled every 100 ms) and an estimate
#      of the model FLOP utilisation (the model's matrix products counted from
#      its sizes, x3 for forward and backward, over the GPU's dense bf16 peak).
# Prints one line per stage with its time; logs and a summary go to $OUT (or
# .gpu-check/out). Exits non-zero on any failure.
#
#   bash tests/gpu/check.sh
#
# Settings (environment): VQA_GPU_PEAK_TFLOPS (default 989, an H100/H200's
# dense bf16), VQA_GPU_EPOCHS (default 3: the last is timed, the first warms
# up; the bundle's 128 questions make 8 steps of 16 per epoch), VQA_GPU_BATCH
# (per step, default 16), TORCH_DIR (LibTorch's CMake folder;
# default: the one of python3's torch), VQA_GPU_DEVICE=cpu (a dry run of the
# route on a machine without a GPU: stage 3 trains on the CPU).
set -euo pipefail
cd "$(dirname "$0")/../.."
source_dir=$PWD
bundle=$source_dir/.gpu-check
out=${OUT:-$bundle/out}
mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/vqa-gpu-check-XXXXXX")
device=${VQA_GPU_DEVICE:-cuda}
epochs=${VQA_GPU_EPOCHS:-3}
batch=${VQA_GPU_BATCH:-16}
peak_tflops=${VQA_GPU_PEAK_TFLOPS:-989}
summary=$out/summary.txt
: >"$summary"
say() { printf 'gpu-check: %s\n' "$*" | tee -a "$summary"; }
die() { say "FAILED: $*"; exit 1; }
stage_start=0
stage() { stage_start=$(date +%s); stage_name=$1; }
stage_done() { say "stage $stage_name: $(($(date +%s) - stage_start)) s ok"; }

# ---- 0. the prefix with Open MPI, HDF5, Boost, OpenCV -------------------------
stage prefix
prefix=$work/prefix
mkdir -p "$prefix" "$work/bin"
if compgen -G "$bundle/debs/*.deb" >/dev/null; then
  for deb in "$bundle"/debs/*.deb; do dpkg -x "$deb" "$prefix"; done
else
  die "no $bundle/debs/*.deb: run tests/gpu/make_bundle.sh on a Debian 12 machine first"
fi
usr=$prefix/usr
lib=$usr/lib/x86_64-linux-gnu
# Debian's alternatives links are not in the packages: name the tools.
for tool in mpirun mpiexec mpicc mpicxx; do ln -sf "$usr/bin/$tool.openmpi" "$work/bin/$tool"; done
# h5pcc is a script with Debian's /usr in it.
sed "s#/usr#$usr#g" "$usr/bin/h5pcc.openmpi" >"$work/bin/h5pcc" && chmod +x "$work/bin/h5pcc"
export OPAL_PREFIX=$usr  # Open MPI relocated: its wrappers and components under the prefix
export PATH=$work/bin:$usr/bin:$PATH
export LD_LIBRARY_PATH=$lib/openmpi/lib:$lib/hdf5/openmpi:$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG_PATH=$lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$prefix
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One host: Open MPI's launcher without ssh or rsh (its rsh launcher refuses
# to start, even for -np 1, when neither is on PATH).
export OMPI_MCA_plm=isolated
stage_done

# ---- 1. build against the CUDA LibTorch with NCCL -------------------------------
stage build
python=${PYTHON:-python3}
torch_dir=${TORCH_DIR:-$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')}
nccl_flags=(-DVQA_WITH_NCCL=ON)
if [[ $device == cpu ]]; then
  nccl_flags=(-DVQA_WITH_NCCL=AUTO)
else
  # The NCCL wheel ships libnccl.so.2 only: a libnccl.so beside it for the linker.
  nccl_wheel=$("$python" -c 'import importlib.util as u; print(list(u.find_spec("nvidia.nccl").submodule_search_locations)[0])')
  mkdir -p "$work/nccl/lib"
  ln -sf "$nccl_wheel/lib/libnccl.so.2" "$work/nccl/lib/libnccl.so"
  ln -sf "$nccl_wheel/include" "$work/nccl/include"
  nccl_flags+=(-DNCCL_ROOT="$work/nccl")
  export LD_LIBRARY_PATH=$nccl_wheel/lib:$LD_LIBRARY_PATH
fi
cmake -S "$source_dir" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$torch_dir;$usr;$lib/cmake" -DHDF5_C_COMPILER_EXECUTABLE="$work/bin/h5pcc" \
  -DMPI_C_COMPILER="$work/bin/mpicc" -DVQA_OPENCV_INCLUDE_DIR="$usr/include/opencv4" \
  "${nccl_flags[@]}" >"$out/configure.log" 2>&1 || { tail -n 30 "$out/configure.log"; die "configure"; }
grep 'vqa-hpc:' "$out/configure.log" | sed 's/^-- /gpu-check:   /' | tee -a "$summary"
cmake --build "$work/build" --parallel "$(nproc)" --target vqa_train vqa_allreduce_bench \
  test_communicator >"$out/build.log" 2>&1 || { grep -A8 -E 'error|FAILED' "$out/build.log" | head -n 60; die "build"; }
stage_done

# ---- 2. the communicator tests and the NCCL allreduce benchmark -----------------
stage communicator
mpirun -np 1 "$work/build/tests/runtime/test_communicator" >"$out/test_communicator.log" 2>&1 ||
  { tail -n 40 "$out/test_communicator.log"; die "test_communicator"; }
skipped=$(grep -cE '^\[  SKIPPED \]' "$out/test_communicator.log" || true)
say "  $(grep -cE '^\[       OK \]' "$out/test_communicator.log") tests passed, $skipped skipped"
# With a GPU every test must run: a SKIP there means CUDA or NCCL was not usable.
if [[ $device == cuda ]] && ((skipped > 0)); then
  grep -E '^\[  SKIPPED \]' "$out/test_communicator.log" | sed 's/^/gpu-check:   /' | tee -a "$summary"
  die "tests skipped on a GPU machine"
fi
if [[ $device == cuda ]]; then
  mpirun -np 1 "$work/build/vqa_allreduce_bench" --backend nccl --device cuda -b 1M -e 256M -f 4 \
    >"$out/allreduce_bench.log" 2>&1 || { tail -n 20 "$out/allreduce_bench.log"; die "vqa_allreduce_bench"; }
  grep -v '^#' "$out/allreduce_bench.log" | tail -n 3 | sed 's/^/gpu-check:   /' | tee -a "$summary"
fi
stage_done

# ---- 3. a short bf16 training run of the base preset ------------------------------
stage train
memory_log=$out/gpu_memory.csv
if command -v nvidia-smi >/dev/null && [[ $device == cuda ]]; then
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$memory_log" &
  sampler=$!
fi
mpirun -np 1 "$work/build/vqa_train" --train-data "$bundle/synth384.h5" --out "$work/run" \
  --preset base --device "$device" --bf16-autocast true --epochs "$epochs" \
  --global-batch "$batch" --batch-per-rank "$batch" --eval-every 0 --save-every 0 \
  --progress off >"$out/train.log" 2>&1 || { tail -n 30 "$out/train.log"; die "training run"; }
[[ -n ${sampler:-} ]] && kill "$sampler" 2>/dev/null
cp "$work/run/metrics.jsonl" "$out/metrics.jsonl"
grep -E '^model:|^  step ' "$out/train.log" | tail -n 2 | sed 's/^/gpu-check:   /' | tee -a "$summary"
"$python" - "$out/metrics.jsonl" "$out/train.log" "${memory_log:-}" "$peak_tflops" <<'PY' | tee -a "$summary"
import json, re, sys
metrics, log, memory, peak = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
last = [json.loads(line) for line in open(metrics)][-1]  # the last epoch; the first warmed up
sizes = dict(re.findall(r"(\w+)=(\S+)", next(l for l in open(log) if l.startswith("model:"))))
h, ffn, p, s = (int(sizes[k]) for k in ("hidden", "ffn", "patch_size", "image_size"))
tv = (s // p) ** 2 + 1              # image tokens, class token included
tt = 32                             # question tokens (M3AE's length; the synthetic set pads to it or less)
layer = lambda t: 2 * t * (4 * h * h + 2 * h * ffn) + 4 * t * t * h   # projections + attention
vision = 2 * tv * 3 * p * p * h + int(sizes["vision_layers"]) * layer(tv)
text = int(sizes["text_layers"]) * layer(tt)
cross = lambda a, b: layer(a) + 2 * (2 * a * h * h + 2 * b * h * h) + 4 * a * b * h
fusion = int(sizes["fusion_layers"]) * (cross(tt, tv) + cross(tv, tt)) + 2 * (tt + tv) * h * h
forward = vision + text + fusion
rate = last["samples_per_second"]
mfu = 3 * forward * rate / (peak * 1e12)
print(f"gpu-check:   samples/s {rate:.1f}; model FLOPs {3 * forward / 1e9:.1f} G per sample "
      f"(forward x3); utilisation {100 * mfu:.1f}% of {peak:.0f} TFLOP/s")
if memory:
    try:
        used = [int(x) for x in open(memory).read().split() if x.isdigit()]
        print(f"gpu-check:   peak GPU memory {max(used) / 1024:.1f} GiB (nvidia-smi, whole process)")
    except (OSError, ValueError):
        print("gpu-check:   peak GPU memory: not sampled")
PY
stage_done
say "all stages passed; logs in $out"
