#!/usr/bin/env bash
# Scaling benchmark: the same batch per rank at 1 rank and at 2 ranks (one CPU
# thread each), measured in one run, plus 2 ranks with the gradient allreduce
# switched off so that the exposed communication shows.
#
#   jobs/bench_scaling.sh [build-dir] [extra vqa_train flags]
#
# Prints samples/s for each and the efficiency S2 / (2 x S1), from the last
# epoch of each run (the first pays for warm-up), median over --repeats runs.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
preset=${PRESET:-small}
batch=${BATCH_PER_RANK:-16}
steps=${STEPS:-8}
repeats=${REPEATS:-3}
image_size=${IMAGE_SIZE:-96}

work=$(mktemp -d "${TMPDIR:-/tmp}/vqa-scaling-XXXXXX")
trap 'rm -rf "$work"' EXIT
"$build/vqa_prep" synth -o "$work/synth.h5" --image-size "$image_size" \
  --train-questions $((batch * 2 * steps * 2)) --test-questions 64 >/dev/null

mpirun_flags=(--bind-to none)
[[ $(id -u) -eq 0 ]] && mpirun_flags+=(--allow-run-as-root)

# run NAME RANKS [flags...] -> prints the last epoch's samples/s
run() {
  local name=$1 ranks=$2
  shift 2
  mpirun -np "$ranks" "${mpirun_flags[@]}" -x OMP_NUM_THREADS=1 "$build/vqa_train" \
    --train-data "$work/synth.h5" --out "$work/$name" --preset "$preset" --threads 1 \
    --batch-per-rank "$batch" --global-batch $((batch * ranks)) --epochs 2 \
    --max-steps-per-epoch "$steps" --eval-every 0 --save-every 0 --progress off "$@" >"$work/$name.log" 2>&1 ||
    { cat "$work/$name.log" >&2; exit 1; }
  tail -n 1 "$work/$name/metrics.jsonl" | sed -E 's/.*"samples_per_second":([0-9.eE+-]+).*/\1/'
}

median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
calc() { awk "BEGIN {print $1}"; }

# Two independent 1-rank jobs at once share nothing but the machine: their
# summed samples/s is what two ranks could reach with free communication, so
# it separates the machine's limit (shared caches, memory bandwidth, SMT
# siblings behind virtual CPUs) from the job's.
pair_concurrent() {
  local name=$1
  shift
  run "$name-a" 1 "$@" >"$work/$name-a.sps" &
  local pid=$!
  run "$name-b" 1 "$@" >"$work/$name-b.sps"
  wait "$pid"
  calc "$(cat "$work/$name-a.sps") + $(cat "$work/$name-b.sps")"
}

s1=() s2=() s2off=() sind=()
for r in $(seq "$repeats"); do
  s1+=("$(run "one-$r" 1 "$@")")
  s2+=("$(run "two-$r" 2 "$@")")
  s2off+=("$(run "two-nocomm-$r" 2 --no-comm "$@")")
  sind+=("$(pair_concurrent "independent-$r" "$@")")
done
m1=$(printf '%s\n' "${s1[@]}" | median)
m2=$(printf '%s\n' "${s2[@]}" | median)
m2off=$(printf '%s\n' "${s2off[@]}" | median)
mind=$(printf '%s\n' "${sind[@]}" | median)

echo "# vqa-hpc scaling: preset $preset, $batch samples per rank per step, 1 thread per rank, $steps steps per epoch, median of $repeats runs"
printf '%-28s %12s %14s\n' "run" "samples/s" "step time (s)"
printf '%-28s %12.2f %14.3f\n' "1 rank" "$m1" "$(calc "$batch / $m1")"
printf '%-28s %12.2f %14.3f\n' "2 ranks" "$m2" "$(calc "2 * $batch / $m2")"
printf '%-28s %12.2f %14.3f\n' "2 ranks, allreduce off" "$m2off" "$(calc "2 * $batch / $m2off")"
printf '%-28s %12.2f %14.3f\n' "2 independent 1-rank jobs" "$mind" "$(calc "2 * $batch / $mind")"
printf 'efficiency S2 / (2 x S1) = %.3f\n' "$(calc "$m2 / (2 * $m1)")"
printf 'machine ceiling: 2 independent jobs / (2 x S1) = %.3f; 2 ranks / 2 independent jobs = %.3f\n' \
  "$(calc "$mind / (2 * $m1)")" "$(calc "$m2 / $mind")"
printf 'exposed communication at 2 ranks = %.1f%% of the step\n' \
  "$(calc "100 * (1 - $m2 / $m2off)")"
echo "runs: 1 rank ${s1[*]}; 2 ranks ${s2[*]}; 2 ranks no allreduce ${s2off[*]}; 2 independent ${sind[*]}"
