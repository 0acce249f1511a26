#!/usr/bin/env bash
# The GPU check, in one command, on a machine with a GPU, CUDA, a CUDA
# PyTorch (whose wheel carries a full CUDA LibTorch) and the NCCL wheel:
#   0. unpacks .gpu-check/debs into a prefix, then a preflight before any
#      build: the tools, `ldd` of every unpacked library and program with
#      nothing "not found", `mpirun -np 1 hostname`, torch's and CUDA's
#      versions (and a usable GPU unless VQA_GPU_DEVICE=cpu);
#   1. builds vqa_train, vqa_allreduce_bench and the tests of stage 2
#      against that LibTorch with -DVQA_WITH_NCCL=ON, Open MPI, HDF5, Boost
#      and OpenCV coming from .gpu-check/debs (tests/gpu/make_bundle.sh),
#      unpacked into a prefix of their own;
#   b. the side-by-side table (jobs/bench_gpu.sh): vqa_train eager and
#      with --cuda-graph (and without weight copies), PyTorch eager and
#      torch.compile, at 16 and 64 per step in bf16, then the crop and fp16
#      rows while time is left; the table is rewritten after every row;
#   2. runs every test program with a CUDA branch (the communicator's NCCL
#      cases, the loader's pinned batches, checkpoints across devices; they
#      skip without a GPU and must not skip with one) and vqa_allreduce_bench
#      with NCCL (a wrong element makes it fail), on 2 ranks where there are
#      2 GPUs, else on 1 rank, which the summary says;
#   2b. a CUDA graph against the eager path: 20 optimiser steps of the
#      preset in bfloat16 with --cuda-graph true and without it (questions
#      padded alike, dropout 0), per-epoch losses within 1e-2 relative (see
#      the stage); the eager run again with --copy-stream false, its losses
#      within the same tolerance; on the CPU (VQA_GPU_DEVICE=cpu, 4 steps) the
#      graph run is eager and must say so and match to the last bit;
#   3. trains the base preset in bfloat16 on 1 rank (NCCL refuses two ranks
#      on one GPU) with 2 accumulation steps, --bf16-allreduce, evaluation and
#      a checkpoint every epoch, then resumes it for one more epoch with
#      --resume auto, then runs float16 with loss scaling; prints samples/s,
#      the step phases, the peak GPU memory (nvidia-smi, sampled every 100
#      ms) and an estimate of the model FLOP utilisation (the model's matrix
#      products counted from its sizes, x3 for forward and backward, over the
#      GPU's dense bf16 peak).
# The stages after the build run in that order (bench, tests, graph, sweep,
# train), each only while the call's time budget (VQA_GPU_BUDGET_S) has room
# for it by its estimate on a GPU; a stage left out says so, and so does the
# last line. A failed bench lets the later stages run, failing at the end;
# runs and tests stop at the budget's end + 60 s (a hang is reported).
# Prints one line per stage with its time. $OUT (or .gpu-check/out) gets
# only a few small files: summary.txt, table.txt, table.csv, rows.jsonl,
# metrics.jsonl; the logs, traces and runs stay in $VQA_GPU_WORK/logs (on a
# failure the end of the failing log is printed). Exits non-zero on any
# failure.
#
#   bash tests/gpu/check.sh
#
# Settings (environment): VQA_GPU_BUDGET_S (default 450: the seconds from
# the start within which every stage must end; 0: no budget; the bench
# stops starting rows 40 s before it, which the tests' stage needs),
# VQA_GPU_BENCH (default 1; 0 leaves the bench out; VQA_GPU_BENCH_S, the
# seconds it may take at most; its settings, as
# jobs/bench_gpu.sh reads them: VQA_GPU_BENCH_BATCHES "16 64",
# VQA_GPU_BENCH_STEPS 8, VQA_GPU_BENCH_PRECISIONS "bf16 fp16",
# VQA_GPU_BENCH_COMPILE "default reduce-overhead"), VQA_GPU_PEAK_TFLOPS (default 989, an H100/H200's
# dense bf16), VQA_GPU_EPOCHS (default 4: the first warms up, the median of
# the others is quoted; the bundle's 532 questions make 17 optimiser steps of
# 2 x 16 per epoch, the last one short), VQA_GPU_BATCH (per micro-step, default 16), VQA_GPU_STEPS
# (optimiser steps per epoch, default 0: all), VQA_GPU_PRESET
# (default base), VQA_GPU_UNTIL (the last stage to run: prefix, preflight,
# build, bench, communicator, graph, sweep or train, the default), VQA_GPU_SWEEP (stage sweep,
# below), TORCH_DIR (LibTorch's CMake folder; default: the one of
# python3's torch), VQA_GPU_WORK (default .gpu-check/work: the prefix and
# the build; a second call reuses the build), VQA_GPU_DEVICE=cpu (a dry run
# of the route on a machine without a GPU: stage 3 trains on the CPU; use a
# small VQA_GPU_PRESET and VQA_GPU_STEPS there).
set -euo pipefail
cd "$(dirname "$0")/../.."
source_dir=$PWD
bundle=$source_dir/.gpu-check
out=${OUT:-$bundle/out}
mkdir -p "$out"
work=${VQA_GPU_WORK:-$bundle/work}
mkdir -p "$work"
device=${VQA_GPU_DEVICE:-cuda}
epochs=${VQA_GPU_EPOCHS:-4}
batch=${VQA_GPU_BATCH:-16}
preset=${VQA_GPU_PRESET:-base}
peak_tflops=${VQA_GPU_PEAK_TFLOPS:-989}
logs=$work/logs
rm -rf "$logs"
mkdir -p "$logs"
summary=$out/summary.txt
: >"$summary"
budget=${VQA_GPU_BUDGET_S:-450}
[[ $budget =~ ^[0-9]+$ ]] || { echo "gpu-check: VQA_GPU_BUDGET_S must be a whole number of seconds, got '$budget'" >&2; exit 2; }
check_start=$(date +%s)
say() { printf 'gpu-check: %s\n' "$*" | tee -a "$summary"; }
die() { say "FAILED: $*"; exit 1; }
stage_start=0
stage() { stage_start=$(date +%s); stage_name=$1; }
left_out=()  # stages the budget left out
failed=()    # failures that let the later stages run (the bench's)
# limited CMD...: CMD, stopped (TERM, KILL 10 s later) at the budget's end
# + 60 s, or after 900 s without a budget: a hang ends with status 124.
limited() {
  local seconds=900
  ((budget > 0)) && seconds=$((check_start + budget + 60 - $(date +%s)))
  ((seconds < 30)) && seconds=30
  timeout --kill-after=10 "$seconds" "$@" </dev/null  # no terminal read from the background
}
why_failed() {  # STATUS: why a run failed, for die
  if (($1 == 124 || $1 == 137)); then echo " (stopped: past the budget's end + 60 s)"; else echo " (exit $1)"; fi
}
# train_or_die LOG WHAT ARG...: vqa_train on 1 rank with ARGs, its output in
# $logs/LOG; on failure the log's end and the check fails naming WHAT.
train_or_die() {
  local log=$logs/$1 what=$2 status=0
  shift 2
  limited mpirun -np 1 "$work/build/vqa_train" "$@" >"$log" 2>&1 || status=$?
  ((status == 0)) || { tail -n 30 "$log"; die "$what$(why_failed "$status")"; }
}
until_stage=${VQA_GPU_UNTIL:-train}
case $until_stage in prefix | preflight | build | bench | communicator | graph | sweep | train) ;; *)
  echo "gpu-check: VQA_GPU_UNTIL must be prefix, preflight, build, bench, communicator, graph, sweep or train, got '$until_stage'" >&2
  exit 2 ;;
esac
stop_if_last() {
  if [[ $stage_name == "$until_stage" && $until_stage != train ]]; then
    say "stopped after stage $stage_name (VQA_GPU_UNTIL); $(($(date +%s) - check_start)) s in all"
    exit 0
  fi
}
stage_done() {
  say "stage $stage_name: $(($(date +%s) - stage_start)) s ok"
  stop_if_last
}
# budget_left: seconds left of VQA_GPU_BUDGET_S (a large number without one).
budget_left() {
  if ((budget == 0)); then echo 1000000; else echo $((check_start + budget - $(date +%s))); fi
}
# stage_fits NAME SECONDS: starts stage NAME when the budget has SECONDS
# left (its estimate on a GPU: the H200 run's time with room to spare); else
# the summary says it was left out, and why, and it returns 1.
stage_fits() {
  stage "$1"
  local left
  left=$(budget_left)
  ((left >= $2)) && return 0
  say "stage $1: not run: ${left} s left of VQA_GPU_BUDGET_S=$budget, it takes about $2 s"
  left_out+=("$1")
  stop_if_last
  return 1
}

# ---- 0. the prefix with Open MPI, HDF5, Boost, OpenCV -------------------------
stage prefix
prefix=$work/prefix
rm -rf "$prefix"
mkdir -p "$prefix" "$work/bin"
rm -rf "${work:?}/lib"
if compgen -G "$bundle/debs/*.deb" >/dev/null; then
  for deb in "$bundle"/debs/*.deb; do dpkg -x "$deb" "$prefix"; done
else
  die "no $bundle/debs/*.deb: run tests/gpu/make_bundle.sh on a Debian 12 machine first"
fi
usr=$prefix/usr
lib=$usr/lib/x86_64-linux-gnu
# Links to absolute paths (zlib1g-dev's libz.so -> /lib/...) point into the
# prefix instead.
while IFS= read -r link; do
  ln -sfn "$prefix$(readlink "$link")" "$link"
done < <(find "$prefix" -type l -lname '/*')
# Debian's alternatives links are not in the packages: name the tools.
for tool in mpirun mpiexec mpicc mpicxx; do ln -sf "$usr/bin/$tool.openmpi" "$work/bin/$tool"; done
# h5pcc is a script with Debian's /usr in it.
sed "s#/usr#$usr#g" "$usr/bin/h5pcc.openmpi" >"$work/bin/h5pcc" && chmod +x "$work/bin/h5pcc"
# h5pcc, which CMake's FindHDF5 tries on a minimal program, links HDF5's
# static libraries with -lcrypto -lcurl -lsz -lz: the linker looks in the
# prefix (LIBRARY_PATH) and finds libcrypto.so and libcurl.so where their
# -dev packages (not in the bundle) would make them.
mkdir -p "$work/lib"
for name in crypto curl; do
  for file in "$lib/lib$name.so".[0-9]*; do ln -sf "$file" "$work/lib/lib$name.so"; break; done
done
export LIBRARY_PATH=$work/lib:$lib
export OPAL_PREFIX=$usr  # Open MPI relocated: its wrappers and components under the prefix
export PATH=$work/bin:$usr/bin:$PATH
# libpsm_infinipath.so.1 is an alternatives link too (to libpsm1/); UCX's
# transport modules in ucx/ need their sibling libuct_ib.so.0.
for psm in "$usr"/lib/libpsm1/*.so.*; do
  [[ -e $psm ]] && ln -sf "$psm" "$lib/$(readelf -d "$psm" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')"
done
export LD_LIBRARY_PATH=$lib/openmpi/lib:$lib/hdf5/openmpi:$lib:$lib/ucx:$prefix/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG_PATH=$lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$prefix
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One host: Open MPI's launcher without ssh or rsh (its rsh launcher refuses
# to start, even for -np 1, when neither is on PATH).
export OMPI_MCA_plm=isolated
stage_done

# ---- preflight: what the build and the runs need, before building -------------
stage preflight
python=${PYTHON:-python3}
missing_tools=()
for tool in cmake ninja c++ "$python" pkg-config mpirun; do
  command -v "$tool" >/dev/null || missing_tools+=("$tool")
done
((${#missing_tools[@]} == 0)) || die "missing tools: ${missing_tools[*]}"
# Every unpacked library and program must find its libraries, OpenCV's
# aside: only vqa_prep loads them (its image codecs need GDAL, TIFF, WebP,
# ...), and the check neither builds nor runs it (the bundle carries OpenCV
# for the configure step, and its datasets are made on the Debian host).
not_found=$(find "$usr/lib" "$usr/bin" "$prefix/lib" -type f \( -name '*.so*' -o -perm -u+x \) \
  -not -name 'libopencv_*' \
  2>/dev/null | while IFS= read -r file; do
  { ldd "$file" 2>/dev/null || true; } | { grep 'not found' || true; } | sed "s#^#${file#"$prefix"}: #"
done | sort -u)
if [[ -n $not_found ]]; then
  printf '%s\n' "$not_found" | head -n 40 | sed 's/^/gpu-check:   /' | tee -a "$summary"
  die "libraries not found (add their packages to tests/gpu/make_bundle.sh)"
fi
mpirun -np 1 hostname >"$logs/mpirun_hostname.log" 2>&1 || { cat "$logs/mpirun_hostname.log"; die "mpirun -np 1 hostname"; }
torch_line=$("$python" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())') ||
  die "python cannot import torch ($python)"
say "  torch, CUDA, GPU usable: $torch_line"
if [[ $device == cuda ]]; then
  [[ $torch_line == *True ]] || die "torch sees no usable GPU"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/gpu-check:   /' | tee -a "$summary"
fi
stage_done

# ---- 1. build against the CUDA LibTorch with NCCL -------------------------------
# The test programs with a CUDA branch, and their folders under tests/ (none
# of them needs vqa_prep or OpenCV, which the bundle cannot load).
gpu_tests=(test_communicator test_loader test_checkpoint_device)
declare -A gpu_test_dirs=([test_communicator]=runtime [test_loader]=data [test_checkpoint_device]=train)
stage build
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
  "${nccl_flags[@]}" >"$logs/configure.log" 2>&1 || { tail -n 30 "$logs/configure.log"; die "configure"; }
grep 'vqa-hpc:' "$logs/configure.log" | sed 's/^-- /gpu-check:   /' | tee -a "$summary"
cmake --build "$work/build" --parallel "$(nproc)" --target vqa_train vqa_project vqa_allreduce_bench \
  "${gpu_tests[@]}" >"$logs/build.log" 2>&1 || { grep -A8 -E 'error|FAILED' "$logs/build.log" | head -n 60; die "build"; }
stage_done

# ---- bench: vqa_train and PyTorch side by side (jobs/bench_gpu.sh) -----------------
# The table first: what a short call on a GPU machine is for. On the bundle's
# bench384.h5 (8 steps of 64, 35 of 16), rows in the order bench_gpu.sh
# gives them, none started after the budget less the 40 s the tests' stage
# needs; table.txt is rewritten after each row, so a call cut off still
# returns what it measured. Each vqa_train row takes about 15 s on an H200,
# a PyTorch eager one about 20 s, a torch.compile one 60-120 s.
if [[ ${VQA_GPU_BENCH:-1} != 0 ]] && stage_fits bench 60; then
  # The rows stop 40 s before the budget's end (the tests' stage), or after
  # VQA_GPU_BENCH_S seconds of the bench when that comes first.
  bench_end=0
  ((budget > 0)) && bench_end=$((check_start + budget - 40))
  if [[ -n ${VQA_GPU_BENCH_S:-} ]]; then
    own_end=$(($(date +%s) + VQA_GPU_BENCH_S))
    ((bench_end == 0 || own_end < bench_end)) && bench_end=$own_end
  fi
  bench_deadline=()
  ((bench_end > 0)) && bench_deadline=("DEADLINE=$bench_end")
  env "${bench_deadline[@]}" DEVICE="$device" PYTHON="$python" DATA="$bundle/bench384.h5" \
    OUT_DIR="$logs/bench_gpu" BATCHES="${VQA_GPU_BENCH_BATCHES:-16 64}" \
    STEPS="${VQA_GPU_BENCH_STEPS:-8}" PRECISIONS="${VQA_GPU_BENCH_PRECISIONS:-bf16 fp16}" \
    COMPILE_MODES="${VQA_GPU_BENCH_COMPILE-default reduce-overhead}" PRESET="$preset" \
    PEAK_TFLOPS="$peak_tflops" bash "$source_dir/jobs/bench_gpu.sh" "$work/build" \
    >"$logs/bench_gpu.log" 2>&1 || bench_status=$?
  cp "$logs/bench_gpu/table.txt" "$logs/bench_gpu/table.csv" "$logs/bench_gpu/rows.jsonl" "$out/" 2>/dev/null || true
  [[ -f $out/table.txt ]] && sed 's/^/gpu-check:   /' "$out/table.txt" | tee -a "$summary"
  if ((${bench_status:-0} != 0)); then
    tail -n 40 "$logs/bench_gpu.log"
    failed+=("bench_gpu.sh (exit $bench_status; rows that ran are in table.txt)")
    say "stage bench: FAILED (exit $bench_status, $logs/bench_gpu.log); the later stages run"
  else
    stage_done
  fi
fi

# ---- 2. the tests with a CUDA branch and the NCCL allreduce benchmark ----------
# Each test program whose cases have a CUDA branch, whole (its CPU cases too),
# on 2 ranks where the machine has 2 GPUs or more (a reduction on 1 rank
# returns its input, so only 2 ranks can catch a wrong sum or average), else
# on 1 rank, which the summary says. On a GPU machine no case may skip; on the
# CPU (a dry run) the CUDA cases skip, and the programs exit 77 for it.
if stage_fits communicator 40; then
  gpu_count=0
  [[ $device == cuda ]] && gpu_count=$("$python" -c 'import torch; print(torch.cuda.device_count())')
  test_ranks=1
  ((gpu_count >= 2)) && test_ranks=2
  for test in "${gpu_tests[@]}"; do
    ranks=$test_ranks
    [[ $test == test_checkpoint_device ]] && ranks=1  # one process; it uses every GPU it sees
    test_log=$logs/$test.log
    status=0
    limited mpirun -np "$ranks" "$work/build/tests/${gpu_test_dirs[$test]}/$test" --gtest_color=no \
      >"$test_log" 2>&1 || status=$?
    skipped=$(grep -cE '^\[  SKIPPED \] [A-Za-z]' "$test_log" || true)
    passed=$(grep -cE '^\[       OK \]' "$test_log" || true)
    if ((status != 0 && status != 77)); then
      tail -n 40 "$test_log"
      die "$test on $ranks rank(s)$(why_failed "$status")"
    fi
    say "  $test on $ranks rank(s): $passed passed, $skipped skipped"
    # With a GPU every case must run: a SKIP there means CUDA or NCCL was not usable.
    if [[ $device == cuda ]] && ((skipped > 0 || status != 0)); then
      grep -E '^\[  SKIPPED \]' "$test_log" | sed 's/^/gpu-check:   /' | tee -a "$summary"
      die "$test skipped cases on a GPU machine"
    fi
  done
  if [[ $device == cuda ]]; then
    ((test_ranks == 2)) ||
      say "  1 rank only: this machine has $gpu_count GPU; NCCL refuses two ranks on one GPU, so the reductions across ranks are not checked here"
    status=0
    limited mpirun -np "$test_ranks" "$work/build/vqa_allreduce_bench" --backend nccl --device cuda -b 1M -e 256M -f 4 \
      >"$logs/allreduce_bench.log" 2>&1 || status=$?
    ((status == 0)) || { tail -n 20 "$logs/allreduce_bench.log"; die "vqa_allreduce_bench$(why_failed "$status")"; }
    grep -v '^#' "$logs/allreduce_bench.log" | tail -n 3 | sed 's/^/gpu-check:   /' | tee -a "$summary"
  fi
  stage_done
fi

# ---- 2b. graph: a CUDA-graph run against the eager run, 20 steps -------------------
# The same 20 optimiser steps (5 epochs of 4, batch VQA_GPU_BATCH, bfloat16,
# dropout 0 so that no random draw differs) with --cuda-graph true and with
# --trim-text-padding false (the captured run pads questions the same way;
# on the CPU, where nothing is captured and the option changes nothing, the
# eager run trims them as the graph run does).
# Tolerance: each epoch's mean training loss within 1e-2 relative. Then the
# projection to 8 and 64 GPUs from each run (vqa_project) on four fabrics. A replay
# runs the kernels the eager step launches, on the same inputs, so only
# bfloat16 rounding in kernels whose reduction order may differ between a
# captured and an eager launch (cuBLAS's choice of algorithm for a stream) is
# allowed for: bfloat16 keeps 8 bits (3.9e-3 relative per rounding), and 20
# steps of AdamW carry a difference forward.
# On the CPU (a dry run: no graph, the reference BLAS of the bare root) 2
# epochs of 2 steps.
if stage_fits graph 90; then
  graph_precision=bf16 graph_epochs=5 graph_steps=4
  [[ $device == cpu ]] && graph_precision=fp32 graph_epochs=2 graph_steps=2
  graph_flags=(--train-data "$bundle/synth384.h5" --preset "$preset" --device "$device"
    --global-batch "$batch" --batch-per-rank "$batch" --precision "$graph_precision" --dropout 0
    --epochs "$graph_epochs" --max-steps-per-epoch "$graph_steps" --eval-every 0 --save-every 0
    --progress off)
  eager_padding=(--trim-text-padding false)
  [[ $device == cpu ]] && eager_padding=()
  rm -rf "$work/run-graph" "$work/run-eager" "$work/run-eager-nocopy"
  train_or_die graph.log "CUDA graph run" "${graph_flags[@]}" --out "$work/run-graph" --cuda-graph true
  train_or_die graph_eager.log "eager run beside the CUDA graph run" "${graph_flags[@]}" \
    --out "$work/run-eager" "${eager_padding[@]}"
  # The eager run again with the batches copied on the compute stream: the
  # side stream's copies (--copy-stream, the default) run the same kernels on
  # the same values. On the CPU the losses must be equal to the last bit. On
  # a GPU two eager runs are not bit-identical: the fused attention's
  # backward accumulates with atomics in no fixed order (nothing sets
  # deterministic algorithms), so the same 1e-2 relative as the graph's
  # comparison below, for the same reason (bf16 rounding carried by AdamW).
  copy_tolerance=1e-2
  [[ $device == cpu ]] && copy_tolerance=0
  train_or_die graph_eager_nocopy.log "eager run with --copy-stream false" "${graph_flags[@]}" \
    --out "$work/run-eager-nocopy" "${eager_padding[@]}" --copy-stream false
  "$python" - "$work/run-eager/metrics.jsonl" "$work/run-eager-nocopy/metrics.jsonl" "$copy_tolerance" \
    <<'PY' | tee -a "$summary" || die "the side stream's copies changed the losses (above)"
import json, sys
side, plain = ([json.loads(l)["train_loss"] for l in open(p)] for p in sys.argv[1:3])
tolerance = float(sys.argv[3])
worst = max((abs(a - b) / abs(b) for a, b in zip(side, plain)), default=float("inf"))
print(f"gpu-check:   --copy-stream true / false: losses {side} / {plain}: worst relative "
      f"difference {worst:.2e} (tolerance {tolerance:g})")
sys.exit(0 if len(side) == len(plain) > 0 and worst <= tolerance else 1)
PY
  if [[ $device == cpu ]]; then
    grep -q 'CUDA graph: eager steps (the device is the CPU)' "$logs/graph.log" ||
      die "the CPU run did not say why it took no CUDA graph"
    graph_tolerance=0
  else
    grep -q 'CUDA graph: captured' "$logs/graph.log" || die "no CUDA graph was captured (graph.log)"
    graph_tolerance=1e-2
  fi
  say "  $(grep -m1 -o 'CUDA graph: [a-z].*' "$logs/graph.log")"
  "$python" - "$work/run-graph/metrics.jsonl" "$work/run-eager/metrics.jsonl" "$graph_tolerance" \
    "$graph_epochs" "$graph_steps" <<'PY' | tee -a "$summary" || die "CUDA graph and eager losses differ (above)"
import json, sys
graph, eager = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
tolerance, epochs, steps = float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
worst = max(abs(g["train_loss"] - e["train_loss"]) / abs(e["train_loss"]) for g, e in zip(graph, eager))
rate = lambda runs: sorted(r["samples_per_second"] for r in runs[1:])[len(runs[1:]) // 2]
print(f"gpu-check:   graph vs eager, {len(graph)} epochs of {steps} steps: losses "
      f"{', '.join('%.5f/%.5f' % (g['train_loss'], e['train_loss']) for g, e in zip(graph, eager))}; "
      f"worst relative difference {worst:.2e} (tolerance {tolerance:g}); samples/s "
      f"{rate(graph):.1f} graph, {rate(eager):.1f} eager (medians after the first epoch)")
sys.exit(0 if len(graph) == len(eager) == epochs and worst <= tolerance else 1)
PY
  # The scaling figures from both 1-GPU runs (their last epoch's diagnosis.json):
  # what the faster step costs in communication on each fabric. Whole tables
  # in $logs/projection_RUN_FABRIC.txt; the summary keeps 8 and 64 ranks.
  for fabric in nvlink-h100 ib-ndr pcie-no-p2p 1gbe; do
    for run in graph eager; do
      "$work/build/vqa_project" "$work/run-$run/diagnosis.json" --fabric "$fabric" --max-ranks 64 \
        >"$logs/projection_${run}_$fabric.txt" 2>&1 ||
        { cat "$logs/projection_${run}_$fabric.txt"; die "vqa_project on the $run run"; }
      say "  projection $fabric, $run step: $(awk '$1 == 8 || $1 == 64 { b = $8; for (i = 9; i <= NF; i++) b = b " " $i; printf "%s ranks %s samples/s efficiency %s (%s); ", $1, $6, $7, b }' "$logs/projection_${run}_$fabric.txt")"
    done
  done
  stage_done
fi

# ---- sweep (optional): samples/s of the preset by precision and batch -----------
# VQA_GPU_SWEEP="bf16:16 bf16:64 fp32:16 bf16:16:--packed-attention=off": each
# entry (precision:batch per step[:one more flag]) trains 3 epochs, no
# evaluation, no checkpoint; the median samples/s of the last two and the step
# phases are printed. Whether samples/s grows with the batch tells a
# launch-bound step (the host queues kernels slower than the GPU runs them)
# from a compute-bound one.
if [[ -n ${VQA_GPU_SWEEP:-} ]]; then
  stage sweep
  for entry in $VQA_GPU_SWEEP; do
    IFS=: read -r sweep_precision sweep_batch sweep_flag <<<"$entry"
    sweep_log=$logs/sweep_${sweep_precision}_${sweep_batch}.log
    rm -rf "$work/run-sweep"
    # shellcheck disable=SC2086 # the optional flag is one word or none
    limited mpirun -np 1 "$work/build/vqa_train" --train-data "$bundle/synth384.h5" --preset "$preset" \
      --device "$device" --global-batch "$sweep_batch" --batch-per-rank "$sweep_batch" --progress off \
      --precision "$sweep_precision" --epochs 3 --save-every 0 --eval-every 0 \
      --max-steps-per-epoch "${VQA_GPU_STEPS:-0}" --out "$work/run-sweep" ${sweep_flag:-} \
      >>"$sweep_log" 2>&1 || { tail -n 20 "$sweep_log"; die "sweep entry $entry"; }
    say "  $entry: $("$python" -c 'import json, sys; r = sorted(json.loads(l)["samples_per_second"] for l in open(sys.argv[1]).readlines()[1:]); print("%.1f samples/s" % r[len(r) // 2])' "$work/run-sweep/metrics.jsonl");$(grep '^  step ' "$sweep_log" | tail -n 1)"
  done
  stage_done
fi

# ---- 3. a short bf16 training run of the base preset ------------------------------
if stage_fits train 150; then
  memory_log=$logs/gpu_memory.csv
  if command -v nvidia-smi >/dev/null && [[ $device == cuda ]]; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$memory_log" &
    sampler=$!
  fi
  precision=bf16
  [[ $device == cpu ]] && precision=fp32
  # Every epoch evaluates and saves; 2 accumulation steps; bfloat16 buckets.
  common_flags=(--train-data "$bundle/synth384.h5" --preset "$preset" --device "$device"
    --global-batch $((2 * batch)) --batch-per-rank "$batch" --bf16-allreduce true --progress off
    --max-steps-per-epoch "${VQA_GPU_STEPS:-0}")
  train_flags=("${common_flags[@]}" --out "$work/run" --eval-every 1 --save-every 1)
  rm -rf "$work/run" "$work/run-fp16"
  train_or_die train.log "training run" "${train_flags[@]}" --precision "$precision" --epochs "$epochs"
  cp "$work/run/metrics.jsonl" "$out/metrics.jsonl"
  # One more epoch from the last checkpoint.
  train_or_die train_resume.log "resumed training run" "${train_flags[@]}" --precision "$precision" \
    --epochs $((epochs + 1)) --resume auto
  grep -q 'resumed from' "$logs/train_resume.log" || die "the resumed run did not say 'resumed from'"
  say "  resume: $(grep -m1 -o 'resumed from.*' "$logs/train_resume.log")"
  # float16 with dynamic loss scaling (on the CPU: the scaler around float32).
  train_or_die train_fp16.log "fp16 training run" "${common_flags[@]}" --out "$work/run-fp16" \
    --precision fp16 --epochs 2 --save-every 0 --eval-every 0
  say "  fp16: $("$python" -c 'import json, sys; r = json.loads(open(sys.argv[1]).readlines()[-1]); print("loss %.4f, loss scale %g, skipped steps %d, samples/s %.1f" % (r["train_loss"], r.get("loss_scale", 0), r["skipped_steps"], r["samples_per_second"]))' "$work/run-fp16/metrics.jsonl")"
  [[ -n ${sampler:-} ]] && kill "$sampler" 2>/dev/null
  {
    grep -m1 '^model:' "$logs/train.log" || true
    grep '^  step ' "$logs/train.log" | tail -n 1 || true
    grep 'memory per rank' "$logs/train.log" | tail -n 1 || true
  } | sed 's/^/gpu-check:   /' | tee -a "$summary"
  "$python" - "$out/metrics.jsonl" "$logs/train.log" "${memory_log:-}" "$peak_tflops" \
    "$source_dir/jobs" <<'PY' | tee -a "$summary"
import json, sys
metrics, log, memory, peak = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
sys.path.insert(0, sys.argv[5])
from model_flops import forward_flops, model_sizes  # jobs/bench_gpu.sh's formula too
epochs = [json.loads(line) for line in open(metrics)]
timed = sorted(e["samples_per_second"] for e in epochs[1:] or epochs)  # the first warmed up
sizes = model_sizes(next(l for l in open(log) if l.startswith("model:")))
# 32 question tokens: M3AE's length (the synthetic set pads to it or less).
forward = forward_flops(sizes, 32)
rate = timed[len(timed) // 2]
mfu = 3 * forward * rate / (peak * 1e12)
print(f"gpu-check:   samples/s {rate:.1f} (median of {len(timed)} epochs after the first; "
      f"{', '.join(f'{r:.1f}' for r in timed)}); model FLOPs {3 * forward / 1e9:.1f} G per sample "
      f"(forward x3); utilisation {100 * mfu:.1f}% of {peak:.0f} TFLOP/s")
if memory:
    try:
        used = [int(x) for x in open(memory).read().split() if x.isdigit()]
        print(f"gpu-check:   peak GPU memory {max(used) / 1024:.1f} GiB (nvidia-smi, whole process)")
    except (OSError, ValueError):
        print("gpu-check:   peak GPU memory: not sampled")
PY
  stage_done
fi
where="logs in $logs (on this machine); summary and table in $out"
((${#failed[@]} == 0)) || die "${failed[*]}; $where"
((${#left_out[@]} == 0)) || where="left out by the budget: ${left_out[*]} (VQA_GPU_BENCH=0 in a second call runs them); $where"
say "$( ((${#left_out[@]} == 0)) && echo "all stages passed" || echo "the stages that ran passed"); $where"
