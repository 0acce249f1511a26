#!/usr/bin/env bash
# jobs/plot_run.sh on a real run directory: a short 2-rank vqa_train run of
# the tiny preset (3 epochs, evaluation every other epoch, so the table has
# epochs without accuracy), then the PNG must exist, be non-empty and start
# with the PNG signature; a folder without metrics.jsonl must be refused
# with exit 1 and a message naming the file, leaving no PNG.
#
#   tests/train/test_plot_run.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
# shellcheck source=tests/support/script_test.sh
source "$(dirname "$0")/../support/script_test.sh"
script_test_begin plot "$1" "$2"

"$build_dir/vqa_prep" synth --train-questions 256 --test-questions 64 -o "$work/synth.h5" >/dev/null
mpirun --allow-run-as-root --oversubscribe -np 2 "$build_dir/vqa_train" --train-data "$work/synth.h5" \
  --out "$work/run" --epochs 3 --eval-every 2 --global-batch 32 --batch-per-rank 16 --threads 1 \
  --progress off --save-every 0 >"$work/train.log" 2>&1 || { cat "$work/train.log" >&2; exit 1; }

if ! bash "$source_dir/jobs/plot_run.sh" "$work/run" >"$work/plot.log" 2>&1; then
  cat "$work/plot.log" >&2
  fail "plot_run.sh exited non-zero on a real run directory"
fi
png=$work/run/run.png
if [[ ! -s $png ]]; then
  fail "no non-empty $png"
elif [[ $(head -c 8 "$png" | od -An -tx1 | tr -d ' \n') != 89504e470d0a1a0a ]]; then
  fail "$png does not start with the PNG signature"
else
  echo "plot_run.sh wrote $(stat -c %s "$png") bytes: $(cat "$work/plot.log")"
fi

mkdir "$work/empty"
status=0
bash "$source_dir/jobs/plot_run.sh" "$work/empty" >"$work/empty.log" 2>&1 || status=$?
[[ $status -eq 1 ]] || fail "a folder without metrics.jsonl gave exit $status, not 1"
grep -q "$work/empty/metrics.jsonl is missing or empty" "$work/empty.log" ||
  fail "the refusal does not name the file: $(cat "$work/empty.log")"
[[ ! -e $work/empty/run.png ]] || fail "a PNG was left after the refusal"

script_test_end plot_run
