#!/usr/bin/env bash
# vqa_train and PyTorch side by side on one GPU, in one run: the same model
# (the base preset: M3AE's), the same batch, one rank. Per batch size:
#   vqa-hpc                   vqa_train in bf16, fp16 (loss scaling) and fp32
#                             (its default --tf32 false, LibTorch's: no TF32 in
#                             matrix products; cuDNN's convolution, the patch
#                             embedding, uses it either way)
#   vqa-hpc-graph             vqa_train in bf16 with --cuda-graph true (each
#                             step's forward and backward replayed as one CUDA
#                             graph; GRAPH=0 leaves the row out)
#   vqa-hpc-crop              the same with --augment resized-crop (SLAKE's
#                             random resized crop of 512 px sources, on the
#                             default crop threads): does the loader keep up
#                             with the fast step? (CROP=0 leaves it out)
#   vqa-hpc-no-copies         vqa_train in the first precision with
#                             --weight-copies false (autocast casts each
#                             weight at every use, as PyTorch does): what the
#                             bf16 copies of the weights are worth (COPIES=0
#                             leaves it out)
#   pytorch-eager             jobs/ddp_reference.py as a PyTorch user who knows
#                             the library writes it: bf16 autocast,
#                             F.scaled_dot_product_attention, fused AdamW, no DDP
#                             on one GPU, TF32 left at PyTorch's defaults
#   pytorch-compile-MODE      the same under torch.compile(mode=MODE), per COMPILE_MODES
# and prints one table (written to OUT_DIR/table.txt and table.csv). The
# rows run in the order of what the comparison needs most: vqa-hpc in the
# first precision and PyTorch eager at each batch, then the graph rows, the
# rows without weight copies, the torch.compile modes, the crop rows, the
# other precisions; the table is
# written again after every row, so a run cut short leaves what it measured.
#
#   jobs/bench_gpu.sh [BUILD_DIR] [extra vqa_train flags]
#
# Columns:
#   samples/s     batch / the median step time of the timed steps (CUDA events
#                 on a GPU, the host clock on the CPU). vqa_train: its second
#                 epoch of STEPS steps (the first warms up); PyTorch: STEPS steps
#                 after WARMUP untimed ones
#   MFU_%         model FLOP utilisation: the model's matrix products counted
#                 from its sizes for MAX_LEN question tokens, forward x3, over
#                 PEAK_TFLOPS (the same formula as tests/gpu/check.sh)
#   peak_GiB      the timed steps' peak: GPU memory allocated by the caching
#                 allocator; on the CPU the resident set's high-water mark
#   ops/step      operators dispatched on the host per step, and
#   kernels/step  GPU kernels per step (copies left out; "K/G graphs" when G
#                 CUDA graph launches replay them), both from the profiler over
#                 2 steps (vqa_train: --profile over the last 2 steps of its
#                 first epoch; PyTorch: torch.profiler over 2 steps after the
#                 timed ones, counted the same way)
#   data_%        vqa_train: rank 0's wait for the loader's next batch, in
#                 % of its mean step (the timed epoch's phase timers)
#   host_ms       wall time per step the host spends inside operators (the union
#                 of their intervals on every host thread, same 2 steps). Under
#                 the profiler, which adds its own cost to every operator:
#                 compare rows with each other, not with the step time. It
#                 leaves out the host's own code between operators, and when the
#                 GPU is behind it includes waits for room in the launch queue.
#                 (table.csv's host_cpu_ms: PyTorch's process CPU time per timed
#                 step, without the profiler)
#   gpu_idle_ms   per step, the GPU's time between kernels (same 2 steps)
#   warmup_s      PyTorch: wall time of the WARMUP untimed steps; with
#                 torch.compile it includes compilation (the eager row's is the
#                 same steps without it)
# Then the ratios vqa-hpc bf16 / PyTorch eager and / the best compile mode.
# What differs between the two: vqa_train reads every batch from its HDF5
# file (inside its step time) and computes each batch up to its longest
# question; the reference's batches are made on the GPU beforehand and
# computed on all MAX_LEN tokens, as M3AE pads them. A PyTorch without
# torch.compile (or without F.scaled_dot_product_attention or fused AdamW)
# gives rows saying so (the explicit attention, foreach AdamW instead).
#
# Settings (environment):
#   DEVICE=cuda           cuda | cpu (a dry run: every row on the CPU, both in
#                         float32, whatever the precision, as vqa_train on the
#                         CPU; VQA_GPU_DEVICE is read too)
#   PRESET=base           model preset, for both
#   IMAGE_SIZE=384        synthetic images' side
#   MAX_LEN=32            tokens per question, padding included (M3AE's length)
#   BATCHES="16 64"       samples per step (one rank, no accumulation)
#   STEPS=20              timed steps (vqa_train: steps per epoch; at least 3)
#   WARMUP=10             PyTorch's untimed steps (compilation happens in them)
#   PRECISIONS="bf16 fp16 fp32"           vqa_train's rows
#   GRAPH=1               the vqa-hpc-graph row (in the first precision)
#   COPIES=1              the vqa-hpc-no-copies row (in the first precision,
#                         unless that is fp32, where copies change nothing)
#   CROP=1                the vqa-hpc-crop row (needs a dataset with source
#                         images: vqa_prep synth --source-size)
#   COMPILE_MODES="default reduce-overhead"   torch.compile rows ("" for none)
#   PEAK_TFLOPS=989       the GPU's dense bf16 peak (H100 / H200)
#   RUN_TIMEOUT=600       seconds one run may take (0: no limit); a run past it
#                         is ended and its row says so, and the others go on
#   DEADLINE=             a time (seconds since 1970, `date +%s`) after which no
#                         run starts, and which no run outlives: a run that
#                         cannot start for it, or an estimate that says it
#                         would not end before it, gets a row saying so
#                         (the estimate: the same kind of run's time so far,
#                         else ESTIMATE_VQA=30, ESTIMATE_EAGER=30,
#                         ESTIMATE_COMPILE=120 seconds)
#   DATA=                 a dataset made beforehand, for a build without vqa_prep
#                         (the GPU check builds vqa_train alone), made with
#                         vqa_prep synth -o FILE --image-size 384 --max-len 32
#                         --vocab-size 50265 --train-questions 1920
#                         --test-questions 8 --questions-per-image 64
#                         --source-size 512
#                         ((WARMUP + STEPS) x the largest batch; MAX_LEN tokens)
#   PYTHON=               python3 if it imports torch, else /usr/bin/python3
#   DDP_FLAGS=            more jobs/ddp_reference.py flags (they win)
#   OUT_DIR=runs/bench_gpu   table.txt, table.csv, rows.jsonl, logs/
# With BUILD_DIR the GPU check's (tests/gpu/check.sh: .gpu-check/work/build),
# the script runs with that check's prefix of Open MPI and HDF5.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
device=${DEVICE:-${VQA_GPU_DEVICE:-cuda}}
preset=${PRESET:-base}
image_size=${IMAGE_SIZE:-384}
max_len=${MAX_LEN:-32}
read -r -a batches <<<"${BATCHES:-16 64}"
steps=${STEPS:-20}
warmup=${WARMUP:-10}
read -r -a precisions <<<"${PRECISIONS:-bf16 fp16 fp32}"
graph=${GRAPH:-1}
copies=${COPIES:-1}
crop=${CROP:-1}
read -r -a compile_modes <<<"${COMPILE_MODES-default reduce-overhead}"
peak_tflops=${PEAK_TFLOPS:-989}
run_timeout=${RUN_TIMEOUT:-600}
out_dir=${OUT_DIR:-runs/bench_gpu}
data=${DATA:-}
deadline=${DEADLINE:-}

die() {
  echo "bench_gpu.sh: $*" >&2
  exit 1
}
positive() { [[ $2 =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer, got '$2'"; }
[[ $device == cuda || $device == cpu ]] || die "DEVICE must be cuda or cpu, got '$device'"
positive IMAGE_SIZE "$image_size"
positive MAX_LEN "$max_len"
positive STEPS "$steps"
((steps >= 3)) || die "STEPS must be at least 3 (the profile takes the first epoch's last 2 steps)"
[[ $warmup =~ ^[0-9]+$ ]] || die "WARMUP must be a non-negative integer, got '$warmup'"
((${#batches[@]})) || die "BATCHES is empty"
for b in "${batches[@]}"; do positive BATCHES "$b"; done
[[ $graph == 0 || $graph == 1 ]] || die "GRAPH must be 0 or 1, got '$graph'"
[[ $copies == 0 || $copies == 1 ]] || die "COPIES must be 0 or 1, got '$copies'"
[[ $crop == 0 || $crop == 1 ]] || die "CROP must be 0 or 1, got '$crop'"
for p in "${precisions[@]}"; do
  [[ $p == bf16 || $p == fp16 || $p == fp32 ]] || die "PRECISIONS takes bf16 fp16 fp32, got '$p'"
done
for m in "${compile_modes[@]}"; do
  [[ $m == default || $m == reduce-overhead || $m == max-autotune-no-cudagraphs ]] ||
    die "COMPILE_MODES takes default reduce-overhead max-autotune-no-cudagraphs, got '$m'"
done
[[ $peak_tflops =~ ^[0-9]+([.][0-9]+)?$ ]] || die "PEAK_TFLOPS must be a number, got '$peak_tflops'"
[[ $run_timeout =~ ^[0-9]+$ ]] || die "RUN_TIMEOUT must be a non-negative integer, got '$run_timeout'"
[[ -z $deadline || $deadline =~ ^[0-9]+$ ]] || die "DEADLINE must be seconds since 1970 (date +%s), got '$deadline'"
declare -A estimate=([vqa]=${ESTIMATE_VQA:-30} [eager]=${ESTIMATE_EAGER:-30} [compile]=${ESTIMATE_COMPILE:-120})
for kind in "${!estimate[@]}"; do positive "ESTIMATE_${kind^^}" "${estimate[$kind]}"; done
# run_limit KIND: sets limit (the timeout command for the next run) from
# RUN_TIMEOUT and DEADLINE, or returns 1 with `why` set when the run cannot
# end before DEADLINE by KIND's estimate.
run_limit() {
  local seconds=$run_timeout left
  limit=()
  if [[ -n $deadline ]]; then
    left=$((deadline - $(date +%s)))
    if ((left < ${estimate[$1]})); then
      why="not run: ${left} s left before DEADLINE, a $1 run takes about ${estimate[$1]} s"
      return 1
    fi
    ((seconds == 0 || left < seconds)) && seconds=$left
  fi
  ((seconds > 0)) && limit=(timeout --kill-after=10 "$seconds")
  return 0
}
[[ -x $build/vqa_train ]] || die "$build/vqa_train not found; build it or pass the build directory"

python=""
for candidate in ${PYTHON:+"$PYTHON"} python3 /usr/bin/python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c 'import torch' 2>/dev/null; then
    python=$candidate
    break
  fi
  [[ -n ${PYTHON:-} ]] && die "PYTHON=$PYTHON cannot import torch"
done
[[ -n $python ]] || die "no python3 that can import torch (Debian: python3-torch); set PYTHON"

# The GPU check's build links Open MPI and HDF5 from the check's own prefix:
# the environment tests/gpu/check.sh gives its runs (a copy of its lines;
# change both together).
check_work=$(cd "$build/.." && pwd)
if [[ -d $check_work/prefix/usr/lib/x86_64-linux-gnu/openmpi ]]; then
  usr=$check_work/prefix/usr
  lib=$usr/lib/x86_64-linux-gnu
  export OPAL_PREFIX=$usr PATH=$check_work/bin:$usr/bin:$PATH OMPI_MCA_plm=isolated
  export LD_LIBRARY_PATH=$lib/openmpi/lib:$lib/hdf5/openmpi:$lib:$lib/ucx:$check_work/prefix/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  if nccl_wheel=$("$python" -c 'import importlib.util as u; print(list(u.find_spec("nvidia.nccl").submodule_search_locations)[0])' 2>/dev/null); then
    export LD_LIBRARY_PATH=$nccl_wheel/lib:$LD_LIBRARY_PATH
  fi
fi
command -v mpirun >/dev/null || die "mpirun not found"

torch_version=$("$python" -c 'import torch; print(torch.__version__)')
if [[ $device == cuda ]]; then
  "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' ||
    die "DEVICE=cuda but PyTorch $torch_version ($python) sees no usable GPU; DEVICE=cpu for a dry run"
fi
# The reference as a PyTorch user would write it, where this PyTorch has it.
torch_flags=(--device "$device" --steps "$steps" --warmup-steps "$warmup")
if "$python" -c 'import sys, torch.nn.functional as F; sys.exit(0 if hasattr(F, "scaled_dot_product_attention") else 1)'; then
  torch_attention=sdpa
else
  torch_attention=explicit
fi
torch_flags+=(--attention "$torch_attention")
optimizer_note="foreach AdamW"
if [[ $device == cuda ]] && "$python" -c 'import inspect, sys, torch; sys.exit(0 if "fused" in inspect.signature(torch.optim.AdamW).parameters else 1)'; then
  torch_flags+=(--fused-adamw)
  optimizer_note="fused AdamW"
else
  torch_flags+=(--foreach)
fi
# On the CPU the reference computes in float32 (a dry run of the route, not a
# comparison); vqa_train's bf16 rows autocast there only with LibTorch 2.4 on.
torch_precision=bf16
torch_note="bf16 autocast, attention $torch_attention, $optimizer_note, no DDP on one GPU, TF32 at PyTorch's defaults"
if [[ $device == cpu ]]; then
  torch_precision=fp32
  torch_flags+=(--threads 1)
  torch_note="fp32, attention $torch_attention, $optimizer_note, DDP (gloo) at 1 rank, 1 thread as vqa_train"
fi

mkdir -p "$out_dir/logs"
logs=$out_dir/logs
rows=$out_dir/rows.jsonl
: >"$rows"
work=$(mktemp -d "${TMPDIR:-/tmp}/vqa-bench-gpu-XXXXXX")
trap 'rm -rf "$work"' EXIT

max_batch=$(printf '%s\n' "${batches[@]}" | sort -n | tail -n 1)
question_length=$max_len
if [[ -z $data ]]; then
  [[ -x $build/vqa_prep ]] ||
    die "no $build/vqa_prep to make the dataset: make it where there is one and pass DATA=FILE (see the header)"
  data=$work/synth.h5
  # WARMUP + STEPS steps of the largest batch (at least 1.5 x STEPS: synth
  # keeps about 9 in 10 of the questions asked for); 64 questions per image
  # keep the file small (about 40 MB at the defaults, 30 MB of it the crop's
  # sources of 4/3 the image size).
  "$build/vqa_prep" synth -o "$data" --image-size "$image_size" --max-len "$max_len" \
    --vocab-size 50265 --questions-per-image 64 --test-questions 8 \
    --source-size $((image_size * 4 / 3)) \
    --train-questions $(((steps + (warmup > (steps + 1) / 2 ? warmup : (steps + 1) / 2)) * max_batch)) \
    >/dev/null
  inspect=$("$build/vqa_prep" inspect "$data" --records 0)
  question_length=$(sed -nE 's/^answers: .*; max question length ([0-9]+).*/\1/p' <<<"$inspect")
  [[ -n $question_length ]] || die "could not read the question length from vqa_prep inspect"
  train_questions=$(sed -nE 's/^\[train\] ([0-9]+) questions.*/\1/p' <<<"$inspect")
  ((train_questions >= steps * max_batch)) ||
    die "the synthetic set has $train_questions questions, fewer than STEPS x $max_batch"
fi
[[ -r $data ]] || die "DATA=$data cannot be read"

mpirun_flags=(--bind-to none)
[[ $(id -u) -eq 0 ]] && mpirun_flags+=(--allow-run-as-root)
vqa_threads=()
[[ $device == cpu ]] && vqa_threads=(--threads 1)
failures=0

# ddp_setup RUN_DIR: the reference's sizes and structure from vqa_train's
# "model:" line, parameter counts checked (stops the script if they differ).
# shellcheck source=jobs/ddp_setup.sh
source jobs/ddp_setup.sh

# row_json KIND FILE... : one JSON object for rows.jsonl from a run's outputs.
#   vqa NAME PRECISION BATCH RUN_DIR PROFILE   (metrics.jsonl, PROFILE.txt and the trace)
#   torch NAME PRECISION BATCH JSON            (ddp_reference.py's line)
#   note NAME PRECISION BATCH TEXT             (a row that did not run, and why)
row_json() {
  "$python" - "$@" <<'EOF'
import json, re, sys
kind, name, precision, batch = sys.argv[1:5]
row = {"impl": name, "precision": precision, "batch": int(batch)}
if kind == "vqa":
    run, profile = sys.argv[5:7]
    epochs = [json.loads(line) for line in open(run + "/metrics.jsonl") if line.strip()]
    last = epochs[-1]  # the second epoch; the first warmed up
    rank = last["per_rank"][0]
    row.update(samples_per_second=int(batch) / last["step_seconds"]["p50"],
               samples_per_second_mean=last["samples_per_second"],
               steps=last["optimizer_steps"], peak_memory_bytes=rank.get("peak_memory_bytes"),
               data_wait_percent=100 * rank["phases"]["data_wait"] / rank["step_mean"])
    try:
        text = open(profile + ".txt").read()
        row["operators_per_step"] = float(re.search(r"([0-9.]+) operators dispatched", text)[1])
        gpu = re.search(r"([0-9.]+) kernels launched, busy ([0-9.]+) ms, idle between kernels "
                        r"([0-9.]+) ms", text)
        if gpu:
            row.update(kernels_per_step=float(gpu[1]), gpu_idle_ms=float(gpu[3]))
        trace = json.load(open(profile))["traceEvents"]
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in trace if e.get("cat") == "operator")
        busy, reached = 0.0, None
        for start, end in spans:
            if reached is None or start >= reached:
                busy, reached = busy + end - start, end
            elif end > reached:
                busy, reached = busy + end - reached, end
        steps = int(re.search(r"profile of ([0-9]+) steps", text)[1])
        row["host_ms"] = busy / 1e3 / steps
    except (OSError, TypeError, ValueError, KeyError) as error:
        row["note"] = f"no profile ({error})"
elif kind == "torch":
    r = json.loads(open(sys.argv[5]).read().strip().splitlines()[-1])
    gpu_idle = r.get("gpu_idle_seconds_per_step")
    row.update(samples_per_second=r["samples_per_second_median"],
               samples_per_second_mean=r["samples_per_second"], steps=r["steps"],
               peak_memory_bytes=r.get("peak_memory_bytes"),
               operators_per_step=r.get("operators_per_step"),
               kernels_per_step=r.get("kernels_per_step"),
               graph_launches_per_step=r.get("graph_launches_per_step"),
               host_ms=1e3 * r["host_operator_seconds_per_step"],
               host_cpu_ms=1e3 * r["host_seconds_per_step"],
               gpu_idle_ms=None if gpu_idle is None else 1e3 * gpu_idle,
               warmup_seconds=r["warmup_seconds"], parameters=r["parameters"])
else:
    row["note"] = sys.argv[5]
print(json.dumps(row))
EOF
}

# run_vqa NAME PRECISION BATCH [IMPL [FLAG...]]: vqa_train, 2 epochs of
# STEPS steps, its row named IMPL (default vqa-hpc), with FLAGs added; the
# profile covers the first epoch's last 2 steps, so the timed epoch runs
# without the profiler.
run_vqa() {
  local name=$1 precision=$2 batch=$3 impl=${4:-vqa-hpc} run=$work/$1 status=0 start=$SECONDS why
  shift 3
  (($# == 0)) || shift
  if ! run_limit vqa; then
    row_json note "$impl" "$precision" "$batch" "$why" >>"$rows"
    return
  fi
  rm -rf "$run"
  "${limit[@]}" mpirun -np 1 "${mpirun_flags[@]}" "$build/vqa_train" --train-data "$data" \
    --out "$run" --preset "$preset" --device "$device" --precision "$precision" \
    "${vqa_threads[@]}" --global-batch "$batch" --batch-per-rank "$batch" --epochs 2 \
    --max-steps-per-epoch "$steps" --eval-every 0 --save-every 0 --progress off \
    --profile "$logs/$name.trace.json" --timeline-first-step $((steps - 2)) --timeline-steps 2 \
    "${vqa_extra[@]}" "$@" >"$logs/$name.log" 2>&1 || status=$?
  echo "bench_gpu.sh: $name: exit $status after $((SECONDS - start)) s" >&2
  ((status == 0)) && estimate[vqa]=$((SECONDS - start > 0 ? SECONDS - start : 1))
  if ((status == 0)); then
    cp "$run/metrics.jsonl" "$logs/$name.metrics.jsonl"
    row_json vqa "$impl" "$precision" "$batch" "$run" "$logs/$name.trace.json" >>"$rows"
  else
    failed_row "$impl" "$precision" "$batch" "$status" "$logs/$name.log"
  fi
}

# failed_row IMPL PRECISION BATCH STATUS LOG: a row for a run that failed or
# ran past RUN_TIMEOUT; the end of its log on stderr.
failed_row() {
  local why="failed (exit $4)"
  if (($4 == 124 || $4 == 137)) && [[ -n $deadline ]] && (($(date +%s) + 2 >= deadline)); then
    # Cut off by DEADLINE, which the caller chose: a row that says so, not a failure.
    row_json note "$1" "$2" "$3" "cut off at DEADLINE (its estimate was too short)" >>"$rows"
    return
  fi
  (($4 == 124 || $4 == 137)) && why="ran past RUN_TIMEOUT=$run_timeout s"
  echo "bench_gpu.sh: $1 $2 batch $3 $why; the end of $5:" >&2
  tail -n 15 "$5" >&2
  row_json note "$1" "$2" "$3" "$why: see $5" >>"$rows"
  failures=$((failures + 1))
}

# run_torch IMPL BATCH [flags]: jobs/ddp_reference.py; exit status 3 says
# this PyTorch lacks what the flags ask for, and why.
run_torch() {
  local impl=$1 batch=$2 name=$1-$2 status=0 start=$SECONDS why kind=eager
  shift 2
  [[ $impl == pytorch-compile-* ]] && kind=compile
  if ! run_limit "$kind"; then
    row_json note "$impl" "$torch_precision" "$batch" "$why" >>"$rows"
    return
  fi
  "${limit[@]}" "$python" jobs/ddp_reference.py "${ddp_flags[@]}" "${torch_flags[@]}" \
    --batch-per-rank "$batch" --precision "$torch_precision" "$@" \
    >"$logs/$name.json" 2>"$logs/$name.log" || status=$?
  echo "bench_gpu.sh: $name: exit $status after $((SECONDS - start)) s" >&2
  ((status == 0)) && estimate[$kind]=$((SECONDS - start > 0 ? SECONDS - start : 1))
  if ((status == 0)); then
    theirs=$(sed -nE 's/.*"parameters": ([0-9]+).*/\1/p' "$logs/$name.json")
    [[ $theirs == "$parameters" ]] ||
      die "PARAMETER COUNTS DIFFER: vqa_train $parameters, jobs/ddp_reference.py $theirs in $logs/$name.json"
    row_json torch "$impl" "$torch_precision" "$batch" "$logs/$name.json" >>"$rows"
  elif ((status == 3)); then
    row_json note "$impl" "$torch_precision" "$batch" "$(tail -n 1 "$logs/$name.log" | sed 's/^ddp_reference.py: //')" >>"$rows"
  else
    failed_row "$impl" "$torch_precision" "$batch" "$status" "$logs/$name.log"
  fi
}

torch_compile_note="; compile modes: ${compile_modes[*]:-none}"
where=$device
[[ $device == cuda ]] && where="GPU ($("$python" -c 'import torch; print(torch.cuda.get_device_name(0))'))"
# write_table: table.txt (with its header lines), table.csv and the ratios
# from the rows so far; called after every row, so that a run cut short
# leaves a table of what it measured.
write_table() {
  local model_line
  model_line=$(grep -m 1 '^model: ' "$logs/model_line_source.log" 2>/dev/null) || return 0
  "$python" jobs/bench_gpu_table.py "$rows" "$out_dir/table.csv" "$model_line" "$max_len" \
    "$peak_tflops" "$parameters" "$steps" >"$work/table.txt"

  {
    echo "# vqa-hpc and PyTorch on one $where, one rank: preset $preset, ${image_size} px, questions padded to $question_length tokens, $steps timed steps (vqa_train: its second epoch; PyTorch: after $warmup warm-up steps)"
    echo "# vqa_train: $build/vqa_train; fp32 without TF32 in matrix products (its default, LibTorch's)"
    echo "# PyTorch $torch_version: $torch_note$torch_compile_note"
    [[ $device == cpu ]] && echo "# CPU dry run: PyTorch's rows compute in float32, and so do vqa_train's unless its LibTorch (2.4 on) autocasts on the CPU, which each run's train.log says; MFU against $peak_tflops TFLOP/s means nothing here"
    echo "# samples/s: batch / median step time; MFU against $peak_tflops TFLOP/s; ops/step, kernels/step, host_ms (inside host operators), gpu_idle_ms: 2 steps under the profiler; kernels/step, gpu_idle_ms on a GPU only"
    cat "$work/table.txt"
  } >"$out_dir/table.txt"
}

batch=${batches[0]}  # ddp_setup's --batch-per-rank; each run gives its own after it
vqa_extra=("$@")
echo "bench_gpu.sh: $device, preset $preset, $image_size px, questions of $max_len tokens, batches ${batches[*]}, $steps timed steps; PyTorch $torch_version ($python); logs in $logs" >&2
# The comparison's core first, at every batch (vqa-hpc in the first
# precision, PyTorch eager), then the graph rows, the rows without weight
# copies, each torch.compile mode, the crop rows and vqa-hpc's other
# precisions.
first=${precisions[0]}
for batch in "${batches[@]}"; do
  run_vqa "vqa-$first-$batch" "$first" "$batch"
  if ((${#ddp_flags[@]} == 0)) && [[ -f $work/vqa-$first-$batch/train.log ]]; then
    ddp_setup "$work/vqa-$first-$batch"
    cp "$work/vqa-$first-$batch/train.log" "$logs/model_line_source.log"
  fi
  ((${#ddp_flags[@]})) || die "no vqa_train run finished, so the reference has no model line to follow (see $logs)"
  run_torch pytorch-eager "$batch"
  write_table
done
if ((graph)); then
  for batch in "${batches[@]}"; do
    run_vqa "vqa-graph-$first-$batch" "$first" "$batch" vqa-hpc-graph --cuda-graph true
    write_table
  done
fi
if ((copies)) && [[ $first != fp32 ]]; then
  for batch in "${batches[@]}"; do
    run_vqa "vqa-no-copies-$first-$batch" "$first" "$batch" vqa-hpc-no-copies --weight-copies false
    write_table
  done
fi
for mode in "${compile_modes[@]}"; do
  for batch in "${batches[@]}"; do
    run_torch "pytorch-compile-$mode" "$batch" --compile "$mode"
    write_table
  done
done
if ((crop)); then
  for batch in "${batches[@]}"; do
    run_vqa "vqa-crop-$first-$batch" "$first" "$batch" vqa-hpc-crop \
      --cuda-graph "$([[ $graph == 1 ]] && echo true || echo false)" --augment resized-crop
    write_table
  done
fi
for precision in "${precisions[@]:1}"; do
  for batch in "${batches[@]}"; do
    run_vqa "vqa-$precision-$batch" "$precision" "$batch"
    write_table
  done
done
cat "$out_dir/table.txt"
echo "wrote $out_dir/table.txt, $out_dir/table.csv, $rows; logs in $logs"
((failures == 0)) || die "$failures run(s) failed (rows above say which)"
