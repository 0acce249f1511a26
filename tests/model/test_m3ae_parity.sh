#!/usr/bin/env bash
# M3AE's forward against an independent PyTorch reference (m3ae_reference.py,
# torch.nn modules with M3AE's names), through the whole user path: the
# reference's Lightning-style checkpoint -> data_prep/m3ae_to_safetensors.py
# -> vqa_train --init-from -> --eval-only --predictions-logits. Logits must
# equal the reference's within 1e-4 relative (max |difference| / max |logit|)
# on the synthetic test split (questions of different lengths, padded), with
# the vision position table resized from a smaller pre-training grid:
#   1. a small M3AE-shaped model (hidden 64), at 2 ranks and at 1 rank, whose
#      two prediction files must agree (numbers within 1e-5);
#   2. --init-from refuses a file with a missing tensor, an unknown tensor
#      and a wrong shape, exit 2, the message naming the tensor.
# The full base size (CLIP ViT-B/16 at 384 px from a 288 px table,
# RoBERTa-base, 6+6 fusion layers) is compared the same way in
# test_m3ae_export.sh, before its export (one reference model of that size
# for both: it takes a minute to make and run on 2 cores).
#
#   tests/model/test_m3ae_parity.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
# shellcheck source=tests/support/script_test.sh
source "$(dirname "$0")/../support/script_test.sh"
script_test_begin m3ae-parity "$1" "$2"

# shellcheck source=tests/model/m3ae_script_common.sh
source "$(dirname "$0")/m3ae_script_common.sh"

# ---- 1. small M3AE-shaped model ---------------------------------------------
small=(--hidden 64 --heads 2 --ffn 256 --vision-layers 2 --text-layers 2 --fusion-layers 2
  --patch-size 8)
"$build_dir/vqa_prep" synth --train-questions 64 --test-questions 40 -o "$work/small.h5" >/dev/null
"$python" "$reference" --dataset "$work/small.h5" --checkpoint "$work/small.ckpt" \
  --logits "$work/small-reference.json" "${small[@]}" --pretrain-image-size 24 \
  --max-text-length 512 >"$work/small-reference.log"
cat "$work/small-reference.log"
"$python" "$convert" "$work/small.ckpt" -o "$work/small.safetensors"
for ranks in 2 1; do
  if eval_only "small-np$ranks" "$ranks" "$work/small.h5" "$work/small.safetensors" --preset base \
    "${small[@]}"; then
    grep "^init-from .*: loaded" "$work/small-np$ranks.log"
    "$python" "$compare" logits "$work/small-reference.json" "$work/small-np$ranks.jsonl" \
      "$tolerance" || fail "small model at $ranks rank(s): logits differ from the reference"
  else
    cat "$work/small-np$ranks.log" >&2
    fail "vqa_train --eval-only on the small model at $ranks rank(s) exited non-zero"
  fi
done
grep -q "resized 1 (vision.position_embeddings: 10 -> 17 rows (bicubic))" "$work/small-np1.log" ||
  fail "the summary does not report the resized position table"
"$python" "$compare" same "$work/small-np1.jsonl" "$work/small-np2.jsonl" 1e-5 ||
  fail "predictions at 1 and 2 ranks differ"

# ---- 2. refusals ------------------------------------------------------------
# A state_dict edited three ways, each converted and refused by every rank.
for case in missing unknown shape; do
  "$python" - "$work" "$case" "$convert" <<'PY'
import importlib.util, sys, torch
work, case, convert = sys.argv[1:4]
spec = importlib.util.spec_from_file_location("convert", convert)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
state = module.load_state_dict(f"{work}/small.ckpt")
if case == "missing":
    del state["multi_modal_vision_layers.1.crossattention.output.dense.weight"]
elif case == "unknown":
    state["multi_modal_vision_layers.1.adapter.weight"] = torch.zeros(4, 4)
else:
    state["language_encoder.encoder.layer.0.intermediate.dense.weight"] = torch.zeros(128, 64)
torch.save(state, f"{work}/{case}.pt")
PY
  "$python" "$convert" "$work/$case.pt" -o "$work/$case.safetensors" >/dev/null
  status=0
  eval_only "refuse-$case" 2 "$work/small.h5" "$work/$case.safetensors" --preset base "${small[@]}" ||
    status=$?
  case $case in
    missing) want="missing tensor multi_modal_vision_layers.1.crossattention.output.dense.weight (for the model's fusion.image_layers.1.cross_attention.output.weight, shape [64, 64])" ;;
    unknown) want="unknown tensor multi_modal_vision_layers.1.adapter.weight [4, 4]" ;;
    shape) want="tensor language_encoder.encoder.layer.0.intermediate.dense.weight has shape [128, 64], the model's text.layers.0.feed_forward.up.weight has shape [256, 64]" ;;
  esac
  [[ $status -eq 2 ]] || fail "$case: exit status $status, not 2"
  grep -qF "$want" "$work/refuse-$case.log" || { cat "$work/refuse-$case.log" >&2; fail "$case: no message '$want'"; }
  [[ $(grep -cF "error on rank" "$work/refuse-$case.log") -ge 1 ]] || fail "$case: no rank reported it"
  echo "refused ($case): $(grep -oF "$want" "$work/refuse-$case.log" | head -n 1)"
done

script_test_end m3ae_parity
