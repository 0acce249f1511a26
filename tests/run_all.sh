#!/usr/bin/env bash
# The README's test command: installs what is missing (env/setup.sh), builds
# everything in build/ and runs every test with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash env/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build --parallel "$(nproc)"
# mpirun refuses root unless told; the tests pass --allow-run-as-root themselves
# and these cover the binaries that the tests start through scripts.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir build --no-tests=error --output-on-failure --timeout 900 "$@"
