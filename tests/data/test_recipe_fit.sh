#!/usr/bin/env bash
# A dataset that does not fit the M3AE recipe is refused at start-up: a
# small VQA-RAD-layout dataset (the docs test's stand-in) converted three
# ways that M3AE cannot read (the word tokenizer; RoBERTa's tokens without
# CLIP's normalisation; CLIP's normalisation at 224 px where --preset base
# takes 384), each given to vqa_train --init-from an M3AE-shaped checkpoint
# with RoBERTa-base's 50265-token vocabulary (m3ae_reference.py at hidden
# 64, converted by m3ae_to_safetensors.py) under mpirun with 2 ranks:
# non-zero exit within 5 s of starting (beyond what 2 ranks of vqa_train
# --help take), before the model is built, the message naming
# the file, what it has and the vqa_prep convert options it needs. Then the
# convert command the first refusal prints, run as printed, makes a file that
# passes (--eval-only loads the checkpoint and evaluates).
#
#   tests/data/test_recipe_fit.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
# shellcheck source=tests/support/script_test.sh
source "$(dirname "$0")/../support/script_test.sh"
# shellcheck disable=SC2154 # source_dir, build_dir, work: set by script_test_begin
script_test_begin recipe_fit "$1" "$2"

python=$(torch_python 'import torch, h5py')
[[ -n $python ]] || { echo "FAIL: no python3 that imports torch and h5py (bash env/setup.sh)" >&2; exit 1; }
prep=$build_dir/vqa_prep
bound_s=5
cd "$work"

# ---- stand-ins: VQA-RAD's layout, a RoBERTa-base-sized vocabulary, M3AE ----
python3 "$source_dir/tests/data/recipe_stand_ins.py" "$work" rad
inputs=(--train-json rad/trainset.json --test-json rad/testset.json --images rad/images
  --include-test-answers --answer-normalization m3ae)
roberta=(--tokenizer roberta --vocab-json models/roberta-base/vocab.json
  --merges-txt models/roberta-base/merges.txt)
"$prep" convert "${inputs[@]}" --image-size 384 -o word.h5 >/dev/null
"$prep" convert "${inputs[@]}" "${roberta[@]}" --image-size 384 -o roberta-dataset-norm.h5 >/dev/null
"$prep" convert "${inputs[@]}" "${roberta[@]}" --normalize clip --image-size 224 \
  -o roberta-clip-224.h5 >/dev/null
"$prep" convert "${inputs[@]}" "${roberta[@]}" --normalize clip --image-size 384 \
  -o reference.h5 >/dev/null
small=(--hidden 64 --heads 2 --ffn 256 --vision-layers 2 --text-layers 2 --fusion-layers 2
  --patch-size 16)
"$python" "$source_dir/tests/model/m3ae_reference.py" --dataset reference.h5 \
  --checkpoint m3ae.ckpt --logits reference-logits.json "${small[@]}" \
  --pretrain-image-size 32 --max-text-length 512 >reference.log
"$python" "$source_dir/data_prep/m3ae_to_safetensors.py" m3ae.ckpt -o models/m3ae.safetensors \
  >/dev/null

# train NAME DATASET: vqa_train --eval-only with the M3AE recipe's init-from
# and preset on 2 ranks; output in NAME.log, seconds in $seconds.
train() {
  local name=$1 dataset=$2 start end status=0
  start=$(date +%s.%N)
  mpirun --allow-run-as-root --oversubscribe -np 2 "$build_dir/vqa_train" --train-data "$dataset" \
    --out "run-$name" --preset base "${small[@]}" --init-from models/m3ae.safetensors --eval-only \
    --device cpu --threads 1 --progress off --global-batch 2 --batch-per-rank 1 \
    >"$name.log" 2>&1 || status=$?
  end=$(date +%s.%N)
  seconds=$(python3 -c "print(f'{$end - $start:.2f}')")
  return "$status"
}

# The bound is on what the refusal adds to starting the program: on a loaded
# machine loading LibTorch and MPI_Init alone take seconds. Baseline: the
# same 2 ranks printing --help.
start=$(date +%s.%N)
mpirun --allow-run-as-root --oversubscribe -np 2 "$build_dir/vqa_train" --help >/dev/null 2>&1
startup=$(python3 -c "print(f'{$(date +%s.%N) - $start:.2f}')")
echo "starting 2 ranks of vqa_train (--help): $startup s"

# refused NAME DATASET WHAT_IT_HAS NEEDED_OPTIONS
refused() {
  local name=$1 dataset=$2 has=$3 needed=$4
  if train "$name" "$dataset"; then
    fail "$name: vqa_train accepted $dataset"
    tail -n 5 "$name.log" >&2
    return
  fi
  echo "$name: exit non-zero in $seconds s ($startup s of it starting the ranks):" \
    "$(grep -m1 'does not fit' "$name.log")"
  python3 -c "import sys; sys.exit(0 if $seconds - $startup < $bound_s else 1)" ||
    fail "$name: took $seconds s, more than $bound_s s after the $startup s start"
  grep -q "$dataset does not fit the recipe: --init-from models/m3ae.safetensors" "$name.log" ||
    fail "$name: no message naming $dataset and the recipe"
  grep -q "has $has" "$name.log" || fail "$name: the message does not say the file has '$has'"
  grep -q -- "Make a fitting file with: vqa_prep convert .*$needed" "$name.log" ||
    fail "$name: the message does not name the options '$needed'"
  if grep -q "^init-from\|model: " "$name.log"; then
    fail "$name: the model was built before the refusal"
  fi
}

refused word word.h5 "the word tokenizer (.* tokens), 32 tokens per question, dataset image normalisation" \
  "--tokenizer roberta --vocab-json models/roberta-base/vocab.json --merges-txt models/roberta-base/merges.txt --normalize clip --image-size 384"
refused normalisation roberta-dataset-norm.h5 "the roberta tokenizer (50265 tokens), 32 tokens per question, dataset image normalisation" \
  "--normalize clip --image-size 384"
refused image-size roberta-clip-224.h5 "the roberta tokenizer (50265 tokens), 32 tokens per question, clip image normalisation, 224 px images" \
  "--image-size 384"

# The command the word file's refusal prints, run as printed, makes a file
# the recipe takes.
command=$(grep -m1 -o "Make a fitting file with: vqa_prep convert .*" word.log |
  sed 's/^Make a fitting file with: vqa_prep //')
echo "running the printed command: vqa_prep $command"
rm -f word.h5
read -r -a words <<<"$command"
"$prep" "${words[@]}" >/dev/null || fail "the printed convert command failed"
if train fitting word.h5; then
  echo "fitting: $(grep -m1 '^init-from' fitting.log | cut -c1-160) ($seconds s)"
  grep -q "^init-from models/m3ae.safetensors: loaded" fitting.log ||
    fail "fitting: the checkpoint was not loaded"
else
  fail "fitting: the remade word.h5 was refused"
  tail -n 5 fitting.log >&2
fi

script_test_end recipe_fit
