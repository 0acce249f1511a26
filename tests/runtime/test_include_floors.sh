#!/usr/bin/env bash
# src/runtime is built in floors: each file may include runtime headers of
# its own floor or a lower one, never of a higher one, so the runtime reads
# bottom-up and no include goes back up. Every file of the folder must be in
# the table below (a new file gets a floor when it is added).
#
#   tests/runtime/test_include_floors.sh SOURCE_DIR [BUILD_DIR]
set -euo pipefail
cd "$1/src/runtime"

declare -A floor=(
  # 0: the error checks and the plain pieces, on MPI, CUDA and the OS alone
  [types.h]=0 [check.h]=0 [check.cpp]=0 [gpu_check.h]=0 [tracked_check.h]=0
  [version.h]=0 [version.cpp]=0 [system_info.h]=0 [system_info.cpp]=0
  [memory_usage.h]=0 [memory_usage.cpp]=0 [stream_clock.h]=0 [stream_clock.cpp]=0
  [stop_request.h]=0 [stop_request.cpp]=0 [allreduce_choice.h]=0 [allreduce_choice.cpp]=0
  [cuda_graph.h]=0 [cuda_graph.cpp]=0
  # 1: the MPI calls behind the scalar and string collectives
  [mpi_collectives.h]=1 [mpi_collectives.cpp]=1
  # 2: the collective watchdog and the trackers it reads; the start-up check
  # that every rank runs alike
  [rank_agreement.h]=2 [rank_agreement.cpp]=2 [watchdog.h]=2 [watchdog_impl.h]=2 [watchdog.cpp]=2 [collective_tracker.cpp]=2
  # 3: the process (MPI start-up and shut-down) and the MPI ring
  [distributed.h]=3 [distributed.cpp]=3 [ring_allreduce.h]=3 [ring_allreduce.cpp]=3
  # 4: the communicator the training loop sees, and its backends
  [communicator.h]=4 [communicator_impl.h]=4 [communicator.cpp]=4
  [mpi_communicator.h]=4 [mpi_communicator.cpp]=4 [mpi_allreduce_tuning.cpp]=4
  [nccl_communicator.cpp]=4
)

failures=0 includes=0 files=0
for file in *.h *.cpp; do
  files=$((files + 1))
  if [[ -z ${floor[$file]:-} ]]; then
    echo "FAIL: src/runtime/$file has no floor in $0"
    failures=$((failures + 1))
    continue
  fi
  while IFS= read -r header; do
    includes=$((includes + 1))
    if [[ -z ${floor[$header]:-} ]]; then
      echo "FAIL: src/runtime/$file includes runtime/$header, which has no floor"
      failures=$((failures + 1))
    elif ((floor[$header] > floor[$file])); then
      echo "FAIL: src/runtime/$file (floor ${floor[$file]}) includes runtime/$header (floor ${floor[$header]})"
      failures=$((failures + 1))
    fi
  done < <(sed -n 's/^#include "runtime\/\([^"]*\)".*/\1/p' "$file")
done
# The table names no file that is gone.
for file in "${!floor[@]}"; do
  [[ -e $file ]] || { echo "FAIL: $0 names src/runtime/$file, which does not exist"; failures=$((failures + 1)); }
done
echo "src/runtime: $files files, $includes runtime includes, $failures upward or unplaced"
((failures == 0))
