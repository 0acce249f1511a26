#!/usr/bin/env bash
# A picture of a run: jobs/plot_run.sh RUN_DIR [PNG]
# Draws RUN_DIR/metrics.jsonl (one JSON object per epoch, written by
# vqa_train) as a PNG (default RUN_DIR/run.png): the training loss (and the
# test loss where evaluated), overall / open / closed test accuracy per epoch
# with the best epoch marked, and samples/s per epoch. Needs python3 (its
# standard library only) and gnuplot (gnuplot-nox, which env/setup.sh installs).
set -euo pipefail
if (($# < 1 || $# > 2)); then
  echo "usage: jobs/plot_run.sh RUN_DIR [PNG]" >&2
  exit 2
fi
run_dir=$1
png=${2:-$run_dir/run.png}
metrics=$run_dir/metrics.jsonl
script_dir=$(cd "$(dirname "$0")" && pwd)
if [[ ! -s $metrics ]]; then
  echo "plot_run.sh: $metrics is missing or empty (is $run_dir a vqa_train --out folder?)" >&2
  exit 1
fi
for tool in python3 gnuplot; do
  command -v "$tool" >/dev/null || { echo "plot_run.sh: $tool not found (bash env/setup.sh)" >&2; exit 1; }
done

table=$(mktemp)
trap 'rm -f "$table"' EXIT
# One line per epoch: epoch train_loss test_loss overall open closed samples/s best
# (percent; "nan" where the epoch was not evaluated). A resumed run appends
# epochs again: the last record of an epoch wins.
python3 - "$metrics" >"$table" <<'PY'
import json, sys
records = {}
with open(sys.argv[1]) as lines:
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except ValueError as error:
            sys.exit(f"plot_run.sh: {sys.argv[1]} line {number}: not JSON ({error})")
        if "epoch" in record:  # an --eval-only record has none
            records[record["epoch"]] = record
def value(record, key, scale=1.0):
    return f"{record[key] * scale:.6g}" if key in record else "nan"
for epoch in sorted(records):
    r = records[epoch]
    print(epoch, value(r, "train_loss"), value(r, "test_loss"), value(r, "overall", 100),
          value(r, "open", 100), value(r, "closed", 100), value(r, "samples_per_second"),
          1 if r.get("best") else 0)
PY
title="vqa_train run: $(basename "$(cd "$run_dir" && pwd)")"
gnuplot -e "table='$table'; png='$png'; plot_title='$title'" "$script_dir/run_plot.gp"
if [[ ! -s $png ]]; then
  echo "plot_run.sh: gnuplot wrote no $png" >&2
  exit 1
fi
echo "plot_run.sh: wrote $png"
