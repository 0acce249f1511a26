#!/usr/bin/env bash
# Local launcher: runs a program (vqa_train, a benchmark) under mpirun on this
# machine, one rank per GPU if there are GPUs, else one rank per CPU core,
# with the cores shared out between the ranks and each rank bound to its own.
# It prints the mpirun command it runs.
#
#   jobs/launch_local.sh [--ranks N] [--threads T] [--dry-run] [--] PROGRAM [ARGS...]
#   jobs/launch_local.sh build/vqa_train --config jobs/configs/quickstart.ini
#
#   --ranks N    ranks to start (default: GPUs, else cores)
#   --threads T  CPU threads per rank (default: cores / ranks, at least 1)
#   --dry-run    print the command, do not run it
#
# GPUs: the CUDA_VISIBLE_DEVICES list if set, else `nvidia-smi -L`. Cores:
# physical cores among the CPUs this process may use (SMT siblings do not
# speed LibTorch's matrix products up). Each rank gets OMP_NUM_THREADS=T and,
# when PROGRAM is vqa_train, --threads T (unless ARGS set --threads). More
# ranks x threads than cores (a test on a small machine) runs oversubscribed
# and unbound. VQA_MPIRUN_FLAGS adds flags to mpirun (space-separated).
set -euo pipefail

ranks=""
threads=""
dry_run=false
while (($#)); do
  case "$1" in
    --ranks) ranks=${2:?--ranks needs a number}; shift 2 ;;
    --threads) threads=${2:?--threads needs a number}; shift 2 ;;
    --dry-run) dry_run=true; shift ;;
    --) shift; break ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "launch_local.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
if (($# == 0)); then
  echo "launch_local.sh: no program to run (see --help)" >&2
  exit 2
fi
for value in "$ranks" "$threads"; do
  if [[ -n $value && ! $value =~ ^[1-9][0-9]*$ ]]; then
    echo "launch_local.sh: '$value' is not a positive whole number" >&2
    exit 2
  fi
done

# count_gpus: visible NVIDIA GPUs (0 without a driver).
count_gpus() {
  if [[ -n ${CUDA_VISIBLE_DEVICES+set} ]]; then
    # An empty list hides every GPU; "-1" and "none" too.
    local list=${CUDA_VISIBLE_DEVICES//[[:space:]]/}
    if [[ -z $list || $list == -1 || $list == none ]]; then
      echo 0
    else
      echo "$list" | tr ',' '\n' | grep -c .
    fi
  elif command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true
  else
    echo 0
  fi
}

# count_cores: physical cores among the CPUs this process may run on.
count_cores() {
  local allowed physical
  # Not plain nproc: it answers OMP_NUM_THREADS when that is set.
  allowed=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
  # lscpu -p lists every CPU with its core and socket; keep the allowed ones.
  physical=$(lscpu -p=CPU,CORE,SOCKET 2>/dev/null | grep -v '^#' |
    awk -F, -v allowed="$(taskset -pc $$ 2>/dev/null | sed 's/.*: //')" '
      BEGIN { n = split(allowed, parts, ","); for (i = 1; i <= n; i++) {
                if (split(parts[i], r, "-") == 2) { for (c = r[1]; c <= r[2]; c++) ok[c] = 1 }
                else ok[parts[i]] = 1 } }
      (allowed == "" || ($1 in ok)) && !seen[$3 "," $2]++ { count++ }
      END { print count + 0 }')
  if ((physical >= 1 && physical <= allowed)); then echo "$physical"; else echo "$allowed"; fi
}

gpus=$(count_gpus)
cores=$(count_cores)
if [[ -z $ranks ]]; then
  if ((gpus > 0)); then ranks=$gpus; else ranks=$cores; fi
fi
if [[ -z $threads ]]; then
  threads=$((cores / ranks))
  ((threads >= 1)) || threads=1
fi

flags=(-np "$ranks")
if ((ranks * threads <= cores)); then
  # Each rank on `threads` cores of its own, consecutive (shared caches).
  flags+=(--map-by "slot:PE=$threads" --bind-to core)
else
  flags+=(--oversubscribe --bind-to none)
fi
flags+=(-x "OMP_NUM_THREADS=$threads")
# Open MPI refuses to start as root unless told; containers and CI run as root.
[[ $(id -u) -eq 0 ]] && flags+=(--allow-run-as-root)
if [[ -n ${VQA_MPIRUN_FLAGS:-} ]]; then
  read -r -a extra <<<"$VQA_MPIRUN_FLAGS"
  flags+=("${extra[@]}")
fi

program=("$@")
if [[ $(basename "$1") == vqa_train && " $* " != *" --threads "* && " $* " != *" --threads="* ]]; then
  program+=(--threads "$threads")
fi

echo "launch_local.sh: $gpus GPU(s), $cores core(s): $ranks rank(s) x $threads thread(s)"
# %q: the printed command can be pasted back into a shell.
echo "+ mpirun$(printf ' %q' "${flags[@]}" "${program[@]}")"
$dry_run && exit 0
exec mpirun "${flags[@]}" "${program[@]}"
