#!/usr/bin/env bash
# Scaling report: samples/s of vqa_train at 1, 2, ... N ranks with the same
# batch per rank (one CPU thread each), its efficiency and per-step phase
# breakdown, next to PyTorch DDP running the same model, loss, optimiser and
# batch (jobs/ddp_reference.py), all measured in one run.
#
#   jobs/bench_scaling.sh [build-dir] [extra vqa_train flags]
#
# Settings (environment):
#   PRESET=small          model preset (tiny | small), for both implementations
#   BATCH_PER_RANK=16     samples per rank per optimiser step (no accumulation)
#   MAX_LEN=12            tokens per question in the dataset, padding included (the
#                         synthetic questions are up to 12 long; M3AE pads to 32).
#                         vqa_train cuts each batch to its longest question; the
#                         DDP reference computes on all MAX_LEN columns, as M3AE does
#   DDP_ATTENTION=explicit  the DDP model's attention: explicit (matmul / softmax /
#                         matmul, as vqa_train's) or torch (nn.MultiheadAttention)
#   STEPS=8               timed optimiser steps; vqa_train runs 2 epochs of STEPS
#                         steps and the first is warm-up, DDP gets STEPS warm-up steps
#   REPEATS=3             runs of everything; the table shows medians
#   RANKS="1 2"           rank counts; mpirun gets --oversubscribe beyond the core count
#   IMAGE_SIZE=96         synthetic images' side (a multiple of the preset's patch size)
#   OUT_DIR=runs/scaling  gets scaling.txt (this output), scaling.csv, scaling.png
#                         and runs.csv (every single measurement)
#   DDP=1                 0: leave out the PyTorch DDP reference
#   CONTROLS=1            0: leave out the controls at 2 ranks (allreduce off; two
#                         independent 1-rank jobs at once, the machine's ceiling)
#   DDP_FLAGS=            more jobs/ddp_reference.py flags, e.g. --foreach (they win)
#   VARIANTS=             more vqa_train flag sets, ';' between them, each run at every
#                         rank count right after the default in every repeat (rows
#                         vqa-hpc-v1, v2, ...), e.g. "--allreduce-tune-steps 0" (the
#                         start-up choice against the one tuned in training)
#   PYTHON=               an interpreter that can `import torch` (default: the
#                         first of python3, /usr/bin/python3 that can)
#
# samples/s is the last epoch's (vqa_train's metrics.jsonl) or the timed steps'
# (DDP) on rank 0; efficiency is S_N / (N x S_1); the phases are vqa_train's
# per-step means over all steps of all ranks, in ms ("n/a" from a vqa_train
# without phase timers). The DDP model takes its sizes from vqa_train's log
# (extra vqa_train flags such as --hidden reach it too); before the first DDP
# run the script checks that both models have the same parameter count and
# stops if they do not. The defaults take about 5 minutes on 2 quiet cores
# (several times longer on a loaded machine, whose numbers are noise).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
preset=${PRESET:-small}
batch=${BATCH_PER_RANK:-16}
max_len=${MAX_LEN:-12}
ddp_attention=${DDP_ATTENTION:-explicit}
steps=${STEPS:-8}
repeats=${REPEATS:-3}
image_size=${IMAGE_SIZE:-96}
read -r -a ranks_list <<<"${RANKS:-1 2}"
out_dir=${OUT_DIR:-runs/scaling}
with_ddp=${DDP:-1}
with_controls=${CONTROLS:-1}
variants=()
IFS=';' read -r -a variants <<<"${VARIANTS:-}"

die() {
  echo "bench_scaling.sh: $*" >&2
  exit 1
}
for n in "${ranks_list[@]}"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || die "RANKS must be positive integers, got '${RANKS:-}'"
done
((${#ranks_list[@]})) || die "RANKS is empty"
[[ $batch =~ ^[1-9][0-9]*$ ]] || die "BATCH_PER_RANK must be a positive integer, got '$batch'"
[[ $max_len =~ ^[1-9][0-9]*$ ]] || die "MAX_LEN must be a positive integer, got '$max_len'"
[[ $ddp_attention == explicit || $ddp_attention == torch ]] ||
  die "DDP_ATTENTION must be explicit or torch, got '$ddp_attention'"
for tool in vqa_prep vqa_train; do
  [[ -x $build/$tool ]] || die "$build/$tool not found; build it (cmake --build $build) or pass the build directory"
done
command -v gnuplot >/dev/null || die "gnuplot not found (Debian: gnuplot-nox, in env/setup.sh)"
max_ranks=$(printf '%s\n' "${ranks_list[@]}" | sort -n | tail -n 1)
has_two=0
for n in "${ranks_list[@]}"; do [[ $n == 2 ]] && has_two=1; done

python=""
if [[ $with_ddp == 1 ]]; then
  for candidate in ${PYTHON:+"$PYTHON"} python3 /usr/bin/python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import torch' 2>/dev/null; then
      python=$candidate
      break
    fi
  done
  [[ -n $python ]] || die "no python3 that can import torch (Debian: python3-torch, in env/setup.sh); set PYTHON, or DDP=0"
fi
json_python=${python:-python3}

mkdir -p "$out_dir"
work=$(mktemp -d "${TMPDIR:-/tmp}/vqa-scaling-XXXXXX")
trap 'rm -rf "$work"' EXIT
"$build/vqa_prep" synth -o "$work/synth.h5" --image-size "$image_size" --max-len "$max_len" \
  --train-questions $((batch * max_ranks * steps * 2)) --test-questions 64 >/dev/null
# "answers: K labels; tokenizer: word, V entries; max question length L"
question_length=$("$build/vqa_prep" inspect "$work/synth.h5" --records 0 |
  sed -nE 's/^answers: .*; max question length ([0-9]+).*/\1/p')
[[ -n $question_length ]] || die "could not read the question length from vqa_prep inspect"

# nproc follows OMP_NUM_THREADS (CTest sets it to 1); the cores are what counts here.
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
mpirun_flags=(--bind-to none)
[[ $(id -u) -eq 0 ]] && mpirun_flags+=(--allow-run-as-root)

# One line of numbers from the last epoch of <run>/metrics.jsonl:
# samples/s, then the mean ms per step of data_wait h2d forward backward
# comm_exposed optimizer ("n/a" where the record has no phases).
metrics_row() {
  "$json_python" - "$1" <<'EOF'
import json, sys
lines = [line for line in open(sys.argv[1]) if line.strip()]
record = json.loads(lines[-1])
phases = record.get("phases", {})
row = ["%.4f" % record["samples_per_second"]]
for key in ("data_wait", "h2d", "forward", "backward", "comm_exposed", "optimizer"):
    value = phases.get(key, {}).get("mean")
    row.append("n/a" if value is None else "%.3f" % (1000 * value))
print(" ".join(row))
EOF
}

# run_vqa NAME RANKS [flags...] -> prints metrics_row of the last epoch
run_vqa() {
  local name=$1 ranks=$2
  shift 2
  local flags=("${mpirun_flags[@]}")
  ((ranks > cores)) && flags+=(--oversubscribe)
  mpirun -np "$ranks" "${flags[@]}" -x OMP_NUM_THREADS=1 "$build/vqa_train" \
    --train-data "$work/synth.h5" --out "$work/$name" --preset "$preset" --threads 1 \
    --batch-per-rank "$batch" --global-batch $((batch * ranks)) --epochs 2 \
    --max-steps-per-epoch "$steps" --eval-every 0 --save-every 0 --progress off "$@" >"$work/$name.log" 2>&1 ||
    { cat "$work/$name.log" >&2; die "vqa_train run $name failed"; }
  metrics_row "$work/$name/metrics.jsonl"
}

# ddp_setup RUN_DIR: the DDP reference's flags from a vqa_train run, parameter counts checked.
# shellcheck source=jobs/ddp_setup.sh
source jobs/ddp_setup.sh

# run_ddp NAME RANKS -> prints the DDP reference's samples/s
run_ddp() {
  local name=$1 ranks=$2
  "$python" jobs/ddp_reference.py "${ddp_flags[@]}" --ranks "$ranks" --steps "$steps" \
    --warmup-steps "$steps" >"$work/$name.json" 2>"$work/$name.log" ||
    { cat "$work/$name.log" >&2; die "jobs/ddp_reference.py run $name failed"; }
  "$json_python" -c 'import json, sys; print("%.4f" % json.loads(open(sys.argv[1]).readlines()[-1])["samples_per_second"])' \
    "$work/$name.json"
}

# Two independent 1-rank jobs at once share nothing but the machine: their
# summed samples/s is what two ranks could reach with free communication, so
# it separates the machine's limit (shared caches, memory bandwidth, SMT
# siblings behind virtual CPUs) from the job's.
pair_concurrent() {
  local name=$1
  shift
  run_vqa "$name-a" 1 "$@" >"$work/$name-a.row" &
  local pid=$!
  run_vqa "$name-b" 1 "$@" >"$work/$name-b.row"
  wait "$pid"
  awk '{s += $1} END {printf "%.4f\n", s}' "$work/$name-a.row" "$work/$name-b.row"
}

# Every measurement goes to runs.csv as "impl,ranks,repeat,samples/s,phases...".
runs_csv=$out_dir/runs.csv
echo "impl,ranks,repeat,samples_per_second,data_wait_ms,h2d_ms,forward_ms,backward_ms,comm_exposed_ms,optimizer_ms" >"$runs_csv"
record() { # impl ranks repeat values...
  local impl=$1 ranks=$2 repeat=$3
  shift 3
  local IFS=,
  echo "$impl,$ranks,$repeat,$*" >>"$runs_csv"
}

# Each result is assigned to a variable first, so that a failed run stops the
# script (set -e does not see a failure inside an argument's $(...)).
for r in $(seq "$repeats"); do
  for n in "${ranks_list[@]}"; do
    result=$(run_vqa "vqa-$n-$r" "$n" "$@")
    read -r -a row <<<"$result"
    record vqa-hpc "$n" "$r" "${row[@]}"
    for v in "${!variants[@]}"; do
      read -r -a variant_flags <<<"${variants[v]}"
      result=$(run_vqa "vqa-v$((v + 1))-$n-$r" "$n" "$@" "${variant_flags[@]}")
      read -r -a row <<<"$result"
      record "vqa-hpc-v$((v + 1))" "$n" "$r" "${row[@]}"
    done
    if [[ $with_ddp == 1 ]]; then
      ((${#ddp_flags[@]})) || ddp_setup "$work/vqa-$n-$r"
      result=$(run_ddp "ddp-$n-$r" "$n")
      record pytorch-ddp "$n" "$r" "$result" n/a n/a n/a n/a n/a n/a
    fi
  done
  if [[ $with_controls == 1 && $has_two == 1 ]]; then
    result=$(run_vqa "nocomm-2-$r" 2 --no-comm "$@")
    read -r -a row <<<"$result"
    record "vqa-hpc-allreduce-off" 2 "$r" "${row[@]}"
    result=$(pair_concurrent "independent-$r" "$@")
    record "independent-1-rank-jobs" 2 "$r" "$result" n/a n/a n/a n/a n/a n/a
  fi
done
[[ -n $parameters ]] || parameters=$(sed -nE 's/^model: .*, ([0-9]+) parameters$/\1/p' "$work/vqa-${ranks_list[0]}-1/train.log")

# Medians per (impl, ranks), efficiency against the same impl's 1-rank row
# (or its smallest rank count), ratio vqa-hpc / DDP; the table as text and CSV.
"$json_python" - "$runs_csv" "$out_dir/scaling.csv" "$batch" <<'EOF' >"$work/table.txt"
import csv, sys
runs_path, table_path, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
phase_names = ["data_wait_ms", "h2d_ms", "forward_ms", "backward_ms", "comm_exposed_ms", "optimizer_ms"]
groups = {}
for row in csv.DictReader(open(runs_path)):
    groups.setdefault((row["impl"], int(row["ranks"])), []).append(row)

def median(values):
    values = sorted(values)
    return values[(len(values) - 1) // 2] if values else None

def number(text):
    return None if text in ("", "n/a") else float(text)

table = {}
for (impl, ranks), rows in groups.items():
    entry = {"sps": median([float(r["samples_per_second"]) for r in rows]), "runs": [float(r["samples_per_second"]) for r in rows]}
    for name in phase_names:
        values = [number(r[name]) for r in rows]
        entry[name] = None if None in values else median(values)
    table[(impl, ranks)] = entry

order = ["vqa-hpc"] + ["vqa-hpc-v%d" % k for k in range(1, 100)] + [
    "pytorch-ddp", "vqa-hpc-allreduce-off", "independent-1-rank-jobs"]
keys = sorted(table, key=lambda k: (order.index(k[0]) if k[0] in order else 99, k[1]))
def fmt(value, spec):
    return "n/a" if value is None else format(value, spec)

header = ["impl", "ranks", "samples/s", "step_ms", "efficiency", "vs_ddp"] + [n[:-3] for n in phase_names]
print("%-24s %5s %10s %8s %10s %7s %9s %7s %8s %9s %12s %9s" % tuple(header))
with open(table_path, "w", newline="") as out:
    writer = csv.writer(out)
    writer.writerow(["impl", "ranks", "samples_per_second", "step_ms", "efficiency", "ratio_vs_ddp"] + phase_names + ["runs"])
    for impl, ranks in keys:
        e = table[(impl, ranks)]
        base_impl = impl if impl in ("vqa-hpc", "pytorch-ddp") else "vqa-hpc"
        base_ranks = min(r for i, r in table if i == base_impl)
        base = table[(base_impl, base_ranks)]["sps"]
        efficiency = e["sps"] / (ranks / base_ranks * base)
        ddp = table.get(("pytorch-ddp", ranks))
        ratio = e["sps"] / ddp["sps"] if impl == "vqa-hpc" and ddp else None
        step_ms = 1000.0 * batch * ranks / e["sps"]
        print("%-24s %5d %10.2f %8.1f %10.3f %7s %9s %7s %8s %9s %12s %9s" % (
            impl, ranks, e["sps"], step_ms, efficiency, fmt(ratio, ".2f"),
            *[fmt(e[n], ".1f") for n in phase_names]))
        writer.writerow([impl, ranks, "%.4f" % e["sps"], "%.2f" % step_ms, "%.4f" % efficiency,
                         fmt(ratio, ".4f")] + [fmt(e[n], ".3f") for n in phase_names] +
                        [" ".join("%.2f" % v for v in e["runs"])])
EOF

{
  echo "# vqa-hpc scaling: preset $preset ($parameters parameters), $batch samples per rank per step, questions padded to $question_length tokens, 1 thread per rank, $steps timed steps, median of $repeats runs; $cores cores"
  [[ $with_ddp == 1 ]] && echo "# PyTorch DDP reference: attention $ddp_attention (jobs/ddp_reference.py --attention), every padded column computed"
  echo "# efficiency = S_N / (N x S_1) of the same implementation; vs_ddp = vqa-hpc / PyTorch DDP at the same ranks;"
  echo "# phases: ms per step, mean over all steps of all ranks (vqa_train's phase timers)"
  cat "$work/table.txt"
  if [[ $with_controls == 1 && $has_two == 1 ]]; then
    awk -F, -v batch="$batch" '
      NR > 1 { s[$1 "," $2] = $3 }
      END {
        s1 = s["vqa-hpc,1"]; s2 = s["vqa-hpc,2"]; off = s["vqa-hpc-allreduce-off,2"]; ind = s["independent-1-rank-jobs,2"]
        if (s1 > 0) printf "efficiency S2 / (2 x S1) = %.3f\n", s2 / (2 * s1)
        if (s1 > 0) printf "machine ceiling: 2 independent jobs / (2 x S1) = %.3f; 2 ranks / 2 independent jobs = %.3f\n", ind / (2 * s1), s2 / ind
        printf "exposed communication at 2 ranks (against allreduce off) = %.1f%% of the step\n", 100 * (1 - s2 / off)
      }' "$out_dir/scaling.csv"
  fi
  for v in "${!variants[@]}"; do echo "vqa-hpc-v$((v + 1)): ${variants[v]}"; done
  echo "runs (samples/s per repeat):"
  awk -F, 'NR > 1 { printf "  %s x%s: %s\n", $1, $2, $NF }' "$out_dir/scaling.csv"
} | tee "$out_dir/scaling.txt"

gnuplot -e "csv='$out_dir/scaling.csv'; png='$out_dir/scaling.png'; title='vqa-hpc scaling, preset $preset, $batch samples/rank/step'" \
  jobs/scaling_plot.gp
echo "wrote $out_dir/scaling.txt, $out_dir/scaling.csv, $out_dir/scaling.png, $runs_csv"
