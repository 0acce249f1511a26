# Sourced by the tests written in bash: `script_test_begin NAME SOURCE_DIR
# BUILD_DIR` sets source_dir and build_dir (absolute), a work folder removed
# on exit, and fail() (counts failures, names them on stderr);
# `script_test_end` exits 1 after any failure; `torch_python "import torch"`
# prints the first of python3, /usr/bin/python3 that runs the given code
# (Debian's python3-torch is only in the system interpreter), or nothing.
# shellcheck shell=bash
# The variables set here are for the sourcing script:
# shellcheck disable=SC2034

script_test_begin() {
  local name=$1
  source_dir=$(cd "$2" && pwd)
  build_dir=$(cd "$3" && pwd)
  work=$(mktemp -d "${TMPDIR:-/tmp}/vqa-test-$name-XXXXXX")
  trap 'rm -rf "$work"' EXIT
  failures=0
}

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

torch_python() {
  local candidate
  for candidate in python3 /usr/bin/python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c "$1" 2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
}

script_test_end() {
  local name=$1
  if ((failures)); then
    echo "$failures check(s) failed" >&2
    exit 1
  fi
  echo "$name: all checks passed"
}
