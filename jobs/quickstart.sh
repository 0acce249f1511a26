#!/usr/bin/env bash
# The README's first command: installs the dependencies, builds, writes the
# synthetic dataset and trains the tiny model on 2 CPU ranks, started by the
# local launcher (jobs/launch_local.sh: mpirun with each rank bound to its own
# cores and its thread count set; it prints the command it runs).
# Extra arguments go to vqa_train (e.g. --epochs 5). At the end it draws the
# run (jobs/plot_run.sh) and prints where the PNG is.
set -euo pipefail
cd "$(dirname "$0")/.."

bash env/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build --parallel "$(env -u OMP_NUM_THREADS nproc)" --target vqa_prep vqa_train

mkdir -p data
build/vqa_prep synth -o data/synth.h5

# 2 ranks whatever the machine: the configuration's batch sizes (global 32 =
# 16 per rank x 2) and its tuning are for two. The launcher gives each rank
# half of the cores.
jobs/launch_local.sh --ranks 2 build/vqa_train --config jobs/configs/quickstart.ini "$@"

# The run directory: the configuration's, or an --out given here.
out=runs/quickstart
args=("$@")
for ((i = 0; i < ${#args[@]}; ++i)); do
  case ${args[i]} in
    --out) out=${args[i + 1]:-$out} ;;
    --out=*) out=${args[i]#--out=} ;;
  esac
done
jobs/plot_run.sh "$out"
echo "quickstart: the run's picture is $out/run.png; its numbers are in $out/train.log and $out/metrics.jsonl"
