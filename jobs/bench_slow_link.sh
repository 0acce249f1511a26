#!/usr/bin/env bash
# Two ranks on two hosts joined by a slow link: how far vqa_train's 2-rank
# speed-up falls as the link slows (and how much of the link its gradient
# allreduce uses), next to PyTorch DDP running the same model over the same
# link, with and without find_unused_parameters (the setting many users' own
# loops leave on). One machine plays both hosts: jobs/emulated_hosts.sh makes
# two network namespaces, each on a core of its own, joined by a link shaped
# with tc's token bucket, and the link is reshaped in place for each rate, so
# every rate's numbers come from the same hosts in one run.
#
#   jobs/bench_slow_link.sh [build-dir] [extra vqa_train flags]
#
# Per rate, each repeat measures: vqa_train on 1 rank (host 0 alone, no link
# traffic: the baseline) and on 2 ranks (one per host, Open MPI over TCP on
# the link), the DDP reference on 1 rank and on 2 ranks (one process per
# host, gloo over the link), the same with --find-unused-parameters, and
# vqa_allreduce_bench across the link at vqa_train's gradient bytes per step
# (float32): the project's allreduce and raw MPI_Allreduce, the ceiling of
# what a training step can get from this link.
#
# Settings (environment):
#   PRESET=small          model preset (tiny | small), for both implementations
#   BATCH_PER_RANK=16     samples per rank per optimiser step
#   MAX_LEN=12            tokens per question in the synthetic dataset
#   STEPS=8               timed optimiser steps; vqa_train runs 2 epochs of STEPS
#                         steps and the first is warm-up, DDP gets STEPS warm-up steps
#   REPEATS=3             runs of everything at every rate; the table shows medians
#   IMAGE_SIZE=96         synthetic images' side (a multiple of the preset's patch size)
#   VOCAB_SIZE=0          vocabulary entries of the synthetic questions (vqa_prep synth
#                         --vocab-size; e.g. 50265, RoBERTa's, with MAX_LEN=32: a word
#                         embedding as large as M3AE's, of which a step touches a few
#                         hundred rows); 0: the templates' few words
#   RATES="none 10gbit 2500mbit 1gbit 500mbit"
#                         link rates (tc: kbit, mbit, gbit); none = the veth unshaped
#   PARTS="vqa1 vqa2 ddp1 ddp2 ddpfu allreduce"
#                         the measurements of each repeat (vqa2 always runs): vqa_train
#                         on 1 / 2 ranks, PyTorch on 1 rank, DDP on 2, DDP with
#                         find_unused_parameters, vqa_allreduce_bench across the link
#   VARIANTS=             more vqa_train flag sets, ';' between them, each run on 2 ranks in
#                         every repeat right after the default (e.g. fixed allreduce
#                         choices against --mpi-allreduce auto's tuning:
#                         "--mpi-allreduce ring --bucket-mb 1;--mpi-allreduce library
#                         --bucket-mb 4"); a second table gives each one's median
#   OUT_DIR=runs/slow-link  gets slow_link.txt (this output), slow_link.csv,
#                         runs.csv (every single measurement) and each 2-rank run's
#                         allreduce tuning record (tuning-RUN.json)
#   DDP_FLAGS=            more jobs/ddp_reference.py flags (they win)
#   PYTHON=               an interpreter that can `import torch` (default: the
#                         first of python3, /usr/bin/python3 that can)
#
# samples/s is the last epoch's (vqa_train's metrics.jsonl) or the timed
# steps' (DDP) on rank 0. From the 2-rank vqa_train run's last record also:
# the achieved bus bandwidth of its gradient allreduces (bus_gbps) as a share
# of the link's rate, the exposed communication's share of the step, and the
# diagnosis. Link GB/s is the tc rate / 8; with 2 ranks the bus bandwidth is
# what each rank sends per second, so 100% would be the link full in both
# directions; tc counts whole Ethernet frames, so TCP's payload at MTU 1500
# tops out near 95% (1448 of 1514 bytes a frame). The DDP model's sizes come
# from vqa_train's `model:` log line and the script stops if the parameter
# counts differ, as jobs/bench_scaling.sh does. Each host has one core, which
# also does the kernel's work for its traffic (unshaped, veth passes segments
# of up to 64 KiB; shaped, tbf sends frames of MTU size, tens of times the
# packets), work that a real host's NIC offloads would largely spare its
# compute core: the shaped rates are a pessimistic emulation. Needs root
# (network namespaces). The defaults take about 25 minutes on 2 quiet cores,
# most of it at the slow rates; anything else running (a build) shows as
# stragglers and compute contention in the diagnosis.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
preset=${PRESET:-small}
batch=${BATCH_PER_RANK:-16}
max_len=${MAX_LEN:-12}
steps=${STEPS:-8}
repeats=${REPEATS:-3}
image_size=${IMAGE_SIZE:-96}
vocab_size=${VOCAB_SIZE:-0}
read -r -a rates <<<"${RATES:-none 10gbit 2500mbit 1gbit 500mbit}"
out_dir=${OUT_DIR:-runs/slow-link}
read -r -a parts <<<"${PARTS:-vqa1 vqa2 ddp1 ddp2 ddpfu allreduce}"
variants=()
IFS=';' read -r -a variants <<<"${VARIANTS:-}"
hosts_tool=$PWD/jobs/emulated_hosts.sh

die() {
  echo "bench_slow_link.sh: $*" >&2
  exit 1
}
for value in "$batch" "$max_len" "$steps" "$repeats" "$image_size"; do
  [[ $value =~ ^[1-9][0-9]*$ ]] ||
    die "BATCH_PER_RANK, MAX_LEN, STEPS, REPEATS and IMAGE_SIZE must be positive integers, got '$value'"
done
[[ $vocab_size =~ ^[0-9]+$ ]] || die "VOCAB_SIZE must be 0 or a positive integer, got '$vocab_size'"
((${#rates[@]})) || die "RATES is empty"
for part in "${parts[@]}"; do
  [[ " vqa1 vqa2 ddp1 ddp2 ddpfu allreduce " == *" $part "* ]] ||
    die "PARTS holds '$part'; the parts are vqa1 vqa2 ddp1 ddp2 ddpfu allreduce"
done
runs_part() { [[ $1 == vqa2 || " ${parts[*]} " == *" $1 "* ]]; }
for rate in "${rates[@]}"; do
  [[ $rate == none || $rate =~ ^[0-9.]+[kmgt]?bit$ ]] ||
    die "RATES holds '$rate', not a tc rate such as 1gbit or 500mbit, or none"
done
[[ $(id -u) -eq 0 ]] || die "needs root: the two hosts are network namespaces (jobs/emulated_hosts.sh)"
for tool in ip tc unshare taskset setsid mpirun; do
  command -v "$tool" >/dev/null || die "$tool not found (iproute2, util-linux, Open MPI)"
done
for tool in vqa_prep vqa_train vqa_allreduce_bench; do
  [[ -x $build/$tool ]] || die "$build/$tool not found; build it (cmake --build $build) or pass the build directory"
done
# The hosts see the same files but start their processes elsewhere: absolute paths.
build=$(cd "$build" && pwd)

python=""
for candidate in ${PYTHON:+"$PYTHON"} python3 /usr/bin/python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c 'import torch' 2>/dev/null; then
    python=$(command -v "$candidate")
    break
  fi
done
[[ -n $python ]] || die "no python3 that can import torch (Debian: python3-torch, in env/setup.sh); set PYTHON"

mkdir -p "$out_dir"
work=$(mktemp -d "${TMPDIR:-/tmp}/vqa-slow-link-XXXXXX")
name=sl$$
name=${name:0:12}
hosts_up=0
# Whatever ends the script: the hosts and their processes go (the watcher of
# emulated_hosts.sh does the same if this shell is killed outright).
cleanup() {
  if ((hosts_up)); then "$hosts_tool" down "$name" || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$build/vqa_prep" synth -o "$work/synth.h5" --image-size "$image_size" --max-len "$max_len" \
  --vocab-size "$vocab_size" --train-questions $((batch * 2 * steps * 2)) --test-questions 64 >/dev/null
# "answers: K labels; tokenizer: word, V entries; max question length L"
question_length=$("$build/vqa_prep" inspect "$work/synth.h5" --records 0 |
  sed -nE 's/^answers: .*; max question length ([0-9]+).*/\1/p')
[[ -n $question_length ]] || die "could not read the question length from vqa_prep inspect"

hosts_up=1
"$hosts_tool" up "$name" 2 --rate "${rates[0]}" --owner $$ >&2
# Each rank on a core of its own, or the 2-rank numbers measure one core.
# shellcheck disable=SC2016 # $(...) is for the shell on each host, not this one
placement=$("$hosts_tool" mpirun "$name" sh -c 'echo "$(hostname) $(sed -n "s/^Cpus_allowed_list:\t//p" /proc/self/status)"' | sort)
placement=$(tr '\n' ' ' <<<"$placement")
echo "rank placement (host, allowed cores): $placement" >&2
[[ $(awk '{for (i = 2; i <= NF; i += 2) print $i}' <<<"$placement" | sort -u | wc -l) == 2 ]] ||
  echo "bench_slow_link.sh: WARNING: the 2 ranks share cores ($placement); the 2-rank numbers are not those of 2 hosts" >&2

root_flags=()
[[ $(id -u) -eq 0 ]] && root_flags=(--allow-run-as-root)
vqa_flags=(--train-data "$work/synth.h5" --preset "$preset" --threads 1 --batch-per-rank "$batch"
  --epochs 2 --max-steps-per-epoch "$steps" --eval-every 0 --save-every 0 --progress off)

# One line from the last record of <run>/metrics.jsonl: samples/s, step ms,
# exposed communication ms, bus GB/s, allreduce bytes per step, the rules
# that fired (';'-joined, "-" for none); each diagnosis as "rule<TAB>message"
# into the file given second.
metrics_row() {
  "$python" - "$1" "$2" <<'EOF'
import json, sys
lines = [line for line in open(sys.argv[1]) if line.strip()]
record = json.loads(lines[-1])
def number(value, scale=1.0, spec="%.4f"):
    return "n/a" if value is None else spec % (scale * value)
step = record.get("step_seconds", {}).get("mean")
exposed = record.get("phases", {}).get("comm_exposed", {}).get("mean")
diagnoses = record.get("diagnosis", [])
with open(sys.argv[2], "w") as out:
    for d in diagnoses:
        out.write("%s\t%s\n" % (d.get("rule", "?"), " ".join(str(d.get("message", "")).split())))
print(" ".join([
    number(record["samples_per_second"]), number(step, 1000, "%.3f"), number(exposed, 1000, "%.3f"),
    number(record.get("bus_gbps")), number(record.get("allreduce_bytes_per_step"), 1, "%.0f"),
    ";".join(d.get("rule", "?") for d in diagnoses) or "-"]))
EOF
}

# run_vqa RUN RANKS [flags...] -> prints metrics_row; 1 rank on host 0 alone,
# 2 ranks one per host.
run_vqa() {
  local run=$1 ranks=$2
  shift 2
  local launch
  if ((ranks == 1)); then
    launch=("$hosts_tool" exec "$name" 0 mpirun "${root_flags[@]}" -np 1 --bind-to none)
  else
    launch=("$hosts_tool" mpirun "$name")
  fi
  "${launch[@]}" -x OMP_NUM_THREADS=1 "$build/vqa_train" "${vqa_flags[@]}" --out "$work/$run" \
    --global-batch $((batch * ranks)) "$@" >"$work/$run.log" 2>&1 ||
    { tail -n 40 "$work/$run.log" >&2; die "vqa_train run $run failed"; }
  metrics_row "$work/$run/metrics.jsonl" "$work/$run.diagnosis"
  # What --mpi-allreduce auto / --bucket-mb 0 tried and chose, kept past the work dir.
  [[ -f $work/$run/allreduce_tuning.json ]] && cp "$work/$run/allreduce_tuning.json" "$out_dir/tuning-$run.json"
  true
}

# ddp_setup RUN_DIR: the DDP reference's flags from a vqa_train run, parameter counts checked.
# shellcheck source=jobs/ddp_setup.sh
source jobs/ddp_setup.sh

samples_per_second() { # JSON file of the DDP reference -> its samples/s
  "$python" -c 'import json, sys; print("%.4f" % json.loads(open(sys.argv[1]).readlines()[-1])["samples_per_second"])' "$1"
}

# wait_ranks PID...: 0 once all have exited 0; at the first failure the others
# are killed (a rank left alone would wait for its peer until gloo's timeout).
wait_ranks() {
  local pending=("$@") finished status pid rest
  while ((${#pending[@]})); do
    status=0
    wait -n -p finished "${pending[@]}" || status=$?
    if ((status)); then
      for pid in "${pending[@]}"; do kill "$pid" 2>/dev/null || true; done
      wait "${pending[@]}" 2>/dev/null || true
      return 1
    fi
    rest=()
    for pid in "${pending[@]}"; do [[ $pid == "$finished" ]] || rest+=("$pid"); done
    pending=("${rest[@]}")
  done
}

# run_ddp RUN RANKS PORT [ddp_reference flags...] -> prints samples/s; 1 rank
# on host 0 (spawn launcher, gloo on loopback), 2 ranks one process per host,
# gloo on vqa0 (a host's name resolves to nothing, and gloo would fall back to
# loopback) with the rendezvous on host 0's PORT (a new one each run: no wait
# for TIME_WAIT).
run_ddp() {
  local run=$1 ranks=$2 port=$3
  shift 3
  local common=("$python" jobs/ddp_reference.py "${ddp_flags[@]}" --steps "$steps" --warmup-steps "$steps" "$@")
  if ((ranks == 1)); then
    "$hosts_tool" exec "$name" 0 env GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1 "${common[@]}" --ranks 1 \
      >"$work/$run.json" 2>"$work/$run.log" ||
      { tail -n 40 "$work/$run.log" >&2; die "jobs/ddp_reference.py run $run failed"; }
  else
    local pids=() i
    for ((i = 0; i < ranks; i++)); do
      "$hosts_tool" exec "$name" "$i" env GLOO_SOCKET_IFNAME=vqa0 OMP_NUM_THREADS=1 "${common[@]}" \
        --rank "$i" --world-size "$ranks" --master "10.201.0.1:$port" \
        >"$work/$run-$i.json" 2>"$work/$run-$i.log" &
      pids+=($!)
    done
    wait_ranks "${pids[@]}" ||
      { tail -n 20 "$work/$run"-*.log >&2; die "jobs/ddp_reference.py run $run failed"; }
    mv "$work/$run-0.json" "$work/$run.json"
  fi
  samples_per_second "$work/$run.json"
}

# run_allreduce RUN BYTES VQA_RUN -> "ours_busbw raw_busbw" (GB/s) across the
# link, the project's allreduce with the algorithm of vqa_train's run VQA_RUN.
run_allreduce() {
  local run=$1 bytes=$2 algorithm
  local flags=(-b "$bytes" -e "$bytes" -w 1 -n 2 -r 3 --check=false)
  # The same algorithm as vqa_train's, where this build has the choice.
  algorithm=$(sed -nE 's/^mpi-allreduce = //p' "$3/config.ini" 2>/dev/null || true)
  [[ -n $algorithm ]] && flags+=(--mpi-allreduce "$algorithm")
  "$hosts_tool" mpirun "$name" -x OMP_NUM_THREADS=1 "$build/vqa_allreduce_bench" "${flags[@]}" \
    >"$work/$run.log" 2>&1 || { tail -n 40 "$work/$run.log" >&2; die "vqa_allreduce_bench run $run failed"; }
  # size count type redop time(us) algbw busbw #wrong async(us) raw(us) ratio; 2 ranks: busbw = algbw
  awk '!/^#/ && $1 ~ /^[0-9]+$/ && NF >= 10 {
         raw = ($10 == "-") ? "n/a" : sprintf("%.4f", $1 / $10 / 1e3)
         printf "%.4f %s\n", $7, raw; found = 1; exit }
       END { if (!found) exit 1 }' "$work/$run.log" ||
    die "no result row in $work/$run.log"
}

# Every measurement goes to runs.csv.
runs_csv=$out_dir/runs.csv
echo "rate,impl,ranks,repeat,samples_per_second,step_ms,comm_exposed_ms,bus_gbps,allreduce_bytes_per_step,diagnosis" >"$runs_csv"
record() { # rate impl ranks repeat values...
  local IFS=,
  echo "$*" >>"$runs_csv"
}
diagnosis_tsv=$work/diagnosis.tsv
: >"$diagnosis_tsv"

# Each result is assigned to a variable first, so that a failed run stops the
# script (set -e does not see a failure inside an argument's $(...)).
first=1
port=29500
for rate in "${rates[@]}"; do
  ((first)) || "$hosts_tool" shape "$name" --rate "$rate"
  first=0
  echo "link $rate" >&2
  for r in $(seq "$repeats"); do
    if runs_part vqa1; then
      result=$(run_vqa "vqa-1-$rate-$r" 1 "$@")
      read -r -a row <<<"$result"
      record "$rate" vqa-hpc 1 "$r" "${row[@]}"
    fi
    result=$(run_vqa "vqa-2-$rate-$r" 2 "$@")
    read -r -a row <<<"$result"
    record "$rate" vqa-hpc 2 "$r" "${row[@]}"
    bytes=${row[4]}
    while IFS=$'\t' read -r rule message; do
      printf '%s\t%s\t%s\t%s\n' "$rate" "$r" "$rule" "$message" >>"$diagnosis_tsv"
    done <"$work/vqa-2-$rate-$r.diagnosis"
    for v in "${!variants[@]}"; do
      read -r -a variant_flags <<<"${variants[v]}"
      result=$(run_vqa "vqa-v$((v + 1))-$rate-$r" 2 "$@" "${variant_flags[@]}")
      read -r -a row <<<"$result"
      record "$rate" "vqa-hpc-v$((v + 1))" 2 "$r" "${row[@]}"
    done
    ((${#ddp_flags[@]})) || ddp_setup "$work/vqa-2-$rate-$r"
    port=$((port + 2))
    if runs_part ddp1; then
      result=$(run_ddp "ddp-1-$rate-$r" 1 0)
      record "$rate" pytorch-ddp 1 "$r" "$result" n/a n/a n/a n/a -
    fi
    if runs_part ddp2; then
      result=$(run_ddp "ddp-2-$rate-$r" 2 "$port")
      record "$rate" pytorch-ddp 2 "$r" "$result" n/a n/a n/a n/a -
    fi
    if runs_part ddpfu; then
      result=$(run_ddp "ddpfu-2-$rate-$r" 2 $((port + 1)) --find-unused-parameters)
      record "$rate" pytorch-ddp-find-unused 2 "$r" "$result" n/a n/a n/a n/a -
    fi
    if runs_part allreduce && [[ $bytes =~ ^[0-9]+$ ]] && ((bytes > 0)); then
      result=$(run_allreduce "allreduce-$rate-$r" "$bytes" "$work/vqa-2-$rate-$r")
      read -r -a row <<<"$result"
      record "$rate" vqa-allreduce 2 "$r" n/a n/a n/a "${row[0]}" "$bytes" -
      record "$rate" mpi-allreduce 2 "$r" n/a n/a n/a "${row[1]}" "$bytes" -
    fi
  done
done

# Medians per (rate, impl, ranks); one row per rate, as text and CSV; the
# diagnosis of the 2-rank vqa_train run whose samples/s is the median. With
# VARIANTS also each flag set's 2-rank median beside the default's and
# DDP's, and what the default's tuning chose in each repeat
# (tuning-vqa-2-RATE-R.json).
"$python" - "$runs_csv" "$out_dir/slow_link.csv" "$diagnosis_tsv" "$out_dir" "${#variants[@]}" "$repeats" \
  "${rates[@]}" <<'EOF' >"$work/table.txt"
import csv, json, os, sys
runs_path, table_path, diagnosis_path, out_dir = sys.argv[1:5]
count, repeats, rates = int(sys.argv[5]), int(sys.argv[6]), sys.argv[7:]
rows = list(csv.DictReader(open(runs_path)))

def number(text):
    return None if text in ("", "n/a", None) else float(text)

def median(values):
    values = sorted(v for v in values if v is not None)
    return values[(len(values) - 1) // 2] if values else None

def runs(rate, impl, ranks):
    return [r for r in rows if r["rate"] == rate and r["impl"] == impl and r["ranks"] == str(ranks)]

def med(rate, impl, ranks, key):
    return median([number(r[key]) for r in runs(rate, impl, ranks)])

def link_gbps(rate):
    if rate == "none":
        return None
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12, "bit": 1.0}
    for unit in ("kbit", "mbit", "gbit", "tbit", "bit"):
        if rate.endswith(unit):
            return float(rate[:-len(unit)]) * units[unit] / 8 / 1e9

def ratio(a, b):
    return None if a is None or not b else a / b

def fmt(value, spec):
    return "n/a" if value is None else format(value, spec)

diagnoses = {}
for line in open(diagnosis_path):
    rate, repeat, rule, message = line.rstrip("\n").split("\t", 3)
    diagnoses.setdefault((rate, repeat), []).append((rule, message))

columns = ["rate", "link_GBps", "vqa_1", "vqa_2", "vqa_2/1", "torch_1", "ddp_2", "ddp_fu_2",
           "vqa2/ddp2", "vqa_bus_GBps", "bus/link_%", "mpi_ar_GBps", "our_ar_GBps", "exposed_%"]
widths = [9, 9, 8, 8, 7, 8, 8, 8, 9, 12, 10, 11, 11, 9]
print(" ".join("%*s" % (w, c) for w, c in zip(widths, columns)))
lines = []
with open(table_path, "w", newline="") as out:
    writer = csv.writer(out)
    writer.writerow(["rate", "link_gbytes_per_s", "vqa_1_rank_sps", "vqa_2_ranks_sps", "vqa_2_over_1",
                     "pytorch_1_rank_sps", "ddp_2_ranks_sps", "ddp_find_unused_2_ranks_sps",
                     "vqa2_over_ddp2", "vqa_bus_gbytes_per_s", "bus_over_link_percent",
                     "mpi_allreduce_bus_gbytes_per_s", "vqa_allreduce_bus_gbytes_per_s",
                     "exposed_comm_percent", "allreduce_bytes_per_step", "diagnosis"])
    for rate in rates:
        link = link_gbps(rate)
        v1, v2 = med(rate, "vqa-hpc", 1, "samples_per_second"), med(rate, "vqa-hpc", 2, "samples_per_second")
        t1 = med(rate, "pytorch-ddp", 1, "samples_per_second")
        d2 = med(rate, "pytorch-ddp", 2, "samples_per_second")
        f2 = med(rate, "pytorch-ddp-find-unused", 2, "samples_per_second")
        bus = med(rate, "vqa-hpc", 2, "bus_gbps")
        shares = [ratio(number(r["comm_exposed_ms"]), number(r["step_ms"])) for r in runs(rate, "vqa-hpc", 2)]
        exposed = median(shares)
        mpi = med(rate, "mpi-allreduce", 2, "bus_gbps")
        ours = med(rate, "vqa-allreduce", 2, "bus_gbps")
        bytes_ = med(rate, "vqa-hpc", 2, "allreduce_bytes_per_step")
        values = [link, v1, v2, ratio(v2, v1), t1, d2, f2, ratio(v2, d2), bus,
                  None if link is None or bus is None else 100 * bus / link, mpi, ours,
                  None if exposed is None else 100 * exposed]
        specs = [".3f", ".1f", ".1f", ".2f", ".1f", ".1f", ".1f", ".2f", ".3f", ".0f", ".3f", ".3f", ".0f"]
        print(" ".join("%*s" % (w, c) for w, c in
                       zip(widths, [rate] + [fmt(v, s) for v, s in zip(values, specs)])))
        # The repeat whose 2-rank samples/s is the median.
        two = sorted(runs(rate, "vqa-hpc", 2), key=lambda r: float(r["samples_per_second"]))
        chosen = two[(len(two) - 1) // 2]["repeat"] if two else None
        found = diagnoses.get((rate, chosen), [])
        lines.append((rate, chosen, found))
        writer.writerow([rate] + [fmt(v, ".4f") for v in values] +
                        [fmt(bytes_, ".0f"), " | ".join(m if m.startswith(r) else r + ": " + m
                                                        for r, m in found)])
print()
print("diagnosis of the 2-rank vqa_train run (the median repeat) at each rate:")
for rate, repeat, found in lines:
    if not found:
        print("  %-9s (none)" % rate)
    for rule, message in found:
        # vqa_train's messages begin with their rule's name.
        print("  %-9s %s" % (rate, message if message.startswith(rule) else rule + ": " + message))
if count:
    impls = ["vqa-hpc"] + ["vqa-hpc-v%d" % (k + 1) for k in range(count)]
    names = ["default"] + ["v%d" % (k + 1) for k in range(count)]
    print()
    print("2-rank samples/s (medians) of the default and each variant; def/best: over the best variant")
    print(" ".join("%9s" % c for c in ["rate"] + names + ["ddp_2", "def/ddp2", "def/best"]))
    for rate in rates:
        values = [med(rate, impl, 2, "samples_per_second") for impl in impls]
        ddp = med(rate, "pytorch-ddp", 2, "samples_per_second")
        tried = [v for v in values[1:] if v is not None]
        cells = ["n/a" if v is None else "%.1f" % v for v in values + [ddp]]
        cells.append("n/a" if ddp is None or values[0] is None else "%.2f" % (values[0] / ddp))
        cells.append("n/a" if not tried or values[0] is None else "%.3f" % (values[0] / max(tried)))
        print(" ".join("%9s" % c for c in [rate] + cells))
    print("the default's tuning, per repeat: choice, bucket size (steps spent, seconds lost against the choice)")
    for rate in rates:
        for r in range(1, repeats + 1):
            path = os.path.join(out_dir, "tuning-vqa-2-%s-%d.json" % (rate, r))
            if os.path.exists(path):
                t = json.load(open(path))
                choice = t.get("choice", "start-up choice kept")
                if "MiB buckets" not in choice:
                    choice += ", %.3g MiB buckets" % t.get("bucket_mb", 0)
                print("  %-9s %d: %s (%s steps, %.2f s)" % (
                    rate, r, choice, t.get("steps_spent", 0), t.get("seconds_lost", 0.0)))
EOF

for v in "${!variants[@]}"; do echo "  v$((v + 1)): ${variants[v]}"; done >>"$work/table.txt"

bytes=$(awk -F, '$2 == "vqa-hpc" && $3 == 2 { print $9; exit }' "$runs_csv")
{
  echo "# vqa-hpc over a slow link: 2 emulated hosts (network namespaces, tc tbf on each direction), 1 core and 1 thread each;"
  echo "# preset $preset ($parameters parameters), $batch samples per rank per step, questions padded to $question_length tokens,"
  echo "# vocabulary $( ((vocab_size)) && echo "$vocab_size entries" || echo "of the templates' words"); vqa_train flags: ${*:-(none)}"
  echo "# $steps timed steps, median of $repeats runs; allreduce $bytes bytes per step (float32 in vqa_allreduce_bench)"
  echo "# samples/s: vqa_1 / torch_1 on host 0 alone, the rest one rank per host; vqa_2/1 = speed-up (2 is linear);"
  echo "# ddp_fu = DDP with find_unused_parameters=True; bus GB/s: vqa_train's gradient allreduces (bus_gbps),"
  echo "# mpi_ar / our_ar: vqa_allreduce_bench at the same bytes (raw MPI_Allreduce / the project's allreduce);"
  echo "# exposed: communication the step waits for, share of the step; bus/link tops out near 95% (TCP in Ethernet frames)"
  cat "$work/table.txt"
} | tee "$out_dir/slow_link.txt"
echo "wrote $out_dir/slow_link.txt, $out_dir/slow_link.csv, $runs_csv"
