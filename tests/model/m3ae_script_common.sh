# Sourced by test_m3ae_parity.sh and test_m3ae_export.sh after
# script_test_begin (which sets source_dir, build_dir and work): the
# interpreter with torch, the reference and converter scripts, and eval_only.
# shellcheck shell=bash
# The variables set here are for the sourcing script; source_dir, build_dir
# and work come from it:
# shellcheck disable=SC2034,SC2154

python=$(torch_python 'import torch, h5py')
[[ -n $python ]] || { echo "FAIL: no python3 that imports torch and h5py (bash env/setup.sh)" >&2; exit 1; }
reference=$source_dir/tests/model/m3ae_reference.py
convert=$source_dir/data_prep/m3ae_to_safetensors.py
compare=$source_dir/tests/model/compare_predictions.py
mpirun=(mpirun --allow-run-as-root --oversubscribe)
tolerance=1e-4  # logits: max |difference| / max |logit|

# vqa_train --eval-only on NAME with RANKS ranks, DATASET and WEIGHTS, and
# the flags that follow; predictions with logits in $work/NAME.jsonl.
eval_only() {
  local name=$1 ranks=$2 dataset=$3 weights=$4
  shift 4
  "${mpirun[@]}" -np "$ranks" "$build_dir/vqa_train" --train-data "$dataset" --out "$work/$name" \
    --init-from "$weights" --eval-only --predictions "$work/$name.jsonl" --predictions-logits \
    --threads 1 --progress off --global-batch 4 --batch-per-rank $((4 / ranks)) "$@" \
    >"$work/$name.log" 2>&1
}
