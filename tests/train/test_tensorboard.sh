#!/usr/bin/env bash
# TensorBoard's event files against metrics.jsonl: a 2-rank run of the tiny
# preset (3 epochs, evaluation every other epoch, a checkpoint each epoch),
# resumed for a fourth epoch (a second event file in the same directory,
# its steps after the first's), read back by tests/train/read_tensorboard.py
# (an independent reader: Python's protobuf and crc32c, TensorBoard's field
# numbers) and compared value by value, float32 exact. Then the reader must
# refuse a copy with one data byte flipped (a CRC mismatch) and a
# metrics.jsonl with one loss changed.
#
#   tests/train/test_tensorboard.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
# shellcheck source=tests/support/script_test.sh
source "$(dirname "$0")/../support/script_test.sh"
script_test_begin tensorboard "$1" "$2"
python=/usr/bin/python3
"$python" -c 'import crc32c, google.protobuf' 2>/dev/null ||
  { echo "FAIL: $python cannot import crc32c and google.protobuf (Debian: python3-crc32c, python3-protobuf; env/setup.sh)" >&2; exit 1; }
reader=$source_dir/tests/train/read_tensorboard.py

"$build_dir/vqa_prep" synth --train-questions 256 --test-questions 64 -o "$work/synth.h5" >/dev/null
train() {
  mpirun --allow-run-as-root --oversubscribe -np 2 "$build_dir/vqa_train" --train-data "$work/synth.h5" \
    --out "$work/run" --eval-every 2 --global-batch 32 --batch-per-rank 16 --threads 1 \
    --progress off --save-every 1 "$@" >>"$work/train.log" 2>&1 || { cat "$work/train.log" >&2; exit 1; }
}
train --epochs 3
train --epochs 4 --resume auto
files=("$work"/run/events.out.tfevents.*)
((${#files[@]} == 2)) || fail "expected 2 event files (a run and its resume), found ${#files[@]}"

if "$python" "$reader" "$work/run" >"$work/read.log" 2>&1; then
  cat "$work/read.log"
else
  fail "the event files differ from metrics.jsonl: $(cat "$work/read.log")"
fi

# One byte of the last record's data flipped: the reader must say CRC.
mkdir "$work/flipped"
cp "$work/run/config.ini" "$work/run/metrics.jsonl" "$work/flipped/"
cp "${files[0]}" "$work/flipped/"
flipped=$work/flipped/$(basename "${files[0]}")
"$python" -c 'import sys; b = bytearray(open(sys.argv[1], "rb").read()); b[-6] ^= 1; open(sys.argv[1], "wb").write(b)' "$flipped"
if "$python" "$reader" "$work/flipped" >"$work/flipped.log" 2>&1; then
  fail "the reader took a file with a flipped byte"
else
  grep -q 'CRC mismatch' "$work/flipped.log" || fail "no CRC mismatch reported: $(cat "$work/flipped.log")"
fi

# One training loss changed in a copy of metrics.jsonl: a value difference.
"$python" - "$work/run/metrics.jsonl" "$work/changed.jsonl" <<'PY'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
records[1]["train_loss"] *= 1.001
open(sys.argv[2], "w").write("".join(json.dumps(r) + "\n" for r in records))
PY
if "$python" "$reader" "$work/run" "$work/changed.jsonl" >"$work/changed.log" 2>&1; then
  fail "the reader took a metrics.jsonl whose loss differs"
else
  grep -q 'train/loss is' "$work/changed.log" || fail "the loss difference was not named: $(cat "$work/changed.log")"
fi

script_test_end tensorboard
