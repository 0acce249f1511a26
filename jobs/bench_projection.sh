#!/usr/bin/env bash
# Checks the projection (src/train/projection.h, vqa_project) against
# measurement on RANKS emulated hosts (jobs/emulated_hosts.sh, one rank per
# host): for each per-rank batch, one 1-rank run gives the step profile; for
# each link rate the link is measured (vqa_allreduce_bench across the hosts:
# bus bandwidth at 4 MiB, latency of one message round, CPU time per MB
# moved; with ranks sharing cores, also the bus bandwidth while the cores
# compute), vqa_project predicts the RANKS-rank samples/s from the profile and
# those numbers alone, and a RANKS-rank run measures it. Prints predicted,
# measured and the error.
#
#   jobs/bench_projection.sh [build-dir] [extra vqa_train flags]
#
# Settings (environment):
#   RANKS=2               ranks, one per emulated host (more ranks than cores
#                         share them: the 1-rank profile is then taken while
#                         every other host runs the same job, as the ranks will)
#   RATES="none 10gbit 2500mbit 1gbit 500mbit"  link rates (tc; none: the veth unshaped)
#   BATCHES="8 32"        samples per rank per step
#   PRESET=small, STEPS=8 (timed steps per epoch; 2 epochs, the first warm-up),
#   IMAGE_SIZE=96, MAX_LEN=12, OUT_DIR=runs/projection (projection.txt, projection.csv)
#   LINK_UNDER_LOAD=auto  also measure the link while every host runs the
#                         1-rank job: its bus bandwidth during backward (yes |
#                         no | auto: yes when RANKS exceeds the cores, where
#                         two ranks share a core and each ring step waits for
#                         a core that a rank computes on)
#
# The 1-rank run uses --bucket-mb 1, so that its profile records when each MiB
# of gradients is ready, and runs while hosts 1..RANKS-1 run the same job
# (the hosts share this machine's cores, caches and memory bandwidth as the
# ranks will); vqa_project re-cuts it to the buckets the multi-rank run picks
# itself (--bucket-mb 0, auto). Needs root (network namespaces).
set -euo pipefail
shopt -s inherit_errexit # a failure inside $(...) ends the script too
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
read -r -a rates <<<"${RATES:-none 10gbit 2500mbit 1gbit 500mbit}"
read -r -a batches <<<"${BATCHES:-8 32}"
ranks=${RANKS:-2}
preset=${PRESET:-small}
steps=${STEPS:-8}
image_size=${IMAGE_SIZE:-96}
max_len=${MAX_LEN:-12}
out_dir=${OUT_DIR:-runs/projection}
link_under_load=${LINK_UNDER_LOAD:-auto}

die() {
  echo "bench_projection.sh: $*" >&2
  exit 1
}
for tool in vqa_prep vqa_train vqa_project vqa_allreduce_bench; do
  [[ -x $build/$tool ]] || die "$build/$tool not found; build it or pass the build directory"
done
[[ $(id -u) -eq 0 ]] || die "needs root (network namespaces)"
for b in "${batches[@]}"; do [[ $b =~ ^[1-9][0-9]*$ ]] || die "BATCHES must be positive integers"; done
[[ $ranks =~ ^[2-9]$|^1[0-6]$ ]] || die "RANKS must be 2 to 16, got '$ranks'"
case $link_under_load in
  yes | no) ;;
  auto) link_under_load=$( ((ranks > $(nproc))) && echo yes || echo no) ;;
  *) die "LINK_UNDER_LOAD must be yes, no or auto, got '$link_under_load'" ;;
esac

mkdir -p "$out_dir"
work=$(mktemp -d "${TMPDIR:-/tmp}/vqa-projection-XXXXXX")
hosts=pj$$
hosts=${hosts:0:12}
cleanup() {
  bash jobs/emulated_hosts.sh down "$hosts" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
bash jobs/emulated_hosts.sh up "$hosts" "$ranks" --owner $$ >/dev/null

max_batch=$(printf '%s\n' "${batches[@]}" | sort -n | tail -n 1)
"$build/vqa_prep" synth -o "$work/synth.h5" --image-size "$image_size" --max-len "$max_len" \
  --train-questions $((max_batch * ranks * steps * 2)) --test-questions 16 >/dev/null

# train_args NAME RANKS BATCH EPOCHS: vqa_train's command line, into the array args
train_args() {
  local name=$1 ranks=$2 batch=$3 epochs=$4
  args=("$build/vqa_train" --train-data "$work/synth.h5" --out "$work/$name" --preset "$preset"
    --threads 1 --batch-per-rank "$batch" --global-batch $((batch * ranks)) --epochs "$epochs"
    --max-steps-per-epoch "$steps" --eval-every 0 --save-every 0 --progress off)
}

# train NAME RANKS BATCH [flags...]: the last epoch's samples/s
train() {
  local name=$1 ranks=$2 batch=$3
  shift 3
  local args
  train_args "$name" "$ranks" "$batch" 2
  if ((ranks == 1)); then
    # The emulated hosts share one machine (cores, caches, memory
    # bandwidth): the profile is taken while every other host runs the same
    # 1-rank job on its own, as the multi-rank run's ranks compute side by side.
    local neighbours=() host
    for ((host = 1; host < ${RANKS:-2}; host++)); do
      bash jobs/emulated_hosts.sh exec "$hosts" "$host" mpirun --allow-run-as-root -np 1 \
        --bind-to none -x OMP_NUM_THREADS=1 "${args[@]/$work\/$name/$work/$name-neighbour$host}" \
        "$@" >"$work/$name-neighbour$host.log" 2>&1 &
      neighbours+=($!)
    done
    bash jobs/emulated_hosts.sh exec "$hosts" 0 mpirun --allow-run-as-root -np 1 --bind-to none \
      -x OMP_NUM_THREADS=1 "${args[@]}" "$@" >"$work/$name.log" 2>&1
    for host in "${!neighbours[@]}"; do
      wait "${neighbours[$host]}" || {
        cat "$work/$name-neighbour$((host + 1)).log" >&2
        die "a neighbour of $name failed"
      }
    done
  else
    bash jobs/emulated_hosts.sh mpirun "$hosts" -x OMP_NUM_THREADS=1 "${args[@]}" "$@" \
      >"$work/$name.log" 2>&1
  fi || { cat "$work/$name.log" >&2; die "vqa_train run $name failed"; }
  python3 -c 'import json, sys; print("%.4f" % json.loads(open(sys.argv[1]).readlines()[-1])["samples_per_second"])' \
    "$work/$name/metrics.jsonl"
}

# allreduce_table: vqa_allreduce_bench across the hosts at 4 B, 4 KiB and 4 MiB
allreduce_table() {
  local table
  table=$(bash jobs/emulated_hosts.sh mpirun "$hosts" "$build/vqa_allreduce_bench" -b 4 -e 4M -f 1024 \
    -n 5 -r 3 -w 2 --raw false 2>&1) || { echo "$table" >&2; die "vqa_allreduce_bench failed"; }
  echo "$table"
}

# link_fabric BATCH [flags...]: "BUSGBPS:LATENCYUS:CPUUS_PER_MB[:BUSGBPS_IN_BACKWARD]"
# of the link as it is shaped now (the CPU column: what each MB sent and
# received costs the rank's core), measured with the hosts idle, as the
# link is once backward has ended; with LINK_UNDER_LOAD also the bus
# bandwidth while every host runs the 1-rank job of BATCH, as during
# backward, when a rank's allreduce waits for a core that ranks compute on.
# The load runs in this script's session, as the ranks' own compute threads
# do: a load in a session of its own (setsid) gets a scheduling group of its
# own (the kernel's autogroup), and the allreduce then wakes ahead of it and
# reads the idle link's bandwidth (0.119 against 0.085 GB/s, 4 hosts on 2
# cores at 1 Gbit/s).
link_fabric() {
  local batch=$1 table loaded="" host loads=() args
  shift
  table=$(allreduce_table)
  if [[ $link_under_load == yes ]]; then
    set -m # each load in a process group of its own, to end it whole; same session
    for ((host = 0; host < ranks; host++)); do
      train_args "load$host" 1 "$batch" 1000
      bash jobs/emulated_hosts.sh exec "$hosts" "$host" mpirun --allow-run-as-root -np 1 \
        --bind-to none -x OMP_NUM_THREADS=1 "${args[@]}" "$@" </dev/null >"$work/load$host.log" 2>&1 &
      loads+=($!)
    done
    set +m
    sleep 15 # past start-up: every host computes
    loaded=$(allreduce_table | awk '$1 == 4194304 { printf ":%.4f", $7 }')
    # mpirun passes SIGTERM on to its rank (which Open MPI starts in a
    # process group of its own); whatever is left in the hosts then is the
    # load's, as nothing else runs there now.
    for host in "${!loads[@]}"; do kill -TERM -- "-${loads[$host]}" 2>/dev/null || true; done
    for host in "${!loads[@]}"; do
      wait "${loads[$host]}" 2>/dev/null || true
      for pid in $(ip netns pids "$hosts-h$host" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
      rm -rf "$work/load$host"
    done
    [[ $loaded =~ ^:[0-9]+\.[0-9]+$ ]] || die "no 4 MiB row in vqa_allreduce_bench's table beside the load"
  fi
  # rows: size count type redop time(us) algbw busbw ...; a 4-byte allreduce
  # takes one message round at 2 ranks, log2(ranks) rounds beyond (recursive
  # doubling); the projection counts its latency per round.
  awk -v ranks="$ranks" -v loaded="$loaded" '$1 == 4 { latency = $5 } $1 == 4194304 { bus = $7; cpu = $12 }
       END { rounds = ranks > 2 ? log(ranks) / log(2) : 1
             printf "%.4f:%.1f:%.0f%s\n", bus, latency / rounds, cpu, loaded }' <<<"$table"
}

echo "batch,rate,fabric,predicted,measured,error_percent" >"$out_dir/projection.csv"
{
  echo "# projection check: preset $preset, $ranks emulated hosts ($(nproc) cores), 1 thread per rank, $steps timed steps;"
  echo "# predicted = vqa_project from the 1-rank profile and the link's measured bus bandwidth, latency and CPU per MB (bus bandwidth during backward measured under load: $link_under_load)"
  printf '%6s %9s %28s %11s %10s %8s\n' batch rate fabric predicted measured error
} | tee "$out_dir/projection.txt"
for batch in "${batches[@]}"; do
  bash jobs/emulated_hosts.sh shape "$hosts" --rate none
  one=$(train "one-$batch" 1 "$batch" --bucket-mb 1 "$@")
  for rate in "${rates[@]}"; do
    bash jobs/emulated_hosts.sh shape "$hosts" --rate "$rate"
    fabric=$(link_fabric "$batch" "$@")
    predicted=$("$build/vqa_project" "$work/one-$batch/diagnosis.json" --fabric "$fabric" \
      --max-ranks "$ranks" --json | python3 -c 'import json, sys
rows = [r for r in json.load(sys.stdin)["rows"] if r["ranks"] == int(sys.argv[1])]
print("%.4f" % rows[0]["samples_per_second"])' "$ranks")
    measured=$(train "n$ranks-$batch-$rate" "$ranks" "$batch" "$@")
    error=$(awk -v p="$predicted" -v m="$measured" 'BEGIN { printf "%+.1f", 100 * (p - m) / m }')
    echo "$batch,$rate,$fabric,$predicted,$measured,$error" >>"$out_dir/projection.csv"
    printf '%6s %9s %28s %11.1f %10.1f %7s%%\n' "$batch" "$rate" "$fabric" "$predicted" "$measured" \
      "$error" | tee -a "$out_dir/projection.txt"
  done
  echo "  (batch $batch: 1 rank $one samples/s)" | tee -a "$out_dir/projection.txt"
done
echo "wrote $out_dir/projection.txt and $out_dir/projection.csv"
