#!/usr/bin/env bash
# jobs/emulated_hosts.sh end to end: two hosts (network namespaces) on a
# 200 Mbit/s link, vqa_train --preset tiny at 2 ranks across it with
# --bf16-allreduce, and
#   - the run exits 0, and its <out>/diagnosis.json names the run
#     communication-bound (at 200 Mbit/s even bf16 gradients of the tiny
#     model take longer than its compute);
#   - that diagnosis does not recommend --bf16-allreduce, which is on already;
#   - diagnosis.json has the projection to more ranks: "projection" with a row
#     (ranks, samples_per_second, efficiency, bottleneck) for 1, 2, 4 and 8 ranks;
#   - `down` leaves no namespace of the set;
# then a set whose owner (a background sleep) is killed with SIGKILL is gone,
# with the processes started on its hosts, within 5 s (the watcher's job).
# Needs root, iproute2 and util-linux; exit 77 (SKIP) otherwise.
#
#   tests/runtime/test_emulated_hosts.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
# shellcheck source=tests/support/script_test.sh
source "$(dirname "$0")/../support/script_test.sh"
script_test_begin emulated-hosts "$1" "$2"

skip() {
  echo "SKIP: $*"
  exit 77
}
[[ $(id -u) -eq 0 ]] || skip "needs root to create network namespaces (jobs/emulated_hosts.sh)"
for tool in ip tc unshare taskset setsid mpirun; do
  command -v "$tool" >/dev/null || skip "$tool not found (iproute2, util-linux, Open MPI)"
done
ip netns add "vqa-probe-$$" 2>/dev/null || skip "cannot create a network namespace (ip netns add)"
ip netns del "vqa-probe-$$"

hosts=$source_dir/jobs/emulated_hosts.sh
name=eh$$
name=${name:0:12}
owned=eh$$o
owned=${owned:0:12}
sleeper=""
# However the test ends: both sets down, the owner stand-in gone.
trap '"$hosts" down "$name" >/dev/null 2>&1 || true
      "$hosts" down "$owned" >/dev/null 2>&1 || true
      [[ -n $sleeper ]] && kill -9 "$sleeper" 2>/dev/null
      rm -rf "$work"' EXIT

namespaces_of() { # NAME -> the set's namespaces that exist, one a line
  # (a namespace removed while this lists them makes ip complain on stderr)
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$1-(h[0-9]+|sw)$" || true
}

# ---- 1. vqa_train across a 200 Mbit/s link ------------------------------
start=$SECONDS
batch=16
steps=6
"$build_dir/vqa_prep" synth -o "$work/synth.h5" --image-size 32 --max-len 12 \
  --train-questions $((batch * 2 * steps * 2)) --test-questions 16 >/dev/null
"$hosts" up "$name" 2 --rate 200mbit --owner $$ >"$work/up.log" 2>&1 ||
  { cat "$work/up.log" >&2; fail "emulated_hosts.sh up $name 2 --rate 200mbit failed"; }
[[ $(namespaces_of "$name" | wc -l) == 3 ]] || fail "expected $name-h0, $name-h1 and $name-sw, got: $(namespaces_of "$name" | tr '\n' ' ')"

if "$hosts" mpirun "$name" -x OMP_NUM_THREADS=1 "$build_dir/vqa_train" --train-data "$work/synth.h5" \
  --out "$work/run" --preset tiny --threads 1 --batch-per-rank "$batch" --global-batch $((batch * 2)) \
  --epochs 2 --max-steps-per-epoch "$steps" --eval-every 0 --save-every 0 --progress off \
  --bf16-allreduce >"$work/train.log" 2>&1; then
  echo "vqa_train over 200mbit: $((SECONDS - start)) s so far"
  if [[ ! -f $work/run/diagnosis.json ]]; then
    fail "no diagnosis.json in the run's output"
  else
    # One "FAIL: ..." line per broken expectation (python3 without torch will do).
    python3 - "$work/run/diagnosis.json" >"$work/checks.txt" <<'EOF' || fail "could not read diagnosis.json"
import json, sys
report = json.load(open(sys.argv[1]))
diagnoses = report.get("diagnosis", [])
bound = [d for d in diagnoses if d.get("rule") == "communication-bound"]
if not bound:
    print("FAIL: no communication-bound diagnosis at 200mbit; rules: %s; exposed %s of step %s s" % (
        [d.get("rule") for d in diagnoses], report.get("phases", {}).get("comm_exposed"),
        report.get("step_seconds")))
for d in bound:
    # The message and the remedies it lists (numbers.remedies[].option), as text.
    remedies = d.get("numbers", {}).get("remedies", [])
    texts = [str(d.get("message", ""))] + [json.dumps(r) for r in remedies]
    if any("--bf16-allreduce" in t for t in texts):
        print("FAIL: the communication-bound diagnosis recommends --bf16-allreduce, which is on: %s"
              % " ".join(texts))
projection = report.get("projection")
if not isinstance(projection, dict):
    print("FAIL: diagnosis.json has no \"projection\" object (top-level keys: %s)" % sorted(report))
else:
    rows = projection.get("rows")
    if not isinstance(rows, list):
        print("FAIL: projection has no \"rows\" array")
    else:
        for row in rows:
            missing = [k for k in ("ranks", "samples_per_second", "efficiency", "bottleneck")
                       if k not in row]
            if missing:
                print("FAIL: projection row %s lacks %s" % (row, missing))
        present = {row.get("ranks") for row in rows if isinstance(row, dict)}
        for ranks in (1, 2, 4, 8):
            if ranks not in present:
                print("FAIL: projection has no row for %d ranks (rows for %s)" % (ranks, sorted(present, key=str)))
EOF
    while IFS= read -r line; do
      [[ $line == FAIL:* ]] && fail "${line#FAIL: }"
    done <"$work/checks.txt"
  fi
else
  tail -n 40 "$work/train.log" >&2
  fail "vqa_train at 2 ranks across the emulated hosts exited non-zero"
fi
"$hosts" down "$name"
[[ -z $(namespaces_of "$name") ]] || fail "namespaces left after down: $(namespaces_of "$name" | tr '\n' ' ')"
echo "case 1 (vqa_train over 200mbit, down): $((SECONDS - start)) s"

# ---- 2. the owner killed: the watcher removes the set --------------------
start=$SECONDS
sleep 600 &
sleeper=$!
disown "$sleeper" # its SIGKILL below is no news
"$hosts" up "$owned" 2 --rate none --owner "$sleeper" >"$work/up2.log" 2>&1 ||
  { cat "$work/up2.log" >&2; fail "emulated_hosts.sh up $owned 2 --owner $sleeper failed"; }
# A process on host 1 must go with the set.
"$hosts" exec "$owned" 1 sleep 600 &
guest=$!
disown "$guest" # the watcher's SIGKILL is expected
sleep 0.5
[[ $(namespaces_of "$owned" | wc -l) == 3 ]] || fail "set $owned not up: $(namespaces_of "$owned" | tr '\n' ' ')"
kill -0 "$guest" 2>/dev/null || fail "the process started on $owned-h1 is not running"
kill -9 "$sleeper"
sleeper=""
gone=0
for _ in $(seq 50); do
  if [[ -z $(namespaces_of "$owned") ]]; then
    gone=1
    break
  fi
  sleep 0.1
done
((gone)) || fail "5 s after its owner was killed, set $owned still has: $(namespaces_of "$owned" | tr '\n' ' ')"
sleep 0.2
if kill -0 "$guest" 2>/dev/null; then
  fail "the process started on $owned-h1 outlived the set"
  kill -9 "$guest" 2>/dev/null || true
fi
[[ ! -e ${VQA_HOSTS_STATE:-/run/vqa-emulated-hosts}/$owned ]] || fail "the state of $owned is left behind"
echo "case 2 (owner killed, set removed): $((SECONDS - start)) s"

script_test_end emulated-hosts
