#!/usr/bin/env bash
# The README's first command: installs the dependencies, builds, writes the
# synthetic dataset and trains the tiny model on 2 CPU ranks with mpirun.
# Extra arguments go to vqa_train (e.g. --epochs 5).
set -euo pipefail
cd "$(dirname "$0")/.."

bash env/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build --parallel "$(nproc)" --target vqa_prep vqa_train

mkdir -p data
build/vqa_prep synth -o data/synth.h5

mpirun_flags=(-np 2)
# Open MPI refuses to start as root unless told; containers and CI run as root.
[[ $(id -u) -eq 0 ]] && mpirun_flags+=(--allow-run-as-root)
set -x
mpirun "${mpirun_flags[@]}" build/vqa_train --config jobs/configs/quickstart.ini "$@"
