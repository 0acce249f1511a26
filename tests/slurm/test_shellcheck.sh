#!/usr/bin/env bash
# Lint of every shell script of the project: `bash -n` (syntax) and
# `shellcheck` (all severities, sourced files followed) on each file under
# jobs/, tests/, env/ and .ci/ that ends in .sh or .sbatch or starts with a
# sh/bash #! line. A script may disable a check only with a comment saying
# why, next to the directive.
#
#   tests/slurm/test_shellcheck.sh SOURCE_DIR
set -euo pipefail
cd "$1"
if ! command -v shellcheck >/dev/null; then
  echo "FAIL: shellcheck is not installed (Debian package shellcheck; env/setup.sh installs it)" >&2
  exit 1
fi

scripts=()
while IFS= read -r -d '' file; do
  if [[ $file == *.sh || $file == *.sbatch ]] ||
    head -n 1 "$file" | grep -Eq '^#!(/usr)?/bin/(env +)?(ba)?sh( |$)'; then
    scripts+=("$file")
  fi
done < <(find jobs tests env .ci -type f -not -name '*.py' -print0 2>/dev/null | sort -z)
((${#scripts[@]} > 0)) || { echo "FAIL: no scripts found under $PWD" >&2; exit 1; }

failed=()
for script in "${scripts[@]}"; do
  # Sourced files declare their shell (# shellcheck shell=bash); bash -n
  # reads them as bash either way.
  bash -n "$script" || failed+=("$script (bash -n)")
  # A disabled check needs its reason: after a second # on the directive's
  # line, or on the comment line just above it.
  while IFS= read -r line; do
    number=${line%%:*}
    text=${line#*:}
    if [[ $text != *disable=*#* ]]; then
      above=$(sed -n "$((number - 1))p" "$script")
      [[ $above =~ ^[[:space:]]*# ]] || failed+=("$script:$number (shellcheck disable without a reason)")
    fi
  done < <(grep -nE '^[[:space:]]*# *shellcheck +disable=' "$script" || true)
  shellcheck -x "$script" || failed+=("$script (shellcheck)")
done

echo "checked ${#scripts[@]} scripts:"
printf '  %s\n' "${scripts[@]}"
if ((${#failed[@]})); then
  printf 'FAIL: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "PASS: bash -n and shellcheck clean"
