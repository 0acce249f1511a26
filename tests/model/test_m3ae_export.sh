#!/usr/bin/env bash
# vqa_train --export-m3ae, the model back in M3AE's format, round trip: the
# reference's checkpoint (m3ae_reference.py) -> m3ae_to_safetensors.py ->
# vqa_train --init-from -> --export-m3ae -> data_prep/m3ae_from_safetensors.py
# -> the reference built as M3AE's VQA fine-tuning builds it, loaded with
# load_state_dict(strict=True). Its logits must equal vqa_train's
# (--eval-only --predictions-logits, the same weights) within 1e-4 relative
# (max |difference| / max |logit|):
#   1. a small M3AE-shaped model (hidden 64) trained 2 optimiser steps on 2
#      ranks (weights away from the import), exported at the end of training;
#      --eval-only from its checkpoint exports the same bytes; the same state
#      with q and k of one CLIP block swapped must fail the comparison;
#   2. the full base size, one batch of 4 questions: first M3AE's forward
#      parity at that size (the logits of vqa_train --init-from against the
#      reference's own, as test_m3ae_parity.sh checks the small model), then
#      the import exported as is and round-tripped;
#   3. refusals, exit 2 with a message: a directory that does not exist, a
#      name that is not .safetensors.
#
#   tests/model/test_m3ae_export.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
# shellcheck source=tests/support/script_test.sh
source "$(dirname "$0")/../support/script_test.sh"
script_test_begin m3ae-export "$1" "$2"

# shellcheck source=tests/model/m3ae_script_common.sh
source "$(dirname "$0")/m3ae_script_common.sh"
back=$source_dir/data_prep/m3ae_from_safetensors.py

# The exported state through m3ae_from_safetensors.py and the strictly loaded
# reference against vqa_train's logits: NAME SIZE_FLAGS...
round_trip() {
  local name=$1
  shift
  "$python" "$reference" --dataset "$work/$name.h5" --load-state "$work/$name-export.ckpt" \
    --logits "$work/$name-round-trip.json" "$@" >"$work/$name-round-trip.log" 2>&1 ||
    { cat "$work/$name-round-trip.log" >&2; return 1; }
  cat "$work/$name-round-trip.log"
  "$python" "$compare" logits "$work/$name-round-trip.json" "$work/$name.jsonl" "$tolerance"
}

# ---- 1. small M3AE-shaped model, trained a little ----------------------------
small=(--hidden 64 --heads 2 --ffn 256 --vision-layers 2 --text-layers 2 --fusion-layers 2
  --patch-size 8)
"$build_dir/vqa_prep" synth --train-questions 64 --test-questions 40 -o "$work/small.h5" >/dev/null
"$python" "$reference" --dataset "$work/small.h5" --checkpoint "$work/small.ckpt" \
  --logits "$work/small-pretrained.json" "${small[@]}" --pretrain-image-size 24 \
  --max-text-length 512 >/dev/null
"$python" "$convert" "$work/small.ckpt" -o "$work/small.safetensors" >/dev/null
if "${mpirun[@]}" -np 2 "$build_dir/vqa_train" --train-data "$work/small.h5" --out "$work/train" \
  --init-from "$work/small.safetensors" --preset base "${small[@]}" --epochs 1 \
  --max-steps-per-epoch 2 --global-batch 8 --batch-per-rank 4 --lr 1e-3 --eval-every 0 \
  --threads 1 --progress off --export-m3ae "$work/trained.safetensors" >"$work/train.log" 2>&1; then
  grep "under M3AE.s names" "$work/train.log"
else
  cat "$work/train.log" >&2
  fail "training the small model with --export-m3ae exited non-zero"
fi
checkpoints=("$work"/train/checkpoints/epoch-*.pt)
[[ -e ${checkpoints[0]} ]] || fail "training wrote no epoch checkpoint under $work/train/checkpoints"
checkpoint=${checkpoints[-1]}
if eval_only small 2 "$work/small.h5" "$checkpoint" --preset base "${small[@]}" \
  --export-m3ae "$work/small-export.safetensors"; then
  cmp -s "$work/trained.safetensors" "$work/small-export.safetensors" ||
    fail "the export at the end of training differs from the export of its checkpoint"
  # Training moved the weights: the file is not the import written back.
  "$python" - "$work/small-export.safetensors" "$work/small.ckpt" "$back" "$convert" <<'PY' ||
import importlib.util, sys
def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
exported = load("back", sys.argv[3]).read_safetensors(sys.argv[1])
pretrained = load("convert", sys.argv[4]).load_state_dict(sys.argv[2])
moved = max((exported[n].float() - pretrained[n].float()).abs().max().item()
            for n in ("vqa_head.3.weight", "multi_modal_vision_layers.0.output.dense.weight"))
print(f"trained weights moved from the import by up to {moved:.3g}")
sys.exit(0 if moved > 1e-4 else 1)
PY
    fail "the exported weights are the imported ones: training did not change them"
  "$python" "$back" "$work/small-export.safetensors" --clip-text-from "$work/small.ckpt" \
    -o "$work/small-export.ckpt"
  round_trip small "${small[@]}" --max-text-length 512 ||
    fail "small model: the exported model's logits in the reference differ from vqa_train's"
  # A wrong mapping must show: q and k of CLIP's first block swapped.
  "$python" - "$work/small-export.ckpt" <<'PY'
import sys, torch
checkpoint = torch.load(sys.argv[1])
packed = checkpoint["state_dict"]["vision_encoder.visual.transformer.resblocks.0.attn.in_proj_weight"]
h = packed.shape[1]
packed[:2 * h] = torch.cat([packed[h:2 * h], packed[:h]]).clone()
torch.save(checkpoint, sys.argv[1])
PY
  if round_trip small "${small[@]}" --max-text-length 512 >"$work/swapped.log" 2>&1; then
    cat "$work/swapped.log" >&2
    fail "q and k swapped in one block still passed the comparison: the test cannot fail"
  else
    echo "q and k swapped: $(grep -o "relative [^ ]*" "$work/swapped.log" | head -n 1), refused as it must be"
  fi
else
  cat "$work/small.log" >&2
  fail "vqa_train --eval-only --export-m3ae on the small model exited non-zero"
fi

# ---- 2. the full base size, one batch ----------------------------------------
"$build_dir/vqa_prep" synth --train-questions 8 --test-questions 4 --questions-per-image 2 \
  --image-size 384 -o "$work/base.h5" >/dev/null
"$python" "$reference" --dataset "$work/base.h5" --checkpoint "$work/base.ckpt" \
  --logits "$work/base-pretrained.json" >"$work/base-reference.log"
cat "$work/base-reference.log"
"$python" "$convert" "$work/base.ckpt" -o "$work/base.safetensors" >/dev/null
rm -f "$work/base.ckpt"
if eval_only base 1 "$work/base.h5" "$work/base.safetensors" --preset base \
  --export-m3ae "$work/base-export.safetensors"; then
  grep "^init-from .*: loaded" "$work/base.log"
  "$python" "$compare" logits "$work/base-pretrained.json" "$work/base.jsonl" "$tolerance" ||
    fail "base model: vqa_train's logits differ from the reference's (forward parity)"
  grep "under M3AE.s names" "$work/base.log"
  "$python" "$back" "$work/base-export.safetensors" --clip-text-from "$work/base.safetensors" \
    -o "$work/base-export.ckpt"
  rm -f "$work/base.safetensors" "$work/base-export.safetensors"
  round_trip base ||
    fail "base model: the exported model's logits in the reference differ from vqa_train's"
else
  cat "$work/base.log" >&2
  fail "vqa_train --eval-only --export-m3ae at the base size exited non-zero"
fi

# ---- 3. refusals --------------------------------------------------------------
for case in directory suffix; do
  case $case in
    directory) target=$work/missing/model.safetensors
      want="--export-m3ae $target: cannot write there ($work/missing is not a writable directory)" ;;
    suffix) target=$work/model.pt
      want="--export-m3ae $target: the name must end in .safetensors" ;;
  esac
  status=0
  eval_only "refuse-$case" 2 "$work/small.h5" "$work/small.safetensors" --preset base \
    "${small[@]}" --export-m3ae "$target" || status=$?
  [[ $status -eq 2 ]] || fail "$case: exit status $status, not 2"
  grep -qF -- "$want" "$work/refuse-$case.log" ||
    { cat "$work/refuse-$case.log" >&2; fail "$case: no message '$want'"; }
  [[ ! -e $target && ! -e $target.tmp ]] || fail "$case: something was written at $target"
  echo "refused ($case): $(grep -oF -- "$want" "$work/refuse-$case.log" | head -n 1)"
done

script_test_end m3ae_export
