#!/usr/bin/env bash
# Asynchronous checkpoints (--async-checkpoint, checkpoint_writer.h), 2 ranks
# of the tiny preset, 3 epochs, a checkpoint each epoch:
#  (a) written in the background, every checkpoint holds the weights of the
#      synchronous run's bit for bit (each read back with --eval-only and
#      exported), best_model.pt is byte for byte the synchronous one, the
#      final weights are the synchronous run's, and the host copy was
#      allocated at start-up (not in the first save's step);
#  (b) rank 0 SIGKILLed while its background thread writes the second
#      checkpoint (--test-kill-in-checkpoint-write 2, once the temporary file
#      holds its first bytes): `latest` still names the first, the half-written
#      file is only a .tmp, and --resume auto continues from the first and ends
#      with the uninterrupted run's metrics (equal, not close: same ranks,
#      same order of operations) and final weights.
#
#   tests/train/test_async_checkpoint.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
# shellcheck source=tests/support/script_test.sh
source "$(dirname "$0")/../support/script_test.sh"
script_test_begin async-checkpoint "$1" "$2"

"$build_dir/vqa_prep" synth --train-questions 256 --test-questions 64 -o "$work/synth.h5" >/dev/null
common=(--train-data "$work/synth.h5" --epochs 3 --eval-every 1 --global-batch 32
  --batch-per-rank 16 --threads 1 --progress off --save-every 1 --keep-checkpoints 0)
# train LOG RANKS ARGS...: fails the test (and shows LOG) when vqa_train does.
train() {
  local log=$1 ranks=$2
  shift 2
  mpirun --allow-run-as-root --oversubscribe -np "$ranks" "$build_dir/vqa_train" "$@" \
    >"$work/$log" 2>&1 || { cat "$work/$log" >&2; fail "vqa_train ($log) failed"; exit 1; }
}
# The weights a checkpoint holds, as safetensors bytes (read back, exported).
weights_of() {
  train "export-$2.log" 1 --train-data "$work/synth.h5" --eval-only --resume "$1" \
    --threads 1 --progress off --out "$work/eval-$2" --export-m3ae "$work/$2.safetensors"
}

# (a) the same run, synchronous and asynchronous.
train sync.log 2 "${common[@]}" --out "$work/sync" --async-checkpoint false \
  --export-m3ae "$work/sync-final.safetensors"
train async.log 2 "${common[@]}" --out "$work/async" --async-checkpoint true \
  --export-m3ae "$work/async-final.safetensors"
grep -q 'epoch-0001.pt: training blocked .* writing in the background' "$work/async.log" ||
  fail "the asynchronous run did not write in the background: $(grep 'checkpoint epoch' "$work/async.log")"
# The host copy is made before the first step, not inside the first save's.
grep -q 'checkpoint host copy: [0-9]* MiB allocated at start-up' "$work/async.log" ||
  fail "the asynchronous run did not allocate its host copy at start-up"
grep -q 'epoch-0001.pt: training blocked .*(synchronous save)' "$work/sync.log" ||
  fail "the synchronous run did not save synchronously"
cmp -s "$work/sync-final.safetensors" "$work/async-final.safetensors" ||
  fail "the final weights of the asynchronous run differ from the synchronous run's"
cmp -s "$work/sync/best_model.pt" "$work/async/best_model.pt" ||
  fail "best_model.pt written in the background differs from the synchronous one"
for epoch in 0000 0001 0002; do
  weights_of "$work/sync/checkpoints/epoch-$epoch.pt" "sync-$epoch"
  weights_of "$work/async/checkpoints/epoch-$epoch.pt" "async-$epoch"
  cmp -s "$work/sync-$epoch.safetensors" "$work/async-$epoch.safetensors" ||
    fail "checkpoint epoch-$epoch.pt written in the background holds other weights than the synchronous one"
done
cmp -s "$work/async-0002.safetensors" "$work/async-final.safetensors" ||
  fail "the last checkpoint does not hold the final weights"

# (b) rank 0 killed during the background write of the second checkpoint.
if mpirun --allow-run-as-root --oversubscribe -np 2 "$build_dir/vqa_train" "${common[@]}" \
  --out "$work/killed" --test-kill-in-checkpoint-write 2 >"$work/killed.log" 2>&1; then
  fail "the run with --test-kill-in-checkpoint-write 2 did not die"
fi
checkpoints=$work/killed/checkpoints
grep -q 'signal 9' "$work/killed.log" || fail "rank 0 was not killed by SIGKILL: $(tail -5 "$work/killed.log")"
[[ "$(cat "$checkpoints/latest")" == epoch-0000.pt ]] ||
  fail "after the kill, latest names '$(cat "$checkpoints/latest")', not epoch-0000.pt"
[[ ! -e "$checkpoints/epoch-0001.pt" ]] || fail "the killed write left epoch-0001.pt"
[[ -s "$checkpoints/epoch-0001.pt.tmp" ]] ||
  fail "no half-written epoch-0001.pt.tmp: the kill was not during the write ($(ls "$checkpoints"))"
train resumed.log 2 "${common[@]}" --out "$work/killed" --resume auto \
  --export-m3ae "$work/resumed-final.safetensors"
grep -q "resumed from $checkpoints/epoch-0000.pt" "$work/resumed.log" ||
  fail "the resume did not start from epoch-0000.pt: $(grep -i 'resum\|skipping' "$work/resumed.log")"
! grep -q 'skipping checkpoint' "$work/resumed.log" ||
  fail "the resume met a checkpoint it had to skip: $(grep 'skipping' "$work/resumed.log")"
[[ ! -e "$checkpoints/epoch-0001.pt.tmp" ]] || fail "the resumed run left the stale epoch-0001.pt.tmp"
cmp -s "$work/async-final.safetensors" "$work/resumed-final.safetensors" ||
  fail "the resumed run's final weights differ from the uninterrupted run's"
python3 - "$work/async/metrics.jsonl" "$work/killed/metrics.jsonl" >"$work/metrics.txt" 2>&1 <<'PY' ||
import json, sys
def last_per_epoch(path):
    records = {}
    for line in open(path):
        if line.strip():
            record = json.loads(line)
            records[record["epoch"]] = record
    return records
want, got = last_per_epoch(sys.argv[1]), last_per_epoch(sys.argv[2])
bad = []
for epoch in (1, 2):
    for key in ("train_loss", "test_loss", "overall", "open", "closed", "lr", "global_step"):
        if got.get(epoch, {}).get(key) != want[epoch][key]:
            bad.append(f"epoch {epoch} {key}: resumed {got.get(epoch, {}).get(key)}, uninterrupted {want[epoch][key]}")
print("\n".join(bad) if bad else "resumed metrics of epochs 1 and 2 equal the uninterrupted run's")
sys.exit(1 if bad else 0)
PY
  fail "the resumed run's metrics differ: $(cat "$work/metrics.txt")"
cat "$work/metrics.txt"
grep -h 'checkpoint epoch' "$work/sync.log" "$work/async.log"

script_test_end async-checkpoint
