#!/usr/bin/env bash
# The Slurm chain of docs/slurm.md (data preparation with the recipe, then
# training with --dependency=afterok), its block run as written on a real
# single-node Slurm started by this test, in a scratch copy of the
# repository with stand-ins: VQA-RAD's layout and a RoBERTa-base-sized
# tokenizer (tests/data/recipe_stand_ins.py), an M3AE-shaped checkpoint
# (m3ae_reference.py at hidden 64, converted by m3ae_to_safetensors.py) at
# models/m3ae.safetensors, jobs/configs/vqa_rad.ini with the real file's
# prep-convert lines, data and init-from but a small model on the CPU for 1
# epoch, partitions named cpu and gpu, and an sbatch first on PATH that
# gives the jobs this node's shape (2 tasks, 1 CPU each, no GPUs). Both jobs
# must complete with exit code 0, the training one loading the checkpoint
# into the model the recipe's file fits.
#
#   tests/slurm/test_docs_chain.sh SOURCE_DIR BUILD_DIR
#
# Needs root (see slurm_cluster.sh); exits 77 (CTest: skipped) otherwise.
set -euo pipefail
source_dir=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
# shellcheck source=tests/slurm/slurm_cluster.sh
source "$source_dir/tests/slurm/slurm_cluster.sh"

slurm_test_begin docs_chain
python=""
for candidate in python3 /usr/bin/python3; do
  if "$candidate" -c 'import torch, h5py' 2>/dev/null; then
    python=$candidate
    break
  fi
done
[[ -n $python ]] || fail "no python3 that imports torch and h5py (bash env/setup.sh)"

# The block docs/slurm.md marks for this test.
block=$(python3 - "$source_dir" <<'PY'
import os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "tests", "docs"))
import docs_commands
for line, text, marker in docs_commands.blocks_of(sys.argv[1], "docs/slurm.md"):
    if marker and "slurm_docs_chain" in marker:
        print(text)
        break
PY
)
[[ -n $block ]] || fail "docs/slurm.md has no block whose marker names slurm_docs_chain"
echo "---- the block of docs/slurm.md"
echo "$block"

# ---- the scratch repository and its stand-ins ----
python3 - "$source_dir" "$build" "$work" <<'PY'
import os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "tests", "docs"))
import docs_commands
docs_commands.make_repo(*sys.argv[1:4])
PY
repo=$work/repo
rm "$repo/jobs"
mkdir -p "$repo/jobs/configs" "$repo/models"
for entry in "$source_dir"/jobs/*; do
  [[ $(basename "$entry") == configs ]] || ln -s "$entry" "$repo/jobs/"
done
for entry in "$source_dir"/jobs/configs/*; do
  [[ $(basename "$entry") == vqa_rad.ini ]] || ln -s "$entry" "$repo/jobs/configs/"
done
model=(hidden=64 heads=2 ffn=256 vision-layers=2 text-layers=2 fusion-layers=2 patch-size=16)
{
  sed -e 's/^device = .*/device = cpu/' -e 's/^precision = .*/precision = fp32/' \
    -e 's/^epochs = .*/epochs = 1/' -e 's/^global-batch = .*/global-batch = 2/' \
    -e 's/^batch-per-rank = .*/batch-per-rank = 1/' "$source_dir/jobs/configs/vqa_rad.ini"
  echo "# The test's stand-in: a small model of the same structure, on the CPU."
  for setting in "${model[@]}" threads=1 progress=off; do echo "${setting%%=*} = ${setting#*=}"; done
} >"$repo/jobs/configs/vqa_rad.ini"
python3 "$source_dir/tests/data/recipe_stand_ins.py" "$repo" data/VQA_RAD
# The checkpoint is made for a file converted as the recipe says.
mapfile -t recipe < <(cd "$repo" && source jobs/slurm/lib.sh &&
  slurm_recipe_convert jobs/configs/vqa_rad.ini data/VQA_RAD)
(cd "$repo" && "$build/vqa_prep" convert "${recipe[@]:0:${#recipe[@]}-1}" "$work/reference.h5" \
  >/dev/null)
flags=()
for setting in "${model[@]}"; do flags+=("--${setting%%=*}" "${setting#*=}"); done
"$python" "$source_dir/tests/model/m3ae_reference.py" --dataset "$work/reference.h5" \
  --checkpoint "$work/m3ae.ckpt" --logits "$work/reference.json" "${flags[@]}" \
  --pretrain-image-size 32 --max-text-length 512 >"$work/reference.log"
"$python" "$source_dir/data_prep/m3ae_to_safetensors.py" "$work/m3ae.ckpt" \
  -o "$repo/models/m3ae.safetensors" >/dev/null

SLURM_TEST_PARTITIONS="cpu gpu" slurm_cluster_start "$work/slurm"
mkdir -p "$work/bin"
real_sbatch=$(command -v sbatch)
cat >"$work/bin/sbatch" <<EOF
#!/bin/bash
# This node's shape for every job; the ids for the test.
out=\$("$real_sbatch" --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 --time=30 "\$@") || exit
echo "\$out" | tee -a "$work/submitted"
EOF
chmod +x "$work/bin/sbatch"

cd "$repo"
PATH=$work/bin:$PATH bash -euo pipefail -c "$block" || fail "the block failed"
mapfile -t jobs < <(grep -o '[0-9]\+$' "$work/submitted")
((${#jobs[@]} == 2)) || fail "the block submitted ${#jobs[@]} job(s), expected 2: $(cat "$work/submitted")"
for i in 0 1; do
  job=${jobs[i]}
  name=$([[ $i == 0 ]] && echo vqa-prep || echo vqa-train)
  state=$(slurm_wait_job "$job" 'COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY' 240) ||
    fail "job $job did not finish"
  exit_code=$(slurm_job_field "$job" ExitCode)
  echo "---- job $job ($name): $state, exit code $exit_code"
  grep -m 2 "error on" "$repo/$name-$job.out" || true
  grep -v ' = ' "$repo/$name-$job.out" | tail -n 12 || true
  [[ $state == COMPLETED && $exit_code == 0:0 ]] || fail "job $job ended $state with exit code $exit_code"
done
grep -q "recipe jobs/configs/vqa_rad.ini: vqa_prep convert .*--tokenizer roberta" \
  "$repo/vqa-prep-${jobs[0]}.out" || fail "the prep job did not convert with the recipe's options"
grep -q "init-from models/m3ae.safetensors: loaded" "$repo/runs/vqa_rad-${jobs[1]}/train.log" ||
  fail "the training job did not load the checkpoint"
[[ -f $repo/runs/vqa_rad-${jobs[1]}/DONE ]] || fail "no DONE marker in runs/vqa_rad-${jobs[1]}"
echo "PASS: docs/slurm.md's chain: job ${jobs[0]} converted with vqa_rad.ini's options," \
  "job ${jobs[1]} trained from models/m3ae.safetensors on its output"
