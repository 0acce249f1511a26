# Sourced by jobs/bench_scaling.sh, jobs/bench_slow_link.sh and jobs/bench_gpu.sh, not run.
#
# ddp_setup RUN_DIR: the DDP reference (jobs/ddp_reference.py) gets every
# size of vqa_train's model and its structure (activation, LayerNorm
# epsilons, text positions) from the run's "model:" log line, the bucket size
# from its config.ini (with --bucket-mb 0, auto, DDP's own default of 25 MiB),
# then DDP_FLAGS (which win). Both models must have the same parameter count,
# or the comparison means nothing: sets ddp_flags and parameters, or stops
# the script. The caller sets preset, batch, question_length, python (an
# interpreter with torch) and die(); ddp_attention if it picks the attention.
# shellcheck shell=bash disable=SC2154  # preset, batch, ... come from the sourcing script
ddp_flags=()
parameters=""
ddp_setup() {
  local run=$1 line theirs field value extra ddp_bucket_mb
  line=$(grep -m 1 '^model: ' "$run/train.log") || die "no 'model: ...' line in $run/train.log"
  parameters=$(sed -nE 's/^model: .*, ([0-9]+) parameters$/\1/p' <<<"$line")
  [[ -n $parameters ]] || die "no parameter count in: $line"
  [[ $line == *input=pixels* ]] || die "the DDP reference covers pixel input only: $line"
  ddp_bucket_mb=$(sed -nE 's/^bucket-mb = //p' "$run/config.ini")
  [[ $ddp_bucket_mb == 0 ]] && ddp_bucket_mb=25
  ddp_flags=(--preset "$preset" --batch-per-rank "$batch" --question-length "$question_length"
    --bucket-mb "$ddp_bucket_mb")
  [[ -n ${ddp_attention:-} ]] && ddp_flags+=(--attention "$ddp_attention")
  for field in hidden heads ffn vision_layers text_layers fusion_layers vocab_size \
    max_text_length num_answers image_size patch_size dropout; do
    value=$(sed -nE "s/.* ${field}=([0-9.eE+-]+)[ ,].*/\1/p" <<<"$line")
    [[ -n $value ]] || die "no $field in: $line"
    ddp_flags+=("--${field//_/-}" "$value")
  done
  # The structure (base: M3AE's QuickGELU, LayerNorm epsilons, RoBERTa's
  # positions and token-type row); a line without these fields is from a
  # vqa_train that has only tiny's and small's, the reference's defaults.
  for field in vision_activation text_positions text_token_type; do
    value=$(sed -nE "s/.* ${field}=([a-z_]+)([ ,].*)?$/\1/p" <<<"$line")
    [[ -n $value ]] && ddp_flags+=("--${field//_/-}" "$value")
  done
  value=$(sed -nE 's|.* layer_norm_eps\(vision/text/fusion/head\)=([^ ,]+).*|\1|p' <<<"$line")
  [[ -n $value ]] && ddp_flags+=(--layer-norm-eps "$value")
  read -r -a extra <<<"${DDP_FLAGS:-}"
  ddp_flags+=("${extra[@]}")
  theirs=$("$python" jobs/ddp_reference.py "${ddp_flags[@]}" --count-only |
    "$python" -c 'import json, sys; print(json.load(sys.stdin)["parameters"])') ||
    die "jobs/ddp_reference.py ${ddp_flags[*]} --count-only failed"
  if [[ $parameters != "$theirs" ]]; then
    echo "vqa_train:        $line" >&2
    echo "ddp_reference.py: $("$python" jobs/ddp_reference.py "${ddp_flags[@]}" --count-only)" >&2
    die "PARAMETER COUNTS DIFFER: vqa_train $parameters, jobs/ddp_reference.py $theirs; the two models are not the same, so no comparison"
  fi
  echo "parameter counts agree: vqa_train and jobs/ddp_reference.py both $parameters" >&2
}
