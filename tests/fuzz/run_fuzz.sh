#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (a build folder of their own,
# -DVQA_FUZZ=ON) and runs each for a set time, then prints runs and crashes
# per target.
#
#   tests/fuzz/run_fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# SECONDS_PER_TARGET defaults to 60; TARGET is convert_json, hdf5_bytes,
# hdf5_edits, safetensors or checkpoint (default: all five). Environment: VQA_FUZZ_BUILD (build folder,
# default build-fuzz-clang), VQA_FUZZ_JOBS (compile jobs, default 2).
#
# Each run starts from the seed corpus (tests/fuzz/corpus/<target>) and the
# regression inputs (tests/fuzz/regressions/<target>); new inputs go to
# <build>/fuzz/corpus/<target>, each finding to <build>/fuzz/artifacts/<target>/
# (crash-*, leak-*, timeout-*, oom-*). libFuzzer runs in fork mode and goes on
# after a finding, so one run counts them all. To keep one: fix the code, copy
# the artifact to tests/fuzz/regressions/<target>/ under a name that says what
# it was, and the CTest test fuzz_replay_<target> replays it from then on.
# Exit status: 0 when no target found anything, 1 when one did, 2 on a usage
# error.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
seconds="${1:-60}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [[ "$seconds" -lt 1 ]]; then
  echo "run_fuzz.sh: SECONDS_PER_TARGET must be a positive integer, got '$seconds'" >&2
  exit 2
fi
shift $(($# > 0 ? 1 : 0))
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  targets=(convert_json hdf5_bytes hdf5_edits safetensors checkpoint)
fi
for target in "${targets[@]}"; do
  if [[ ! -f "$root/tests/fuzz/fuzz_${target}.cpp" ]]; then
    echo "run_fuzz.sh: no fuzz target '$target' (tests/fuzz/fuzz_${target}.cpp)" >&2
    exit 2
  fi
done
build="${VQA_FUZZ_BUILD:-$root/build-fuzz-clang}"
jobs="${VQA_FUZZ_JOBS:-2}"

for tool in clang clang++ cmake ninja; do
  if ! command -v "$tool" > /dev/null; then
    echo "run_fuzz.sh: $tool not found (env/setup.sh installs clang and libclang-rt-14-dev)" >&2
    exit 2
  fi
done

if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DVQA_FUZZ=ON > "$build.configure.log"
fi
binaries=()
for target in "${targets[@]}"; do binaries+=("fuzz_${target}"); done
cmake --build "$build" --target "${binaries[@]}" -j "$jobs"

results=()
crashed=0
for target in "${targets[@]}"; do
  corpus="$build/fuzz/corpus/$target"
  artifacts="$build/fuzz/artifacts/$target"
  log="$build/fuzz/$target.log"
  mkdir -p "$corpus" "$artifacts" "$root/tests/fuzz/regressions/$target"
  # -timeout: an input takes milliseconds; 10 s is a hang even on a loaded machine.
  options=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 -max_total_time="$seconds"
           -timeout=10 -rss_limit_mb=2048 -close_fd_mask=3 -artifact_prefix="$artifacts/")
  if [[ -f "$root/tests/fuzz/$target.dict" ]]; then
    options+=(-dict="$root/tests/fuzz/$target.dict")
  fi
  echo "run_fuzz.sh: $target for $seconds s (log: $log)"
  before="$(find "$artifacts" -type f | wc -l)"
  status=0
  LSAN_OPTIONS="suppressions=$root/tests/fuzz/lsan.supp" "$build/tests/fuzz/fuzz_$target" "${options[@]}" "$corpus" "$root/tests/fuzz/corpus/$target" \
    "$root/tests/fuzz/regressions/$target" > "$log" 2>&1 || status=$?
  # Fork mode's progress lines: "#RUNS: cov: ... oom/timeout/crash: O/T/C time: ...".
  last="$(grep -E '^#[0-9]+: ' "$log" | tail -n 1 || true)"
  runs="$(sed -E 's/^#([0-9]+):.*/\1/' <<< "$last")"
  kinds="$(sed -nE 's#.*oom/timeout/crash: ([0-9]+/[0-9]+/[0-9]+).*#\1#p' <<< "$last")"
  found=$(($(find "$artifacts" -type f | wc -l) - before))
  if [[ "$status" -ne 0 || "$found" -gt 0 ]]; then
    crashed=1
    echo "run_fuzz.sh: $target: $found finding(s) in $artifacts; the end of its log:"
    grep -v NEW_FUNC "$log" | tail -n 20
  fi
  results+=("$(printf '%-14s %6s s %12s %14s %10s' "$target" "$seconds" "${runs:-?}" \
    "${kinds:-?}" "$found")")
done

echo
echo "target           time         runs  oom/time/crash   findings"
printf '%s\n' "${results[@]}"
exit "$crashed"
